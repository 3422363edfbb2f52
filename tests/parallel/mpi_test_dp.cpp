// Data parallelism end to end (parallel/dp.h through train::Trainer), on
// the world of N ranks: every ZeRO stage trains like one process holding the
// whole global batch, checkpoints move between dp sizes and stages, and a dp
// size that does not match the group is refused.
//
// The single-process reference runs on rank 0 alone and its numbers are
// broadcast: at N = 8 on two cores, eight copies of it would cost more than
// the runs under test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/threads.h"
#include "kernels/ops.h"
#include "parallel/dp_run.h"
#include "train/checkpoint.h"
#include "common/run_context.h"

namespace loom::test {
namespace {

namespace fs = std::filesystem;
using train::RunConfig;
using train::StepStats;
using train::Trainer;

constexpr int64_t kSteps = 20;
// fp32 losses of another reduction order (the group's averaging, the
// reduce-scatter's, another GEMM batch) agree to a few ulps at the first step
// and drift apart slowly: 2e-7 after 20 steps at N = 1 to 8. 1e-5 is what the
// issue asks for.
constexpr double kTolerance = 1e-5;
// The global gradient norm is compared too, as the direct evidence that it
// spans every shard (one shard's norm would be off by ~1/sqrt(N)). It is a
// root of a sum of squares of values that are themselves sums of cancelling
// terms, so it carries more of the rounding than the loss: up to 8e-6 at
// N = 3, where averaging divides by 3 inexactly.
constexpr double kNormTolerance = 1e-4;

// What a run leaves to compare: per step the loss and the global gradient
// norm before clipping.
struct Curve {
  std::vector<double> losses, grad_norms;
};

Curve curve_of(const std::vector<StepStats>& steps) {
  Curve c;
  for (const StepStats& s : steps) c.losses.push_back(s.loss), c.grad_norms.push_back(s.grad_norm);
  return c;
}

// The same global batch, trained by one process: dp x micro_batch sequences
// per micro-batch, no group, the plain (stage 0) optimizer.
RunConfig alone(RunConfig c) {
  c.train.micro_batch *= c.parallel.dp;
  c.parallel.dp = 1;
  c.parallel.zero_stage = 0;
  c.parallel.offload_optimizer = false;
  return c;
}

// Printed by rank 0 so that the observed differences appear in the test log.
void report(const std::string& what, double loss_diff, double norm_diff = -1) {
  if (world().rank() != 0) return;
  if (norm_diff >= 0)
    std::printf("[dp N=%d] %s: max relative difference: loss %.3g, grad norm %.3g\n", world().size(), what.c_str(),
                loss_diff, norm_diff);
  else
    std::printf("[dp N=%d] %s: max relative loss difference %.3g\n", world().size(), what.c_str(), loss_diff);
  std::fflush(stdout);
}

// Every rank sees the same train shard in dir_ (rank 0 writes it).
class DataParallelTest : public SharedDataTest<"loom_mpi_dp", 4000> {
 protected:
  static int world_size() { return world().size(); }
  // Sequences per dp rank per micro-batch: about 8 over the group (at least
  // 1 each), so that the run learns smoothly enough at every N for small
  // rounding differences to stay small.
  static int64_t micro_batch() { return std::max(1, 8 / world_size()); }

  // cfg trained kSteps steps with the world as its dp group.
  static Curve run_on_world(const RunConfig& cfg) {
    TrainerOn on(cfg, &world());
    Trainer& t = on.t;
    return curve_of(train_until(t, kSteps));
  }

  // cfg trained kSteps steps by rank 0 alone, on every rank; cached by the
  // whole config, since several dp runs share one reference.
  static Curve reference(const RunConfig& cfg) {
    const std::string key = train::run_config_to_json(cfg).dump();
    auto it = references_.find(key);
    if (it != references_.end()) return it->second;
    Curve c;
    if (world().rank() == 0) c = run_on_rank_zero(cfg);
    c.losses = broadcast_values(world(), c.losses, kSteps);
    c.grad_norms = broadcast_values(world(), c.grad_norms, kSteps);
    return references_[key] = c;
  }

