// The seams of a block (model/family.h, model/steps.h; DESIGN.md §8 "one
// block, three attentions"): a family's block calls the attention step and
// the MLP step its caller hands it, with the caller's positions, so a new
// attention (ring, paged) or MLP (experts) plugs in without touching the
// blocks. Each test runs one layer of gpt2-tiny and llama-tiny (GQA) on
// weights from the sharding-invariant init.
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "common/compare.h"
#include "common/tensors.h"
#include "kernels/ops.h"
#include "model/family.h"
#include "model/params.h"
#include "model/steps.h"

namespace loom::model {
namespace {

using namespace loom::test;

constexpr int64_t kB = 2, kT = 8;

// One layer of a tiny model with its weights, gradients, activations and
// scratch in host buffers.
struct Layer {
  explicit Layer(const char* preset) : cfg(model_preset(preset)), specs(param_specs(cfg)) {
    const int64_t C = cfg.n_embd, NH = cfg.n_head, NKV = cfg.n_kv_head, HS = cfg.head_size(), F = cfg.d_ff;
    const int64_t P = param_count(specs);
    params = f32({P}), grads = f32({P});
    init_params(params, specs, 5);
    w = ParamViews(specs, params).layer(cfg, 0);
    g = ParamViews(specs, grads).layer(cfg, 0);
    d = Dims{kB, kT, C, NH, NKV, HS, F, cfg.norm_eps, cfg.rope_theta};
    const bool gpt2 = cfg.family == Family::gpt2;
    a.norm1 = f32({kB, kT, C}), a.rstd1 = f32({kB * kT}), a.mean1 = gpt2 ? f32({kB * kT}) : Tensor();
    a.q = f32({kB, kT, NH, HS}), a.k = f32({kB, kT, NKV, HS}), a.v = f32({kB, kT, NKV, HS});
    a.att = f32({kB, kT, NH, HS}), a.lse = f32({kB, NH, kT});
    a.res1 = f32({kB, kT, C});
    a.norm2 = f32({kB, kT, C}), a.rstd2 = f32({kB * kT}), a.mean2 = gpt2 ? f32({kB * kT}) : Tensor();
    a.fc = f32({kB, kT, F}), a.act = f32({kB, kT, F}), a.up = gpt2 ? Tensor() : f32({kB, kT, F});
    s.dnorm = f32({kB, kT, C});
    s.dq = f32({kB, kT, NH, HS}), s.dk = f32({kB, kT, NKV, HS}), s.dv = f32({kB, kT, NKV, HS});
    s.dq_rot = f32({kB, kT, NH, HS}), s.dk_rot = f32({kB, kT, NKV, HS});
    s.datt = f32({kB, kT, NH, HS});
    s.dfc = f32({kB, kT, F}), s.dup = f32({kB, kT, F}), s.dact = f32({kB, kT, F});
    x = f32({kB, kT, C}), out = f32({kB, kT, C}), dres = f32({kB, kT, C});
    fill_random(x, 1), fill_random(dres, 2);
    pos = i32({kT});
    for (int32_t t = 0; t < kT; ++t) pos.data_as<int32_t>()[t] = t;
  }

  Tensor f32(Shape shape) {
    store.push_back(std::make_unique<float[]>(static_cast<size_t>(shape.numel())));
    return Tensor(store.back().get(), DType::f32, shape);
  }
  Tensor i32(Shape shape) {
    store.push_back(std::make_unique<float[]>(static_cast<size_t>(shape.numel())));
    return Tensor(store.back().get(), DType::i32, shape);
  }
  static void fill_random(const Tensor& t, uint32_t seed) {
    const Floats v = random_floats(static_cast<size_t>(t.numel()), seed);
    std::copy(v.begin(), v.end(), t.data_as<float>());
  }

  void forward(AttentionStep& attention, const MlpStep& mlp, int64_t layer = 0) {
    const BlockFamily& f = block_family(cfg.family);
    f.forward(out, x, w, a, {d, attention, mlp, pos, layer});
  }
  void backward(AttentionStep& attention, const MlpStep& mlp, int64_t layer = 0) {
    const BlockFamily& f = block_family(cfg.family);
    f.backward(dres, x, w, g, a, s, {d, attention, mlp, pos, layer});
  }
  const MlpStep& own_mlp() const { return block_family(cfg.family).mlp(); }

