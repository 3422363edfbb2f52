// The engine over a runner that is no model (infer::ModelRunner): what the
// engine does on its own (scheduling, block copies, sampling, pooling, the
// end of requests) seen without a forward pass. The runner's logits make
// the next token the row's token + 1 (mod V), its hidden state of a row is
// (token, position, 1, 0), and it records every batch and block copy.
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/tensor.h"
#include "infer/engine.h"

namespace loom::infer {
namespace {

constexpr int64_t kVocab = 16, kWidth = 4;

class CountingRunner final : public ModelRunner {
 public:
  CountingRunner() {
    cfg_.vocab_size = kVocab, cfg_.n_embd = kWidth, cfg_.max_seq_len = 64;
    logits_.resize(static_cast<size_t>(256 * kVocab));
    hidden_.resize(static_cast<size_t>(256 * kWidth));
  }
  const model::ModelConfig& config() const override { return cfg_; }
  void copy_blocks(std::span<const std::pair<int32_t, int32_t>> src_dst) override {
    copies.insert(copies.end(), src_dst.begin(), src_dst.end());
  }
  Tensor step(const model::PagedBatch& b) override {
    batch_tokens.push_back(static_cast<int64_t>(b.tokens.size()));
    std::fill(logits_.begin(), logits_.end(), 0.f);
    for (size_t r = 0; r < b.logit_rows.size(); ++r)
      logits_[r * kVocab + static_cast<size_t>((b.tokens[b.logit_rows[r]] + 1) % kVocab)] = 10.f;
    for (size_t h = 0; h < b.hidden_rows.size(); ++h) {
      const int32_t row = b.hidden_rows[h];
      const float values[kWidth] = {float(b.tokens[row]), float(b.positions[row]), 1.f, 0.f};
      std::copy(values, values + kWidth, hidden_.begin() + static_cast<std::ptrdiff_t>(h * kWidth));
    }
    num_hidden_ = static_cast<int64_t>(b.hidden_rows.size());
    return Tensor(logits_.data(), DType::f32, {static_cast<int64_t>(b.logit_rows.size()), kVocab});
  }
  Tensor hidden() const override {
    return Tensor(const_cast<float*>(hidden_.data()), DType::f32, {num_hidden_, kWidth});
  }
  int64_t kv_cache_bytes() const override { return 0; }

  std::vector<std::pair<int32_t, int32_t>> copies;
  std::vector<int64_t> batch_tokens;  // per step

 private:
  model::ModelConfig cfg_;
  std::vector<float> logits_, hidden_;
  int64_t num_hidden_ = 0;
};

struct Fixture {
  explicit Fixture(int64_t budget = 8) {
    auto r = std::make_unique<CountingRunner>();
    runner = r.get();
    EngineConfig c;
    c.num_blocks = 40, c.block_size = 4, c.max_num_batched_tokens = budget, c.max_num_seqs = 8;
    engine = std::make_unique<Engine>(std::move(r), c, BlockHash{});
  }
  CountingRunner* runner = nullptr;
  std::unique_ptr<Engine> engine;
};

GenerationParams greedy(int64_t max_tokens, int64_t n = 1) {
  GenerationParams p;
  p.sampler.temperature = 0.f;
  p.stop.max_tokens = max_tokens;
  p.n = n;
  return p;
}

TEST(EngineRunner, GreedyTokensFollowTheRunnersLogits) {
  Fixture f;
  const auto out = f.engine->generate({{3}, {14, 9}}, greedy(4));
  EXPECT_EQ(out[0][0].tokens, (std::vector<int32_t>{4, 5, 6, 7}));
  EXPECT_EQ(out[1][0].tokens, (std::vector<int32_t>{10, 11, 12, 13}));
  EXPECT_EQ(out[0][0].finish, FinishReason::length);
}

TEST(EngineRunner, ChunksPromptsWithinTheTokenBudget) {
  Fixture f(8);
  std::vector<int32_t> prompt(20, 1);
  f.engine->generate({prompt}, greedy(2));
  ASSERT_GE(f.runner->batch_tokens.size(), 3u);
  EXPECT_EQ(f.runner->batch_tokens[0], 8);
  EXPECT_EQ(f.runner->batch_tokens[1], 8);
  EXPECT_EQ(f.runner->batch_tokens[2], 4);
}

TEST(EngineRunner, ForkedSequencesCopyTheirSharedPartialBlockBeforeWritingIt) {
  Fixture f;
  const auto out = f.engine->generate({{1, 2, 3, 4, 5, 6}}, greedy(3, 2));  // 6 tokens: the second block is partial
  EXPECT_EQ(out[0][0].tokens, out[0][1].tokens);  // greedy: both the same
  EXPECT_FALSE(f.runner->copies.empty());
  EXPECT_EQ(f.engine->kv().stats().used_blocks, 0);
}

TEST(EngineRunner, PoolsTheHiddenRowsOfEveryChunk) {
  Fixture f(8);
  std::vector<int32_t> prompt;
  for (int32_t t = 0; t < 20; ++t) prompt.push_back(t % kVocab);
  const auto mean = f.engine->embed({prompt}, Pooling::mean);
  double tokens = 0, positions = 0;
  for (int32_t t = 0; t < 20; ++t) tokens += t % kVocab, positions += t;
  EXPECT_EQ(mean[0], (std::vector<float>{float(tokens / 20), float(positions / 20), 1.f, 0.f}));
  const auto last = f.engine->embed({prompt}, Pooling::last);
  EXPECT_EQ(last[0], (std::vector<float>{float(19 % kVocab), 19.f, 1.f, 0.f}));
}

TEST(EngineRunner, NeedsItsKvCacheSizeGiven) {
  // A runner's cache is its own: the engine cannot size it from a model.
  EngineConfig c;
  c.block_size = 4, c.max_num_seqs = 2, c.num_blocks = 3;  // 8 tokens: less than max_seq_len 64
  EXPECT_THROW(Engine(std::make_unique<CountingRunner>(), c, BlockHash{}), loom::Error);
}

}  // namespace
}  // namespace loom::infer
