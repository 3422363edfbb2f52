// GPT-2 and Llama forward/backward against a float64 PyTorch model written
// independently in tests/ref/ref_model.py: logits, loss and the gradient of
// every parameter from the same weights (loaded through io::SafetensorsFile),
// and the losses of 5 AdamW steps (kernels::adamw_step vs torch.optim.AdamW).
//
// Tolerances (|a - e| <= atol + rtol |e|), f32 vs float64; observed worst
// cases in brackets (2-layer models, C 32, B 2, T 8):
// - loss: rtol 1e-4 (DESIGN.md §6: model fp32 vs PyTorch) [1.1e-7].
// - logits: rtol 1e-4, atol 1e-5 for logits near 0 [|a - e| / (|e| + 1e-6) 3.3e-4,
//   on logits ~1e-3].
// - gradients: rtol 1e-4, atol 1e-5 * max |e| of that tensor: an element of a
//   gradient is a sum of many terms of both signs, so its f32 error scales
//   with the tensor's magnitude, not with the (possibly ~0) element itself
//   [max |a - e| / max |e| 7.2e-7; relative error 2.3e-4 on elements above
//   1e-3 max |e|].
// - AdamW losses over 5 steps: rtol 1e-4 [1.5e-7].
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/compare.h"
#include "common/ref.h"
#include "common/ref_model_config.h"
#include "common/tensors.h"
#include "core/memory.h"
#include "io/safetensors.h"
#include "kernels/ops.h"
#include "model/model.h"

namespace loom::model {
namespace {

using namespace loom::test;

struct Case {
  explicit Case(const std::string& family)
      : rc("model_" + family + ".ref"),
        cfg(model_config_of(rc)),
        model(cfg, rc["tokens"].shape[0], rc["tokens"].shape[1], pools) {
    model.load_params(io::SafetensorsFile::open(std::string(LOOM_REF_DIR) + "/model_" + family + ".safetensors"));
  }
  Tensor tokens() { return rc["tokens"].view(); }
  Tensor targets() { return rc["targets"].view(); }

