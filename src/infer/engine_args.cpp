#include "infer/engine_args.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/memory.h"

namespace loom::infer {

void EngineArgs::validate() const {
  compute_dtype();
  cache_dtype();
  LOOM_REQUIRE(block_size >= 1 && max_num_seqs >= 1 && max_num_batched_tokens >= 1,
               "--block-size, --max-num-seqs and --max-num-batched-tokens must be >= 1 (given ", block_size, ", ",
               max_num_seqs, ", ", max_num_batched_tokens, ")");
  LOOM_REQUIRE(block_size <= kMaxBlockSize, "--block-size = ", block_size, " is invalid: allowed 1 to ",
               kMaxBlockSize, " tokens");
  LOOM_REQUIRE(max_model_len >= 0, "--max-model-len = ", max_model_len, " is invalid: allowed >= 1 (0: the model's)");
  LOOM_REQUIRE(std::isfinite(kv_cache_mb) && kv_cache_mb >= 0 && kv_cache_mb <= double(1 << 30), "--kv-cache-mb = ",
               kv_cache_mb, " is invalid: allowed 0 (the default) to 2^30 MiB");
}

EngineConfig EngineArgs::config(const model::ModelConfig& cfg) const {
  validate();
  EngineConfig c;
  c.block_size = block_size;
  c.kv_dtype = cache_dtype();
  c.max_model_len = max_model_len > 0 ? std::min(max_model_len, cfg.max_seq_len) : cfg.max_seq_len;
  c.max_num_seqs = max_num_seqs;
  c.max_num_batched_tokens = max_num_batched_tokens;
  c.batch_invariant = batch_invariant;
  // At least one byte when given, so a tiny budget is the engine's error, not its default.
  if (kv_cache_mb > 0) c.kv_cache_bytes = std::max<int64_t>(1, static_cast<int64_t>(kv_cache_mb * (1 << 20)));
  c.kv_memory_limit_bytes = available_memory_bytes() / 2;  // 0 where unknown: no limit
  return c;
}

}  // namespace loom::infer
