// What `loom generate` and `loom serve` both do to start an engine: read the
// memory left on the machine (the KV cache's default share of it) and load a
// model directory's weights in the serving dtype.
#pragma once

#include <cstdint>
#include <string>

#include "core/memory.h"
#include "core/tensor.h"
#include "model/config_json.h"

namespace loom::cli {

// MemAvailable of /proc/meminfo in bytes; 0 where it cannot be read.
int64_t available_memory_bytes();

// dir's weights, converted to dtype (fp32 | bf16 | fp16; what names the flag
// in the error for another value).
OwnedTensor load_weights(const model::ModelDir& dir, const std::string& dtype, const std::string& what,
                         Pools& pools);

}  // namespace loom::cli
