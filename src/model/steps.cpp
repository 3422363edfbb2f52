// The training attention step (steps.h) and the family table's lookup
// (family.h).
#include "core/error.h"
#include "kernels/ops.h"
#include "model/family.h"
#include "model/steps.h"

namespace loom::model {

void LocalAttention::forward(const AttentionArgs& a) { kernels::attention_forward(a.out, a.lse, a.q, a.k, a.v); }

void LocalAttention::backward(const AttentionArgs& a, const AttentionGrads& g) {
  kernels::attention_backward(g.dq, g.dk, g.dv, g.dout, a.q, a.k, a.v, a.out, a.lse);
}

const BlockFamily& block_family(Family f) {
  if (f == Family::gpt2) return gpt2_family();
  LOOM_CHECK(f == Family::llama, "unknown model family ", static_cast<int>(f));
  return llama_family();
}

}  // namespace loom::model
