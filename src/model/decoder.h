// Decoder: incremental decoding of one sequence (B = 1) with a contiguous KV
// cache, for `loom generate`. It reads a model's flat parameters (shared with
// a Model, or loaded by the caller) and owns only what decoding needs: per
// layer K and V of (1, capacity, NKV, HS) from pools[kv_cache], and one
// layer's activations for a chunk of tokens from pools[activations], laid out
// once.
//
//   Decoder dec(cfg, model.params(), pools);
//   Tensor logits = dec.prefill(prompt);   // (V): next-token logits
//   while (...) logits = dec.decode_step(sample(logits));
//
// Token t of the sequence sits at position t (GPT-2's wpe row, Llama's RoPE
// angle); the blocks are the training ones (family.h) run on cache views,
// with an attention step that reads the cache (decoder.cpp), so the logits
// equal those of Model::forward over the whole sequence.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/memory.h"
#include "model/config.h"
#include "model/params.h"

namespace loom::model {

struct DecoderState;  // cache, activations, weight views (decoder.cpp)

struct DecoderSizes {
  // Tokens the KV cache holds, 1 to cfg.max_seq_len; 0: cfg.max_seq_len. A
  // caller that knows its longest sequence asks for that, so a long-context
  // model does not allocate a cache for its whole context.
  int64_t capacity = 0;
  // Prompts longer than max_chunk are prefilled in chunks of max_chunk tokens
  // (bounds the activations); >= 1, clamped to the capacity.
  int64_t max_chunk = 256;
};

class Decoder {
 public:
  // params: (P) f32 packed per param_specs(cfg); must outlive the decoder.
  Decoder(const ModelConfig& cfg, const Tensor& params, Pools& pools, const DecoderSizes& sizes = {});
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  const ModelConfig& config() const { return cfg_; }
  // Tokens in the cache; the next token goes to this position.
  int64_t position() const { return pos_; }
  int64_t capacity() const { return capacity_; }
  // Empties the cache (a new sequence).
  void reset() { pos_ = 0; }

  // Appends tokens (at least one) to the sequence and returns the logits
  // (V) f32 that follow the last; the view is valid until the next call.
  // More tokens than capacity() - position(), or a token outside [0, V), is
  // a loom::Error (and leaves the cache unchanged).
  Tensor prefill(std::span<const int32_t> tokens);
  Tensor decode_step(int32_t token) { return prefill(std::span<const int32_t>(&token, 1)); }

 private:
  // Runs tokens [pos_, pos_ + T) through the model; T <= max_chunk.
  void forward_chunk(std::span<const int32_t> tokens);

  ModelConfig cfg_;
  std::vector<ParamSpec> specs_;
  int64_t capacity_, max_chunk_;
  int64_t pos_ = 0;
  std::unique_ptr<DecoderState> st_;
};

}  // namespace loom::model
