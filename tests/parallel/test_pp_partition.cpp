// Pipeline partition (parallel/pp_partition.h): the cost model against the
// formula worked by hand, GPT-2 124M splits derived by hand (one pipeline
// stage per rank and interleaved), the most even rank loads and the tie rule
// against brute force over every contiguous split, and the errors for
// impossible or malformed splits.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/config.h"
#include "parallel/pp_partition.h"

namespace loom::parallel {
namespace {

std::vector<int64_t> counts_of(const PpPartition& p) {
  std::vector<int64_t> counts;
  for (const PpPartition::Stage& s : p.stages) counts.push_back(s.count);
  return counts;
}

// Layers per rank of pp (stage s on rank s % pp).
std::vector<int64_t> rank_layers_of(const PpPartition& p, int pp) {
  std::vector<int64_t> layers(static_cast<size_t>(pp), 0);
  for (size_t s = 0; s < p.stages.size(); ++s) layers[s % static_cast<size_t>(pp)] += p.stages[s].count;
  return layers;
}

std::vector<double> sorted_largest_first(std::vector<double> loads) {
  std::sort(loads.begin(), loads.end(), std::greater<>());
  return loads;
}

// The message of the loom::Error that f throws ("" if none).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Every way to cut n layers into `stages` contiguous stages of >= 1 layer,
// in lexicographic order of the counts.
void for_each_split(int64_t n, int stages, std::vector<int64_t>& prefix,
                    const std::function<void(const std::vector<int64_t>&)>& visit) {
  if (static_cast<int>(prefix.size()) == stages - 1) {
    prefix.push_back(n);
    visit(prefix);
    prefix.pop_back();
    return;
  }
  const int64_t later = stages - static_cast<int64_t>(prefix.size()) - 1;
  for (int64_t c = 1; c <= n - later; ++c) {
    prefix.push_back(c);
    for_each_split(n - c, stages, prefix, visit);
    prefix.pop_back();
  }
}

model::ModelConfig gpt2_with(int64_t n_layer, int64_t n_embd, int64_t vocab) {
  model::ModelConfig cfg = model::model_preset("gpt2-tiny");
  cfg.n_layer = n_layer, cfg.n_embd = n_embd, cfg.d_ff = 4 * n_embd, cfg.vocab_size = vocab;
  return cfg;
}

TEST(PpPartition, Gpt2HeadCostIsSixVCOverALayersFlopsPerToken) {
  const model::ModelConfig cfg = model::model_preset("gpt2-124m");
  const double C = 768, V = 50257, T = 1024;
  // A GPT-2 layer: c_attn C x 3C + 3C, c_proj C x C + C, c_fc C x 4C + 4C,
  // mlp.c_proj 4C x C + C, two LayerNorms 4C: 12 C^2 + 13 C parameters.
  const double layer = 6 * (12 * C * C + 13 * C) + 12 * C * T;
  EXPECT_DOUBLE_EQ(pp_head_cost(cfg, 1024), (6 * V * C + 6 * 2 * C) / layer);
  EXPECT_NEAR(pp_head_cost(cfg, 1024), 4.457, 1e-3);
  // Tied or not, the head GEMM runs: the same cost.
  model::ModelConfig untied = cfg;
  untied.tie_embeddings = false;
  EXPECT_DOUBLE_EQ(pp_head_cost(untied, 1024), pp_head_cost(cfg, 1024));
  // Token and position rows: 2 tables x 2 C.
  EXPECT_DOUBLE_EQ(pp_embedding_cost(cfg, 1024), 4 * C / layer);
  // A longer context makes layers dearer, the head relatively cheaper.
  EXPECT_LT(pp_head_cost(cfg, 4096), pp_head_cost(cfg, 1024));
}

TEST(PpPartition, LlamaLayerCountsItsGqaAndSwigluParameters) {
  const model::ModelConfig cfg = model::model_preset("llama-tiny");
  const double C = 64, KV = 2 * 16, F = 172, V = 512, T = 64;
  // q, o: C x C; k, v: KV x C; gate, up, down: 3 C F; two RMSNorms 2 C.
  const double layer = 6 * (2 * C * C + 2 * KV * C + 3 * C * F + 2 * C) + 12 * C * T;
  EXPECT_DOUBLE_EQ(pp_head_cost(cfg, 64), (6 * V * C + 6 * C) / layer);
  EXPECT_DOUBLE_EQ(pp_embedding_cost(cfg, 64), 2 * C / layer);
}

// 12 layers of cost 1; stage 0 adds e ~ 6e-5, the last stage h ~ 4.457.
// One stage per rank (v = 1): each rank starts with 1 layer, and each further
// layer goes to the least loaded rank, ties to the higher rank.
TEST(PpPartition, Gpt2At1024SplitsMatchTheHandDerivation) {
  const model::ModelConfig cfg = model::model_preset("gpt2-124m");
  const double e = pp_embedding_cost(cfg, 1024), h = pp_head_cost(cfg, 1024);
  // 2 ranks start at (1 + e, 1 + h = 5.457) with 10 layers left. Rank 0 is
  // least until (6 + e, 5.457) (5 + e < 5.457 still takes one), then the two
  // alternate: (6 + e, 6.457) -> (7 + e, 6.457) -> (7 + e, 7.457) ->
  // (8 + e, 7.457) -> (8 + e, 8.457): {8, 4}, the same optimum as the
  // exact min-max split (9 + e > 8.457).
  const PpPartition p2 = balanced_pp_partition(cfg, 1024, 2, 1);
  EXPECT_EQ(counts_of(p2), (std::vector<int64_t>{8, 4}));
  EXPECT_DOUBLE_EQ(p2.max_cost(), 4 + h);
  // 3 ranks start at (1 + e, 1, 5.457); ranks 1 and 0 alternate (1 < 1 + e,
  // so rank 1 first) up to (5 + e, 5, 5.457), then rank 1 (5 is least) takes
  // the twelfth layer: {5, 6, 1}, max 6.
  const PpPartition p3 = balanced_pp_partition(cfg, 1024, 3, 1);
  EXPECT_EQ(counts_of(p3), (std::vector<int64_t>{5, 6, 1}));
  EXPECT_DOUBLE_EQ(p3.max_cost(), 6.0);
  // 4 ranks start at (1 + e, 1, 1, 5.457) with 8 layers left, all of which go
  // to ranks 0..2 since none of them reaches 5.457: in turns rank 2, rank 1
  // (ties to the higher rank), rank 0 (1 + e > 1): (2 + e, 2, 2) after 3,
  // (3 + e, 3, 3) after 6, then ranks 2 and 1: (3 + e, 4, 4). {3, 4, 4, 1}:
  // the head stage alone sets the max, 5.457, and the other three are level
  // within a layer (the old rule left {1, 5, 5, 1}).
  const PpPartition p4 = balanced_pp_partition(cfg, 1024, 4, 1);
  EXPECT_EQ(counts_of(p4), (std::vector<int64_t>{3, 4, 4, 1}));
  EXPECT_DOUBLE_EQ(p4.max_cost(), 1 + h);
  EXPECT_DOUBLE_EQ(p4.stages[0].cost, 3 + e);
  for (const PpPartition* p : {&p2, &p3, &p4}) {
    int64_t next = 0;
    for (const PpPartition::Stage& s : p->stages) {
      EXPECT_EQ(s.first, next);
      next += s.count;
    }
    EXPECT_EQ(next, 12);
  }
}

// With one stage per rank a rank's load is its stage's cost, bit for bit.
TEST(PpPartition, RankLoadsWithOneStagePerRankAreTheStageCosts) {
  const model::ModelConfig cfg = model::model_preset("gpt2-124m");
  for (int pp = 1; pp <= 12; ++pp) {
    const PpPartition p = balanced_pp_partition(cfg, 1024, pp, 1);
    const std::vector<double> loads = p.rank_loads(pp);
    ASSERT_EQ(loads.size(), p.stages.size());
    for (int s = 0; s < pp; ++s) EXPECT_EQ(loads[s], p.stages[s].cost) << "pp " << pp << " stage " << s;
  }
}

// Interleaved: rank r holds stages r, r + pp, ...; rank 0 holds stage 0 (+ e)
// and rank pp - 1 the last stage (+ h ~ 4.457).
TEST(PpPartition, Gpt2At1024InterleavedSplitsBalanceRankLoadsAsDerivedByHand) {
  const model::ModelConfig cfg = model::model_preset("gpt2-124m");
  const double e = pp_embedding_cost(cfg, 1024), h = pp_head_cost(cfg, 1024);
  // pp = 2, v = 2: stages 0, 2 on rank 0 and 1, 3 on rank 1. Ranks start with
  // 2 layers each, (2 + e, 2 + h = 6.457); rank 0 takes layers up to 6 + e,
  // then (7 + e, 6.457) -> (7 + e, 7.457) -> (8 + e, 7.457) -> (8 + e, 8.457):
  // 8 and 4 layers. Rank 0's 8 over stage 0 (1 + e) and stage 2 (1): stage 2
  // first, then turns, stage 0's e sending ties to stage 2: (4, 4). Rank 1's
  // 4 over stage 1 (1) and stage 3 (1 + h): both extra layers to stage 1,
  // (3, 1). So {4, 3, 4, 1}, rank loads (8 + e, 4 + h).
  const PpPartition p22 = balanced_pp_partition(cfg, 1024, 2, 2);
  EXPECT_EQ(counts_of(p22), (std::vector<int64_t>{4, 3, 4, 1}));
  EXPECT_EQ(p22.rank_loads(2), (std::vector<double>{8 + e, 4 + h}));
  // pp = 3, v = 2: ranks start at (2 + e, 2, 2 + h = 6.457); 6 layers go to
  // ranks 1, 0, 1, 0, 1, 0: (5 + e, 5, 6.457). Rank 0: stages 0, 3 -> (2, 3);
  // rank 1: stages 1, 4 -> (2, 3); rank 2: stages 2, 5 -> (1, 1).
  const PpPartition p32 = balanced_pp_partition(cfg, 1024, 3, 2);
  EXPECT_EQ(counts_of(p32), (std::vector<int64_t>{2, 2, 1, 3, 3, 1}));
  EXPECT_EQ(p32.rank_loads(3), (std::vector<double>{5 + e, 5, 2 + h}));
  // pp = 4, v = 2: ranks start at (2 + e, 2, 2, 6.457); 4 layers to ranks 2,
  // 1, 0, 2: (3 + e, 3, 4, 6.457); inside ranks ties go to the later stage.
  const PpPartition p42 = balanced_pp_partition(cfg, 1024, 4, 2);
  EXPECT_EQ(counts_of(p42), (std::vector<int64_t>{1, 1, 2, 1, 2, 2, 2, 1}));
  EXPECT_EQ(p42.rank_loads(4), (std::vector<double>{3 + e, 3, 4, 2 + h}));
  // pp = 4, v = 3: 12 stages of one layer; every rank holds 3.
  const PpPartition p43 = balanced_pp_partition(cfg, 1024, 4, 3);
  EXPECT_EQ(counts_of(p43), std::vector<int64_t>(12, 1));
  EXPECT_EQ(p43.rank_loads(4), (std::vector<double>{3 + e, 3, 3, 3 + h}));
}

// The water-filling property itself, on the real presets: a rank that got
// more than its v layers ends at most one layer above every other rank (it
// was least loaded when it took its last one).
TEST(PpPartition, EveryRankAboveItsMinimumIsWithinOneLayerOfEveryOther) {
  for (const char* preset : {"gpt2-124m", "gpt2-350m", "llama-110m"}) {
    const model::ModelConfig cfg = model::model_preset(preset);
    for (int64_t seq_len : {128, 1024}) {
      for (int v = 1; v <= 3; ++v) {
        for (int pp = 1; pp * v <= cfg.n_layer; ++pp) {
          const PpPartition p = balanced_pp_partition(cfg, seq_len, pp, v);
          const std::vector<double> loads = p.rank_loads(pp);
          const std::vector<int64_t> layers = rank_layers_of(p, pp);
          for (int a = 0; a < pp; ++a) {
            if (layers[a] == v) continue;
            for (int b = 0; b < pp; ++b)
              EXPECT_LE(loads[a] - 1, loads[b]) << preset << " T=" << seq_len << " pp=" << pp << " v=" << v;
          }
        }
      }
    }
  }
}

TEST(PpPartition, NegligibleHeadGivesEqualSplitsWhenDivisible) {
  // vocab 2 at C = 64, T = 64: the head is 768 FLOPs against a layer's ~3e5.
  for (model::ModelConfig cfg : {gpt2_with(12, 64, 2), model::model_preset("llama-tiny")}) {
    cfg.n_layer = 12, cfg.vocab_size = 2;
    ASSERT_LT(pp_head_cost(cfg, 64), 0.01);
    for (int v : {1, 2, 3})
      for (int pp : {1, 2, 3, 4, 6, 12}) {
        if (12 % (pp * v) != 0) continue;
        const PpPartition p = balanced_pp_partition(cfg, 64, pp, v);
        EXPECT_EQ(counts_of(p), std::vector<int64_t>(pp * v, 12 / (pp * v))) << "pp " << pp << " v " << v;
      }
  }
}

TEST(PpPartition, AsManyStagesAsLayersGivesOneLayerEach) {
  const model::ModelConfig cfg = model::model_preset("gpt2-124m");
  for (auto [pp, v] : {std::pair{12, 1}, std::pair{6, 2}, std::pair{4, 3}, std::pair{1, 12}}) {
    const PpPartition p = balanced_pp_partition(cfg, 1024, pp, v);
    EXPECT_EQ(counts_of(p), std::vector<int64_t>(12, 1)) << "pp " << pp << " v " << v;
    EXPECT_DOUBLE_EQ(p.max_cost(), 1 + pp_head_cost(cfg, 1024));
  }
}

// For small models, every contiguous split of n_layer into pp x v stages,
// costed by explicit_pp_partition: (a) none has a smaller maximum rank load
// than the balanced split; (b) none has rank loads sorted largest first that
// are lexicographically smaller; (c) none with the same load on every rank
// has a cheaper dearest stage; and (d) the tie rule: among the splits with
// the least sorted loads, the balanced one's layers per rank are
// lexicographically least (extra layers on later ranks). A rank's load
// depends on its layer count alone (rank_loads), so every comparison is
// exact. Costs differ per case through C, V, T and family.
TEST(PpPartition, BalancedHasTheMostEvenRankLoadsAgainstBruteForce) {
  struct Case {
    model::ModelConfig cfg;
    int64_t seq_len;
  };
  std::vector<Case> cases;
  for (int64_t n_embd : {32, 64})
    for (int64_t vocab : {2, 300, 2000, 9000})
      for (int64_t seq_len : {16, 64}) cases.push_back({gpt2_with(10, n_embd, vocab), seq_len});
  model::ModelConfig llama = model::model_preset("llama-tiny");
  cases.push_back({llama, 64});
  llama.vocab_size = 4000;
  cases.push_back({llama, 32});

  int64_t splits_seen = 0;
  for (const Case& c : cases) {
    for (int v = 1; v <= 3; ++v) {
      for (int64_t n_layer = 1; n_layer <= 12; ++n_layer) {
        model::ModelConfig cfg = c.cfg;
        cfg.n_layer = n_layer;
        for (int pp = 1; pp <= 4 && pp * v <= n_layer; ++pp) {
          const int stages = pp * v;
          const PpPartition balanced = balanced_pp_partition(cfg, c.seq_len, pp, v);
          const std::vector<double> loads = balanced.rank_loads(pp);
          double least_max = 1e300, least_stage_max = 1e300;
          std::vector<double> least_sorted(static_cast<size_t>(pp), 1e300);
          std::vector<int64_t> first_layers, prefix;
          for_each_split(n_layer, stages, prefix, [&](const std::vector<int64_t>& split) {
            ++splits_seen;
            const PpPartition p = explicit_pp_partition(cfg, c.seq_len, stages, split);
            const std::vector<double> l = p.rank_loads(pp), sorted = sorted_largest_first(l);
            least_max = std::min(least_max, sorted[0]);
            if (sorted < least_sorted) least_sorted = sorted, first_layers.clear();
            if (sorted == least_sorted) {
              const std::vector<int64_t> layers = rank_layers_of(p, pp);
              if (first_layers.empty() || layers < first_layers) first_layers = layers;
            }
            if (l == loads) least_stage_max = std::min(least_stage_max, p.max_cost());
          });
          const std::string where = concat("C=", cfg.n_embd, " V=", cfg.vocab_size, " T=", c.seq_len,
                                           " n_layer=", n_layer, " pp=", pp, " v=", v);
          EXPECT_EQ(sorted_largest_first(loads)[0], least_max) << where;  // (a)
          EXPECT_EQ(sorted_largest_first(loads), least_sorted) << where;  // (b)
          EXPECT_EQ(balanced.max_cost(), least_stage_max) << where;       // (c)
          EXPECT_EQ(rank_layers_of(balanced, pp), first_layers) << where; // (d)
        }
      }
    }
  }
  EXPECT_GT(splits_seen, 10000);
}

TEST(PpPartition, ExplicitSplitCostsMatchTheBalancedOnes) {
  const model::ModelConfig cfg = model::model_preset("gpt2-124m");
  const double e = pp_embedding_cost(cfg, 1024), h = pp_head_cost(cfg, 1024);
  const PpPartition balanced = balanced_pp_partition(cfg, 1024, 3, 1);
  const PpPartition same = explicit_pp_partition(cfg, 1024, 3, counts_of(balanced));
  ASSERT_EQ(same.stages.size(), balanced.stages.size());
  for (size_t s = 0; s < same.stages.size(); ++s) {
    EXPECT_EQ(same.stages[s].first, balanced.stages[s].first);
    EXPECT_EQ(same.stages[s].count, balanced.stages[s].count);
    EXPECT_EQ(same.stages[s].cost, balanced.stages[s].cost);
  }
  const PpPartition p = explicit_pp_partition(cfg, 1024, 3, {2, 7, 3});
  EXPECT_DOUBLE_EQ(p.stages[0].cost, 2 + e);
  EXPECT_DOUBLE_EQ(p.stages[1].cost, 7);
  EXPECT_DOUBLE_EQ(p.stages[2].cost, 3 + h);
  EXPECT_EQ(p.stages[2].first, 9);
  // One stage holds the embedding and the head.
  EXPECT_DOUBLE_EQ(explicit_pp_partition(cfg, 1024, 1, {12}).stages[0].cost, 12 + e + h);
}

TEST(PpPartition, MoreStagesThanLayersIsAnErrorSayingEachStageNeedsALayer) {
  model::ModelConfig cfg = model::model_preset("gpt2-tiny");
  cfg.n_layer = 6;
  EXPECT_EQ(error_of([&] { balanced_pp_partition(cfg, 64, 8, 1); }),
            "parallel.pp x parallel.virtual_stages = 8 stages for model.n_layer = 6 layers: every stage needs at "
            "least one layer");
  EXPECT_EQ(error_of([&] { balanced_pp_partition(cfg, 64, 4, 2); }),
            "parallel.pp x parallel.virtual_stages = 8 stages for model.n_layer = 6 layers: every stage needs at "
            "least one layer");
  EXPECT_EQ(error_of([&] { balanced_pp_partition(cfg, 64, 3, 2); }), "");
  const std::string no_pp = error_of([&] { balanced_pp_partition(cfg, 64, 0, 1); });
  EXPECT_NE(no_pp.find("parallel.pp = 0"), std::string::npos) << no_pp;
  EXPECT_NE(no_pp.find("at least 1"), std::string::npos) << no_pp;
  const std::string no_v = error_of([&] { balanced_pp_partition(cfg, 64, 2, 0); });
  EXPECT_NE(no_v.find("parallel.virtual_stages = 0"), std::string::npos) << no_v;
  EXPECT_NE(no_v.find("at least 1"), std::string::npos) << no_v;
  EXPECT_NE(error_of([&] { balanced_pp_partition(cfg, 0, 2, 1); }).find("seq_len = 0"), std::string::npos);
}

TEST(PpPartition, MalformedExplicitSplitsAreErrorsNamingWhatIsWrong) {
  model::ModelConfig cfg = model::model_preset("gpt2-tiny");
  cfg.n_layer = 6;
  const std::string count = error_of([&] { explicit_pp_partition(cfg, 64, 3, {3, 3}); });
  EXPECT_NE(count.find("parallel.pp_layers has 2 entries"), std::string::npos) << count;
  EXPECT_NE(count.find("= 3 stages"), std::string::npos) << count;
  const std::string zero = error_of([&] { explicit_pp_partition(cfg, 64, 3, {3, 0, 3}); });
  EXPECT_NE(zero.find("parallel.pp_layers[1] = 0"), std::string::npos) << zero;
  EXPECT_NE(zero.find("at least one layer"), std::string::npos) << zero;
  const std::string negative = error_of([&] { explicit_pp_partition(cfg, 64, 3, {-1, 4, 3}); });
  EXPECT_NE(negative.find("parallel.pp_layers[0] = -1"), std::string::npos) << negative;
  const std::string sum = error_of([&] { explicit_pp_partition(cfg, 64, 3, {2, 2, 3}); });
  EXPECT_NE(sum.find("sums to 7 layers but model.n_layer = 6"), std::string::npos) << sum;
}

}  // namespace
}  // namespace loom::parallel
