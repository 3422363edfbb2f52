#include "cli/engine_setup.h"

#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "model/paged_runner.h"

namespace loom::cli {

void add_engine_options(CLI::App& cmd, infer::EngineArgs& e) {
  cmd.add_option("--dtype", e.dtype, "weights and compute: fp32 | bf16 | fp16")->capture_default_str();
  cmd.add_flag("--dequantize", e.dequantize,
               "a quantized GGUF model: dequantize its weights to --dtype at load (default: compute from the "
               "quantized blocks, with fp32 activations)");
  cmd.add_option("--kv-dtype", e.kv_dtype, "KV cache: fp32 | bf16 | fp16")->capture_default_str();
  cmd.add_option("--kv-cache-mb", e.kv_cache_mb, "KV cache memory per model (default: --max-num-seqs sequences of "
                                                 "--max-model-len, at most half the available memory)");
  cmd.add_option("--max-model-len", e.max_model_len, "tokens per sequence, prompt and output (default: the model's "
                                                     "max_seq_len)");
  cmd.add_option("--block-size", e.block_size, "tokens per KV cache block")->capture_default_str();
  cmd.add_option("--max-num-seqs", e.max_num_seqs, "sequences computed together at most")->capture_default_str();
  cmd.add_option("--max-num-batched-tokens", e.max_num_batched_tokens,
                 "tokens per engine step at most (longer prompts are computed in chunks beside the decodes)")
      ->capture_default_str();
}

model::ServingWeights load_weights(const model::ModelDir& dir, const infer::EngineArgs& e, Pools& pools) {
  return model::load_serving_weights(dir, e.compute_dtype(), e.dequantize, "--dtype", pools[MemTag::params]);
}

std::string weights_description(const model::ServingWeights& w, const std::string& dtype) {
  if (!w.quant) return dtype;
  return concat(w.quant->summary(), " matrices in their blocks, the rest ", dtype, "; ", w.bytes() >> 20, " MiB");
}

}  // namespace loom::cli
