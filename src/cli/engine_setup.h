// What `loom generate` and `loom serve` both do to start an engine: read the
// memory left on the machine (the KV cache's default share of it) and load a
// model directory's weights in the serving dtype.
#pragma once

#include <cstdint>
#include <string>

#include "core/memory.h"
#include "core/tensor.h"
#include "model/config_json.h"
#include "model/quant_weights.h"

namespace loom::cli {

// MemAvailable of /proc/meminfo in bytes; 0 where it cannot be read.
int64_t available_memory_bytes();

// dir's weights for the engine, in dtype (fp32 | bf16 | fp16; what names the
// flag in the error for another value): a GGUF file's quantized linears in
// their blocks unless dequantize (model/quant_weights.h).
model::ServingWeights load_weights(const model::ModelDir& dir, const std::string& dtype, const std::string& what,
                                   bool dequantize, Pools& pools);
// "fp32", or "q4_K 12, q6_K 3 matrices in their blocks, the rest fp32; 17 MiB".
std::string weights_description(const model::ServingWeights& w, const std::string& dtype);

}  // namespace loom::cli
