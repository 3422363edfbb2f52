// Recompute policies (model/model.h): none, selective and full give bitwise
// the same losses and gradients (recomputation reruns the same kernels on the
// same inputs), keep fewer activation bytes in that order, and the model's
// activations pool holds exactly what Model::activation_bytes predicts.
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/compare.h"
#include "common/tensors.h"
#include "core/error.h"
#include "core/memory.h"
#include "kernels/ops.h"
#include "model/model.h"

namespace loom::model {
namespace {

using namespace loom::test;

constexpr int64_t kB = 2, kT = 16;

std::vector<int32_t> batch_tokens(int64_t vocab, int salt) {
  std::vector<int32_t> t(kB * kT);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int32_t>((i * 7919 + salt * 131 + 17) % vocab);
  return t;
}

// Two micro-batches accumulated (backward's += path), as the trainer runs them.
struct Pass {
  std::vector<float> losses;
  std::vector<float> grads;  // the whole flat gradient
};

Pass run(const std::string& preset, DType compute, Recompute recompute) {
  const ModelConfig cfg = model_preset(preset);
  Pools pools;
  Model m(cfg, kB, kT, pools, {.compute = compute, .recompute = recompute});
  m.init_params(11);
  m.zero_grads();
  Pass r;
  for (int mb = 0; mb < 2; ++mb) {
    std::vector<int32_t> tokens = batch_tokens(cfg.vocab_size, mb), targets = batch_tokens(cfg.vocab_size, mb + 5);
    r.losses.push_back(m.forward(i32_view(tokens, {kB, kT}), i32_view(targets, {kB, kT})));
    m.backward(0.5f);
  }
  r.grads = to_floats(m.grads());
  return r;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void expect_policies_bitwise_equal(const std::string& preset, DType compute) {
  const Pass none = run(preset, compute, Recompute::none);
  for (Recompute r : {Recompute::selective, Recompute::full}) {
    const Pass p = run(preset, compute, r);
    EXPECT_TRUE(bitwise_equal(none.losses, p.losses)) << preset << " " << recompute_name(r);
    EXPECT_TRUE(bitwise_equal(none.grads, p.grads)) << preset << " " << recompute_name(r);
  }
}

TEST(Recompute, SelectiveAndFullGiveBitwiseTheSameLossesAndGradientsGpt2) {
  expect_policies_bitwise_equal("gpt2-tiny", DType::f32);
}

TEST(Recompute, SelectiveAndFullGiveBitwiseTheSameLossesAndGradientsLlama) {
  expect_policies_bitwise_equal("llama-tiny", DType::f32);
}

TEST(Recompute, SelectiveAndFullGiveBitwiseTheSameLossesAndGradientsUnderBf16) {
  if (!kernels::bf16_matmul_unsupported_reason().empty()) GTEST_SKIP() << "this CPU has no bf16 GEMM";
  expect_policies_bitwise_equal("gpt2-tiny", DType::bf16);
  expect_policies_bitwise_equal("llama-tiny", DType::bf16);
}

TEST(Recompute, ActivationsPoolHoldsExactlyTheLayoutBytes) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full}) {
      const ModelConfig cfg = model_preset(preset);
      Pools pools;
      Model m(cfg, kB, kT, pools, {.recompute = r});
      EXPECT_EQ(pools.report()[MemTag::activations].current,
                static_cast<size_t>(Model::activation_bytes(cfg, kB, kT, {.recompute = r})))
          << preset << " " << recompute_name(r);
    }
  }
}

// Per block and token, GPT-2 keeps norm1, q, k, v, att, res1, norm2 (7 C)
// and fc, act (2 F) without recompute; selective keeps q, k, v, res1, fc
// (4 C + F) and full none of them: the drops must be at least what those
// counts predict, less the one set of buffers all blocks share.
TEST(Recompute, SelectiveAndFullKeepFewerActivationBytesAtGpt2Scale) {
  const ModelConfig cfg = model_preset("gpt2-124m");
  const int64_t B = 4, T = 128, C = cfg.n_embd, L = cfg.n_layer, N = B * T;
  const int64_t none = Model::activation_bytes(cfg, B, T, {.recompute = Recompute::none});
  const int64_t sel = Model::activation_bytes(cfg, B, T, {.recompute = Recompute::selective});
  const int64_t full = Model::activation_bytes(cfg, B, T, {.recompute = Recompute::full});
  // Dropped per block under selective: norm1, att, norm2 (3 C) and the GELU
  // output (F = 4 C), plus norm statistics and lse, shared once instead of L times.
  const int64_t dropped = N * (3 * C + cfg.d_ff) * 4;
  EXPECT_GE(none - sel, (L - 1) * dropped);
  // full also drops q, k, v, res1, fc (4 C + F) per block but the shared set.
  EXPECT_GE(sel - full, (L - 1) * N * (4 * C + cfg.d_ff) * 4);
  EXPECT_GT(full, 0);
}

TEST(Recompute, UnknownPolicyNameIsAClearError) {
  expect_error([] { recompute_from_name("some"); }, {"recompute policy 'some'", "none, selective, full"});
  EXPECT_EQ(recompute_from_name("full"), Recompute::full);
}

}  // namespace
}  // namespace loom::model
