#include "train/optimizer.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/ops.h"

namespace loom::train {

AdamW::AdamW(parallel::DataParallel& dp, const AdamWOptions& options)
    : dp_(dp), options_(options), state_pool_(&dp.state_pools()[MemTag::optimizer]) {
  if (!options.keeps_state) return;
  LOOM_CHECK(dp.options().optimizer_state_floats >= 2, "DataParallel counted ", dp.options().optimizer_state_floats,
             " optimizer floats per parameter; AdamW keeps 2");
  if (dp.state_on_disk()) return;  // the moments are the offload file's arrays 0 and 1 (zero until written)
  for (int g = 0; g < dp.num_groups(); ++g) {
    const int64_t S = dp.group(g).shard_numel;
    m_.push_back(state_pool_->zeros(DType::f32, {S}));
    v_.push_back(state_pool_->zeros(DType::f32, {S}));
  }
}

namespace {

// param = master rounded to param's dtype; where the master weights are on
// the host and param on a device (offload_optimizer beside a GPU's model),
// rounded on the host into `staging` and copied over (synchronously, so the
// next piece may reuse it). staging grows from `host` to the largest piece
// and is kept: `host` pins (memory.h), which is too slow to do per piece.
void write_param(Tensor param, const Tensor& master, Pool& host, Storage& staging) {
  if (param.device() == master.device()) return kernels::cast(param, master);
  const size_t bytes = static_cast<size_t>(param.numel()) * dtype_size(param.dtype());
  if (staging.bytes() < bytes) {
    staging = Storage();  // the old one back first
    staging = host.allocate(bytes);
  }
  const Tensor staged(staging.data(), param.dtype(), param.shape());
  kernels::cast(staged, master);
  copy_tensor(param, staged);
}

// AdamW on piece u: the moments, the gradient and the master weights in one
// place; the weights the model reads, if apart, written as write_param does.
void adamw_piece(const parallel::UpdatePiece& u, Tensor m, Tensor v, const kernels::AdamWConfig& cfg, Pool& host,
                 Storage& staging) {
  if (!u.param.defined() || u.param.device() == u.master.device())
    return kernels::adamw_step(u.master, m, v, u.grad, u.param, cfg);
  kernels::adamw_step(u.master, m, v, u.grad, Tensor(), cfg);
  write_param(u.param, u.master, host, staging);
}

// The deltas' elements inside piece p, added to its master weights and
// rounded into its compute weights; `pool` (where the master weights live)
// stages them onto a device, or the rounded weights off the host.
void apply_deltas(const parallel::ParamPiece& p, const parallel::UpdatePiece& u, std::span<const ParamDelta> deltas,
                  Pool& pool, Storage& staging) {
  for (const ParamDelta& d : deltas) {
    const int64_t end = d.offset + static_cast<int64_t>(d.values.size());
    const int64_t lo = std::max(p.offset, d.offset), hi = std::min(p.offset + p.count, end);
    if (lo >= hi) continue;
    Tensor values(const_cast<float*>(d.values.data()) + (lo - d.offset), DType::f32, {hi - lo});
    OwnedTensor staged;
    if (u.master.device() != values.device()) {
      staged = pool.empty(DType::f32, {hi - lo});
      copy_tensor(staged, values);
      values = staged;
    }
    const Tensor master = u.master.slice(0, lo - p.offset, hi - lo);
    kernels::add(master, master, values);
    if (u.param.defined()) write_param(u.param.slice(0, lo - p.offset, hi - lo), master, pool, staging);
  }
}

}  // namespace

void AdamW::step(double lr, float grad_scale, std::span<const ParamDelta> deltas) {
  LOOM_CHECK(options_.keeps_state, "AdamW::step of an optimizer whose state is kept elsewhere");
  ++steps_;
  kernels::AdamWConfig cfg;
  cfg.lr = static_cast<float>(lr);
  cfg.beta1 = static_cast<float>(options_.beta1);
  cfg.beta2 = static_cast<float>(options_.beta2);
  cfg.eps = static_cast<float>(options_.eps);
  cfg.step = steps_;
  cfg.grad_scale = grad_scale;
  dp_.update_begin();
  if (dp_.state_on_disk()) {  // the same kernel on each extent, its moments and master read from disk
    dp_.stream_update([&](int, const parallel::ParamPiece& p, const parallel::UpdatePiece& u,
                          std::span<const Tensor> state) {
      cfg.weight_decay = p.decay ? static_cast<float>(options_.weight_decay) : 0.f;
      adamw_piece(u, state[0], state[1], cfg, *state_pool_, staging_);
      if (!deltas.empty()) apply_deltas(p, u, deltas, *state_pool_, staging_);
    });
    return dp_.update_finish();
  }
  for (int g = 0; g < dp_.num_groups(); ++g) {
    const Tensor m = m_[static_cast<size_t>(g)], v = v_[static_cast<size_t>(g)];
    for (const parallel::ParamPiece& p : dp_.group(g).pieces) {
      const parallel::UpdatePiece u = dp_.update_piece(g, p);
      cfg.weight_decay = p.decay ? static_cast<float>(options_.weight_decay) : 0.f;
      adamw_piece(u, m.slice(0, p.shard_offset, p.count), v.slice(0, p.shard_offset, p.count), cfg, *state_pool_,
                  staging_);
      if (!deltas.empty()) apply_deltas(p, u, deltas, *state_pool_, staging_);
    }
  }
  dp_.update_finish();
}

void AdamW::read_moments(int g, Tensor m, Tensor v) const {
  if (dp_.state_on_disk()) {
    dp_.read_optimizer_state(g, 0, m);
    dp_.read_optimizer_state(g, 1, v);
    return;
  }
  copy_tensor(m, this->m(g).reshape(m.shape()));
  copy_tensor(v, this->v(g).reshape(v.shape()));
}

Tensor AdamW::m(int g) const {
  LOOM_CHECK(!dp_.state_on_disk(), "AdamW::m: the moments are on disk (read_moments)");
  LOOM_CHECK(g >= 0 && g < static_cast<int>(m_.size()), "AdamW::m: group ", g);
  return m_[static_cast<size_t>(g)];
}

Tensor AdamW::v(int g) const {
  LOOM_CHECK(!dp_.state_on_disk(), "AdamW::v: the moments are on disk (read_moments)");
  LOOM_CHECK(g >= 0 && g < static_cast<int>(v_.size()), "AdamW::v: group ", g);
  return v_[static_cast<size_t>(g)];
}

Tensor AdamW::m() const {
  dp_.shard_numel();  // one group, or a loom::Error saying there are several
  return m(0);
}

Tensor AdamW::v() const {
  dp_.shard_numel();
  return v(0);
}

void AdamW::load_moments(int g, const Tensor& m, const Tensor& v) {
  if (!options_.keeps_state) return;  // the servers load theirs
  const int64_t S = dp_.group(g).shard_numel;
  for (const Tensor* t : {&m, &v})
    LOOM_CHECK(t->dtype() == DType::f32 && t->numel() == S, "AdamW::load_moments: group ", g, " ", t->str());
  if (dp_.state_on_disk()) {
    dp_.write_optimizer_state(g, 0, m);
    dp_.write_optimizer_state(g, 1, v);
    return;
  }
  // A checkpoint's host tensors into the moments wherever they live.
  copy_tensor(m_[static_cast<size_t>(g)], m.reshape({S}));
  copy_tensor(v_[static_cast<size_t>(g)], v.reshape({S}));
}

void AdamW::load_state(const Tensor& m, const Tensor& v, int64_t steps_taken) {
  dp_.shard_numel();  // one group, or a loom::Error saying there are several
  load_moments(0, m, v);
  steps_ = steps_taken;
}

}  // namespace loom::train
