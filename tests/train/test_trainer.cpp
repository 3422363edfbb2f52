#include "train/trainer.h"
#include "comm/self_communicator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "common/compare.h"
#include "common/tensors.h"
#include "core/error.h"
#include "core/memory.h"
#include "kernels/ops.h"
#include "text/shards.h"
#include "train/evaluate.h"
#include "train/lr_schedule.h"
#include "parallel/dp.h"
#include "tiny_run.h"
#include "common/run_context.h"

namespace loom::train {
namespace {


namespace fs = std::filesystem;

class TrainerTest : public TinyRunTest {
 protected:
  TrainerTest() : TinyRunTest("loom_test_trainer") {}
  // 20 steps at train.dtype = dtype against fp32, per family (defined below).
  void expect_run_matches_fp32_over_20_steps(const std::string& dtype, DType compute) const;
};

TEST(LrSchedule, LinearWarmupThenCosineDecayToMinLr) {
  const LrSchedule s{1.0, 0.1, 10, 110};
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_NEAR(s.at(60), 0.55, 1e-12);  // half way: the cosine's mid-point
  EXPECT_DOUBLE_EQ(s.at(110), 0.1);
  for (int64_t i = 10; i < 110; ++i) EXPECT_LE(s.at(i + 1), s.at(i));
  EXPECT_GT(s.at(109), 0.1);
}

// Two trainers from the same config: 4 step losses and a val loss, bitwise equal.
void expect_two_runs_bitwise_identical(const RunConfig& c) {
  std::vector<double> a, b;
  for (std::vector<double>* out : {&a, &b}) {
    test::TestContext one;
    Trainer t(c, one.ctx());
    for (int i = 0; i < 4; ++i) out->push_back(t.step().loss);
    out->push_back(t.evaluate());
  }
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(double)), 0);
}

// data.train = "dir/*.bin" also reads the val shard, and a val split holds
// fewer windows than one evaluation batch: the run says so.
TEST_F(TrainerTest, AShardInBothSplitsAndAValSplitBelowOneBatchAreNamed) {
  RunConfig c = config();
  test::TestContext one;
  ::testing::internal::CaptureStderr();
  { Trainer apart(c, one.ctx()); }
  EXPECT_EQ(::testing::internal::GetCapturedStderr().find("is both a train shard"), std::string::npos);
  c.data.train = {(dir_ / "*.bin").string()};
  ::testing::internal::CaptureStderr();
  { Trainer both(c, one.ctx()); }
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("val_000000.bin' is both a train shard (data.train) and a val shard (data.val)"),
            std::string::npos) << log;
  EXPECT_EQ(log.find("fewer than one evaluation batch"), std::string::npos) << log;
  // A val split smaller than one evaluation batch is said too.
  c.train.micro_batch = 64;
  c.data.train = config().data.train;
  ::testing::internal::CaptureStderr();
  { Trainer small(c, one.ctx()); }
  const std::string small_log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(small_log.find("data.val holds 31 windows of 16 tokens, fewer than one evaluation batch of 64"),
            std::string::npos) << small_log;
}

TEST_F(TrainerTest, SameConfigAndSeedGiveBitwiseIdenticalLosses) { expect_two_runs_bitwise_identical(config()); }

TEST_F(TrainerTest, AnotherSeedGivesOtherLosses) {
  RunConfig c = config();
  test::TestContext p1, p2;
  Trainer t1(c, p1.ctx());
  c.train.seed += 1;
  Trainer t2(c, p2.ctx());
  EXPECT_NE(t1.step().loss, t2.step().loss);
}

TEST_F(TrainerTest, LossAndValLossFallOnALearnableStream) {
  test::TestContext one;
  Trainer t(config(), one.ctx());
  const double val_before = t.evaluate();
  double first = 0, last = 0;
  for (int i = 0; i < 20; ++i) {
    const StepStats s = t.step();
    EXPECT_EQ(s.step, i + 1);
    EXPECT_EQ(s.tokens, 2 * 2 * 16);
    if (i == 0) first = s.loss;
    last = s.loss;
  }
  EXPECT_LT(last, first - 1.0);
  EXPECT_LT(t.evaluate(), val_before - 1.0);
}

