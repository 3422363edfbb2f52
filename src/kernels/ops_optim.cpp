// AdamW and the reductions of the optimizer step (ops.h): operand checks,
// then the backend's op.
#include <string>

#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace loom::kernels {
namespace {

void adamw_validate(const Tensor& param, const Tensor& m, const Tensor& v, const Tensor& grad,
                    const Tensor& param_copy, const AdamWConfig& cfg) {
  constexpr const char* op = "adamw_step";
  require_contiguous(op, {{"param", param}, {"m", m}, {"v", v}, {"grad", grad}});
  require_dtype(op, {"param", param}, DType::f32);
  require_dtype(op, {"m", m}, DType::f32);
  require_dtype(op, {"v", v}, DType::f32);
  require_float(op, {"grad", grad});
  require_same_shape(op, {"m", m}, {"param", param});
  require_same_shape(op, {"v", v}, {"param", param});
  require_same_shape(op, {"grad", grad}, {"param", param});
  if (param_copy.defined()) {
    require_contiguous(op, {{"param_copy", param_copy}});
    require_float(op, {"param_copy", param_copy});
    require_same_shape(op, {"param_copy", param_copy}, {"param", param});
  }
  LOOM_REQUIRE(cfg.step >= 1, op, ": step must be >= 1 (1-based, after incrementing), got ", cfg.step);
  LOOM_REQUIRE(cfg.beta1 >= 0.f && cfg.beta1 < 1.f && cfg.beta2 >= 0.f && cfg.beta2 < 1.f, op,
               ": betas must lie in [0, 1), got beta1=", cfg.beta1, " beta2=", cfg.beta2);
  LOOM_REQUIRE(cfg.eps > 0.f, op, ": eps must be > 0, got ", cfg.eps);
}

// A tensor read whole: defined, contiguous, float.
void check_float_tensor(const char* op, Operand t) {
  require_contiguous(op, {t});
  require_float(op, t);
}

}  // namespace

void adamw_step(Tensor param, Tensor m, Tensor v, const Tensor& grad, Tensor param_copy, const AdamWConfig& cfg) {
  adamw_validate(param, m, v, grad, param_copy, cfg);
  backend_of("adamw_step", {{"param", param}, {"m", m}, {"v", v}, {"grad", grad}, {"param_copy", param_copy}})
      .adamw_step(param, m, v, grad, param_copy, cfg);
}

double sum_squares(const Tensor& t) {
  check_float_tensor("sum_squares", {"t", t});
  return backend_of("sum_squares", {{"t", t}}).sum_squares(t);
}

void sum_squares_blocks(std::span<double> sums, std::span<const Tensor> tensors, int64_t block) {
  constexpr const char* op = "sum_squares_blocks";
  LOOM_REQUIRE(block >= 1, op, ": block = ", block, " is invalid: allowed values are >= 1");
  int64_t blocks = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    check_float_tensor(op, {concat("tensors[", i, "]").c_str(), tensors[i]});
    const int64_t n = tensors[i].numel();
    blocks += n / block + (n % block != 0);  // not n + block - 1: block may be as large as int64 allows
  }
  LOOM_REQUIRE(static_cast<int64_t>(sums.size()) == blocks, op, ": sums has ", sums.size(), " elements but the ",
               tensors.size(), " tensors make ", blocks, " blocks of ", block);
  if (blocks == 0) return;
  backend_of(op, "tensors", tensors).sum_squares_blocks(sums, tensors, block);
}

// Every tensor checked first, so a bad one is reported before any work;
// nothing to sum is 0 on any backend.
double global_norm(std::span<const Tensor> tensors) {
  constexpr const char* op = "global_norm";
  for (size_t i = 0; i < tensors.size(); ++i)
    check_float_tensor(op, {concat("tensors[", i, "]").c_str(), tensors[i]});
  if (tensors.empty()) return 0.0;
  return backend_of(op, "tensors", tensors).global_norm(tensors);
}

bool all_finite(const Tensor& t) {
  check_float_tensor("all_finite", {"t", t});
  return backend_of("all_finite", {{"t", t}}).all_finite(t);
}

void scale(Tensor t, float s) {
  check_float_tensor("scale", {"t", t});
  backend_of("scale", {{"t", t}}).scale(t, s);
}

}  // namespace loom::kernels
