// Parameter groups with their own communicators (parallel/dp.h): one group
// over the whole world, the other over pairs of ranks ({0, 1}, {2, 3}, ...;
// at N = 4 the two groups' means differ). After a step every rank's gradient
// of a group's parameter is the mean of exactly its group's ranks' own
// gradients — each rank's own gradient taken from a plain model on that
// rank's data, with no DataParallel — at ZeRO stages 0, 1 and 2; the gradient
// norm counts every parameter once, with its own group's mean; and the update
// leaves a group's parameters equal on exactly its ranks.
//
// Two splits: the embeddings (one whole unit) over the world, and the layer
// norms (a group spread over every layer's unit) over the world, which
// stages 0 and 1 take and stage 2 refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/mpi_env.h"
#include "comm/self_communicator.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/threads.h"
#include "model/config.h"
#include "model/model.h"
#include "parallel/dp.h"
#include "train/optimizer.h"

namespace loom::parallel {
namespace {

using test::world;

constexpr int64_t kBatch = 2, kSeq = 8;
constexpr uint64_t kSeed = 7;

model::ModelConfig tiny() { return model::model_preset("gpt2-tiny"); }

// Rank `rank`'s own tokens and targets.
void fill_rank_data(Tensor tokens, Tensor targets, int rank, int64_t vocab) {
  uint64_t s = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(rank + 1);
  for (Tensor t : {tokens, targets})
    for (int64_t i = 0; i < t.numel(); ++i) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      t.data_as<int32_t>()[i] = static_cast<int32_t>((s >> 11) % static_cast<uint64_t>(vocab));
    }
}

// One forward and backward of `m` on this rank's data.
void run_micro_batch(model::Model& m, Pools& pools) {
  OwnedTensor tokens = pools[MemTag::activations].empty(DType::i32, {kBatch, kSeq});
  OwnedTensor targets = pools[MemTag::activations].empty(DType::i32, {kBatch, kSeq});
  fill_rank_data(tokens, targets, world().rank(), m.config().vocab_size);
  m.forward(tokens, targets);
  m.backward();
}

// This rank's own gradient: a plain model, no DataParallel.
std::vector<float> own_gradient() {
  Pools pools;
  model::Model m(tiny(), kBatch, kSeq, pools);
  m.init_params(kSeed);
  m.zero_grads();
  run_micro_batch(m, pools);
  const float* g = m.grads().data_as<float>();
  return {g, g + m.num_params()};
}

// Every world rank's (P) values, rank r's at [r P, (r + 1) P). Collective.
std::vector<float> from_every_rank(const std::vector<float>& mine) {
  const int64_t P = static_cast<int64_t>(mine.size());
  std::vector<float> all(static_cast<size_t>(P * world().size()));
  world().all_gather(Tensor(all.data(), DType::f32, {P * world().size()}),
                     Tensor(const_cast<float*>(mine.data()), DType::f32, {P}))->wait();
  return all;
}

// The mean over world ranks `ranks` of their values in `all`.
std::vector<double> mean_over(const std::vector<float>& all, size_t P, const std::vector<int>& ranks) {
  std::vector<double> out(P, 0.0);
  for (int r : ranks)
    for (size_t i = 0; i < P; ++i) out[i] += all[static_cast<size_t>(r) * P + i];
  for (double& v : out) v /= static_cast<double>(ranks.size());
  return out;
}

std::vector<int> pair_ranks() {
  const int first = world().rank() / 2 * 2;
  std::vector<int> out{first};
  if (first + 1 < world().size()) out.push_back(first + 1);
  return out;
}

std::vector<int> world_ranks() {
  std::vector<int> out;
  for (int r = 0; r < world().size(); ++r) out.push_back(r);
  return out;
}

// Per flat element: whether it belongs to a parameter `in_world` holds.
std::vector<bool> world_elements(const std::vector<model::ParamSpec>& specs, const ParamPredicate& in_world) {
  std::vector<bool> out;
  for (const model::ParamSpec& s : specs) out.insert(out.end(), static_cast<size_t>(s.numel()), in_world(s));
  return out;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// A model and its DataParallel under `stage` with two groups: `in_world`
// over the world, the rest over the rank's pair.
struct GroupedRun {
  GroupedRun(int stage, const ParamPredicate& in_world)
      : pair(world().split(world().rank() / 2, world().rank(), "pair")),
        m(tiny(), kBatch, kSeq, pools, {.storage = DataParallel::model_storage(stage)}),
        dp(m, world(), no_tp, options(stage, in_world), pools) {
    dp.init_params(kSeed);
  }
  DpOptions options(int stage, const ParamPredicate& in_world) {
    DpOptions o;
    o.zero_stage = stage;
    o.bucket_mb = 0.05;  // several buckets per group
    o.groups = {ParamGroup{"world", world(), in_world},
                ParamGroup{"pair", *pair, [in_world](const model::ParamSpec& p) { return !in_world(p); }}};
    return o;
  }
  std::unique_ptr<comm::Communicator> pair;
  comm::SelfCommunicator no_tp{"tp"};
  Pools pools;
  model::Model m;
  DataParallel dp;
};

ParamPredicate embeddings() { return params_named({"wte.weight", "wpe.weight"}); }
ParamPredicate layer_norms() {
  return [](const model::ParamSpec& p) { return p.name.find("ln_") != std::string::npos; };
}

void expect_group_means_and_norm(int stage, const ParamPredicate& in_world) {
  set_num_threads(1);
  const std::vector<float> all = from_every_rank(own_gradient());
  GroupedRun run(stage, in_world);
  run.dp.zero_grads();
  run.dp.begin_micro_batch(true);
  run_micro_batch(run.m, run.pools);
  const double norm = run.dp.grad_norm();

  const size_t P = static_cast<size_t>(run.m.num_params());
  const std::vector<double> world_mean = mean_over(all, P, world_ranks()), pair_mean = mean_over(all, P, pair_ranks());
  const std::vector<bool> in_world_group = world_elements(run.m.param_specs(), in_world);
  std::vector<double> want(P);
  for (size_t i = 0; i < P; ++i) want[i] = in_world_group[i] ? world_mean[i] : pair_mean[i];
  if (pair_ranks().size() < static_cast<size_t>(world().size())) {
    double apart = 0;  // the two means differ: a wrong communicator would show
    for (size_t i = 0; i < P; ++i) apart = std::max(apart, std::abs(world_mean[i] - pair_mean[i]));
    ASSERT_GT(apart, 1e-3 * max_abs(world_mean));
  }
  // Every piece of this rank's shard of each group holds that group's mean.
  const double tolerance = 1e-5 * max_abs(want);
  int64_t checked = 0;
  for (int g = 0; g < run.dp.num_groups(); ++g) {
    for (const ParamPiece& p : run.dp.group(g).pieces) {
      const Tensor grad = run.dp.update_piece(g, p).grad;
      for (int64_t i = 0; i < p.count; ++i) {
        const size_t at = static_cast<size_t>(p.offset + i);
        ASSERT_EQ(in_world_group[at], g == 0) << "element " << at << " in group " << run.dp.group(g).name;
        ASSERT_NEAR(grad.data_as<float>()[i], want[at], tolerance) << "group " << run.dp.group(g).name << " element "
                                                                     << at << " stage " << stage;
      }
      checked += p.count;
    }
  }
  EXPECT_GT(checked, 0);
  double sum = 0;
  for (double w : want) sum += w * w;
  EXPECT_NEAR(norm, std::sqrt(sum), 1e-5 * std::sqrt(sum)) << "stage " << stage;
}

// After an update a group's parameters are equal on exactly its ranks.
void expect_update_keeps_groups_consistent(int stage, const ParamPredicate& in_world) {
  set_num_threads(1);
  GroupedRun run(stage, in_world);
  train::AdamW adamw(run.dp, {});
  run.dp.zero_grads();
  run.dp.begin_micro_batch(true);
  run_micro_batch(run.m, run.pools);
  run.dp.grad_norm();
  adamw.step(1e-2, 1.f);
  const size_t P = static_cast<size_t>(run.m.num_params());
  std::vector<float> mine(P);
  run.dp.gather_master(Tensor(mine.data(), DType::f32, {static_cast<int64_t>(P)}));
  const std::vector<float> all = from_every_rank(mine);
  const std::vector<bool> in_world_group = world_elements(run.m.param_specs(), in_world);
  const int me = world().rank();
  bool pairs_differ = false;
  for (int r = 0; r < world().size(); ++r) {
    const bool same_pair = r / 2 == me / 2;
    for (size_t i = 0; i < P; ++i) {
      const float theirs = all[static_cast<size_t>(r) * P + i];
      if (in_world_group[i] || same_pair) {
        ASSERT_EQ(theirs, mine[i]) << "rank " << r << " element " << i;
      } else {
        pairs_differ = pairs_differ || theirs != mine[i];
      }
    }
  }
  if (world().size() >= 3) {
    EXPECT_TRUE(pairs_differ) << "the pair group's parameters should differ between pairs";
  }
}

TEST(DpGroups, EachGroupsGradientIsTheMeanOverExactlyItsOwnRanksAtStages0To2) {
  for (int stage : {0, 1, 2}) expect_group_means_and_norm(stage, embeddings());
}

TEST(DpGroups, AGroupSpreadOverEveryLayerIsReducedOverItsOwnRanksAtStages0And1) {
  for (int stage : {0, 1}) expect_group_means_and_norm(stage, layer_norms());
}

TEST(DpGroups, UpdateLeavesEachGroupEqualOnExactlyItsRanks) {
  for (int stage : {0, 1, 2}) expect_update_keeps_groups_consistent(stage, embeddings());
  for (int stage : {0, 1}) expect_update_keeps_groups_consistent(stage, layer_norms());
}

TEST(DpGroups, StageTwoRefusesAGroupThatSplitsAUnitNamingTheParameters) {
  std::string msg;
  try {
    GroupedRun run(2, layer_norms());
  } catch (const Error& e) {
    msg = e.what();
  }
  for (const char* part : {"parallel.zero_stage = 2 needs each unit's parameters in one group", "h.0.ln_1.weight",
                           "share a unit", "stages 0 and 1 allow it"})
    EXPECT_NE(msg.find(part), std::string::npos) << part << " in: " << msg;
}

}  // namespace
}  // namespace loom::parallel