// micro_batch 2 x grad_accum 1 and micro_batch 1 x grad_accum 2 read the same
// windows (no shuffle) and average the same gradients.
TEST_F(TrainerTest, GradAccumulationMatchesALargerMicroBatch) {
  RunConfig c = config();
  c.data.shuffle = false;
  c.train.eval_every = 0;
  c.train.micro_batch = 2, c.train.grad_accum = 1;
  test::TestContext p1, p2;
  Trainer big(c, p1.ctx());
  c.train.micro_batch = 1, c.train.grad_accum = 2;
  Trainer accum(c, p2.ctx());
  for (int i = 0; i < 3; ++i) {
    const StepStats a = big.step(), b = accum.step();
    EXPECT_NEAR(a.loss, b.loss, 1e-4 * std::abs(a.loss)) << "step " << i + 1;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-3 * a.grad_norm) << "step " << i + 1;
  }
}

// oneDNN has bf16 GEMMs only on AVX-512 CPUs; elsewhere bf16 is a user error.
bool bf16_gemm_available() { return kernels::bf16_matmul_unsupported_reason().empty(); }

// DESIGN.md §6: "bf16 run vs fp32 run, first 20 steps: abs loss diff <= 2e-2",
// at the quickstart's lr 3e-3 (observed max 2.1e-3 for gpt2-tiny). At this
// fixture's lr 1e-2, tuned to learn fast, the loss falls from 6.3 to 2.6 in
// 20 steps and the two runs drift apart (0.59 at step 10). fp16 (f16
// compute, dynamic loss scaling) is held to the same bound; its steps must
// not overflow at the default loss scale.
void TrainerTest::expect_run_matches_fp32_over_20_steps(const std::string& dtype, DType compute) const {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    RunConfig c = config();
    c.model = model::model_preset(preset);
    c.train.eval_every = 0;
    c.train.lr = 3e-3, c.train.min_lr = 3e-4;
    test::TestContext p32, p16;
    Trainer f32(c, p32.ctx());
    c.train.dtype = dtype;
    Trainer low(c, p16.ctx());
    EXPECT_EQ(low.model().compute_dtype(), compute);
    double worst = 0;
    for (int i = 0; i < 20; ++i) {
      const StepStats e = f32.step(), a = low.step();
      worst = std::max(worst, std::fabs(a.loss - e.loss));
      EXPECT_NEAR(a.loss, e.loss, 2e-2) << preset << " step " << i + 1;
      EXPECT_FALSE(a.skipped) << preset << " step " << i + 1;
    }
    std::printf("%s %s vs fp32 over 20 steps: max |loss diff| %.2e\n", preset, dtype.c_str(), worst);
  }
}

TEST_F(TrainerTest, Bf16RunMatchesFp32RunOver20Steps) {
  if (!bf16_gemm_available()) GTEST_SKIP() << "this CPU has no bf16 GEMM";
  expect_run_matches_fp32_over_20_steps("bf16", DType::bf16);
}

TEST_F(TrainerTest, Bf16SameConfigAndSeedGiveBitwiseIdenticalLosses) {
  if (!bf16_gemm_available()) GTEST_SKIP() << "this CPU has no bf16 GEMM";
  RunConfig c = config();
  c.train.dtype = "bf16";
  expect_two_runs_bitwise_identical(c);
}

