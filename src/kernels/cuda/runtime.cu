// The CUDA backend's runtime side: device selection, device memory for
// core's pools, the backend table and its registration (cuda_backend.h),
// and the helpers of common.cuh that run on the host.
#include <cstdio>
#include <mutex>
#include <sstream>
#include <vector>

#include "core/memory.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cublaslt_api.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_ops.h"

namespace loom::kernels {
namespace cuda {

cudaStream_t g_stream = nullptr;

void fail_cuda(cudaError_t e, const char* what, const char* file, int line) {
  fail("CUDA: ", what, " failed: ", cudaGetErrorName(e), ": ", cudaGetErrorString(e), " (", file, ":", line, ")");
}

DeviceTemp::DeviceTemp(size_t bytes) {
  if (bytes > 0) LOOM_CUDA_CHECK(cudaMallocAsync(&ptr_, bytes, stream()));
}

DeviceTemp::~DeviceTemp() {
  if (ptr_) cudaFreeAsync(ptr_, stream());  // an error here surfaces at the next check
}

void read_back(void* host, const void* device, size_t bytes) {
  LOOM_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream()));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

BadIdFlag::BadIdFlag() : flag_(sizeof(unsigned long long)) {
  LOOM_CUDA_CHECK(cudaMemsetAsync(flag_.as<void>(), 0xff, sizeof(unsigned long long), stream()));
}

int64_t BadIdFlag::first() const {
  unsigned long long v = 0;
  read_back(&v, flag_.as<void>(), sizeof v);
  return v == ~0ull ? -1 : static_cast<int64_t>(v);
}

namespace {

// ---- device memory for core's pools -----------------------------------------

// Stream ordered (cudaMallocAsync / cudaFreeAsync on the ops' stream), not
// cudaMalloc / cudaFree: cudaFree waits for the whole device, NCCL's streams
// included, so a pool buffer freed during a compute while a pipeline stage's
// receive is posted would wait for the peer's send, which may itself wait
// behind such a free: a deadlock. Ordered after the ops enqueued before it,
// a free cannot overtake a kernel that still reads the memory; collectives
// on NCCL's streams are waited for by the host before their buffers go.
void* allocate(int, size_t bytes) {
  void* p = nullptr;
  cudaError_t e = cudaMallocAsync(&p, bytes, stream());
  if (e == cudaErrorMemoryAllocation) {  // what the pool keeps goes back to the driver, and once more
    cudaGetLastError();
    cudaMemPool_t pool = nullptr;
    int device = 0;
    LOOM_CUDA_CHECK(cudaGetDevice(&device));
    LOOM_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    // The compute stream's frees done; not the device's (cudaDeviceSynchronize
    // would wait for NCCL's streams: the deadlock above).
    LOOM_CUDA_CHECK(cudaStreamSynchronize(stream()));
    LOOM_CUDA_CHECK(cudaMemPoolTrimTo(pool, 0));
    e = cudaMallocAsync(&p, bytes, stream());
  }
  if (e != cudaSuccess) {
    size_t free_bytes = 0, total = 0;
    cudaGetLastError();
    cudaMemGetInfo(&free_bytes, &total);
    fail("out of GPU memory: cudaMallocAsync of ", bytes, " bytes (", bytes >> 20, " MiB) failed: ", cudaGetErrorString(e),
         "; the GPU has ", free_bytes >> 20, " MiB free of ", total >> 20, " MiB");
  }
  return p;
}
void release(int, void* p) { cudaFreeAsync(p, stream()); }  // an error surfaces at the next check
void zero(int, void* p, size_t bytes) {
  LOOM_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream()));
}
void to_device(int, void* dst, const void* src, size_t bytes) {
  LOOM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream()));  // src may be freed once we return
}
void to_host(int, void* dst, const void* src, size_t bytes) { read_back(dst, src, bytes); }
// Ordered on the stream after the ops that wrote src, before those that read dst.
void within(int, void* dst, const void* src, size_t bytes) {
  LOOM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()));
}

void* compute_stream(int) { return g_stream; }

// Host memory registered with the driver: copies DMA it directly. Portable
// (any device of the process may copy it). A failure clears CUDA's error.
bool pin_host(int, void* data, size_t bytes) {
  if (cudaHostRegister(data, bytes, cudaHostRegisterPortable) == cudaSuccess) return true;
  cudaGetLastError();
  return false;
}
void unpin_host(int, void* data) {
  if (cudaHostUnregister(data) != cudaSuccess) cudaGetLastError();  // never pinned: nothing to undo
}

constexpr DeviceMemory kMemory{allocate, release,        zero,     to_device, to_host,
                               within,   compute_stream, pin_host, unpin_host};

// ---- the op tracer's clock (op_trace.h): events on the compute stream ---------

std::mutex g_events_mutex;
std::vector<cudaEvent_t> g_free_events;  // released marks, reused: creating an event costs microseconds

void* clock_mark() {
  cudaEvent_t e = nullptr;
  {
    std::lock_guard lock(g_events_mutex);
    if (!g_free_events.empty()) e = g_free_events.back(), g_free_events.pop_back();
  }
  if (e == nullptr) LOOM_CUDA_CHECK(cudaEventCreate(&e));
  LOOM_CUDA_CHECK(cudaEventRecord(e, stream()));
  return e;
}
double clock_elapsed_us(void* from, void* to) {
  LOOM_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(to)));
  float ms = 0;
  LOOM_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(from), static_cast<cudaEvent_t>(to)));
  return 1e3 * static_cast<double>(ms);
}
void clock_release(void* mark) {
  std::lock_guard lock(g_events_mutex);
  g_free_events.push_back(static_cast<cudaEvent_t>(mark));
}

