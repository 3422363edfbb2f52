// Pipeline partition (parallel/pp_partition.h): the cost model against the
// formula worked by hand, GPT-2 124M splits derived by hand, exact optimality
// and the tie rule against brute force over every contiguous split, and the
// errors for impossible or malformed splits.
#include <gtest/gtest.h>

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
TEST(PpPartition, Gpt2At1024SplitsMatchTheHandDerivation) {
  const model::ModelConfig cfg = model::model_preset("gpt2-124m");
  // 2 stages (a, 12 - a): max(a + e, 16.457 - a); a = 8 gives 8.457, a = 9
  // gives 9 + e: {8, 4}.
  EXPECT_EQ(counts_of(balanced_pp_partition(cfg, 1024, 2)), (std::vector<int64_t>{8, 4}));
  // 3 stages: the last stage's k layers cost k + 4.457, so k = 1 (5.457);
  // the other 11 layers over two stages cost at least 6, reached by {5, 6}
  // (6) and not {6, 5} (6 + e): {5, 6, 1} at 6.
  const PpPartition p3 = balanced_pp_partition(cfg, 1024, 3);
  EXPECT_EQ(counts_of(p3), (std::vector<int64_t>{5, 6, 1}));
  EXPECT_DOUBLE_EQ(p3.max_cost(), 6.0);
  // 4 stages: the last stage alone costs 1 + h = 5.457, so the optimum is
  // 5.457 and any split of 11 layers into three stages of <= 5 reaches it;
  // the tie rule takes the fewest layers first: {1, 5, 5, 1}.
  const PpPartition p4 = balanced_pp_partition(cfg, 1024, 4);
  EXPECT_EQ(counts_of(p4), (std::vector<int64_t>{1, 5, 5, 1}));
  EXPECT_DOUBLE_EQ(p4.max_cost(), 1 + pp_head_cost(cfg, 1024));
  for (const PpPartition* p : {&p3, &p4}) {
    int64_t next = 0;
    for (const PpPartition::Stage& s : p->stages) {
      EXPECT_EQ(s.first, next);
      next += s.count;
    }
    EXPECT_EQ(next, 12);
  }
}

TEST(PpPartition, NegligibleHeadGivesEqualSplitsWhenDivisible) {
  // vocab 2 at C = 64, T = 64: the head is 768 FLOPs against a layer's ~3e5.
  for (model::ModelConfig cfg : {gpt2_with(12, 64, 2), model::model_preset("llama-tiny")}) {
    cfg.n_layer = 12, cfg.vocab_size = 2;
    ASSERT_LT(pp_head_cost(cfg, 64), 0.01);
    for (int stages : {1, 2, 3, 4, 6, 12}) {
      const PpPartition p = balanced_pp_partition(cfg, 64, stages);
      EXPECT_EQ(counts_of(p), std::vector<int64_t>(stages, 12 / stages)) << stages << " stages";
    }
  }
}

TEST(PpPartition, AsManyStagesAsLayersGivesOneLayerEach) {
  const model::ModelConfig cfg = model::model_preset("gpt2-124m");
  const PpPartition p = balanced_pp_partition(cfg, 1024, 12);
  EXPECT_EQ(counts_of(p), std::vector<int64_t>(12, 1));
  EXPECT_DOUBLE_EQ(p.max_cost(), 1 + pp_head_cost(cfg, 1024));
}

// For small models, every contiguous split: none has a lower max cost than
// the balanced one, and the balanced one is the lexicographically first of
// those that tie it. Costs differ per case through C, V, T and family.
TEST(PpPartition, BalancedIsOptimalAndLexicographicallyFirstAgainstBruteForce) {
  struct Case {
    model::ModelConfig cfg;
    int64_t seq_len;
  };
  std::vector<Case> cases;
  for (int64_t n_embd : {32, 64})
    for (int64_t vocab : {2, 300, 2000, 9000})
      for (int64_t seq_len : {16, 64}) cases.push_back({gpt2_with(10, n_embd, vocab), seq_len});
  model::ModelConfig llama = model::model_preset("llama-tiny");
  llama.n_layer = 10;
  cases.push_back({llama, 64});
  llama.vocab_size = 4000;
  cases.push_back({llama, 32});

  for (const Case& c : cases) {
    for (int64_t n_layer = 1; n_layer <= 10; ++n_layer) {
      model::ModelConfig cfg = c.cfg;
      cfg.n_layer = n_layer;
      for (int stages = 1; stages <= std::min<int64_t>(4, n_layer); ++stages) {
        const PpPartition balanced = balanced_pp_partition(cfg, c.seq_len, stages);
        double best = 1e300;
        std::vector<int64_t> first_best, prefix;
        for_each_split(n_layer, stages, prefix, [&](const std::vector<int64_t>& split) {
          const double m = explicit_pp_partition(cfg, c.seq_len, stages, split).max_cost();
          if (m < best) best = m, first_best = split;
        });
        const std::string where = concat("C=", cfg.n_embd, " V=", cfg.vocab_size, " T=", c.seq_len,
                                         " n_layer=", n_layer, " stages=", stages);
        EXPECT_EQ(balanced.max_cost(), best) << where;
        EXPECT_EQ(counts_of(balanced), first_best) << where;
      }
    }
  }
}

TEST(PpPartition, ExplicitSplitCostsMatchTheBalancedOnes) {
  const model::ModelConfig cfg = model::model_preset("gpt2-124m");
  const double e = pp_embedding_cost(cfg, 1024), h = pp_head_cost(cfg, 1024);
  const PpPartition balanced = balanced_pp_partition(cfg, 1024, 3);
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
  EXPECT_EQ(error_of([&] { balanced_pp_partition(cfg, 64, 8); }),
            "parallel.pp x parallel.virtual_stages = 8 stages for model.n_layer = 6 layers: every stage needs at "
            "least one layer");
  EXPECT_NE(error_of([&] { balanced_pp_partition(cfg, 64, 0); }).find("at least 1"), std::string::npos);
  EXPECT_NE(error_of([&] { balanced_pp_partition(cfg, 0, 2); }).find("seq_len = 0"), std::string::npos);
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
