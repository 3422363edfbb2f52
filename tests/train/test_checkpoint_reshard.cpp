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

  std::string name() const {
    return concat("tp=", tp, " dp=", dp, " zero_stage=", zero_stage, " stages=", stages.size(), " buckets=", buckets);
  }
  std::vector<model::ParamSpec> specs(const model::ModelConfig& cfg, size_t stage, int tp_rank) const {
    return model::param_specs(cfg, {tp, tp_rank}, stages.size() == 1 ? model::PpStage{} : stages[stage]);
  }
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

// The run `from` saved: per stage, tp rank and dp rank a shard of its
// checkpoint_saved_segments (a ZeRO-1 piece, whatever the stage), as save
// writes them.
Saved save(const model::ModelConfig& cfg, const Layout& from, std::map<std::string, int64_t>& names) {
  Saved s;
  s.layout.tp = from.tp;
  for (size_t st = 0; st < from.stages.size(); ++st) {
    std::vector<std::vector<model::ParamSpec>> ranks;
    for (int r = 0; r < from.tp; ++r) ranks.push_back(from.specs(cfg, st, r));
    const int64_t P = model::param_count(ranks[0]);
    s.layout.stages.push_back({from.stages[st].first_layer, from.stages[st].n_layers, P});
    add_saved_stage_specs(s.layout, ranks);
    for (int r = 0; r < from.tp; ++r) {
      const std::vector<int64_t> ids = identities(ranks[r], names);
      for (int d = 0; d < from.dp; ++d) {
        const auto segments = checkpoint_saved_segments(buckets_of(P, from.buckets), from.zero_stage, from.dp, d);
        const std::string file = concat("stage", st, "_tp", r, "_dp", d);
        const int index = add_saved_shard(s.layout, {static_cast<int64_t>(st), r, file, "", 0}, segments);
        s.contents.resize(index + 1);
        s.contents[index] = packed(ids, segments);
      }
    }
  }
  sort_saved_segments(s.layout);
  return s;
}

// Every element of every new (stage, tp rank, dp rank) shard of `to` is read
// exactly once, from the saved element of its identity; padding is never
// read, and plan_reads counts it.
void expect_reshards(const model::ModelConfig& cfg, const Layout& from, const Layout& to) {
  std::map<std::string, int64_t> names;
  const Saved saved = save(cfg, from, names);
  const std::string what = concat("saved at ", from.name(), ", read at ", to.name());
  for (size_t st = 0; st < to.stages.size(); ++st) {
    for (int r = 0; r < to.tp; ++r) {
      const std::vector<model::ParamSpec> specs = to.specs(cfg, st, r);
      const std::vector<int64_t> ids = identities(specs, names);
      for (int d = 0; d < to.dp; ++d) {
        const auto mine = parallel::shard_segments(buckets_of(model::param_count(specs), to.buckets), to.zero_stage,
                                                   to.dp, d);
        const std::vector<int64_t> expected = packed(ids, mine);
        std::vector<int64_t> got(expected.size(), kPadding);
        std::vector<int> reads(expected.size(), 0);
        const ReadPlan plan = plan_reads(specs, mine, saved.layout);
        for (const Read& rd : plan.reads) {
          const std::vector<int64_t>& src = saved.contents.at(rd.shard);
          ASSERT_TRUE(rd.count > 0 && rd.src >= 0 && rd.src + rd.count <= static_cast<int64_t>(src.size()) &&
                      rd.dst >= 0 && rd.dst + rd.count <= static_cast<int64_t>(got.size()))
              << what << ": a read outside its shards";
          for (int64_t i = 0; i < rd.count; ++i) got[rd.dst + i] = src[rd.src + i], ++reads[rd.dst + i];
        }
        const std::string at = concat(what, ", stage ", st, " tp rank ", r, " dp rank ", d);
        int64_t wrong = 0, padding = 0;
        for (size_t i = 0; i < expected.size(); ++i) {
          padding += expected[i] == kPadding;
          const bool ok = expected[i] == kPadding ? reads[i] == 0 : reads[i] == 1 && got[i] == expected[i];
          if (!ok && wrong++ < 3)
            ADD_FAILURE() << at << ": element " << i << " read " << reads[i] << " times, holds " << got[i]
                          << ", expected " << expected[i];
        }
        EXPECT_EQ(wrong, 0) << at;
        EXPECT_EQ(plan.padding, padding) << at;
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

}  // namespace
}  // namespace loom::train