  RefCase rc;
  ModelConfig cfg;
  Pools pools;
  Model model;
};

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

void expect_matches_torch(const std::string& family) {
  Case c(family);
  c.model.zero_grads();
  const float loss = c.model.forward(c.tokens(), c.targets());
  EXPECT_NEAR(loss, c.rc["loss"].scalar(), 1e-4 * std::fabs(c.rc["loss"].scalar()));
  EXPECT_ALL_CLOSE(to_floats(c.model.logits()), c.rc["logits"].floats(), 1e-4, 1e-5);
  c.model.backward();
  for (const ParamSpec& s : c.model.param_specs()) {
    const std::vector<float> expected = c.rc["grad." + s.name].floats();
    EXPECT_TRUE(all_close(to_floats(c.model.grad(s.name)), expected, 1e-4, 1e-5 * max_abs(expected))) << s.name;
  }
}

TEST(Gpt2, LogitsLossAndEveryGradientMatchTorch) { expect_matches_torch("gpt2"); }
TEST(Llama, LogitsLossAndEveryGradientMatchTorch) { expect_matches_torch("llama"); }

// Backward adds into the gradients: two backward passes give twice one.
TEST(Gpt2, BackwardAccumulatesIntoGradients) {
  Case c("gpt2");
  c.model.zero_grads();
  c.model.forward(c.tokens(), c.targets());
  c.model.backward();
  const std::vector<float> once = to_floats(c.model.grads());
  c.model.forward(c.tokens(), c.targets());
  c.model.backward(0.5f);  // dloss scales the added gradient
  std::vector<float> expected = once;
  for (float& x : expected) x *= 1.5f;
  EXPECT_ALL_CLOSE(to_floats(c.model.grads()), expected, 1e-6, 1e-9);
}

// A forward given the backward's dloss (the trainer's: loss and gradient in
// one pass over the logits) returns the same loss and leaves the same
// gradients, bit for bit, as forward then backward(dloss). A backward with
// another dloss is refused and loses nothing: the right one still runs.
void expect_forward_with_dloss_is_forward_then_backward(const std::string& family) {
  Case c(family);
  c.model.zero_grads();
  const float loss = c.model.forward(c.tokens(), c.targets());
  c.model.backward(0.375f);
  const std::vector<float> grads = to_floats(c.model.grads());
  c.model.zero_grads();
  EXPECT_EQ(c.model.forward(c.tokens(), c.targets(), 0, 0.375f), loss);
  expect_error([&] { c.model.backward(0.5f); }, {"dloss 0.5 differs from the 0.375 its forward was given"});
  c.model.backward(0.375f);
  EXPECT_EQ(to_floats(c.model.grads()), grads);
}

// A forward that throws (a token out of the vocabulary) leaves nothing for
// backward to finish: not its own half-done pass, nor the forward before it,
// whose logits already hold the loss's gradient.
TEST(Gpt2, BackwardAfterAFailedForwardIsRefused) {
  Case c("gpt2");
  c.model.zero_grads();
  c.model.forward(c.tokens(), c.targets(), 0, 1.f);
  std::vector<int32_t> bad(static_cast<size_t>(c.tokens().numel()), 0);
  bad[1] = static_cast<int32_t>(c.cfg.vocab_size);
  const Tensor bad_tokens(bad.data(), DType::i32, c.tokens().shape());
  EXPECT_ANY_THROW(c.model.forward(bad_tokens, c.targets(), 0, 1.f));
  expect_error([&] { c.model.backward(1.f); }, {"Model::backward", "did not finish"});
}

TEST(Gpt2, ForwardGivenDlossIsForwardThenBackward) { expect_forward_with_dloss_is_forward_then_backward("gpt2"); }
TEST(Llama, ForwardGivenDlossIsForwardThenBackward) { expect_forward_with_dloss_is_forward_then_backward("llama"); }

// Logits-only forward (no targets) gives the same logits and returns 0.
TEST(Llama, ForwardWithoutTargetsGivesLogitsOnly) {
  Case c("llama");
  EXPECT_EQ(c.model.forward(c.tokens()), 0.f);
  EXPECT_ALL_CLOSE(to_floats(c.model.logits()), c.rc["logits"].floats(), 1e-4, 1e-5);
}

void expect_adamw_losses_match_torch(const std::string& family) {
  Case c(family);
  EXPECT_ALL_CLOSE(adamw_losses(c.model, c.pools, c.rc, c.tokens(), c.targets()), c.rc["adamw_losses"].floats(), 1e-4,
                   0.0);
}

TEST(Gpt2, FiveAdamWStepsMatchTorchLosses) { expect_adamw_losses_match_torch("gpt2"); }
TEST(Llama, FiveAdamWStepsMatchTorchLosses) { expect_adamw_losses_match_torch("llama"); }

TEST(Gpt2, LoadingHuggingFaceConv1DLayoutTransposesToLoomLayout) {
  Case c("gpt2");
  Pools pools;
  Model hf(c.cfg, 1, 4, pools);
  hf.load_params(io::SafetensorsFile::open(std::string(LOOM_REF_DIR) + "/model_gpt2_hf.safetensors"),
                 ParamLayout::hf);
  EXPECT_EQ(to_floats(hf.params()), to_floats(c.model.params()));
}

TEST(Model, LoadRejectsAMissingTensorOrWrongShape) {
  Pools pools;
  RefCase rc("model_gpt2.ref");
  ModelConfig cfg = model_config_of(rc);
  cfg.d_ff = 64;  // the file has 128
  Model m(cfg, 1, 4, pools);
  const io::SafetensorsFile f = io::SafetensorsFile::open(std::string(LOOM_REF_DIR) + "/model_gpt2.safetensors");
  expect_error([&] { m.load_params(f); }, {"model_gpt2.safetensors", "h.0.mlp.c_fc.weight", "(128, 32)", "(64, 32)"});
  ModelConfig untied = model_config_of(rc);
  untied.tie_embeddings = false;
  Model u(untied, 1, 4, pools);
  expect_error([&] { u.load_params(f); }, {"'lm_head.weight' is missing"});
}

}  // namespace
}  // namespace loom::model
