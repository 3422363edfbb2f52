// Data parallelism in one process: the pure bucket and shard layout
// (parallel/dp.h), the model's unit hooks, and every ZeRO stage in a group of
// one giving bitwise the plain model's gradients and updates (the multi-rank
// proofs are tests/parallel/mpi_test_dp*.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/tensors.h"
#include "core/error.h"
#include "kernels/ops.h"
#include "model/config.h"
#include "model/model.h"
#include "parallel/dp.h"

namespace loom::parallel {
namespace {

std::vector<model::Unit> units_of(const std::vector<int64_t>& sizes) {
  std::vector<model::Unit> u;
  int64_t at = 0;
  for (int64_t n : sizes) u.push_back({at, at + n}), at += n;
  return u;
}

TEST(DpLayout, BucketsAreWholeUnitsCoveringEverythingGrownFromTheLastUnit) {
  // 1 MiB of f32 = 262144 elements per bucket.
  const auto units = units_of({100000, 200000, 200000, 200000, 50000});
  const std::vector<Bucket> b = make_buckets(units, 0, 1.0);
  // From the end: 50000 + 200000 < 262144, + 200000 >= it: units 2-4; then 1 + 0.
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].first_unit, 0);
  EXPECT_EQ(b[0].last_unit, 1);
  EXPECT_EQ(b[1].first_unit, 2);
  EXPECT_EQ(b[1].last_unit, 4);
  EXPECT_EQ(b[0].begin, 0);
  EXPECT_EQ(b[0].end, b[1].begin);
  EXPECT_EQ(b[1].end, 750000);
  // Tiny buckets: one unit each. Stage 3: one unit each, whatever bucket_mb.
  EXPECT_EQ(make_buckets(units, 2, 1e-6).size(), units.size());
  EXPECT_EQ(make_buckets(units, 3, 1000.0).size(), units.size());
  EXPECT_EQ(make_buckets(units, 1, 1000.0).size(), 1u);
  EXPECT_THROW(make_buckets(units, 4, 1.0), Error);
  EXPECT_THROW(make_buckets(units, 0, 0.0), Error);
}

// A solo range (a tied embedding under pp) is cut out of its bucket: the
// pieces before and after it stay buckets, each finishing with the unit that
// holds its first element, and the solo bucket's ZeRO-1 shard depends only
// on its own size — two models with different neighbours shard it alike.
TEST(DpLayout, SoloRangeGetsABucketOfItsOwnWhoseShardIgnoresItsNeighbours) {
  const auto units = units_of({100, 50, 60, 70});
  // Everything in one bucket; the range [110, 140) of unit 1 cut out.
  const std::vector<Bucket> b = make_buckets(units, 1, 1000.0, {{110, 140}});
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].begin, 0);
  EXPECT_EQ(b[0].end, 110);
  EXPECT_EQ(b[0].first_unit, 0);
  EXPECT_EQ(b[0].last_unit, 1);
  EXPECT_EQ(b[1].begin, 110);
  EXPECT_EQ(b[1].end, 140);
  EXPECT_EQ(b[1].first_unit, 1);
  EXPECT_EQ(b[1].last_unit, 1);
  EXPECT_EQ(b[2].begin, 140);
  EXPECT_EQ(b[2].end, 280);
  EXPECT_EQ(b[2].first_unit, 1);
  EXPECT_EQ(b[2].last_unit, 3);
  // A whole unit as the range, at the start and at the end of the buffer.
  const std::vector<Bucket> ends = make_buckets(units, 0, 1000.0, {{0, 100}, {210, 280}});
  ASSERT_EQ(ends.size(), 3u);
  EXPECT_EQ(ends[0].end, 100);
  EXPECT_EQ(ends[1].begin, 100);
  EXPECT_EQ(ends[1].end, 210);
  EXPECT_EQ(ends[2].begin, 210);
  EXPECT_EQ(ends[2].first_unit, 3);
  // Same 30-element range in another layout: the same shard offsets within it.
  const std::vector<Bucket> other = make_buckets(units_of({5, 30, 9}), 1, 1000.0, {{5, 35}});
  for (int size : {2, 3, 4})
    for (int r = 0; r < size; ++r) {
      const Segment a = shard_segments(b, 1, size, r)[1], c = shard_segments(other, 1, size, r)[1];
      EXPECT_EQ(a.offset - 110, c.offset - 5);
      EXPECT_EQ(a.count, c.count);
    }
  // Not inside one unit, overlapping, or from stage 2: errors.
  EXPECT_THROW(make_buckets(units, 1, 1000.0, {{90, 120}}), Error);
  EXPECT_THROW(make_buckets(units, 1, 1000.0, {{100, 120}, {110, 130}}), Error);
  EXPECT_THROW(make_buckets(units, 1, 1000.0, {{100, 100}}), Error);
  EXPECT_THROW(make_buckets(units, 2, 1000.0, {{100, 120}}), Error);
}

