#include "comm/mpi_runtime.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "comm/communicator.h"
#include "core/error.h"

namespace loom::comm {
namespace {

void finalize_at_exit() {
  // A job that lost a rank on purpose (a parameter-server worker dropped:
  // parallel/ps.h) cannot finalize: OpenMPI 4.1's MPI_Finalize waits in a
  // fence for every process of the job, the dead one included, and hangs
  // (measured: 2 runs in 3 under --enable-recovery). The survivors leave
  // without it; mpirun --enable-recovery accepts that.
  if (lost_a_peer()) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace

void mpi_ensure_initialized() {
  static std::once_flag once;
  std::call_once(once, [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    int provided = MPI_THREAD_SINGLE;
    if (initialized) {
      MPI_Query_thread(&provided);
    } else {
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
      std::atexit(finalize_at_exit);
    }
    // Each communicator's progress thread calls MPI alongside the caller.
    LOOM_REQUIRE(provided == MPI_THREAD_MULTIPLE,
                 "the MPI library provides thread level ", provided, " but loom needs MPI_THREAD_MULTIPLE (",
                 MPI_THREAD_MULTIPLE, "): use an MPI built with thread support (OpenMPI >= 3)");
  });
}

MpiLibrary mpi_library() {
#if defined(OPEN_MPI)
  return MpiLibrary::open_mpi;
#elif defined(MPICH_VERSION)
  return MpiLibrary::mpich;
#else
  return MpiLibrary::other;
#endif
}

std::vector<CpuMask> mpi_cpu_masks_on_this_node(int& me) {
  mpi_ensure_initialized();
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int n = 1;
  MPI_Comm_size(node, &n);
  MPI_Comm_rank(node, &me);
  const CpuMask mine = this_process_cpus();
  std::vector<CpuMask> all(static_cast<size_t>(n));
  MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_UINT64_T, all.data(), static_cast<int>(mine.size()),
                MPI_UINT64_T, node);
  MPI_Comm_free(&node);
  return all;
}

void mpi_abort_job(const std::string& message) {
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  mpi_abort_job(1);
}

void mpi_abort_job(int exit_code) {
  std::fflush(stdout);  // progress lines printed before the error stay in order
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::abort();  // MPI_Abort does not return; this keeps [[noreturn]] honest
}

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error code " + std::to_string(code);
  return std::string(text, static_cast<size_t>(len));
}

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return MPI_FLOAT;
    case DType::bf16: return MPI_UINT16_T;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    default: LOOM_CHECK(false, "mpi_type: dtype ", dtype_name(dtype), " is not a comm dtype");
  }
}

}  // namespace loom::comm
