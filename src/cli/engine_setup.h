// What `loom generate`, `loom serve` and `loom bench serve` share to start an
// engine: one set of engine flags (infer::EngineArgs), the memory left on the
// machine (the KV cache's default share of it), and a model directory's
// weights in the serving dtype.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "core/memory.h"
#include "core/tensor.h"
#include "infer/engine_args.h"
#include "model/config_json.h"
#include "model/quant_weights.h"

namespace loom::cli {

// The flags of infer::EngineArgs (--dtype, --kv-dtype, --dequantize,
// --kv-cache-mb, --max-model-len, --block-size, --max-num-seqs,
// --max-num-batched-tokens), the same on every command that runs an engine.
void add_engine_options(CLI::App& cmd, infer::EngineArgs& e);

// dir's weights for the engine, in e.dtype: a GGUF file's quantized linears
// in their blocks unless e.dequantize (model/quant_weights.h).
model::ServingWeights load_weights(const model::ModelDir& dir, const infer::EngineArgs& e, Pools& pools);
// "fp32", or "q4_K 12, q6_K 3 matrices in their blocks, the rest fp32; 17 MiB".
std::string weights_description(const model::ServingWeights& w, const std::string& dtype);

}  // namespace loom::cli