TEST(DpLayout, ShardsPartitionEveryBucketAcrossRanksExactlyOnce) {
  const auto units = units_of({7, 13, 1, 29, 2});
  for (int stage : {1, 2, 3}) {
    const std::vector<Bucket> buckets = make_buckets(units, stage, 1e-5);
    for (int size : {1, 2, 3, 5, 8, 64}) {
      std::vector<int> owner(52, 0);
      for (int r = 0; r < size; ++r) {
        int64_t packed = 0;
        for (const Segment& s : shard_segments(buckets, stage, size, r)) {
          EXPECT_EQ(s.shard_offset, packed);  // packed in bucket order
          packed += s.count;
          for (int64_t i = s.offset; i < s.offset + s.count; ++i) owner[i]++;
        }
      }
      EXPECT_TRUE(std::all_of(owner.begin(), owner.end(), [](int n) { return n == 1; }))
          << "stage " << stage << " size " << size;
    }
  }
  // Stage 0 keeps everything on every rank.
  for (const Segment& s : shard_segments(make_buckets(units, 0, 1e-5), 0, 4, 3)) EXPECT_GT(s.count, 0);
}

TEST(DpLayout, ModelUnitsAreContiguousAndFollowTheSpecs) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    Pools pools;
    model::Model m(model::model_preset(preset), 1, 8, pools);
    const auto& u = m.units();
    ASSERT_EQ(static_cast<int64_t>(u.size()), m.config().n_layer + 2);
    EXPECT_EQ(u.front().begin, 0);
    EXPECT_EQ(u.back().end, m.num_params());
    for (size_t i = 1; i < u.size(); ++i) EXPECT_EQ(u[i].begin, u[i - 1].end);
    // Every layer unit has the same size.
    for (size_t i = 2; i + 1 < u.size(); ++i) EXPECT_EQ(u[i].numel(), u[1].numel());
  }
}

// Records the hook calls of a model that owns everything.
class Recorder : public model::StepHooks {
 public:
  Tensor acquire_params(int, model::Pass) override { fail("not expected"); }
  void release_params(int) override { fail("not expected"); }
  Tensor acquire_grads(int) override { fail("not expected"); }
  void grads_ready(int unit) override { ready.push_back(unit); }
  std::vector<int> ready;
};

TEST(DpLayout, BackwardFinishesUnitsFromTheLastToTheFirst) {
  Pools pools;
  model::Model m(model::model_preset("gpt2-tiny"), 1, 8, pools);
  m.init_params(1);
  Recorder r;
  m.set_hooks(&r);
  OwnedTensor tok = pools[MemTag::activations].zeros(DType::i32, {1, 8});
  m.zero_grads();
  m.forward(tok, tok);
  m.backward();
  std::vector<int> want(m.units().size());
  std::iota(want.rbegin(), want.rend(), 0);
  EXPECT_EQ(r.ready, want);
}

// Two steps of a model in a group of one under `stage`: appends each
// micro-batch's loss and each step's gradient norm to *loss; returns the
// parameters after the updates.
std::vector<float> one_step(const char* preset, int stage, DType compute, bool offload, int micro_batches,
                            std::vector<float>* loss) {
  Pools pools;
  const model::ModelConfig cfg = model::model_preset(preset);
  model::Model m(cfg, 2, 8, pools, compute, model::Recompute::none, DataParallel::model_storage(stage));
  DpOptions o;
  o.zero_stage = stage;
  o.bucket_mb = 0.01;  // several buckets
  o.offload_optimizer = offload;
  DataParallel dp(m, nullptr, o, {}, pools);
  dp.init_params(3);
  OwnedTensor tok = pools[MemTag::activations].zeros(DType::i32, {2, 8});
  OwnedTensor tgt = pools[MemTag::activations].zeros(DType::i32, {2, 8});
  for (int64_t i = 0; i < 16; ++i) tok.data_as<int32_t>()[i] = static_cast<int32_t>(i * 7 % 50), tgt.data_as<int32_t>()[i] = static_cast<int32_t>(i * 3 % 50);
  for (int step = 0; step < 2; ++step) {
    dp.zero_grads();
    for (int k = 0; k < micro_batches; ++k) {
      dp.begin_micro_batch(k == micro_batches - 1);
      loss->push_back(m.forward(tok, tgt));
      m.backward(1.f / static_cast<float>(micro_batches));
    }
    const double norm = dp.grad_norm();
    loss->push_back(static_cast<float>(norm));
    dp.update(1e-2, static_cast<float>(norm > 1.0 ? 1.0 / norm : 1.0));
  }
  std::vector<float> out(static_cast<size_t>(m.num_params()));
  dp.gather_master(Tensor(out.data(), DType::f32, {m.num_params()}));
  return out;
}

