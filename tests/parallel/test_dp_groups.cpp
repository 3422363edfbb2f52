// Parameter groups' pure layout (parallel/dp_layout.h): assigning every
// parameter to exactly one group, a group's index space over the flat
// buffer, its buckets and pieces; and a DataParallel of two groups in one
// process (the multi-rank proof is tests/parallel/mpi_test_dp_groups.cpp).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/self_communicator.h"
#include "core/error.h"
#include "core/memory.h"
#include "model/config.h"
#include "model/model.h"
#include "model/params.h"
#include "parallel/dp.h"

namespace loom::parallel {
namespace {

struct Layout {
  model::ModelConfig cfg = model::model_preset("gpt2-tiny");
  std::vector<model::ParamSpec> specs = model::param_specs(cfg);
  std::vector<model::Unit> units = model::model_units(cfg, specs);
};

ParamPredicate layer_norms() {
  return [](const model::ParamSpec& p) { return p.name.find("ln_") != std::string::npos; };
}
ParamPredicate not_layer_norms() {
  return [](const model::ParamSpec& p) { return p.name.find("ln_") == std::string::npos; };
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DpGroups, EveryParameterGoesToTheOneGroupHoldingIt) {
  const Layout l;
  comm::SelfCommunicator a("a"), b("b");
  const std::vector<int> g =
      assign_param_groups(l.specs, {{"norms", a, layer_norms()}, {"rest", b, not_layer_norms()}});
  ASSERT_EQ(g.size(), l.specs.size());
  for (size_t i = 0; i < g.size(); ++i) EXPECT_EQ(g[i], layer_norms()(l.specs[i]) ? 0 : 1) << l.specs[i].name;
  for (int v : assign_param_groups(l.specs, {{"dense", a, all_params()}})) EXPECT_EQ(v, 0);
}

TEST(DpGroups, AParameterInTwoGroupsOrInNoneIsAnErrorNamingIt) {
  const Layout l;
  comm::SelfCommunicator a("a");
  const std::string twice =
      error_of([&] { assign_param_groups(l.specs, {{"all", a, all_params()}, {"norms", a, layer_norms()}}); });
  EXPECT_NE(twice.find("parameter 'h.0.ln_1.weight' is in two groups, 'all' and 'norms'"), std::string::npos) << twice;
  const std::string none = error_of([&] { assign_param_groups(l.specs, {{"norms", a, layer_norms()}}); });
  EXPECT_NE(none.find("parameter 'wte.weight' is in no group (groups 'norms')"), std::string::npos) << none;
  const std::string same_name =
      error_of([&] { assign_param_groups(l.specs, {{"x", a, layer_norms()}, {"x", a, not_layer_norms()}}); });
  EXPECT_NE(same_name.find("two parameter groups are named 'x'"), std::string::npos) << same_name;
  EXPECT_NE(error_of([&] { assign_param_groups(l.specs, {{"x", a, ParamPredicate()}}); }).find("no predicate"),
            std::string::npos);
  EXPECT_THROW(assign_param_groups(l.specs, {}), Error);
  // By name: names the model lacks hold nothing.
  const std::vector<int> named = assign_param_groups(
      l.specs, {{"emb", a, params_named({"wte.weight", "wpe.weight", "no.such"})},
                {"rest", a, [](const model::ParamSpec& p) { return p.name != "wte.weight" && p.name != "wpe.weight"; }}});
  EXPECT_EQ(named[0], 0);
  EXPECT_EQ(named[2], 1);
}

TEST(DpGroups, TheGroupOfEveryParameterLaysOutExactlyAsTheFlatBuffer) {
  const Layout l;
  comm::SelfCommunicator a;
  const GroupSpace s = group_space(l.specs, l.units, assign_param_groups(l.specs, {{"dense", a, all_params()}}), 0);
  ASSERT_EQ(s.runs.size(), 1u);
  EXPECT_EQ(s.runs[0].flat, 0);
  EXPECT_EQ(s.numel, model::param_count(l.specs));
  ASSERT_EQ(s.units.size(), l.units.size());
  for (size_t u = 0; u < l.units.size(); ++u) {
    EXPECT_EQ(s.units[u].begin, l.units[u].begin);
    EXPECT_EQ(s.units[u].end, l.units[u].end);
  }
  for (size_t i = 0; i < l.specs.size(); ++i) EXPECT_EQ(s.specs[i].offset, l.specs[i].offset);
  // So its buckets, segments and pieces are the model's.
  for (int stage : {0, 1, 2, 3}) {
    const std::vector<Bucket> mine = make_buckets(s.units, stage, 0.01), model = make_buckets(l.units, stage, 0.01);
    ASSERT_EQ(mine.size(), model.size());
    for (size_t b = 0; b < mine.size(); ++b) EXPECT_EQ(mine[b].begin, model[b].begin);
    const std::vector<Segment> seg = shard_segments(mine, stage, 3, 1);
    const std::vector<ParamPiece> p = group_pieces(seg, s), q = segment_pieces(seg, l.specs);
    ASSERT_EQ(p.size(), q.size());
    for (size_t i = 0; i < p.size(); ++i) EXPECT_EQ(p[i].offset, q[i].offset);
  }
}

// The layer norms sit inside every layer's unit: their group packs them,
// each unit's share one range of it, and the buckets hold only them.
TEST(DpGroups, AGroupSpreadOverUnitsIsPackedAndBucketedInItsOwnIndexSpace) {
  const Layout l;
  comm::SelfCommunicator a;
  const std::vector<int> g = assign_param_groups(l.specs, {{"norms", a, layer_norms()}, {"rest", a, not_layer_norms()}});
  const GroupSpace s = group_space(l.specs, l.units, g, 0);
  int64_t numel = 0;
  for (size_t i = 0; i < l.specs.size(); ++i)
    if (g[i] == 0) numel += l.specs[i].numel();
  EXPECT_EQ(s.numel, numel);
  EXPECT_EQ(s.units[0].numel(), 0);  // the embeddings' unit has no norm
  EXPECT_GT(s.units[1].numel(), 0);
  EXPECT_GT(s.runs.size(), 2u);  // ln_1 and ln_2 of each layer, ln_f
  // Index i of the group is the flat element its run says, in every run.
  for (size_t k = 0; k < s.specs.size(); ++k) {
    int64_t flat = -1;
    for_each_flat_run(s, s.specs[k].offset, 1, [&](int64_t f, int64_t, int64_t) { flat = f; });
    EXPECT_EQ(flat, s.flat[k]) << s.specs[k].name;
  }
  for (int stage : {0, 1, 3}) {
    const std::vector<Bucket> buckets = make_buckets(s.units, stage, 1e-5);  // one unit each
    int64_t covered = 0;
    for (const Bucket& b : buckets) {
      EXPECT_GT(b.numel(), 0);  // units without norms make no bucket
      EXPECT_EQ(b.begin, covered);
      covered = b.end;
    }
    EXPECT_EQ(covered, s.numel);
    // Pieces cut every rank's segments at the norms, at their flat offsets.
    for (const ParamPiece& p : group_pieces(shard_segments(buckets, stage, 2, 1), s)) {
      bool inside = false;
      for (const model::ParamSpec& spec : l.specs)
        inside = inside || (layer_norms()(spec) && p.offset >= spec.offset && p.offset + p.count <= spec.offset + spec.numel());
      EXPECT_TRUE(inside) << "piece at " << p.offset;
    }
  }
  EXPECT_FALSE(is_one_run(s, 0, s.numel));
}

TEST(DpGroups, StagesTwoAndThreeNeedEachUnitInOneGroup) {
  const Layout l;
  comm::SelfCommunicator a;
  const std::vector<ParamGroup> split{{"norms", a, layer_norms()}, {"rest", a, not_layer_norms()}};
  const std::vector<int> g = assign_param_groups(l.specs, split);
  require_whole_units(l.specs, l.units, g, split, 1);
  const std::string msg = error_of([&] { require_whole_units(l.specs, l.units, g, split, 3); });
  EXPECT_NE(msg.find("parallel.zero_stage = 3 needs each unit's parameters in one group, but 'h.0.ln_1.weight' "
                     "(group 'norms') and 'h.0.attn.c_attn.weight' (group 'rest') share a unit"),
            std::string::npos)
      << msg;
  const std::vector<ParamGroup> whole{{"emb", a, params_named({"wte.weight", "wpe.weight"})},
                                      {"rest", a, [](const model::ParamSpec& p) { return p.name.find("wte") != 0 && p.name.find("wpe") != 0; }}};
  require_whole_units(l.specs, l.units, assign_param_groups(l.specs, whole), whole, 3);
}

TEST(DpGroups, DataParallelOfTwoGroupsShardsEachAndRefusesSingleGroupCheckpointViews) {
  Pools pools;
  model::Model m(model::model_preset("gpt2-tiny"), 1, 8, pools, {.storage = DataParallel::model_storage(1)});
  comm::SelfCommunicator alone, a("a"), b("b");
  DpOptions o;
  o.zero_stage = 1;
  o.groups = {{"norms", a, layer_norms()}, {"rest", b, not_layer_norms()}};
  DataParallel dp(m, alone, alone, o, pools);
  ASSERT_EQ(dp.num_groups(), 2);
  EXPECT_EQ(dp.group(0).name, "norms");
  EXPECT_EQ(&dp.group(1).comm.get(), &b);
  EXPECT_EQ(dp.group(0).shard_numel + dp.group(1).shard_numel, m.num_params());  // groups of one rank
  const std::string msg = error_of([&] { dp.segments(); });
  EXPECT_NE(msg.find("views of one parameter group, but this model's parameters are in 2 ('norms', 'rest')"),
            std::string::npos)
      << msg;
  // A solo parameter's piece is found in whichever group holds it, at its
  // flat offset (its index in "rest" is smaller: the norms before it are
  // not there), the whole of it (one rank).
  const std::string name = "h.1.attn.c_attn.weight";
  DpOptions solo = o;
  solo.solo_params = {name};
  Pools pools2;
  model::Model m2(model::model_preset("gpt2-tiny"), 1, 8, pools2, {.storage = DataParallel::model_storage(1)});
  DataParallel with_solo(m2, alone, alone, solo, pools2);
  for (const model::ParamSpec& spec : m2.param_specs())
    if (spec.name == name) {
      const Segment piece = with_solo.solo_piece(name);
      EXPECT_EQ(piece.offset, spec.offset);
      EXPECT_EQ(piece.count, spec.numel());
    }
  // The default: one group "dense" of every parameter over the dp group.
  Pools pools1;
  model::Model m1(model::model_preset("gpt2-tiny"), 1, 8, pools1, {.storage = DataParallel::model_storage(1)});
  DataParallel one(m1, alone, alone, {.zero_stage = 1}, pools1);
  ASSERT_EQ(one.num_groups(), 1);
  EXPECT_EQ(one.group(0).name, "dense");
  EXPECT_EQ(&one.group(0).comm.get(), &alone);
  EXPECT_EQ(one.shard_numel(), m1.num_params());
}

}  // namespace
}  // namespace loom::parallel