  ModelConfig cfg;
  std::vector<ParamSpec> specs;
  std::vector<std::unique_ptr<float[]>> store;
  Tensor params, grads, x, out, dres, pos;
  LayerWeights w, g;
  LayerActs a;
  Scratch s;
  Dims d{};
};

std::vector<float> floats(const Tensor& t) {
  const float* p = t.data_as<float>();
  return std::vector<float>(p, p + t.numel());
}

// Attention by its definition, one query at a time: softmax over the keys
// whose position is at most the query's (in the same sequence) of the
// scaled scores, times the values; GQA head h reads kv head h / (NH / NKV).
// Positions come from the call, per sequence when they are (B, T).
class NaiveAttention final : public AttentionStep {
 public:
  void forward(const AttentionArgs& a) override {
    const int64_t B = a.q.size(0), T = a.q.size(1), NH = a.q.size(2), HS = a.q.size(3), NKV = a.k.size(2);
    const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
    const float *q = a.q.data_as<float>(), *k = a.k.data_as<float>(), *v = a.v.data_as<float>();
    const int32_t* pos = a.pos.data_as<int32_t>();
    auto position = [&](int64_t b, int64_t t) { return pos[a.pos.ndim() == 2 ? b * T + t : t]; };
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < NH; ++h) {
          const int64_t kvh = h / (NH / NKV);
          const float* qi = q + ((b * T + t) * NH + h) * HS;
          std::vector<double> score(static_cast<size_t>(T), -std::numeric_limits<double>::infinity());
          double top = -std::numeric_limits<double>::infinity();
          for (int64_t j = 0; j < T; ++j) {
            if (position(b, j) > position(b, t)) continue;
            const float* kj = k + ((b * T + j) * NKV + kvh) * HS;
            double dot = 0;
            for (int64_t e = 0; e < HS; ++e) dot += static_cast<double>(qi[e]) * kj[e];
            score[static_cast<size_t>(j)] = dot * scale;
            top = std::max(top, dot * scale);
          }
          double sum = 0;
          std::vector<double> o(static_cast<size_t>(HS), 0.0);
          for (int64_t j = 0; j < T; ++j) {
            const double p = std::exp(score[static_cast<size_t>(j)] - top);
            sum += p;
            const float* vj = v + ((b * T + j) * NKV + kvh) * HS;
            for (int64_t e = 0; e < HS; ++e) o[static_cast<size_t>(e)] += p * vj[e];
          }
          float* out = a.out.data_as<float>() + ((b * T + t) * NH + h) * HS;
          for (int64_t e = 0; e < HS; ++e) out[e] = static_cast<float>(o[static_cast<size_t>(e)] / sum);
          if (a.lse.defined()) a.lse.data_as<float>()[(b * NH + h) * T + t] = static_cast<float>(top + std::log(sum));
        }
  }
  void backward(const AttentionArgs&, const AttentionGrads&) override { FAIL() << "the naive step has no backward"; }
};

// Local flash attention that records what the block hands it.
class RecordingAttention final : public AttentionStep {
 public:
  struct Call {
    bool backward;
    int64_t layer;
    AttentionArgs args;
    AttentionGrads grads;
    std::vector<int32_t> pos;
  };
  void forward(const AttentionArgs& a) override {
    record(false, a, {});
    local_.forward(a);
  }
  void backward(const AttentionArgs& a, const AttentionGrads& g) override {
    record(true, a, g);
    local_.backward(a, g);
  }
  std::vector<Call> calls;

 private:
  void record(bool backward, const AttentionArgs& a, const AttentionGrads& g) {
    const int32_t* p = a.pos.data_as<int32_t>();
    calls.push_back({backward, a.layer, a, g, std::vector<int32_t>(p, p + a.pos.numel())});
  }
  LocalAttention local_;
};

// An MLP that adds nothing: out = 0, and no gradient flows through it.
class ZeroMlp final : public MlpStep {
 public:
  void forward(Tensor out, const Tensor&, const LayerWeights&, LayerActs&, const BlockContext&) const override {
    kernels::fill(out, 0.f);
  }
  void recompute(LayerActs&) const override {}
  Tensor backward(const Tensor&, const Tensor&, const LayerWeights&, const LayerWeights&, const LayerActs&, Scratch& s,
                  const BlockContext&) const override {
    kernels::fill(s.dnorm, 0.f);
    return s.dnorm;
  }
};

TEST(BlockSeams, AttentionStepGetsTheLayerTheActivationsAndTheCallersPositions) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    SCOPED_TRACE(preset);
    Layer l(preset);
    for (int32_t t = 0; t < kT; ++t) l.pos.data_as<int32_t>()[t] = 10 + t;  // a chunk that starts at position 10
    RecordingAttention rec;
    l.forward(rec, l.own_mlp(), 3);
    l.backward(rec, l.own_mlp(), 3);
    ASSERT_EQ(rec.calls.size(), 2u);
    const std::vector<int32_t> expected_pos = {10, 11, 12, 13, 14, 15, 16, 17};
    for (const RecordingAttention::Call& c : rec.calls) {
      EXPECT_EQ(c.layer, 3);
      EXPECT_EQ(c.pos, expected_pos);
      EXPECT_EQ(c.args.q.data(), l.a.q.data());
      EXPECT_EQ(c.args.k.data(), l.a.k.data());
      EXPECT_EQ(c.args.v.data(), l.a.v.data());
      EXPECT_EQ(c.args.out.data(), l.a.att.data());
      EXPECT_EQ(c.args.lse.data(), l.a.lse.data());
    }
    EXPECT_FALSE(rec.calls[0].backward);
    EXPECT_TRUE(rec.calls[1].backward);
    EXPECT_EQ(rec.calls[1].grads.dout.data(), l.s.datt.data());
    // Llama's RoPE turns q, k by position: the step's gradients are wrt
    // them after RoPE, GPT-2's wrt q, k themselves.
    const bool gpt2 = l.cfg.family == Family::gpt2;
    EXPECT_EQ(rec.calls[1].grads.dq.data(), (gpt2 ? l.s.dq : l.s.dq_rot).data());
    EXPECT_EQ(rec.calls[1].grads.dk.data(), (gpt2 ? l.s.dk : l.s.dk_rot).data());
    EXPECT_EQ(rec.calls[1].grads.dv.data(), l.s.dv.data());
  }
}

