// Resharding (train/checkpoint_reshard.h) on hand-built layouts, without
// files or MPI: every element of a saved run's shards holds its identity
// (parameter, global index), and plan_reads must fill each element of each
// new shard from the saved element of the same identity, exactly once, and
// read nothing into vocabulary padding.
#include "train/checkpoint_reshard.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/config.h"
#include "model/params.h"
#include "parallel/dp.h"
#include "train/checkpoint_manifest.h"

namespace loom::train {
namespace {

constexpr int64_t kPadding = -1;

// 12 heads and d_ff = 4 n_embd: tp = 2, 3 and 4 divide them; the vocabulary,
// 64, is padded to 66 rows at tp = 3. Four layers: pipelines of 2 to 4 stages.
model::ModelConfig gpt2_model() {
  model::ModelConfig m = model::model_preset("gpt2-tiny");
  m.n_layer = 4, m.n_embd = 48, m.n_head = 12, m.n_kv_head = 12, m.d_ff = 192, m.vocab_size = 64;
  m.max_seq_len = 16;
  return m;
}

// Untied, grouped-query attention (24 query heads over 12 key/value heads).
model::ModelConfig llama_model() {
  model::ModelConfig m = model::model_preset("llama-tiny");
  m.n_layer = 4, m.n_embd = 48, m.n_head = 24, m.n_kv_head = 12, m.d_ff = 96, m.vocab_size = 64;
  m.max_seq_len = 16;
  return m;
}

// A run's layout: tp and dp sizes, ZeRO stage, the pipeline stages (layer
// ranges, every chunk of every pp rank in stage order; one stage: the whole
// model) and how many dp buckets each stage's flat buffer is cut into.
struct Layout {
  int tp = 1, dp = 1, zero_stage = 1;
  std::vector<model::PpStage> stages = {model::PpStage{}};
  int buckets = 3;
  int ep = 1;  // splits dp: the experts' group is dp / ep ranks

