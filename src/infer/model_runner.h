// ModelRunner: what the engine needs from whatever computes a step (vLLM
// v1's model runner): the step's ragged batch in, the logits of the rows
// asked for out, and the KV blocks it keeps. The engine owns the
// bookkeeping (scheduler, block tables, sampling); a runner only computes.
// PagedModelRunner is the CPU model (model::PagedRunner); tests drive the
// engine with runners that are no model at all, and a device runner plugs in
// here.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>

#include "core/memory.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/paged_runner.h"

namespace loom::infer {

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  // The model's shape (vocab_size, n_embd, max_seq_len are what the engine reads).
  virtual const model::ModelConfig& config() const = 0;
  // Copy-on-write: block dst's K/V become block src's. Before the step that writes dst.
  virtual void copy_blocks(std::span<const std::pair<int32_t, int32_t>> src_dst) = 0;
  // Computes the step (model::PagedBatch says what each row is) and returns
  // the (R, V) f32 logits of batch.logit_rows; valid until the next call.
  virtual Tensor step(const model::PagedBatch& batch) = 0;
  // The last step's final hidden states of batch.hidden_rows, (H, n_embd) f32.
  virtual Tensor hidden() const = 0;
  // Bytes the KV cache holds.
  virtual int64_t kv_cache_bytes() const = 0;
  // LoRA adapters served unmerged (model::PagedRunner::add_adapter): adds
  // one, returning its id (1, 2, ...), which PagedBatch::adapters names. A
  // runner that cannot carry adapters says so (loom::Error).
  virtual int32_t add_adapter(const model::LoraConfig& lora, const Tensor& adapters);
  virtual int32_t num_adapters() const { return 0; }
};

// The CPU model over the paged KV cache.
class PagedModelRunner final : public ModelRunner {
 public:
  PagedModelRunner(const model::ModelConfig& cfg, const Tensor& params, Pools& pools,
                   const model::PagedRunnerSizes& sizes, const model::QuantWeights* quant)
      : runner_(cfg, params, pools, sizes, quant) {}
  const model::ModelConfig& config() const override { return runner_.config(); }
  void copy_blocks(std::span<const std::pair<int32_t, int32_t>> src_dst) override { runner_.copy_blocks(src_dst); }
  Tensor step(const model::PagedBatch& batch) override { return runner_.step(batch); }
  Tensor hidden() const override { return runner_.hidden(); }
  int64_t kv_cache_bytes() const override { return runner_.kv_cache_bytes(); }
  int32_t add_adapter(const model::LoraConfig& lora, const Tensor& adapters) override {
    return runner_.add_adapter(lora, adapters);
  }
  int32_t num_adapters() const override { return runner_.num_adapters(); }

 private:
  model::PagedRunner runner_;
};

}  // namespace loom::infer
