// The MPI backend: communicators over OpenMPI (host memory), with MPI's own
// collectives (Algo::mpi) or loom's ring algorithms (Algo::ring, ring.h).
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace loom::comm {

// The communicator of every process of the job, named "world". Initialises
// MPI on first use (MPI_THREAD_MULTIPLE; finalised at process exit, so
// destroy every communicator before then). A process started without mpirun
// is a world of one.
//
// Numerics: bf16 sum and avg are converted to an f32 copy, reduced in f32
// and rounded back once, so the result does not depend on how many partial
// sums were rounded on the way. avg divides the f32 sum by size(); it is
// refused for i32/i64 (an integer average would truncate).
std::unique_ptr<Communicator> mpi_world(const Options& options = {});

}  // namespace loom::comm
