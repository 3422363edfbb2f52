#include "cli/engine_setup.h"

#include <fstream>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "model/paged_runner.h"

namespace loom::cli {

int64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

model::ServingWeights load_weights(const model::ModelDir& dir, const std::string& dtype, const std::string& what,
                                   bool dequantize, Pools& pools) {
  return model::load_serving_weights(dir, precision_dtype(dtype, what), dequantize, what, pools[MemTag::params]);
}

std::string weights_description(const model::ServingWeights& w, const std::string& dtype) {
  if (!w.quant) return dtype;
  return concat(w.quant->summary(), " matrices in their blocks, the rest ", dtype, "; ", w.bytes() >> 20, " MiB");
}

}  // namespace loom::cli