// The same block with the naive step and with local flash attention: the
// outputs agree to f32 rounding (flash sums in tiles with an online softmax).
TEST(BlockSeams, NaiveAttentionStepGivesTheFlashBlocksOutput) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    SCOPED_TRACE(preset);
    Layer l(preset);
    LocalAttention flash;
    l.forward(flash, l.own_mlp());
    const std::vector<float> flash_out = floats(l.out), flash_lse = floats(l.a.lse);
    NaiveAttention naive;
    l.forward(naive, l.own_mlp());
    EXPECT_ALL_CLOSE(floats(l.out), flash_out, 1e-5, 1e-6);
    EXPECT_ALL_CLOSE(floats(l.a.lse), flash_lse, 1e-5, 1e-6);
  }
}

// Per-token (B, T) positions reach both RoPE and the step: sequence b at
// positions 4b .. 4b + T - 1 turns Llama's q and k by those angles, which
// the naive step, reading the same positions, agrees with flash attention on
// (both mask by order within a sequence). The rotated q and k are compared,
// not the block's output: RoPE makes q . k depend only on the distance
// between positions, so a whole sequence shifted by 4 gives the same output
// up to rounding (which on some instruction sets comes out identical).
TEST(BlockSeams, PerTokenPositionsReachRopeAndTheAttentionStep) {
  Layer l("llama-tiny");
  Tensor per_token = l.i32({kB, kT});
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t t = 0; t < kT; ++t) per_token.data_as<int32_t>()[b * kT + t] = static_cast<int32_t>(4 * b + t);
  LocalAttention flash;
  l.forward(flash, l.own_mlp());
  const std::vector<float> q_zero = floats(l.a.q), k_zero = floats(l.a.k), out_zero = floats(l.out);
  l.pos = per_token;
  l.forward(flash, l.own_mlp());
  const std::vector<float> q_shifted = floats(l.a.q), k_shifted = floats(l.a.k), shifted = floats(l.out);
  for (const auto& [zero, moved, what] : {std::tuple{&q_zero, &q_shifted, "q"}, std::tuple{&k_zero, &k_shifted, "k"}}) {
    const size_t seq = zero->size() / kB;
    EXPECT_EQ(std::vector<float>(zero->begin(), zero->begin() + seq), std::vector<float>(moved->begin(), moved->begin() + seq))
        << "sequence 0's " << what << " starts at position 0 either way";
    EXPECT_NE(std::vector<float>(zero->begin() + seq, zero->begin() + 2 * seq),
              std::vector<float>(moved->begin() + seq, moved->begin() + 2 * seq))
        << "sequence 1's " << what << " turns by other angles";
  }
  EXPECT_EQ(std::vector<float>(out_zero.begin(), out_zero.begin() + kT * l.d.C),
            std::vector<float>(shifted.begin(), shifted.begin() + kT * l.d.C))
      << "sequence 0 starts at position 0 either way";
  NaiveAttention naive;
  l.forward(naive, l.own_mlp());
  EXPECT_ALL_CLOSE(floats(l.out), shifted, 1e-5, 1e-6);
}

// With an MLP that adds nothing the block's output is its attention half,
// x + attention branch: the residual the real block adds its MLP onto.
TEST(BlockSeams, ZeroMlpStepLeavesTheBlockOutputItsAttentionResidual) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    SCOPED_TRACE(preset);
    Layer l(preset);
    LocalAttention flash;
    l.forward(flash, l.own_mlp());
    const std::vector<float> attention_half = floats(l.a.res1), with_mlp = floats(l.out);
    const ZeroMlp zero;
    l.forward(flash, zero);
    EXPECT_EQ(floats(l.out), attention_half);
    EXPECT_NE(floats(l.out), with_mlp);
  }
}

// The MLP's weights are the MLP step's: with the zero step, backward leaves
// their gradients untouched and still fills the attention's.
TEST(BlockSeams, ZeroMlpStepOwnsTheMlpGradients) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    SCOPED_TRACE(preset);
    Layer l(preset);
    LocalAttention flash;
    const ZeroMlp zero;
    l.forward(flash, zero);
    l.backward(flash, zero);
    for (const Tensor& t : {l.g.w_fc, l.g.w_out, l.g.b_fc, l.g.b_out, l.g.w_up}) {
      if (!t.defined()) continue;
      for (float v : floats(t)) ASSERT_EQ(v, 0.f);
    }
    float largest = 0;
    for (float v : floats(l.g.wq)) largest = std::max(largest, std::abs(v));
    EXPECT_GT(largest, 0.f);
  }
}

}  // namespace
}  // namespace loom::model
