#include "comm/nccl/nccl_backend.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "comm/deadline.h"
#include "comm/mpi_runtime.h"
#include "comm/nccl/nccl_communicator.h"
#include "comm/watchdog.h"
#include "core/error.h"

namespace loom::comm {
namespace {

using Clock = std::chrono::steady_clock;

// A pending NCCL operation: the CUDA event recorded after it on its stream.
// Its deadline (Options::timeout_s) counts from the issue, for test() and
// wait() alike (communicator.h): a caller that polls test() is watched too.
class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<NcclState> state, NcclLink* link, cudaEvent_t event, std::string what,
           int64_t seq)
      : state_(std::move(state)), link_(link), event_(event), what_(std::move(what)), seq_(seq),
        deadline_(deadline_after(Clock::now(), state_->options.timeout_s)) {}
  ~NcclWork() override { cudaEventDestroy(event_); }

  bool test() override {
    if (done_) return true;
    const cudaError_t err = cudaEventQuery(event_);
    if (err == cudaSuccess) return done_ = true;
    if (err != cudaErrorNotReady) abort_job(concat("failed: CUDA error: ", cudaGetErrorString(err)));
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(link_->comm, &async);
    if (async != ncclSuccess && async != ncclInProgress)
      abort_job(concat("failed: NCCL error: ", ncclGetErrorString(async), ": ",
                       ncclGetLastError(link_->comm)));
    if (Clock::now() > deadline_) abort_job(concat("did not complete within ", state_->options.timeout_s, " s"));
    return false;
  }

  // Yields while the op is young, then sleeps with a growing pause (up to
  // 1 ms): the GPU finishes it, spinning would only steal a core.
  void wait() override {
    const auto start = Clock::now();
    int sleep_us = 20;
    while (!test()) {  // which aborts past the deadline
      if (Clock::now() - start < std::chrono::milliseconds(2)) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
        sleep_us = std::min(sleep_us * 2, 1000);
      }
    }
  }

 private:
  // The NCCL communicator is aborted first so no kernel stays stuck on it.
  [[noreturn]] void abort_job(const std::string& why) {
    const std::string message =
        concat("[rank ", state_->rank, " of '", state_->name, "'] nccl watchdog: ", what_, " #", seq_,
               " on communicator '", state_->name, "' ", why, ". Aborting the job.");
    ncclCommAbort(link_->comm);
    link_->comm = nullptr;
    mpi_abort_job(message);
  }

  std::shared_ptr<NcclState> state_;
  NcclLink* link_;  // inside *state_
  cudaEvent_t event_;
  std::string what_;
  int64_t seq_;
  Clock::time_point deadline_;
  bool done_ = false;
};

}  // namespace

void cuda_require(cudaError_t err, const std::string& what) {
  LOOM_REQUIRE(err == cudaSuccess, "nccl backend: ", what, " failed: ", cudaGetErrorString(err));
}

void nccl_require(ncclResult_t res, ncclComm_t comm, const std::string& what) {
  LOOM_REQUIRE(res == ncclSuccess, "nccl backend: ", what, " failed: ", ncclGetErrorString(res),
               comm ? concat(": ", ncclGetLastError(comm)) : std::string());
}

WorkPtr make_nccl_work(std::shared_ptr<NcclState> state, NcclLink& link, std::string what, int64_t seq) {
  cudaEvent_t event = nullptr;
  cuda_require(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
  const cudaError_t err = cudaEventRecord(event, link.stream);
  if (err != cudaSuccess) cudaEventDestroy(event);
  cuda_require(err, "cudaEventRecord");
  return std::make_shared<NcclWork>(std::move(state), &link, event, std::move(what), seq);
}

std::function<void()> abort_when_late(const NcclState& state, std::string what) {
  return [rank = state.rank, name = state.name, timeout_s = state.options.timeout_s, what = std::move(what)] {
    mpi_abort_job(concat("[rank ", rank, " of '", name, "'] nccl watchdog: ", what, " did not complete within ",
                         timeout_s, " s (a rank that never arrived, or a network NCCL cannot reach). Aborting the job."));
  };
}

// Waits for the links' queued work and NCCL's teardown, both without a
// deadline of their own: past timeout_s (a peer that died mid-op) the
// watchdog aborts the job rather than hang it at exit.
NcclState::~NcclState() {
  const Watchdog dog(options.timeout_s, abort_when_late(*this, concat("tearing down communicator '", name, "'")));
  cudaSetDevice(device);
  std::vector<NcclLink*> links = {&coll};
  for (NcclLink& l : p2p) links.push_back(&l);
  for (NcclLink* l : links)
    if (l->stream) cudaStreamSynchronize(l->stream);
  // Every link drained, the barrier word is freed on the collectives' stream
  // (cudaFree would wait for every stream of the device: other
  // communicators' posted receives too).
  if (scratch && coll.stream) {
    cudaFreeAsync(scratch, coll.stream);
    cudaStreamSynchronize(coll.stream);
  }
  for (NcclLink* l : links) {
    if (l->comm) ncclCommDestroy(l->comm);
    if (l->stream) cudaStreamDestroy(l->stream);
  }
  if (compute_done) cudaEventDestroy(compute_done);
}

cudaError_t create_link_stream(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamNonBlocking);
}