  std::string name() const {
    return concat("tp=", tp, " dp=", dp, " ep=", ep, " zero_stage=", zero_stage, " stages=", stages.size(),
                  " buckets=", buckets);
  }
  // The parameter groups (checkpoint_groups) of a (stage, tp rank, ep rank).
  std::vector<SavedGroup> groups(const model::ModelConfig& cfg, size_t stage, int tp_rank, int ep_rank) const {
    return checkpoint_groups(model::param_specs(cfg, {tp, tp_rank},
                                                stages.size() == 1 ? model::PpStage{} : stages[stage], {ep, ep_rank}),
                             ep);
  }
  // The ranks of group g's dp group: every dp rank for the dense group, the
  // ep rank's dp / ep replicas for the experts.
  int group_size(size_t g) const { return g == 0 ? dp : dp / ep; }
};

// Equal buckets over a flat buffer of P elements (the last takes the rest).
std::vector<parallel::Bucket> buckets_of(int64_t P, int n) {
  std::vector<parallel::Bucket> out;
  for (int b = 0; b < n; ++b) out.push_back({0, 0, P * b / n, b == n - 1 ? P : P * (b + 1) / n});
  return out;
}

// Each flat element's identity in a (stage, tp rank)'s buffer: the
// parameter's number (by name in `names`, so a tied copy shares it) x 2^32 +
// its global index, or kPadding.
std::vector<int64_t> identities(const std::vector<model::ParamSpec>& specs, std::map<std::string, int64_t>& names) {
  std::vector<int64_t> out(static_cast<size_t>(model::param_count(specs)), kPadding);
  for (const model::ParamSpec& spec : specs) {
    const int64_t id = names.emplace(spec.name, static_cast<int64_t>(names.size())).first->second;
    for (const model::ShardRun& run : model::shard_runs(spec))
      for (int64_t i = 0; i < run.count && run.global >= 0; ++i)
        out[spec.offset + run.local + i] = (id << 32) + run.global + i;
  }
  return out;
}

// The packed shard of `segments` cut from a buffer's identities.
std::vector<int64_t> packed(const std::vector<int64_t>& ids, const std::vector<parallel::Segment>& segments) {
  std::vector<int64_t> out;
  for (const parallel::Segment& s : segments) {
    out.resize(std::max<size_t>(out.size(), s.shard_offset + s.count));
    for (int64_t i = 0; i < s.count; ++i) out[s.shard_offset + i] = ids[s.offset + i];
  }
  return out;
}

// A saved run as load_checkpoint sees it, and what each of its shards holds.
struct Saved {
  SavedLayout layout;
  std::vector<std::vector<int64_t>> contents;  // per shard index
};

// The plan fills `expected` (identities, kPadding where nothing is read)
// from the saved shards, each element once, and counts the padding.
void expect_plan(const ReadPlan& plan, const Saved& saved, const std::vector<int64_t>& expected,
                 const std::string& at) {
  std::vector<int64_t> got(expected.size(), kPadding);
  std::vector<int> reads(expected.size(), 0);
  for (const Read& rd : plan.reads) {
    const std::vector<int64_t>& src = saved.contents.at(rd.shard);
    ASSERT_TRUE(rd.count > 0 && rd.src >= 0 && rd.src + rd.count <= static_cast<int64_t>(src.size()) &&
                rd.dst >= 0 && rd.dst + rd.count <= static_cast<int64_t>(got.size()))
        << at << ": a read outside its shards";
    for (int64_t i = 0; i < rd.count; ++i) got[rd.dst + i] = src[rd.src + i], ++reads[rd.dst + i];
  }
  int64_t wrong = 0, padding = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    padding += expected[i] == kPadding;
    const bool ok = expected[i] == kPadding ? reads[i] == 0 : reads[i] == 1 && got[i] == expected[i];
    if (!ok && wrong++ < 3)
      ADD_FAILURE() << at << ": element " << i << " read " << reads[i] << " times, holds " << got[i] << ", expected "
                    << expected[i];
  }
  EXPECT_EQ(wrong, 0) << at;
  EXPECT_EQ(plan.padding, padding) << at;
}

// The run `from` saved: per stage, group, ep rank, tp rank and rank of the
// group a shard of its checkpoint_saved_segments (a ZeRO-1 piece, whatever
// the stage), as save writes them.
Saved save(const model::ModelConfig& cfg, const Layout& from, std::map<std::string, int64_t>& names) {
  Saved s;
  s.layout.tp = from.tp, s.layout.ep = from.ep;
  for (size_t st = 0; st < from.stages.size(); ++st) {
    s.layout.stages.push_back({from.stages[st].first_layer, from.stages[st].n_layers, 0});
    for (int e = 0; e < from.ep; ++e) {
      std::vector<std::vector<SavedGroup>> ranks;  // [tp rank][group]
      for (int r = 0; r < from.tp; ++r) ranks.push_back(from.groups(cfg, st, r, e));
      for (size_t g = 0; g < ranks[0].size(); ++g) {
        if (g == 0 && e > 0) continue;  // the dense group: every ep rank's is the same
        std::vector<std::vector<model::ParamSpec>> specs;
        for (int r = 0; r < from.tp; ++r) specs.push_back(ranks[r][g].specs);
        const int64_t P = model::param_count(specs[0]);
        const int space = add_saved_space(s.layout, {static_cast<int64_t>(st), ranks[0][g].name, e, P}, specs);
        for (int r = 0; r < from.tp; ++r) {
          const std::vector<int64_t> ids = identities(specs[r], names);
          for (int d = 0; d < from.group_size(g); ++d) {
            const auto segments =
                checkpoint_saved_segments(buckets_of(P, from.buckets), from.zero_stage, from.group_size(g), d);
            const std::string file = concat("stage", st, "_", ranks[0][g].name, e, "_tp", r, "_dp", d);
            const int index = add_saved_shard(s.layout, {space, r, file, "", 0}, segments);
            s.contents.resize(index + 1);
            s.contents[index] = packed(ids, segments);
          }
        }
      }
    }
  }
  sort_saved_segments(s.layout);
  return s;
}

// Every element of every new (stage, group, ep rank, tp rank, dp rank)
// shard of `to` is read exactly once, from the saved element of its
// identity; padding is never read, and plan_reads counts it.
void expect_reshards(const model::ModelConfig& cfg, const Layout& from, const Layout& to) {
  std::map<std::string, int64_t> names;
  const Saved saved = save(cfg, from, names);
  const std::string what = concat("saved at ", from.name(), ", read at ", to.name());
  for (size_t st = 0; st < to.stages.size(); ++st) {
    for (int e = 0; e < to.ep; ++e) {
      for (int r = 0; r < to.tp; ++r) {
        const std::vector<SavedGroup> groups = to.groups(cfg, st, r, e);
        for (size_t g = 0; g < groups.size(); ++g) {
          const std::vector<model::ParamSpec>& specs = groups[g].specs;
          const std::vector<int64_t> ids = identities(specs, names);
          for (int d = 0; d < to.group_size(g); ++d) {
            const auto mine = parallel::shard_segments(buckets_of(model::param_count(specs), to.buckets),
                                                       to.zero_stage, to.group_size(g), d);
            expect_plan(plan_reads(specs, mine, saved.layout), saved, packed(ids, mine),
                        concat(what, ", stage ", st, " group ", groups[g].name, " ep rank ", e, " tp rank ", r,
                               " dp rank ", d));
          }
        }
      }
    }
  }
}

TEST(CheckpointReshard, Tp2ShardsAreReadIntoTp1AndTp4) {
  for (const model::ModelConfig& cfg : {gpt2_model(), llama_model()}) {
    const Layout tp2{2, 1};
    expect_reshards(cfg, tp2, Layout{1, 1});
    expect_reshards(cfg, tp2, Layout{4, 1});
    expect_reshards(cfg, tp2, tp2);
  }
}

TEST(CheckpointReshard, PaddedVocabularyRowsAreNeitherReadNorSaved) {
  const model::ModelConfig cfg = gpt2_model();
  ASSERT_NE(model::vocab_per_rank(cfg, 3) * 3, cfg.vocab_size) << "tp = 3 should pad this vocabulary";
  expect_reshards(cfg, Layout{3, 1}, Layout{2, 1});
  expect_reshards(cfg, Layout{3, 1}, Layout{1, 1});
  expect_reshards(cfg, Layout{2, 1}, Layout{3, 1});
}

TEST(CheckpointReshard, Dp2Zero1ShardsAreReadIntoDp3UnderEveryStage) {
  const model::ModelConfig cfg = gpt2_model();
  const Layout dp2{1, 2, 1};
  for (int stage = 0; stage <= 3; ++stage) expect_reshards(cfg, dp2, Layout{1, 3, stage, {model::PpStage{}}, 2});
  expect_reshards(cfg, Layout{1, 3, 0, {model::PpStage{}}, 5}, dp2);  // saved from a stage-0 run
}

TEST(CheckpointReshard, Pp2StagesAreReadIntoPp1AndPp1IntoPp2AndPp3WithTheTiedCopy) {
  const Layout pp1;
  const Layout pp2{1, 1, 1, {{0, 2}, {2, 2}}};
  const Layout pp3{1, 1, 1, {{0, 1}, {1, 2}, {3, 1}}};
  for (const model::ModelConfig& cfg : {gpt2_model(), llama_model()}) {
    expect_reshards(cfg, pp2, pp1);
    expect_reshards(cfg, pp1, pp2);  // GPT-2: the last stage's wte copy is read from the saved wte
    expect_reshards(cfg, pp2, pp3);
  }
}

TEST(CheckpointReshard, ComposedPpTpDpLayoutIsReadIntoAnother) {
  const Layout from{2, 2, 1, {{0, 2}, {2, 2}}};
  const Layout to{4, 3, 1, {{0, 1}, {1, 1}, {2, 1}, {3, 1}}, 2};
  for (const model::ModelConfig& cfg : {gpt2_model(), llama_model()}) {
    expect_reshards(cfg, from, to);
    expect_reshards(cfg, to, from);
  }
}

// A Mixtral-style model of 4 experts, saved under expert parallelism (each
// ep rank's experts a space of their own) and read at other ep, tp, dp and
// pipeline layouts, and the other way round.
TEST(CheckpointReshard, ExpertShardsAreReadAcrossEpTpDpAndPp) {
  model::ModelConfig cfg = llama_model();
  cfg.n_expert = 4, cfg.top_k = 2, cfg.capacity_factor = 1.f;
  const Layout ep2{1, 4, 1, {model::PpStage{}}, 3, 2};
  for (const Layout& to : {Layout{}, Layout{1, 4, 3, {model::PpStage{}}, 2, 4}, Layout{2, 2, 1, {{0, 2}, {2, 2}}, 3, 2},
                           Layout{4, 3, 0, {model::PpStage{}}, 5}, Layout{1, 2, 1, {model::PpStage{}}, 1, 1}}) {
    expect_reshards(cfg, ep2, to);
    expect_reshards(cfg, to, ep2);
  }
}

}  // namespace
}  // namespace loom::train