  static Curve run_on_rank_zero(const RunConfig& cfg) {
    TrainerOn one(cfg, nullptr);
    return curve_of(train_until(one.t, kSteps));
  }

  static std::map<std::string, Curve> references_;
};

std::map<std::string, Curve> DataParallelTest::references_;

// ---------------------------------------------------------------------------
// Equivalence: dp = N under each ZeRO stage against one process.

class DataParallelEquivalence : public DataParallelTest,
                                public ::testing::WithParamInterface<std::tuple<int, int>> {};

TEST_P(DataParallelEquivalence, LossMatchesSingleProcessOver20Steps) {
  const auto [stage, accum] = GetParam();
  const RunConfig c = dp_config(dir_, world_size(), stage, micro_batch(), accum);
  const Curve dp = run_on_world(c);
  const Curve one = reference(alone(c));
  const double loss_diff = max_relative_difference(dp.losses, one.losses);
  const double norm_diff = max_relative_difference(dp.grad_norms, one.grad_norms);
  report("fp32 zero_stage=" + std::to_string(stage) + " grad_accum=" + std::to_string(accum), loss_diff, norm_diff);
  EXPECT_LE(loss_diff, kTolerance);
  EXPECT_LE(norm_diff, kNormTolerance);
  EXPECT_LT(one.losses.back(), 0.8 * one.losses.front()) << "the reference run should learn the data";
}

INSTANTIATE_TEST_SUITE_P(Stages, DataParallelEquivalence,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Values(1, 2)),
                         [](const ::testing::TestParamInfo<std::tuple<int, int>>& p) {
                           return "zero" + std::to_string(std::get<0>(p.param)) + "_accum" +
                                  std::to_string(std::get<1>(p.param));
                         });

// bf16 compute weights are the rounding of the f32 master weights element by
// element, so a shard rounds exactly as the whole buffer does, and at N = 2
// the first steps are bitwise equal. What differs is the f32 accumulation
// order of the reductions and of the GEMMs over another batch size: where a
// result sits at a bf16 rounding boundary it rounds the other way, one bf16
// step (2^-8 relative), and the runs drift apart. Under N = 3 the scale
// 1 / (B T) of the cross-entropy gradient is 1/32 on a rank but 1/96 alone,
// and the bf16 rounding of dlogits differs from the first step (grad norm
// 2e-3 apart there). Observed: 1.4e-4 to 2.2e-4 at N = 2 to 8; the bound,
// 2e-3, is a quarter of one bf16 step.
TEST_F(DataParallelTest, Bf16Zero3LossMatchesSingleProcessBf16) {
  if (!kernels::bf16_matmul_unsupported_reason().empty()) GTEST_SKIP() << "this CPU has no bf16 GEMM";
  RunConfig c = dp_config(dir_, world_size(), 3, micro_batch(), 1);
  c.train.dtype = "bf16";
  const Curve dp = run_on_world(c);
  const Curve one = reference(alone(c));
  const double loss_diff = max_relative_difference(dp.losses, one.losses);
  report("bf16 zero_stage=3", loss_diff, max_relative_difference(dp.grad_norms, one.grad_norms));
  EXPECT_LE(loss_diff, 2e-3);
}

// fp16 parameters are gathered as bytes (the communicator has no f16 dtype):
// ZeRO-1 and ZeRO-3 train like one fp16 process, with the bound and the
// reason of the bf16 test above (f16 rounds 8x finer than bf16).
TEST_F(DataParallelTest, Fp16ZeroStagesMatchSingleProcessFp16) {
  for (int stage : {1, 3}) {
    RunConfig c = dp_config(dir_, world_size(), stage, micro_batch(), 1);
    c.train.dtype = "fp16";
    const Curve dp = run_on_world(c);
    const Curve one = reference(alone(c));
    const double loss_diff = max_relative_difference(dp.losses, one.losses);
    report("fp16 zero_stage=" + std::to_string(stage), loss_diff,
           max_relative_difference(dp.grad_norms, one.grad_norms));
    EXPECT_LE(loss_diff, 2e-3) << "zero_stage " << stage;
  }
}

// fp16 overflows where the single process does: each rank's backward weighs
// its tokens as the mean over the global batch does (Trainer's
// backward_scale), so its f16 gradients are the single process's size, not
// dp times it. Over loss scales a factor 2 apart, from where nothing
// overflows to where it does, the same steps are skipped at the same scales.
TEST_F(DataParallelTest, Fp16OverflowsAtTheSingleProcessLossScale) {
  constexpr int64_t kScaledSteps = 3;
  bool some_skip = false, some_clean = false;
  for (int k = 20; k <= 27; ++k) {
    RunConfig c = dp_config(dir_, world_size(), 1, micro_batch(), 1);
    c.train.dtype = "fp16";
    c.train.loss_scale = std::ldexp(1.0, k);
    c.train.max_bad_steps = 1000;  // skipping is what is measured
    c.train.steps = kScaledSteps;
    auto skips = [](const std::vector<StepStats>& steps) {
      std::vector<double> v;
      for (const StepStats& s : steps) v.push_back(s.skipped ? s.loss_scale : 0.0);
      return v;
    };
    TrainerOn on(c, &world());
    const std::vector<double> dp = skips(train_until(on.t, kScaledSteps));
    std::vector<double> one;
    if (world().rank() == 0) {
      TrainerOn alone_run(alone(c), nullptr);
      one = skips(train_until(alone_run.t, kScaledSteps));
    }
    one = broadcast_values(world(), one, kScaledSteps);
    EXPECT_EQ(dp, one) << "loss scale 2^" << k << " (each step: the scale it skipped at, or 0)";
    const bool skipped = std::any_of(one.begin(), one.end(), [](double v) { return v > 0; });
    some_skip = some_skip || skipped;
    some_clean = some_clean || !skipped;
  }
  EXPECT_TRUE(some_skip && some_clean) << "the scales should span the single process's overflow threshold";
}

// Offloading moves the master weights and moments to host memory and runs
// the same update there: on a CPU run that is the same arithmetic, bitwise.
TEST_F(DataParallelTest, OffloadOptimizerGivesBitwiseTheSameLosses) {
  for (int stage : {1, 3}) {
    RunConfig c = dp_config(dir_, world_size(), stage, micro_batch(), 1);
    const Curve kept = run_on_world(c);
    c.parallel.offload_optimizer = true;
    const Curve offloaded = run_on_world(c);
    report("offload_optimizer zero_stage=" + std::to_string(stage) + " vs not offloaded",
           max_relative_difference(offloaded.losses, kept.losses));
    EXPECT_EQ(offloaded.losses, kept.losses) << "zero_stage " << stage;
    EXPECT_EQ(offloaded.grad_norms, kept.grad_norms) << "zero_stage " << stage;
  }
}

// With grad_clip far below the gradient norm every step is clipped, by
// clip / norm: the norm must be the global one (compared with the single
// process's directly), or each rank would scale its piece by another factor.
TEST_F(DataParallelTest, ClippingEveryStepMatchesSingleProcessSoTheNormSpansAllShards) {
  constexpr double kClip = 0.01;
  for (int stage : {2, 3}) {
    RunConfig c = dp_config(dir_, world_size(), stage, micro_batch(), 2);
    c.train.grad_clip = kClip;
    const Curve dp = run_on_world(c);
    const Curve one = reference(alone(c));
    for (size_t i = 0; i < dp.grad_norms.size(); ++i)
      ASSERT_GT(dp.grad_norms[i], kClip) << "step " << i + 1 << " was not clipped";
    const double loss_diff = max_relative_difference(dp.losses, one.losses);
    const double norm_diff = max_relative_difference(dp.grad_norms, one.grad_norms);
    report("grad_clip=0.01 zero_stage=" + std::to_string(stage) + " grad_accum=2", loss_diff, norm_diff);
    EXPECT_LE(loss_diff, kTolerance) << "zero_stage " << stage;
    EXPECT_LE(norm_diff, kNormTolerance) << "zero_stage " << stage;
  }
  // Clipping must matter to these losses, or matching them proves nothing
  // about it: the same run without clipping lands far outside the tolerance.
  RunConfig c = dp_config(dir_, world_size(), 0, micro_batch(), 2);
  c.train.grad_clip = kClip;
  const Curve clipped = reference(alone(c));
  c.train.grad_clip = 0;
  const double effect = max_relative_difference(clipped.losses, reference(alone(c)).losses);
  report("grad_clip=0.01 vs no clipping, one process", effect);
  EXPECT_GT(effect, 100 * kTolerance);
}

// ---------------------------------------------------------------------------
// Checkpoint resharding.

// Where a run trains: its dp size and stage, its group, and whether this rank
// is in it (ranks outside wait). Rank 0 is in every layout.
struct Layout {
  std::string name;
  int64_t dp = 1, zero_stage = 0;
  comm::Communicator* group = nullptr;
  bool member = false;
};

class DataParallelCheckpointTest : public DataParallelTest {
 protected:
  // The global batch: a multiple of every dp size used below (N, 2 and 1),
  // at least 8 sequences.
  static int64_t global_batch() {
    const int64_t step = world_size() % 2 == 0 ? world_size() : 2 * world_size();
    return step * ((8 + step - 1) / step);
  }

