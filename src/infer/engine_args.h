// EngineArgs: the engine's settings as a user gives them, the same for
// `loom generate`, `loom serve` and `loom bench serve` (one set of flags,
// cli/engine_setup.h), and the one place they become an EngineConfig (as
// vLLM's EngineArgs become its engine config). What differs between the
// commands is only what each knows about its requests (generate: how many
// sequences and how long; serve: a model's num_ctx), applied to the args
// before config().
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "infer/engine.h"
#include "model/config.h"

namespace loom::infer {

struct EngineArgs {
  std::string dtype = "fp32";     // weights and compute: fp32 | bf16 | fp16
  std::string kv_dtype = "fp32";  // the KV cache: fp32 | bf16 | fp16
  bool dequantize = false;        // a GGUF file's quantized linears dequantized at load
  double kv_cache_mb = 0;         // 0: max_num_seqs sequences of max_model_len (EngineConfig's rule)
  int64_t max_model_len = 0;      // tokens per sequence; 0: the model's max_seq_len (at most that)
  int64_t block_size = 16;
  int64_t max_num_seqs = 64;
  int64_t max_num_batched_tokens = 512;
  bool batch_invariant = true;    // a request's tokens do not depend on its batch (EngineConfig)

  // loom::Error naming the flag (--block-size, ...) and what is allowed.
  void validate() const;
  DType compute_dtype() const { return precision_dtype(dtype, "--dtype"); }
  DType cache_dtype() const { return precision_dtype(kv_dtype, "--kv-dtype"); }
  // The engine's config for a model; the default KV cache (no kv_cache_mb)
  // takes at most half the memory the machine has left.
  EngineConfig config(const model::ModelConfig& cfg) const;
};

}  // namespace loom::infer
