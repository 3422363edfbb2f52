// loom plan --serve (plan/serve_plan.h): a device's KV-cache capacity and
// decode bound for GPT-2 124M, worked from the model's sizes by hand.
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/config.h"
#include "model/params.h"
#include "plan/serve_plan.h"

namespace loom::plan {
namespace {

ServeRequest gpt2_on(double memory_gib, double bandwidth) {
  ServeRequest r;
  r.model = model::model_preset("gpt2-124m");
  r.input_len = 100, r.output_len = 60;
  r.cluster = cluster_preset("h100");
  r.cluster.memory_bytes = memory_gib * 1024 * 1024 * 1024;
  r.cluster.memory_bandwidth = bandwidth;
  return r;
}

TEST(ServePlan, CapacityIsTheKvBlocksLeftOverEachSequencesWholeBlocks) {
  const ServeRequest r = gpt2_on(2, 1e11);
  const ServePlan p = plan_serving(r);
  // K and V of 12 layers x 768 channels in bf16 per token.
  EXPECT_EQ(p.kv_bytes_per_token, 2 * 12 * 768 * 2);
  EXPECT_EQ(p.weight_bytes, 2 * model::param_count(r.model));
  const int64_t blocks = static_cast<int64_t>((2.0 * 1024 * 1024 * 1024 - static_cast<double>(p.weight_bytes)) /
                                              (16.0 * 2 * 12 * 768 * 2));
  EXPECT_EQ(p.kv_blocks, blocks);
  EXPECT_EQ(p.sequences_at_once, blocks / 10);    // 160 tokens: 10 blocks
  EXPECT_EQ(p.sequences_on_average, blocks / 9);  // 130 tokens: 9 blocks
}

// One sequence reads every weight matrix once (the tied table as the LM
// head, one embedding row) and its K and V at the mean context of 130
// tokens; many sequences share the weights, so the bound grows with them.
TEST(ServePlan, DecodeBoundIsBandwidthOverTheBytesAStepReads) {
  const ServeRequest r = gpt2_on(2, 1e11);
  const ServePlan p = plan_serving(r);
  const int64_t wpe_and_wte = 1024 * 768 + 50257 * 768;
  const int64_t matrices = model::param_count(r.model) - wpe_and_wte;
  const int64_t one = 2 * (matrices + 768 + 768 + 50257 * 768) + 130 * p.kv_bytes_per_token;
  EXPECT_EQ(p.decode_step_bytes_one, one);
  EXPECT_DOUBLE_EQ(p.decode_one, 1e11 / static_cast<double>(one));
  EXPECT_GT(p.decode_full, 10 * p.decode_one);
}

TEST(ServePlan, WeightsThatDoNotFitLeaveNoSequences) {
  const ServePlan p = plan_serving(gpt2_on(0.1, 1e11));
  EXPECT_EQ(p.kv_blocks, 0);
  EXPECT_EQ(p.sequences_at_once, 0);
  EXPECT_EQ(p.decode_full, 0.0);
  EXPECT_GT(p.decode_one, 0.0);
}

TEST(ServePlan, SequencesLongerThanTheModelAreAClearError) {
  ServeRequest r = gpt2_on(2, 1e11);
  r.input_len = 1000, r.output_len = 100;
  EXPECT_THROW(plan_serving(r), Error);
}

}  // namespace
}  // namespace loom::plan
