// Internal to model/: a unit's weights and gradients bound for one use
// (model.h Units, Storage, StepHooks). A model that owns its buffers binds
// nothing: its views cover them whole. One without its own parameters
// (ZeRO-3) or gradients (ZeRO-2) gets each unit's buffer from the hooks for
// the scope of its use and gives it back at the end, in the order
// DataParallel's prefetch and bucket reduction are built on:
//
//   forward    acquire params (unit[, tied])  ...  release (unit[, tied])
//   backward   acquire params (unit[, tied]), acquire grads (unit[, tied])
//              ...  release (unit[, tied]), grads_ready(unit)
//
// (the embeddings' backward binds only gradients; a tied head reads unit 0
// beside its own).
#pragma once

#include <vector>

#include "core/tensor.h"
#include "model/blocks.h"
#include "model/model.h"

namespace loom::model {

// Where a model's units live.
struct UnitSource {
  const std::vector<Unit>* units = nullptr;
  Storage storage;
  StepHooks* hooks = nullptr;
  DType compute = DType::f32;
  ParamViews* param_views = nullptr;  // bound to the lent parameters
  ParamViews* grad_views = nullptr;   // bound to the lent gradients
};

enum class Need : uint8_t { params, grads, both };

class BoundUnit {
 public:
  // Binds `unit` (and `tied`, unit 0, unless -1; and `experts`, the unit of
  // unit's MoE experts, unless -1) for `pass`: what `need` asks for,
  // parameters before gradients, unit before experts.
  BoundUnit(const UnitSource& src, Pass pass, Need need, int unit, int tied = -1, int experts = -1);
  // Releases lent parameters, then (when it bound gradients) says the
  // experts' and then the unit's gradients are ready — unless an exception
  // is unwinding, which leaves both as they were when it was thrown.
  ~BoundUnit();
  BoundUnit(const BoundUnit&) = delete;
  BoundUnit& operator=(const BoundUnit&) = delete;

 private:
  Tensor lent_params(int unit, Pass pass) const;
  Tensor lent_grads(int unit) const;

  UnitSource src_;
  int unit_, tied_, experts_;
  bool params_, grads_;
  int exceptions_;
};

}  // namespace loom::model
