// `loom bench ps-transport`: the parameter server's push and pull (parallel/
// ps.h) over MPI point-to-point against MPI one-sided communication (RMA),
// the choice the parameter-server issue asks to measure. World rank 0 is
// the server, the others are workers; one round = every worker pushes n f32
// gradients, the server sums them in worker order (deterministic, as
// parallel/ps.h requires) and every worker pulls the n-element sum back.
//   p2p  MPI_Isend / MPI_Irecv both ways (what loom uses).
//   rma  a window on the server with one slot per worker: each worker
//        MPI_Puts its gradients into its slot, a fence, the server sums the
//        slots, a fence, each worker MPI_Gets the sum, a fence. (An
//        MPI_Accumulate into one buffer would sum in arrival order, which the
//        synchronous mode's determinism rules out.)
// Prints per size the seconds of a round (median) and the push+pull bytes
// per second one worker moves (2 n 4 / seconds), both transports side by side.
#pragma once

#include <cstdint>
#include <string>

namespace loom::bench {

struct PsTransportOptions {
  int64_t min_bytes = 1 << 16;
  int64_t max_bytes = int64_t{64} << 20;
  int iters = 10;
  std::string command;  // the command line that reproduces the run
};

// Runs on every rank of an mpirun job of at least 2; rank 0 prints. Returns the exit code.
int run_ps_transport_bench(const PsTransportOptions& opts);

}  // namespace loom::bench