constexpr DeviceClock kClock{clock_mark, clock_elapsed_us, clock_release};

constexpr Backend kTable = [] {
  Backend b;
  b.name = "cuda";
  b.kind = Device::Kind::cuda;
  b.clock = &kClock;
#define LOOM_KERNEL_OP_ASSIGN(op, ret, params) b.op = &cuda::op;
  LOOM_KERNEL_OPS(LOOM_KERNEL_OP_ASSIGN)
#undef LOOM_KERNEL_OP_ASSIGN
  return b;
}();

std::mutex g_mutex;
int g_registered = -1;  // the registered device, or -1

}  // namespace
}  // namespace cuda

std::string cuda_unavailable_reason(int index) {
  int runtime = 0, driver = 0, count = 0;
  cudaRuntimeGetVersion(&runtime);
  const cudaError_t de = cudaDriverGetVersion(&driver);
  if (de != cudaSuccess || driver == 0)
    return "no NVIDIA driver (libcuda) was found: this machine cannot run CUDA code";
  const cudaError_t ce = cudaGetDeviceCount(&count);
  if (ce != cudaSuccess) {
    cudaGetLastError();
    std::ostringstream os;
    os << "no usable CUDA device: cudaGetDeviceCount failed: " << cudaGetErrorString(ce) << " (driver supports CUDA "
       << driver / 1000 << "." << driver % 1000 / 10 << ", loom was built with " << runtime / 1000 << "."
       << runtime % 1000 / 10 << ")";
    return os.str();
  }
  if (count == 0) return "no CUDA device is visible to this process";
  if (index < 0 || index >= count) {
    std::ostringstream os;
    os << "CUDA device " << index << " does not exist: this process sees " << count << " device(s)";
    return os.str();
  }
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, index) != cudaSuccess) return "cannot read the properties of CUDA device";
  if (p.major < 8) {
    std::ostringstream os;
    os << p.name << " (sm_" << p.major << p.minor << ") is older than loom's CUDA code allows (sm_80 and later: bf16)";
    return os.str();
  }
  int pools = 0;
  if (cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, index) != cudaSuccess || pools == 0)
    return std::string(p.name) + " does not support stream-ordered memory (cudaMallocAsync), which loom's pools use";
  return cuda::cublaslt_unavailable_reason();  // the GEMMs' library, loaded now (cublaslt_api.h)
}

std::string cuda_device_description(int index) {
  cudaDeviceProp p{};
  LOOM_CUDA_CHECK(cudaGetDeviceProperties(&p, index));
  int driver = 0;
  cudaDriverGetVersion(&driver);
  std::ostringstream os;
  os.precision(1);
  os << p.name << ", sm_" << p.major << p.minor << ", " << p.multiProcessorCount << " SMs, " << std::fixed
     << static_cast<double>(p.totalGlobalMem) / (1 << 30) << " GiB, driver CUDA " << driver / 1000 << "."
     << driver % 1000 / 10;
  return os.str();
}

void register_cuda_backend(int index) {
  std::lock_guard lock(cuda::g_mutex);
  if (cuda::g_registered == index) return;
  LOOM_REQUIRE(cuda::g_registered < 0, "register_cuda_backend(", index, "): CUDA device ", cuda::g_registered,
               " is already this process's GPU (one GPU per process)");
  const std::string why = cuda_unavailable_reason(index);
  LOOM_REQUIRE(why.empty(), "cannot use CUDA device ", index, ": ", why);
  LOOM_CUDA_CHECK(cudaSetDevice(index));
  // The pools' memory pool (cudaMallocAsync's, the device's default): it
  // keeps what is freed for the next allocation rather than returning it to
  // the driver at every synchronisation (the default threshold, 0, would map
  // a step's buffers afresh each step), and never makes a stream wait for
  // another to reuse a block (what NCCL's streams free must not hold back
  // the compute stream: the deadlock of allocate()'s comment).
  cudaMemPool_t pool = nullptr;
  LOOM_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, index));
  uint64_t keep = UINT64_MAX;
  LOOM_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  int no = 0;
  LOOM_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolReuseAllowInternalDependencies, &no));
  // The compute stream: a stream of its own rather than the legacy default
  // one, so that it is ordered against NCCL's streams by events alone and
  // its ops can be captured into a CUDA graph (those that neither return a
  // value to the host nor communicate, after a first GEMM has made
  // cuBLASLt's workspace). Blocking (not cudaStreamNonBlocking): work a
  // library or test puts on the legacy default stream (cudaMemcpy) stays
  // ordered with loom's ops, as before. Never destroyed: tensors are freed
  // on it until the process exits.
  cudaStream_t compute = nullptr;
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamDefault));
  try {
    register_device_memory(Device::Kind::cuda, cuda::kMemory);
    register_backend(cuda::kTable);
  } catch (...) {
    cudaStreamDestroy(compute);
    throw;
  }
  cuda::g_stream = compute;  // before any op: nothing allocates until this returns
  cuda::g_registered = index;
}

Stream cuda_stream() {
  std::lock_guard lock(cuda::g_mutex);
  return cuda::g_registered < 0 ? Stream{Device::cpu()} : Stream{Device::cuda(cuda::g_registered), cuda::g_stream};
}

void cuda_synchronize() { LOOM_CUDA_CHECK(cudaDeviceSynchronize()); }

}  // namespace loom::kernels
