// Data parallelism in one process: the pure bucket and shard layout
// (parallel/dp_layout.h) and the model's unit hooks (every ZeRO stage in a
// group of one giving bitwise the plain model's training:
// tests/train/test_optimizer.cpp; the multi-rank proofs:
// tests/parallel/mpi_test_dp*.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/tensors.h"
#include "comm/self_communicator.h"
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

// Lends parameters and gradient buffers (a model built without them, as
// under ZeRO-3) and records every call.
class HookRecorder : public model::StepHooks {
 public:
  using Call = model::HookEvent::Call;
  HookRecorder(const model::Model& m, Pools& pools) {
    for (const model::Unit& u : m.units()) {
      params.push_back(pools[MemTag::params].zeros(DType::f32, {u.numel()}));
      grads.push_back(pools[MemTag::grads].zeros(DType::f32, {u.numel()}));
    }
  }
  Tensor acquire_params(int unit, model::Pass pass) override {
    events[static_cast<int>(pass)].push_back({Call::acquire_params, unit});
    pass_ = pass;
    return params[static_cast<size_t>(unit)];
  }
  void release_params(int unit) override { events[static_cast<int>(pass_)].push_back({Call::release_params, unit}); }
  Tensor acquire_grads(int unit) override {
    events[1].push_back({Call::acquire_grads, unit});
    return grads[static_cast<size_t>(unit)];
  }
  void grads_ready(int unit) override { events[1].push_back({Call::grads_ready, unit}); }
  std::vector<OwnedTensor> params, grads;
  std::vector<model::HookEvent> events[2];

 private:
  model::Pass pass_ = model::Pass::forward;
};

// Model::hook_events (ZeRO-3's prefetch order, and what loom plan simulates
// DataParallel's buffers with) are the calls a real forward and backward
// make, in order: tied (GPT-2) and untied (Llama) heads, MoE experts' units,
// every recompute policy.
TEST(DpLayout, HookEventsAreTheModelsCallsInOrder) {
  model::ModelConfig moe = model::model_preset("llama-tiny");
  moe.n_expert = 4, moe.top_k = 2;
  for (const model::ModelConfig& cfg : {model::model_preset("gpt2-tiny"), model::model_preset("llama-tiny"), moe})
    for (const model::Recompute r : {model::Recompute::none, model::Recompute::selective, model::Recompute::full}) {
      Pools pools;
      model::Model m(cfg, 1, 8, pools, {.recompute = r, .storage = DataParallel::model_storage(3)});
      HookRecorder rec(m, pools);
      m.set_hooks(&rec);
      OwnedTensor tok = pools[MemTag::activations].zeros(DType::i32, {1, 8});
      m.forward(tok, tok);
      m.backward();
      const std::string what = concat("n_expert ", cfg.n_expert, ", tied ", cfg.tie_embeddings, ", recompute ",
                                      model::recompute_name(r));
      EXPECT_EQ(rec.events[0], model::Model::hook_events(cfg, model::Pass::forward)) << what;
      EXPECT_EQ(rec.events[1], model::Model::hook_events(cfg, model::Pass::backward)) << what;
    }
}

// zero_comm_peak replays hand-made calls: units 0 and 2 in group A, unit 1
// in group B, each group of 2 ranks, f32 gradient buffers (4 bytes).
struct ReplayCase {
  std::vector<model::Unit> units = units_of({10, 20, 30});
  std::vector<Bucket> a = {{.first_unit = 2, .last_unit = 2, .begin = 40, .end = 70},
                           {.first_unit = 0, .last_unit = 0, .begin = 0, .end = 10}};
  std::vector<Segment> a_seg = {{.offset = 40, .count = 15}, {.offset = 0, .count = 5}};
  std::vector<Bucket> b = {{.first_unit = 1, .last_unit = 1, .begin = 10, .end = 30}};
  std::vector<Segment> b_seg = {{.offset = 10, .count = 10}};
  std::vector<int> unit_group = {0, 1, 0};
  // Backward: each unit from the last, its parameters acquired (stage 3
  // only), its gradients acquired (2 and 3), released, then ready.
  static std::vector<model::HookEvent> backward(bool grads) {
    using Call = model::HookEvent::Call;
    std::vector<model::HookEvent> out;
    for (int u = 2; u >= 0; --u) {
      out.push_back({Call::acquire_params, u});
      if (grads) out.push_back({Call::acquire_grads, u});
      out.push_back({Call::release_params, u});
      out.push_back({Call::grads_ready, u});
    }
    return out;
  }
};

