#include "cli/engine_setup.h"

#include <fstream>
#include <vector>

#include "core/dtype.h"
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

OwnedTensor load_weights(const model::ModelDir& dir, const std::string& dtype, const std::string& what,
                         Pools& pools) {
  const std::vector<model::ParamSpec> specs = model::param_specs(dir.config);
  OwnedTensor f32 = pools[MemTag::params].empty(DType::f32, {model::param_count(specs)});
  model::load_model_params(dir, f32);
  return model::params_in_dtype(std::move(f32), precision_dtype(dtype, what), pools[MemTag::params]);
}

}  // namespace loom::cli
