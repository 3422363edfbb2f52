#include "comm/communicator.h"

#include <algorithm>
#include <atomic>

#include "core/error.h"

namespace loom::comm {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
  }
  LOOM_CHECK(false, "unknown ReduceOp ", static_cast<int>(op));
}

std::string_view algo_name(Algo algo) {
  switch (algo) {
    case Algo::mpi: return "mpi";
    case Algo::ring: return "ring";
  }
  LOOM_CHECK(false, "unknown Algo ", static_cast<int>(algo));
}

Algo algo_from_name(std::string_view name) {
  if (name == "mpi") return Algo::mpi;
  if (name == "ring") return Algo::ring;
  fail("unknown communication algorithm '", name, "': allowed values are mpi, ring");
}

Range shard_range(int64_t n, int size, int rank) {
  LOOM_CHECK(n >= 0 && size >= 1 && rank >= 0 && rank < size, "shard_range(n=", n, ", size=", size,
             ", rank=", rank, ")");
  const int64_t base = n / size;
  const int64_t extra = n % size;  // ranks [0, extra) hold base + 1
  const int64_t r = rank;
  return Range{r * base + std::min(r, extra), base + (r < extra ? 1 : 0)};
}

WorkPtr Communicator::send_unguarded(Tensor, int, int) {
  fail("communicator '", name(), "' has no fault-tolerant point-to-point (send_unguarded): an MPI communicator does");
}

WorkPtr Communicator::recv_unguarded(Tensor, int, int) {
  fail("communicator '", name(), "' has no fault-tolerant point-to-point (recv_unguarded): an MPI communicator does");
}

namespace {
std::atomic<bool> g_lost_peer{false};
}  // namespace

void note_lost_peer() { g_lost_peer.store(true); }
bool lost_a_peer() { return g_lost_peer.load(); }

}  // namespace loom::comm
