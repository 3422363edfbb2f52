#include "model/units.h"

#include <exception>

#include "core/error.h"

namespace loom::model {

BoundUnit::BoundUnit(const UnitSource& src, Pass pass, Need need, int unit, int tied, int experts)
    : src_(src),
      unit_(unit),
      tied_(tied),
      experts_(experts),
      params_(need != Need::grads),
      grads_(need != Need::params),
      exceptions_(std::uncaught_exceptions()) {
  const std::vector<Unit>& units = *src_.units;
  if (params_ && src_.storage.params && src_.hooks) {
    src_.hooks->params_needed(unit);
    if (tied >= 0) src_.hooks->params_needed(tied);
    if (experts >= 0) src_.hooks->params_needed(experts);
  }
  if (params_ && !src_.storage.params) {
    src_.param_views->bind(lent_params(unit, pass), units[unit].begin);
    if (tied >= 0) src_.param_views->bind_also(lent_params(tied, pass), units[tied].begin);
    if (experts >= 0) src_.param_views->bind_also(lent_params(experts, pass), units[experts].begin);
  }
  if (grads_ && !src_.storage.grads) {
    src_.grad_views->bind(lent_grads(unit), units[unit].begin);
    if (tied >= 0) src_.grad_views->bind_also(lent_grads(tied), units[tied].begin);
    if (experts >= 0) src_.grad_views->bind_also(lent_grads(experts), units[experts].begin);
  }
}

BoundUnit::~BoundUnit() {
  if (std::uncaught_exceptions() > exceptions_) return;
  if (params_ && !src_.storage.params) {
    src_.hooks->release_params(unit_);
    if (tied_ >= 0) src_.hooks->release_params(tied_);
    if (experts_ >= 0) src_.hooks->release_params(experts_);
  }
  if (grads_ && src_.hooks) {
    if (experts_ >= 0) src_.hooks->grads_ready(experts_);
    src_.hooks->grads_ready(unit_);
  }
}

Tensor BoundUnit::lent_params(int unit, Pass pass) const {
  LOOM_REQUIRE(src_.hooks != nullptr, "Model: built without its parameters, and no hooks are set to provide them");
  const Unit& u = (*src_.units)[unit];
  Tensor t = src_.hooks->acquire_params(unit, pass);
  LOOM_CHECK(t.dtype() == src_.compute && t.numel() == u.numel() && t.is_contiguous(), "hooks gave unit ", unit,
             " parameters ", t.str(), ", expected ", u.numel(), " contiguous ", dtype_name(src_.compute));
  return t;
}

Tensor BoundUnit::lent_grads(int unit) const {
  LOOM_REQUIRE(src_.hooks != nullptr, "Model: built without its gradients, and no hooks are set to provide them");
  const Unit& u = (*src_.units)[unit];
  Tensor t = src_.hooks->acquire_grads(unit);
  LOOM_CHECK(t.dtype() == DType::f32 && t.numel() == u.numel() && t.is_contiguous(), "hooks gave unit ", unit,
             " gradients ", t.str(), ", expected ", u.numel(), " contiguous f32");
  return t;
}

}  // namespace loom::model