void order_after_compute(NcclState& state, NcclLink& link, const std::string& what) {
  const cudaStream_t compute = state.compute ? state.compute : cudaStreamLegacy;
  cuda_require(cudaEventRecord(state.compute_done, compute), concat(what, ": cudaEventRecord"));
  cuda_require(cudaStreamWaitEvent(link.stream, state.compute_done, 0), concat(what, ": cudaStreamWaitEvent"));
}

// Three unique ids (collectives, up, down) made on rank 0 travel through the
// bootstrap as i64 words; every rank then joins the three NCCL communicators
// in the same order.
NcclCommunicator::NcclCommunicator(std::unique_ptr<Communicator> bootstrap, int device,
                                   const Options& options, cudaStream_t compute, std::string name)
    : bootstrap_(std::move(bootstrap)), state_(std::make_shared<NcclState>()) {
  NcclState& s = *state_;
  s.device = device;
  s.compute = compute;
  s.rank = bootstrap_->rank();
  s.size = bootstrap_->size();
  s.name = name.empty() ? bootstrap_->name() : std::move(name);
  s.options = options;
  cuda_require(cudaSetDevice(device), concat("cudaSetDevice(", device, ")"));

  std::array<ncclUniqueId, 3> ids{};
  static_assert(sizeof(ids) % sizeof(int64_t) == 0);
  std::array<int64_t, sizeof(ids) / sizeof(int64_t)> words{};
  if (s.rank == 0) {
    for (ncclUniqueId& id : ids) nccl_require(ncclGetUniqueId(&id), nullptr, "ncclGetUniqueId");
    std::memcpy(words.data(), ids.data(), sizeof(ids));
  }
  bootstrap_->broadcast(Tensor(words.data(), DType::i64, {static_cast<int64_t>(words.size())}), 0)->wait();
  std::memcpy(ids.data(), words.data(), sizeof(ids));

  NcclLink* links[] = {&s.coll, &s.p2p[static_cast<int>(P2pLink::up)], &s.p2p[static_cast<int>(P2pLink::down)]};
  const Watchdog dog(options.timeout_s, abort_when_late(s, concat("ncclCommInitRank for communicator '", s.name, "'")));
  for (size_t i = 0; i < ids.size(); ++i) {
    cuda_require(create_link_stream(&links[i]->stream), "cudaStreamCreate");
    nccl_require(ncclCommInitRank(&links[i]->comm, s.size, ids[i], s.rank), nullptr,
                 concat("ncclCommInitRank for communicator '", s.name, "'"));
  }
  // Ordered on the collectives' stream and waited for there alone: a
  // device-wide wait would also wait for other communicators' posted receives.
  void* scratch = nullptr;
  cuda_require(cudaMallocAsync(&scratch, 5 * sizeof(float), s.coll.stream), "cudaMallocAsync of the barrier word");
  s.scratch = static_cast<float*>(scratch);
  cuda_require(cudaMemsetAsync(s.scratch, 0, 5 * sizeof(float), s.coll.stream),
               "cudaMemsetAsync of the barrier word");  // sent as is
  cuda_require(cudaStreamSynchronize(s.coll.stream), "cudaMemsetAsync of the barrier word");  // before NCCL reads it
  cuda_require(cudaEventCreateWithFlags(&s.compute_done, cudaEventDisableTiming), "cudaEventCreate");
}

int cuda_device_count(std::string* reason) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    if (reason) *reason = cudaGetErrorString(err);
    return 0;
  }
  if (n == 0 && reason) *reason = "the CUDA runtime reports 0 devices";
  return n;
}

bool nccl_shares_gpus() {
  const char* v = std::getenv("LOOM_NCCL_SHARE_GPU");
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

std::unique_ptr<Communicator> nccl_world(Communicator& bootstrap, int device, const Options& options,
                                         Stream compute) {
  if (nccl_shares_gpus()) {  // before this process's first NCCL call, which reads them
    setenv("NCCL_HOSTID", concat("loom-rank-", bootstrap.rank()).c_str(), 0);
    setenv("NCCL_NET", "Socket", 0);  // not a network plugin an image ships (IB, EFA)
    setenv("NCCL_SOCKET_IFNAME", "=lo", 0);
    setenv("NCCL_IB_DISABLE", "1", 0);
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    setenv("NCCL_MNNVL_ENABLE", "0", 0);  // an NVLink fabric would join the "hosts" again
  }
  LOOM_REQUIRE(options.timeout_s > 0, "comm timeout_s = ", options.timeout_s,
               " is invalid: it must be > 0 seconds");
  std::string reason;
  const int n = cuda_device_count(&reason);
  LOOM_REQUIRE(n > 0, "nccl backend: no CUDA device: ", reason);
  LOOM_REQUIRE(device >= 0 && device < n, "nccl backend: CUDA device ", device,
               " does not exist: this process sees ", n, " device(s), 0..", n - 1);
  LOOM_REQUIRE(compute.handle == nullptr || compute.device == Device::cuda(device), "nccl backend: the compute ",
               "stream given is on ", device_name(compute.device), ", not on cuda:", device,
               " (this communicator's device)");
  return std::make_unique<NcclCommunicator>(bootstrap.split(0, bootstrap.rank(), "world"), device, options,
                                            static_cast<cudaStream_t>(compute.handle), "world");
}

}  // namespace loom::comm
