#include "train/optimizer.h"

#include "kernels/ops.h"

namespace loom::train {

AdamW::AdamW(const model::Model& model, Pools& pools, const AdamWOptions& options)
    : opt_(options),
      m_(pools[MemTag::optimizer].zeros(DType::f32, {model.num_params()})),
      v_(pools[MemTag::optimizer].zeros(DType::f32, {model.num_params()})) {}

void AdamW::step(model::Model& model, double lr, float grad_scale) {
  ++step_;
  // Under bf16 compute AdamW updates the f32 master and writes its bf16
  // rounding into the compute weights (param_copy).
  const Tensor master = model.master_params(), grads = model.grads();
  const Tensor copy = model.compute_dtype() == DType::f32 ? Tensor() : model.params();
  for (const model::ParamSpec& spec : model.param_specs()) {
    kernels::AdamWConfig cfg;
    cfg.lr = static_cast<float>(lr);
    cfg.beta1 = static_cast<float>(opt_.beta1);
    cfg.beta2 = static_cast<float>(opt_.beta2);
    cfg.eps = static_cast<float>(opt_.eps);
    cfg.weight_decay = spec.shape.ndim() >= 2 ? static_cast<float>(opt_.weight_decay) : 0.f;
    cfg.step = step_;
    cfg.grad_scale = grad_scale;
    const int64_t n = spec.numel();
    kernels::adamw_step(master.slice(0, spec.offset, n), m_.slice(0, spec.offset, n), v_.slice(0, spec.offset, n),
                        grads.slice(0, spec.offset, n), copy.defined() ? copy.slice(0, spec.offset, n) : Tensor(),
                        cfg);
  }
}

}  // namespace loom::train
