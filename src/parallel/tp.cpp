#include "parallel/tp.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <utility>

#include "comm/host_values.h"
#include "core/error.h"
#include "core/memory.h"
#include "kernels/ops.h"

namespace loom::parallel {
namespace {

Tensor flat(const Tensor& t) { return t.reshape({t.numel()}); }

// Adds the seconds a scope takes to a counter.
class Timed {
 public:
  explicit Timed(double& total) : total_(total), start_(std::chrono::steady_clock::now()) {}
  ~Timed() { total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

 private:
  double& total_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

TensorParallel::TensorParallel(comm::Communicator& tp, bool sequence_parallel)
    : tp_(tp), sequence_parallel_(sequence_parallel) {}

// A started collective: its Work, what completes it after the wait (the
// f16 path's cast back) and the flag of the buffer it holds (f16: wide_),
// released when the wait ends, even by an error. Time in wait() counts as
// exposed.
class TensorParallel::Pending final : public model::TpPending {
 public:
  Pending(TensorParallel& owner, comm::WorkPtr work, std::function<void()> finish = {}, bool* busy = nullptr)
      : owner_(owner), work_(std::move(work)), finish_(std::move(finish)), busy_(busy) {}
  // Every caller waits; an unwaited one is waited for here. A destructor
  // cannot throw: while another error unwinds the stack this one is dropped
  // (that one is reported), otherwise it is printed and the process aborts
  // (as the communicator's watchdog does) rather than be lost.
  ~Pending() override {
    if (done_) return;
    try {
      wait();
    } catch (const std::exception& e) {
      if (std::uncaught_exceptions() > 0) return;
      std::fprintf(stderr, "loom: a tensor-parallel collective failed and was never waited for: %s\n", e.what());
      std::abort();
    }
  }
  void wait() override {
    if (done_) return;
    done_ = true;
    struct Release {
      bool* flag;
      ~Release() {
        if (flag != nullptr) *flag = false;
      }
    } release{busy_};
    Timed timed(owner_.seconds_);
    work_->wait();
    if (finish_) finish_();
  }

 private:
  TensorParallel& owner_;
  comm::WorkPtr work_;
  std::function<void()> finish_;
  bool* busy_;
  bool done_ = false;
};

void TensorParallel::reduce(Tensor out, Tensor partial) { start_reduce(out, partial)->wait(); }

// Without SP an all-reduce in place, with SP a reduce-scatter into the rank's
// rows. The communicator has no f16: sums of f16 partials go through f32 (a
// rounding only at the end, like the bf16 sums the communicator does).
std::unique_ptr<model::TpPending> TensorParallel::start_reduce(Tensor out, Tensor partial) {
  Timed timed(seconds_);
  const bool scatter = sequence_parallel_ && tp_.size() > 1;
  LOOM_CHECK(scatter ? out.numel() * tp_.size() == partial.numel() : out.data() == partial.data(),
             "TensorParallel::reduce: out ", out.str(), " partial ", partial.str(),
             scatter ? " (SP: out holds 1/tp of the rows)" : " (without SP: in place)");
  if (partial.dtype() != DType::f16) {
    return std::make_unique<Pending>(*this, scatter ? tp_.reduce_scatter(flat(out), flat(partial), comm::ReduceOp::sum)
                                                    : tp_.all_reduce(flat(partial), comm::ReduceOp::sum));
  }
  // wide_ holds this sum until its wait(): one f16 sum in flight at a time.
  LOOM_CHECK(!wide_busy_, "TensorParallel: an f16 reduce started while another is in flight");
  const int64_t n = partial.numel(), mine = out.numel();
  wide_.resize(static_cast<size_t>(n + mine));
  const Tensor sum(wide_.data(), DType::f32, {n}), piece(wide_.data() + n, DType::f32, {mine});
  kernels::cast(sum, flat(partial));
  comm::WorkPtr work = scatter ? tp_.reduce_scatter(piece, sum, comm::ReduceOp::sum)
                               : tp_.all_reduce(sum, comm::ReduceOp::sum);
  wide_busy_ = true;
  if (!scatter) return std::make_unique<Pending>(*this, work, [partial, sum] { kernels::cast(flat(partial), sum); }, &wide_busy_);
  return std::make_unique<Pending>(*this, work, [out, piece] { kernels::cast(flat(out), piece); }, &wide_busy_);
}

void TensorParallel::gather(Tensor full, const Tensor& shard) { start_gather(full, shard)->wait(); }

std::unique_ptr<model::TpPending> TensorParallel::start_gather(Tensor full, const Tensor& shard) {
  Timed timed(seconds_);
  LOOM_CHECK(shard.numel() * tp_.size() == full.numel(), "gather: full ", full.str(), " shard ", shard.str());
  // A gather only moves bytes: f16 travels as the same-sized bf16.
  return std::make_unique<Pending>(*this,
                                   tp_.all_gather(flat(comm::copy_view(full)), flat(comm::copy_view(shard))));
}

void TensorParallel::all_reduce_sum(Tensor t) {
  Timed timed(seconds_);
  tp_.all_reduce(flat(t), comm::ReduceOp::sum)->wait();
}

// One all-gather of every rank's (lse, target logit) pairs, then each rank
// combines them in rank order (kernels::cross_entropy_shard_combine), so
// every rank gets the same bits.
void TensorParallel::combine_cross_entropy(Tensor lse, Tensor target_logit) {
  Timed timed(seconds_);
  const int64_t N = lse.numel();
  const int P = tp_.size();
  LOOM_CHECK(lse.dtype() == DType::f32 && target_logit.dtype() == DType::f32 && target_logit.numel() == N,
             "combine_cross_entropy: ", lse.str(), " ", target_logit.str());
  stats_.resize(static_cast<size_t>(2 * N * (P + 1)));
  float* mine = stats_.data() + 2 * N * P;  // this rank's pair, packed
  const Tensor my_lse(mine, DType::f32, {N}), my_target(mine + N, DType::f32, {N});
  copy_tensor(my_lse, flat(lse));  // from the device too: the pairs are exchanged and combined on the host
  copy_tensor(my_target, flat(target_logit));
  comm::all_gather_host(tp_, Tensor(stats_.data(), DType::f32, {2 * N * P}), Tensor(mine, DType::f32, {2 * N}));
  const Tensor all(stats_.data(), DType::f32, {P, 2, N});
  if (lse.device().is_cpu()) return kernels::cross_entropy_shard_combine(flat(lse), flat(target_logit), all);
  kernels::cross_entropy_shard_combine(my_lse, my_target, all);  // N values: combined here, copied back
  copy_tensor(flat(lse), my_lse);
  copy_tensor(flat(target_logit), my_target);
}

}  // namespace loom::parallel