// Where there is no bf16 GEMM (below AVX-512, or under --isa avx2) a bf16
// run is refused by name instead of running slower than f32.
TEST_F(TrainerTest, Bf16KeepsMasterWeightsAndOptimizerStateInF32) {
  RunConfig c = config();
  c.train.dtype = "bf16";
  test::TestContext one;
  if (!bf16_gemm_available()) {
    test::expect_error([&] { Trainer refused(c, one.ctx()); },
                       {"train.dtype = bf16", "no bf16 GEMM", "train.dtype = fp32"});
    GTEST_SKIP() << "this CPU has no bf16 GEMM: bf16 training is refused (checked above)";
  }
  Pools& pools = one.pools();
  Trainer t(c, one.ctx());
  const size_t P = static_cast<size_t>(t.model().num_params());
  const MemoryReport r = pools.report();
  EXPECT_EQ(r[MemTag::params].current, 2 * P);
  EXPECT_EQ(r[MemTag::master].current, 4 * P);
  EXPECT_EQ(r[MemTag::grads].current, 4 * P);
  EXPECT_EQ(r[MemTag::optimizer].current, 2 * 4 * P);
  EXPECT_EQ(t.optimizer().m().dtype(), DType::f32);
  EXPECT_EQ(t.optimizer().v().dtype(), DType::f32);
}

TEST_F(TrainerTest, Fp16RunMatchesFp32RunOver20Steps) { expect_run_matches_fp32_over_20_steps("fp16", DType::f16); }

TEST_F(TrainerTest, Fp16SameConfigAndSeedGiveBitwiseIdenticalLosses) {
  RunConfig c = config();
  c.train.dtype = "fp16";
  expect_two_runs_bitwise_identical(c);
}

// A loss scale of 2^40 overflows f16's dlogits (max 65504): those steps are
// skipped — weights, AdamW's update count and moments untouched — and the
// scale halves each time until the gradients are finite; then updates run.
TEST_F(TrainerTest, Fp16OverflowSkipsTheUpdateAndHalvesTheLossScale) {
  RunConfig c = config();
  c.train.dtype = "fp16";
  c.train.loss_scale = 1099511627776.0;  // 2^40
  test::TestContext one;
  Trainer t(c, one.ctx());
  const std::vector<float> before = master_of(t);
  StepStats s = t.step();
  EXPECT_TRUE(s.skipped);
  EXPECT_EQ(s.step, 1);
  EXPECT_EQ(s.loss_scale, 1099511627776.0);
  EXPECT_FALSE(std::isfinite(s.grad_norm));
  EXPECT_EQ(t.loss_scaler()->scale(), 549755813888.0);
  EXPECT_EQ(t.optimizer().steps_taken(), 0);
  EXPECT_EQ(master_of(t), before);
  int skipped = 1;
  while (t.step().skipped) ++skipped;
  EXPECT_GT(skipped, 5);  // 2^40 / 2^skipped must fall below ~1e4 * N before dlogits fit
  EXPECT_EQ(t.optimizer().steps_taken(), 1);
  EXPECT_EQ(t.steps_done(), skipped + 1);
  EXPECT_NE(master_of(t), before);
  std::printf("2^40 loss scale: %d steps skipped, then scale %g\n", skipped, t.loss_scaler()->scale());
}

TEST_F(TrainerTest, Fp16LossScaleDoublesAfterTheWindowOfFiniteSteps) {
  RunConfig c = config();
  c.train.dtype = "fp16";
  c.train.loss_scale = 256;
  c.train.loss_scale_window = 3;
  test::TestContext one;
  Trainer t(c, one.ctx());
  std::vector<double> scales;
  for (int i = 0; i < 7; ++i) scales.push_back(t.step().loss_scale);
  EXPECT_EQ(scales, (std::vector<double>{256, 256, 256, 512, 512, 512, 1024}));
}

