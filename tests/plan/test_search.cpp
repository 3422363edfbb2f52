// loom plan's layout search (plan/search.h): every layout it keeps fits a
// device and reaches the global batch, they come fastest first, and what it
// drops is counted under its reason.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "model/config.h"
#include "plan/search.h"

namespace loom::plan {
namespace {

SearchRequest request(int nodes, int64_t global_batch) {
  return {.model = model::model_preset("gpt2-124m"),
          .seq_len = 1024,
          .global_batch = global_batch,
          .dtype = "bf16",
          .cluster = cluster_preset("h100", nodes),
          .top = 20};
}

int64_t rejected(const SearchResult& s, const std::string& reason) {
  int64_t n = 0;
  for (const Rejected& r : s.rejected)
    if (r.reason.find(reason) != std::string::npos) n += r.count;
  return n;
}

TEST(Search, EveryKeptLayoutFitsReachesTheBatchAndComesFastestFirst) {
  const SearchRequest r = request(2, 64);
  const SearchResult s = search_layouts(r);
  ASSERT_FALSE(s.best.empty());
  EXPECT_LE(s.best.size(), 20u);
  EXPECT_GE(s.considered, s.fitting);
  int64_t dropped = 0;
  for (const Rejected& rej : s.rejected) dropped += rej.count;
  EXPECT_EQ(dropped + s.fitting, s.considered);
  for (size_t i = 0; i < s.best.size(); ++i) {
    const train::RunConfig& c = s.best[i].cfg;
    SCOPED_TRACE(layout_name(c));
    EXPECT_EQ(c.parallel.dp * c.parallel.tp * c.parallel.pp * c.parallel.cp, 16);
    EXPECT_EQ(c.parallel.dp * c.train.micro_batch * c.train.grad_accum, 64);
    EXPECT_LE(s.best[i].peak_bytes, r.cluster.memory_bytes);
    double by_tag = 0;  // the fullest rank's tags, which the table prints, add up to its peak
    for (const TagUsage& u : s.best[i].memory.tags) by_tag += static_cast<double>(u.peak);
    EXPECT_EQ(by_tag, s.best[i].peak_bytes);
    EXPECT_GT(s.best[i].memory[MemTag::activations].peak, 0u);
    EXPECT_LE(c.parallel.tp, 8);
    if (i > 0) {  // fastest first, to within the 0.5 % band the model cannot tell apart
      EXPECT_LE(s.best[i].time.tokens_per_second, 1.006 * s.best[i - 1].time.tokens_per_second);
    }
  }
  EXPECT_GT(rejected(s, "tp > 8 crosses nodes"), 0);
}

TEST(Search, ALayoutThatDoesNotFitIsDroppedForMemory) {
  SearchRequest r = request(1, 8);
  r.cluster.memory_bytes = 1e9;  // 1 GB: GPT-2 124M's AdamW states alone take 2 GB unsharded
  const SearchResult s = search_layouts(r);
  EXPECT_GT(rejected(s, "does not fit a device's memory"), 0);
  for (const Choice& c : s.best) EXPECT_LE(c.peak_bytes, 1e9) << layout_name(c.cfg);
}

TEST(Search, AGlobalBatchNoMeshDividesKeepsNothing) {
  SearchRequest r = request(1, 7);  // 8 devices: dp must divide 7, so dp = 1 and tp x pp x cp = 8
  const SearchResult s = search_layouts(r);
  EXPECT_GT(rejected(s, "dp does not divide the global batch of 7"), 0);
  for (const Choice& c : s.best) EXPECT_EQ(c.cfg.parallel.dp, 1) << layout_name(c.cfg);
}

// A mixture-of-experts model's layouts include expert parallelism: ep
// dividing dp and the experts, each kept one fitting and paying its
// all-to-alls.
TEST(Search, AMixtureOfExpertsModelIsSearchedWithExpertParallelism) {
  SearchRequest r = request(1, 32);
  r.model = model::model_preset("llama-tiny");
  r.model.n_expert = 8, r.model.top_k = 2;
  r.seq_len = 64, r.model.max_seq_len = 64;
  r.top = 100000;
  const SearchResult s = search_layouts(r);
  int with_ep = 0;
  for (const Choice& c : s.best) {
    const train::ParallelConfig& p = c.cfg.parallel;
    if (p.ep == 1) continue;
    ++with_ep;
    SCOPED_TRACE(layout_name(c.cfg));
    EXPECT_EQ(p.dp % p.ep, 0);
    EXPECT_EQ(r.model.n_expert % p.ep, 0);
    EXPECT_GT(c.time.ep, 0.0);
    EXPECT_LE(c.peak_bytes, r.cluster.memory_bytes);
    EXPECT_NE(layout_name(c.cfg).find(concat(" ep ", p.ep)), std::string::npos);
  }
  EXPECT_GT(with_ep, 0);
}

TEST(Search, BadRequestsAreClearErrors) {
  SearchRequest r = request(1, 0);
  EXPECT_THROW(search_layouts(r), Error);
  r = request(1, 8);
  r.dtype = "int8";
  EXPECT_THROW(search_layouts(r), Error);
}

}  // namespace
}  // namespace loom::plan
