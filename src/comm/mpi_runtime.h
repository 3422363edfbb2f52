// The process's MPI library: initialised once, finalised at exit.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "comm/launcher.h"
#include "core/dtype.h"
#include "core/threads.h"

namespace loom::comm {

// MPI_Init_thread(MPI_THREAD_MULTIPLE) on first call (a process started
// without mpirun is a world of one); MPI_Finalize runs at process exit, so
// every communicator must be destroyed before then. loom::Error if the
// library gives less than MPI_THREAD_MULTIPLE.
void mpi_ensure_initialized();
// The MPI library loom is built with (from its header's macros).
MpiLibrary mpi_library();
// The CPU masks (core/threads.h) of the world's processes that share this
// machine's memory (MPI_COMM_TYPE_SHARED, however the launcher names the
// machines), in their order there; `me` is this process's index. Collective
// over the world; initialises MPI.
std::vector<CpuMask> mpi_cpu_masks_on_this_node(int& me);
// Prints `message` (one line, to stderr) and aborts every process of the job.
[[noreturn]] void mpi_abort_job(const std::string& message);
// Aborts every process of the job at once (MPI_Abort on MPI_COMM_WORLD);
// mpirun exits with exit_code. The caller has printed (and flushed) why.
[[noreturn]] void mpi_abort_job(int exit_code);
// MPI's text for an error code ("MPI_ERR_TRUNCATE: message truncated").
std::string mpi_error_text(int code);
// The MPI datatype of one element of a comm dtype (bf16 moves as uint16).
MPI_Datatype mpi_type(DType dtype);

}  // namespace loom::comm
