// PagedRunner: one forward over a serving step's ragged batch (DESIGN.md §8):
// the N tokens of S sequences concatenated, each at its own position, every
// GEMM over all N rows at once, attention per sequence over K/V kept in the
// paged cache (kernels::paged_attention_forward). The blocks are the training
// ones (family.h) with a paged attention step; the runner owns the KV cache
// (pools[kv_cache]) and one step's activations, laid out once. Every linear
// runs batch invariant (Dims::batch_invariant, unless the sizes say
// otherwise), so a row's logits do not depend on the step's other rows. The
// bookkeeping (which tokens, which slots, which blocks) is the caller's
// (infer::Scheduler and KvCacheManager): this class only computes.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "core/memory.h"
#include "model/config.h"
#include "model/params.h"

namespace loom::model {

class QuantWeights;  // model/quant_weights.h
struct LoraConfig;   // model/lora.h

struct PagedRunnerSizes {
  int64_t num_blocks = 0;       // KV blocks (with the null block 0); >= 2
  int64_t block_size = 16;      // tokens per block
  int64_t max_tokens = 256;     // tokens per step at most (the scheduler's budget)
  int64_t max_logit_rows = 64;  // rows whose logits one step returns at most (the running sequences)
  DType kv_dtype = DType::f32;  // the cache's dtype: f32, bf16 or f16
  // Every linear batch invariant (kernels::linear_forward_invariant); off:
  // the training GEMM (oneDNN), whose rows may change with the step's row count.
  bool batch_invariant = true;
  void validate() const;        // loom::Error naming the field
};

// One step's batch: S sequences, the new tokens of each in order.
struct PagedBatch {
  std::span<const int32_t> tokens;        // (N) the step's tokens, sequence by sequence
  std::span<const int32_t> positions;     // (N) each token's position in its sequence
  std::span<const int64_t> slots;         // (N) where its K/V go: block * block_size + offset
  std::span<const int32_t> query_start;   // (S + 1): sequence s owns rows [query_start[s], query_start[s + 1])
  std::span<const int32_t> seq_lens;      // (S) tokens of s in the cache once this step's are written
  std::span<const int32_t> block_tables;  // (S * max_blocks) row-major: s's physical blocks
  int64_t max_blocks = 0;
  std::span<const int32_t> logit_rows;    // rows (of N) whose next-token logits are wanted, in the order returned
  // Rows (of N) whose final hidden states (after the last norm: what the LM
  // head reads) are wanted, in the order hidden() returns them; for
  // embeddings. Together with logit_rows at most max_logit_rows.
  std::span<const int32_t> hidden_rows = {};
  // (S) the LoRA adapter each sequence runs with (PagedRunner::add_adapter's
  // id; 0: the base alone), or empty: every sequence the base alone.
  std::span<const int32_t> adapters = {};
};

// Bytes of one KV block: every layer's K and V for block_size tokens.
int64_t kv_block_bytes(const ModelConfig& cfg, int64_t block_size, DType kv_dtype);

// The weight bytes one decode step of S sequences reads: every matrix
// once (a quantized linear's blocks, where quant holds it; quant may be
// null), the embedding's (and learned positions') S rows, the tied LM
// head's whole table. What bounds decoding on memory bandwidth, with each
// sequence's K and V (kv_block_bytes per token of its context).
int64_t decode_weight_bytes(const ModelConfig& cfg, DType compute, const QuantWeights* quant, int64_t S);

class PagedRunner {
 public:
  // params: (P) packed per param_specs(cfg), f32, bf16 or f16: the runner
  // computes in that dtype (activations too; GEMMs accumulate in f32 as in
  // training) and returns f32 logits. Must outlive the runner. quant (may be
  // null or empty): the linears it holds are multiplied in their blocks
  // (model/quant_weights.h) and their place in params is never read; params
  // must then be f32. Must outlive the runner too.
  PagedRunner(const ModelConfig& cfg, const Tensor& params, Pools& pools, const PagedRunnerSizes& sizes,
              const QuantWeights* quant = nullptr);
  ~PagedRunner();
  PagedRunner(const PagedRunner&) = delete;
  PagedRunner& operator=(const PagedRunner&) = delete;

  const ModelConfig& config() const { return cfg_; }
  const PagedRunnerSizes& sizes() const { return sizes_; }
  // Bytes of the KV cache (every layer's K and V).
  int64_t kv_cache_bytes() const;
  DType compute_dtype() const { return compute_; }

  // Adds a LoRA adapter (model/lora.h) the runner's steps may apply to any
  // of their sequences, unmerged (PagedBatch::adapters), the base left as it
  // is: adapters (lora_param_count(config(), lora)) f32 in lora_param_specs
  // order, copied in the compute dtype. Returns its id: 1, 2, ... A
  // configuration the model cannot carry (lora_modules' checks) or adapters
  // of another size are a loom::Error.
  int32_t add_adapter(const LoraConfig& lora, const Tensor& adapters);
  int32_t num_adapters() const;

  // Copy-on-write: block dst's K/V become block src's, every layer. Before
  // the step that writes into dst.
  void copy_blocks(std::span<const std::pair<int32_t, int32_t>> src_dst);

  // Writes the step's K/V into their slots, runs the blocks and returns the
  // logits (R, V) f32 of batch.logit_rows (R of them, maybe 0); the view is valid
  // until the next call. Operand errors (sizes, ids, positions, slots) are
  // loom::Errors naming what is wrong.
  Tensor step(const PagedBatch& batch);
  // The last step's final hidden states of batch.hidden_rows: (H, C) f32, in
  // their order; valid until the next call.
  Tensor hidden() const;

 private:
  ModelConfig cfg_;
  PagedRunnerSizes sizes_;
  DType compute_;
  std::vector<ParamSpec> specs_;
  struct State;
  std::unique_ptr<State> st_;
};

}  // namespace loom::model