  static RunConfig config_of(const Layout& l) { return dp_config(dir_, l.dp, l.zero_stage, global_batch() / l.dp, 1); }

  // 10 steps in layout l, then a checkpoint under root; the losses on every rank.
  static std::vector<double> train_and_save(const Layout& l, const fs::path& root) {
    std::vector<double> losses;
    if (l.member) {
      TrainerOn on(config_of(l), l.group);
      Trainer& t = on.t;
      losses = losses_of(train_until(t, kSteps / 2));
      save_checkpoint(t, root.string(), 0);
    }
    // save_checkpoint ends in a barrier of its group, so once rank 0 sends,
    // every file of the checkpoint is written.
    return broadcast_values(world(), losses, kSteps / 2);
  }

  // Layout l loads step_dir and trains steps 11 to 20: their losses on every rank.
  static std::vector<double> resume(const Layout& l, const fs::path& step_dir) {
    std::vector<double> losses;
    if (l.member) {
      TrainerOn on(config_of(l), l.group);
      Trainer& t = on.t;
      EXPECT_EQ(load_checkpoint(t, step_dir.string()), kSteps / 2) << l.name;
      losses = losses_of(train_until(t, kSteps));
    }
    return broadcast_values(world(), losses, kSteps / 2);
  }

  // Saved at `from`, resumed under each of `to`: the first 10 losses and the
  // continued 10 match the uninterrupted single-process run's.
  void expect_resumes_continue(const Layout& from, const std::vector<Layout>& to, const std::string& root_name) {
    const Layout one{"dp=1", 1, 0, nullptr, world().rank() == 0};
    const std::vector<double> straight = reference(config_of(one)).losses;
    const std::vector<double> first(straight.begin(), straight.begin() + kSteps / 2);
    const std::vector<double> last(straight.begin() + kSteps / 2, straight.end());

    const fs::path root = dir_ / root_name;
    const std::vector<double> saved = train_and_save(from, root);
    const double saved_diff = max_relative_difference(saved, first);
    report("checkpoint: steps 1-10 at " + from.name, saved_diff);
    EXPECT_LE(saved_diff, kTolerance) << from.name;

    const fs::path step_dir = root / train::checkpoint_step_dir_name(kSteps / 2);
    for (const Layout& l : to) {
      const double diff = max_relative_difference(resume(l, step_dir), last);
      report("checkpoint: saved at " + from.name + ", steps 11-20 resumed at " + l.name, diff);
      EXPECT_LE(diff, kTolerance) << "saved at " << from.name << ", resumed at " << l.name;
    }
  }
};

std::string layout_name(int64_t dp, int64_t stage) {
  return "dp=" + std::to_string(dp) + " zero_stage=" + std::to_string(stage);
}

// Saved at dp = N ZeRO-3; resumed alone, at dp = N ZeRO-1 and on a pair of
// ranks at ZeRO-0. With N >= 3 also the other way: saved on the pair at
// ZeRO-3 and resumed at dp = N ZeRO-1 and alone (at N = 4: the issue's
// "saved at dp=2 ZeRO-3, resumed at dp=1 and at dp=4 ZeRO-1").
TEST_F(DataParallelCheckpointTest, CheckpointResumesUnderAnotherDpSizeAndStage) {
  const int N = world_size(), rank = world().rank();
  // Ranks 0 and 1 form the pair; the others get a group they leave unused.
  std::unique_ptr<comm::Communicator> pair_group = world().split(rank < 2 ? 0 : 1, rank, "dp_pair");
  auto on_world = [&](int64_t stage) { return Layout{layout_name(N, stage), N, stage, &world(), true}; };
  auto on_pair = [&](int64_t stage) { return Layout{layout_name(2, stage), 2, stage, pair_group.get(), rank < 2}; };
  const Layout one{"dp=1 (one process)", 1, 0, nullptr, rank == 0};

  std::vector<Layout> to = {one, on_world(1)};
  if (N >= 2) to.push_back(on_pair(0));
  expect_resumes_continue(on_world(3), to, "ckpt_world_zero3");
  if (N >= 3) expect_resumes_continue(on_pair(3), {on_world(1), one}, "ckpt_pair_zero3");
}

// A stage-0 run holds the whole state on every rank; each rank saves its
// 1/N piece, and the checkpoint resumes at the same layout and alone.
TEST_F(DataParallelCheckpointTest, StageZeroCheckpointResumesAtTheSameLayoutAndAlone) {
  const int N = world_size();
  const Layout stage0{layout_name(N, 0), N, 0, &world(), true};
  const Layout one{"dp=1 (one process)", 1, 0, nullptr, world().rank() == 0};
  expect_resumes_continue(stage0, {stage0, one, Layout{layout_name(N, 2), N, 2, &world(), true}}, "ckpt_world_zero0");
}

// ---------------------------------------------------------------------------
// Impossible configs.

// c on a mesh of `shape` over `ranks` (nullptr: one process).
void expect_trainer_error(const RunConfig& c, const mesh::MeshShape& shape, comm::Communicator* ranks,
                          const std::vector<std::string>& parts) {
  try {
    TestContext run(shape, ranks);
    Trainer t(c, run.ctx());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

// With grad_accum = 3, stages 0 and 1 reduce each bucket once per step (in
// the last micro-batch's backward); stages 2 and 3 keep only a gradient
// shard, so they reduce every micro-batch's buckets.
TEST_F(DataParallelTest, StagesZeroAndOneCommunicateOnlyInTheLastMicroBatch) {
  const int N = world_size();
  for (int stage = 0; stage <= 3; ++stage) {
    TrainerOn on(dp_config(dir_, N, stage, 1, 3), &world());
    Trainer& t = on.t;
    t.dp().reset_comm_stats();
    t.step();
    const int64_t buckets = static_cast<int64_t>(t.dp().buckets().size());
    ASSERT_GT(buckets, 1) << "bucket_mb should cut the gradients into several buckets";
    const int64_t expected = N == 1 ? 0 : stage < 2 ? buckets : 3 * buckets;
    EXPECT_EQ(t.dp().comm_stats().ops, expected) << "stage " << stage;
  }
}

TEST_F(DataParallelTest, TrainerRejectsParallelDpOtherThanTheGroupSize) {
  const int N = world_size();
  expect_trainer_error(dp_config(dir_, N + 1, 0, 1, 1), mesh::MeshShape{1, N, 1, 1, 1}, &world(),
                       {"parallel.dp = " + std::to_string(N + 1), "dp axis has " + std::to_string(N) + " ranks"});
  expect_trainer_error(dp_config(dir_, 2, 1, 1, 1), mesh::MeshShape{}, nullptr, {"parallel.dp = 2", "dp axis has 1 ranks"});
}

}  // namespace
}  // namespace loom::test