TEST(DynamicLossScaler, HalvesOnOverflowDoublesAfterWindowAndRejectsBadState) {
  DynamicLossScaler s(8, 2);
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 4);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.good_steps(), 1);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 8);
  EXPECT_EQ(s.good_steps(), 0);
  DynamicLossScaler one(1, 2);
  EXPECT_FALSE(one.update(false));
  EXPECT_EQ(one.scale(), 1);  // never below 1
  EXPECT_THROW(DynamicLossScaler(0, 2), Error);
  EXPECT_THROW(DynamicLossScaler(8, 0), Error);
  EXPECT_THROW(s.restore(8, 2), Error);  // good steps must stay below the window
}

TEST_F(TrainerTest, EvaluateShardsCoversEveryWindowOnce) {
  Pools pools;
  model::Model m(model::model_preset("gpt2-tiny"), 3, 16, pools);
  m.init_params(3);
  const EvalResult r = evaluate_shards(m, {(dir_ / "val_000000.bin").string()});
  EXPECT_EQ(r.windows, (500 - 1) / 16);
  EXPECT_EQ(r.tokens, r.windows * 16);
  EXPECT_TRUE(std::isfinite(r.loss));
  EXPECT_NEAR(r.perplexity, std::exp(r.loss), 1e-6 * r.perplexity);
  EXPECT_NEAR(r.loss, std::log(512.0), 0.5);  // an untrained model is near uniform
}

// train.adam_beta1 / adam_beta2 / adam_eps reach AdamW (Hugging Face's 0.999 here) and change the update.
TEST_F(TrainerTest, AdamBetasAndEpsilonAreTheConfigs) {
  RunConfig c = config();
  test::TestContext a, b;
  Trainer defaults(c, a.ctx());
  c.train.adam_beta1 = 0.8, c.train.adam_beta2 = 0.999, c.train.adam_eps = 1e-6;
  Trainer hf(c, b.ctx());
  EXPECT_EQ(hf.optimizer().options().beta1, 0.8);
  EXPECT_EQ(hf.optimizer().options().beta2, 0.999);
  EXPECT_EQ(hf.optimizer().options().eps, 1e-6);
  EXPECT_EQ(defaults.optimizer().options().beta2, 0.95);
  defaults.step(), hf.step();
  EXPECT_NE(defaults.step().loss, hf.step().loss);
}

// A MoE model whose capacity drops choices in training (capacity_factor 0.5) evaluates dropless: `loom eval`
// and the in-training val loss equal the same weights' with capacity_factor 0 (what serving and transformers'
// Mixtral compute), bit for bit, and differ from a training forward's.
TEST_F(TrainerTest, AMoeModelEvaluatesWithoutCapacityDrops) {
  const auto moe = [](float capacity_factor) {
    model::ModelConfig c = model::model_preset("llama-tiny");
    c.n_expert = 4, c.top_k = 2, c.capacity_factor = capacity_factor;
    return c;
  };
  Pools pools;
  const std::vector<std::string> val = {(dir_ / "val_000000.bin").string()};
  model::Model dropping(moe(0.5f), 3, 16, pools), dropless(moe(0.f), 3, 16, pools);
  dropping.init_params(3), dropless.init_params(3);
  const double eval = evaluate_shards(dropping, val).loss;
  EXPECT_EQ(eval, evaluate_shards(dropless, val).loss);
  // The same model's training forward drops (the evaluation left it training again).
  std::vector<int32_t> tokens(3 * 16), targets(3 * 16);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(i % 37), targets[i] = int32_t((i + 1) % 37);
  const Tensor tok(tokens.data(), DType::i32, {3, 16}), tgt(targets.data(), DType::i32, {3, 16});
  EXPECT_NE(dropping.forward(tok, tgt), dropless.forward(tok, tgt));
  EXPECT_GT(dropping.moe_stats().dropped, 0);

  RunConfig c = config();
  test::TestContext a, b;
  c.model = moe(0.5f);
  Trainer t_dropping(c, a.ctx());
  c.model = moe(0.f);
  Trainer t_dropless(c, b.ctx());
  EXPECT_EQ(t_dropping.evaluate(), t_dropless.evaluate());
}

}  // namespace
}  // namespace loom::train