TEST(DpLayout, EveryStageInAGroupOfOneGivesBitwiseTheSameTraining) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    for (DType compute : {DType::f32, DType::bf16}) {
      if (compute == DType::bf16 && !kernels::bf16_matmul_unsupported_reason().empty()) continue;
      std::vector<float> loss0;
      const std::vector<float> p0 = one_step(preset, 0, compute, false, 1, &loss0);
      for (int stage : {0, 1, 2, 3}) {
        for (bool offload : {false, true}) {
          std::vector<float> loss;
          const std::vector<float> p = one_step(preset, stage, compute, offload, 1, &loss);
          EXPECT_EQ(loss, loss0) << preset << " stage " << stage << " offload " << offload;
          EXPECT_EQ(p, p0) << preset << " stage " << stage << " offload " << offload;
        }
      }
    }
  }
}

// With two micro-batches, stages 2 and 3 add each micro-batch's reduced
// bucket into the shard ((a1 + b1) + (a2 + b2)) where stages 0 and 1 keep
// accumulating in place (((a1 + b1) + a2) + b2): GPT-2's tied embedding gets
// two contributions per micro-batch, so the sums round differently. The
// losses and gradient norms agree to f32 rounding; AdamW divides by sqrt(v),
// which magnifies the rounding of near-zero gradients, so the parameters
// agree to a small fraction of one step (lr = 1e-2).
TEST(DpLayout, GradientAccumulationAgreesAcrossStagesToRounding) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    std::vector<float> loss0;
    const std::vector<float> p0 = one_step(preset, 0, DType::f32, false, 2, &loss0);
    for (int stage : {1, 2, 3}) {
      std::vector<float> loss;
      const std::vector<float> p = one_step(preset, stage, DType::f32, false, 2, &loss);
      ASSERT_EQ(loss.size(), loss0.size());
      for (size_t i = 0; i < loss.size(); ++i) EXPECT_NEAR(loss[i], loss0[i], 1e-6 * std::abs(loss0[i]));
      double max_diff = 0;
      for (size_t i = 0; i < p.size(); ++i) max_diff = std::max(max_diff, static_cast<double>(std::abs(p[i] - p0[i])));
      EXPECT_LT(max_diff, 1e-2 * 1e-2) << preset << " stage " << stage;
    }
  }
}

TEST(DpLayout, StageThreeModelOwnsNoParametersAndStageTwoNoGradients) {
  Pools pools;
  model::Model m3(model::model_preset("gpt2-tiny"), 1, 8, pools, DType::f32, model::Recompute::none,
                  DataParallel::model_storage(3));
  EXPECT_FALSE(m3.params().defined());
  EXPECT_FALSE(m3.grads().defined());
  EXPECT_THROW(m3.init_params(1), Error);
  EXPECT_THROW(m3.param("wte.weight"), Error);
  OwnedTensor tok = pools[MemTag::activations].zeros(DType::i32, {1, 8});
  EXPECT_THROW(m3.forward(tok, tok), Error);  // no hooks to provide the parameters
  EXPECT_EQ(pools.report()[MemTag::params].current, 0u);
  model::Model m2(model::model_preset("gpt2-tiny"), 1, 8, pools, DType::f32, model::Recompute::none,
                  DataParallel::model_storage(2));
  EXPECT_TRUE(m2.params().defined());
  EXPECT_FALSE(m2.grads().defined());
  // A model built for another stage is refused.
  EXPECT_THROW(DataParallel(m2, nullptr, DpOptions{.zero_stage = 1}, {}, pools), Error);
}

}  // namespace
}  // namespace loom::parallel