// ZeRO 2: a bucket's buffer opens at its first acquire, its piece is
// reduced when it is ready, and the two groups share one window of two
// reductions in flight: 4 (30 + 15 + 20 + 10 + 10 + 5) bytes at the last
// unit, the same after any number of micro-batches. What computes beside
// (unit 1's backward) adds to what is held at that moment.
TEST(DpLayout, ZeroCommPeakReplaysEveryGroupInOneWindow) {
  const ReplayCase c;
  const std::vector<ZeroGroup> groups = {{c.a, c.a_seg, 2}, {c.b, c.b_seg, 2}};
  const auto events = ReplayCase::backward(true);
  for (int mb : {1, 2, 5})
    EXPECT_EQ(zero_comm_peak({}, events, c.units, groups, c.unit_group, 2, mb, 4), 4 * (30 + 15 + 20 + 10 + 10 + 5))
        << mb << " micro-batches";
  const auto beside = [](int unit, bool backward) -> int64_t { return unit == 1 && backward ? 1000 : 0; };
  // Unit 1 computes with unit 2's reduction in flight (4 (30 + 15)) and its own buffer open (4 x 20).
  EXPECT_EQ(zero_comm_peak({}, events, c.units, groups, c.unit_group, 2, 1, 4, beside), 4 * (30 + 15 + 20) + 1000);
}

// ZeRO 0 and 1: only the last micro-batch reduces, each spread bucket from
// its packed copy (ZeroGroup::packed), all held to the step's end; a group
// of one rank reduces nothing.
TEST(DpLayout, ZeroCommPeakHoldsTheLastMicroBatchsPackedReductions) {
  const ReplayCase c;
  const std::vector<int64_t> a_packed = {100, 0}, b_packed = {50};
  const auto events = ReplayCase::backward(false);
  const std::vector<ZeroGroup> groups = {{c.a, c.a_seg, 2, a_packed}, {c.b, c.b_seg, 2, b_packed}};
  const auto beside = [](int unit, bool backward) -> int64_t { return unit == 0 && backward ? 1000 : 0; };
  for (int mb : {1, 3}) {
    EXPECT_EQ(zero_comm_peak({}, events, c.units, groups, c.unit_group, 1, mb, 4), 150);
    EXPECT_EQ(zero_comm_peak({}, events, c.units, groups, c.unit_group, 1, mb, 4, beside), 1150);
  }
  const std::vector<ZeroGroup> alone = {{c.a, c.a_seg, 1, a_packed}, {c.b, c.b_seg, 2, b_packed}};
  EXPECT_EQ(zero_comm_peak({}, events, c.units, alone, c.unit_group, 1, 2, 4), 50);
}

TEST(DpLayout, StageThreeModelOwnsNoParametersAndStageTwoNoGradients) {
  Pools pools;
  model::Model m3(model::model_preset("gpt2-tiny"), 1, 8, pools, {.storage = DataParallel::model_storage(3)});
  EXPECT_FALSE(m3.params().defined());
  EXPECT_FALSE(m3.grads().defined());
  EXPECT_THROW(m3.init_params(1), Error);
  EXPECT_THROW(m3.param("wte.weight"), Error);
  OwnedTensor tok = pools[MemTag::activations].zeros(DType::i32, {1, 8});
  EXPECT_THROW(m3.forward(tok, tok), Error);  // no hooks to provide the parameters
  EXPECT_EQ(pools.report()[MemTag::params].current, 0u);
  model::Model m2(model::model_preset("gpt2-tiny"), 1, 8, pools, {.storage = DataParallel::model_storage(2)});
  EXPECT_TRUE(m2.params().defined());
  EXPECT_FALSE(m2.grads().defined());
  // A model built for another stage is refused.
  comm::SelfCommunicator alone;
  EXPECT_THROW(DataParallel(m2, alone, alone, DpOptions{.zero_stage = 1}, pools), Error);
}

}  // namespace
}  // namespace loom::parallel
