// Decoder (KV cache) against Model::forward over the whole sequence: the
// logits after prefill and after each decode step equal the full forward's
// logits at that position. Tolerance rtol 1e-4, atol 1e-5: the same kernels
// on the same rows, only the GEMM shapes differ (oneDNN may sum in another
// order).
#include <span>
#include <vector>

#include <gtest/gtest.h>

#include "common/compare.h"
#include "common/tensors.h"
#include "core/memory.h"
#include "model/decoder.h"
#include "model/model.h"

namespace loom::model {
namespace {

using namespace loom::test;

std::vector<int32_t> some_tokens(int64_t n, int64_t vocab) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back(static_cast<int32_t>((i * 37 + 11) % vocab));
  return t;
}

// Full forward over prompt_len + steps tokens, then prefill(prompt) and
// `steps` decode steps with prefill chunks of `chunk` tokens.
// capacity: the decoder's (0: the model's max_seq_len).
void expect_decoder_matches_forward(const char* preset, int64_t prompt_len, int64_t steps, int64_t chunk,
                                    int64_t capacity = 0) {
  const ModelConfig cfg = model_preset(preset);
  const int64_t T = prompt_len + steps, V = cfg.vocab_size;
  Pools pools;
  Model model(cfg, 1, T, pools);
  model.init_params(7);
  std::vector<int32_t> tokens = some_tokens(T, V);
  model.forward(i32_view(tokens, {1, T}));
  const std::vector<float> full = to_floats(model.logits());  // (1, T, V)
  auto row = [&](int64_t t) { return std::span<const float>(full).subspan(static_cast<size_t>(t * V), V); };

  Decoder dec(cfg, model.params(), pools, {.capacity = capacity, .max_chunk = chunk});
  Tensor logits = dec.prefill(std::span<const int32_t>(tokens).first(prompt_len));
  EXPECT_ALL_CLOSE(to_floats(logits), row(prompt_len - 1), 1e-4, 1e-5) << "after prefill";
  for (int64_t t = prompt_len; t < T; ++t) {
    logits = dec.decode_step(tokens[t]);
    EXPECT_ALL_CLOSE(to_floats(logits), row(t), 1e-4, 1e-5) << "decode step at position " << t;
  }
  EXPECT_EQ(dec.position(), T);
}

TEST(Decoder, Gpt2PrefillAndDecodeMatchFullForward) { expect_decoder_matches_forward("gpt2-tiny", 5, 6, 256); }
TEST(Decoder, LlamaPrefillAndDecodeMatchFullForward) { expect_decoder_matches_forward("llama-tiny", 5, 6, 256); }
TEST(Decoder, OneTokenPromptsWork) {
  expect_decoder_matches_forward("gpt2-tiny", 1, 4, 256);
  expect_decoder_matches_forward("llama-tiny", 1, 4, 256);
}
TEST(Decoder, ChunkedPrefillMatchesFullForward) {
  expect_decoder_matches_forward("gpt2-tiny", 11, 2, 4);
  expect_decoder_matches_forward("llama-tiny", 11, 2, 4);
}

TEST(Decoder, CacheOfExactlyTheSequenceMatchesFullForward) {
  expect_decoder_matches_forward("gpt2-tiny", 5, 6, 4, 11);
  expect_decoder_matches_forward("llama-tiny", 5, 6, 4, 11);
}

TEST(Decoder, CacheLivesInTheKvCachePool) {
  const ModelConfig cfg = model_preset("llama-tiny");
  Pools pools;
  Model model(cfg, 1, 1, pools);
  model.init_params(1);
  Decoder dec(cfg, model.params(), pools);
  const size_t expected = 2 * cfg.n_layer * cfg.max_seq_len * cfg.kv_dim() * sizeof(float);
  EXPECT_EQ(pools.report()[MemTag::kv_cache].current, expected);
}

// A long-context model (max_seq_len 2^31) decodes with a cache of the
// requested 8 positions: a whole-context cache would be about a terabyte.
TEST(Decoder, CacheHoldsOnlyTheRequestedCapacity) {
  ModelConfig cfg = model_preset("llama-tiny");  // RoPE: no parameter grows with max_seq_len
  cfg.max_seq_len = int64_t{1} << 31;
  Pools pools;
  const std::vector<ParamSpec> specs = param_specs(cfg);
  const OwnedTensor params = pools[MemTag::params].empty(DType::f32, {param_count(specs)});
  init_params(params, specs, 1);
  const int64_t capacity = 8;
  Decoder dec(cfg, params, pools, {.capacity = capacity});
  EXPECT_EQ(dec.capacity(), capacity);
  EXPECT_EQ(pools.report()[MemTag::kv_cache].current, 2 * cfg.n_layer * capacity * cfg.kv_dim() * sizeof(float));
  const std::vector<int32_t> tokens = some_tokens(capacity, cfg.vocab_size);
  dec.prefill(std::span<const int32_t>(tokens).first(5));
  for (int64_t t = 5; t < capacity; ++t) dec.decode_step(tokens[t]);
  expect_error([&] { dec.decode_step(1); }, {"do not fit the KV cache", "8 of 8", "the decoder's capacity"});
}

TEST(Decoder, CapacityBeyondMaxSeqLenIsAnError) {
  const ModelConfig cfg = model_preset("gpt2-tiny");
  Pools pools;
  Model model(cfg, 1, 1, pools);
  expect_error([&] { Decoder(cfg, model.params(), pools, {.capacity = cfg.max_seq_len + 1}); },
               {"decoder capacity 65", "allowed values are 1 to model.max_seq_len = 64"});
}

TEST(Decoder, FullCacheIsAnError) {
  ModelConfig cfg = model_preset("gpt2-tiny");
  cfg.max_seq_len = 4;
  Pools pools;
  Model model(cfg, 1, 1, pools);
  model.init_params(1);
  Decoder dec(cfg, model.params(), pools);
  std::vector<int32_t> prompt = {1, 2, 3, 4};
  dec.prefill(prompt);
  expect_error([&] { dec.decode_step(5); }, {"do not fit the KV cache", "4 of 4"});
  dec.reset();
  expect_error([&] { dec.decode_step(int32_t(cfg.vocab_size)); }, {"token 512", "outside the vocabulary"});
  EXPECT_EQ(dec.position(), 0);
  dec.decode_step(3);
  EXPECT_EQ(dec.position(), 1);
}

}  // namespace
}  // namespace loom::model
