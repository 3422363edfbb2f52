// Whole-model parameter init, import and export over a flat buffer (params.h).
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/ops.h"
#include "model/params.h"

namespace loom::model {
namespace {

// Where a spec's tensor is: the file holding it (nullptr: none) and its name
// there, which in the hf layout may carry transformers' "transformer." prefix
// (when only that one is present).
using FindTensor = std::function<const io::SafetensorsFile*(const std::string& name)>;
std::pair<const io::SafetensorsFile*, std::string> locate(const FindTensor& find, const std::string& name,
                                                          ParamLayout layout) {
  if (const io::SafetensorsFile* f = find(name)) return {f, name};
  if (layout == ParamLayout::hf)
    if (const io::SafetensorsFile* f = find("transformer." + name)) return {f, "transformer." + name};
  return {nullptr, name};
}

// dst (rows, cols) = src (cols, rows)^T
void transpose_into(float* dst, const float* src, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = src[c * rows + r];
}

}  // namespace

Tensor param_view(const Tensor& flat, const ParamSpec& spec) {
  return flat.slice(0, spec.offset, spec.numel()).reshape(spec.shape);
}

void init_params(Tensor flat, const std::vector<ParamSpec>& specs, uint64_t seed) {
  for (const ParamSpec& s : specs) init_param(param_view(flat, s), s, seed);
}

namespace {

// Every spec's tensor, from whichever file `find` gives; `what` names the
// checkpoint in the error of a missing tensor.
void load_params_from(Tensor flat, const std::vector<ParamSpec>& specs, const FindTensor& find,
                      const std::string& what, ParamLayout layout) {
  LOOM_CHECK(flat.numel() == param_count(specs), "flat buffer ", flat.str(), " for ", param_count(specs), " params");
  for (const ParamSpec& s : specs) {
    const auto [found, name] = locate(find, s.name, layout);
    LOOM_REQUIRE(found != nullptr, what, ": tensor '", s.name, "' is missing (the model needs ", specs.size(),
                 " tensors)");
    const io::SafetensorsFile& file = *found;
    const io::TensorInfo& info = file.info(name);
    const bool transposed = layout == ParamLayout::hf && s.hf_transposed;
    const Shape want = transposed ? Shape{s.shape[1], s.shape[0]} : s.shape;
    LOOM_REQUIRE(dtype_is_float(info.dtype), file.path(), ": tensor '", name, "' has dtype ",
                 dtype_name(info.dtype), ": allowed dtypes are F32, BF16 and F16");
    LOOM_REQUIRE(info.shape == want, file.path(), ": tensor '", name, "' has shape ", info.shape.str(),
                 ", expected ", want.str(), " for this model config");
    const Tensor dst = param_view(flat, s);
    if (!transposed && info.dtype == DType::f32) {
      file.read(name, dst);
      continue;
    }
    // Widened to f32 (exact) and / or transposed through a buffer.
    std::vector<float> tmp(static_cast<size_t>(s.numel()));
    const Tensor wide(tmp.data(), DType::f32, want);
    if (info.dtype == DType::f32) {
      file.read(name, wide);
    } else {
      std::vector<uint16_t> low(static_cast<size_t>(s.numel()));
      const Tensor stored(low.data(), info.dtype, want);
      file.read(name, stored);
      kernels::cast(wide, stored);
    }
    if (transposed) transpose_into(dst.data_as<float>(), tmp.data(), s.shape[0], s.shape[1]);
    else kernels::copy(dst, wide.reshape(s.shape));
  }
}

}  // namespace

void load_params(Tensor flat, const std::vector<ParamSpec>& specs, const io::SafetensorsFile& file,
                 ParamLayout layout) {
  const FindTensor find = [&file](const std::string& name) { return file.has(name) ? &file : nullptr; };
  load_params_from(flat, specs, find, file.path(), layout);
}

void load_params(Tensor flat, const std::vector<ParamSpec>& specs, const io::SafetensorsShards& shards,
                 ParamLayout layout) {
  const FindTensor find = [&shards](const std::string& name) { return shards.find(name); };
  load_params_from(flat, specs, find, shards.path(), layout);
}

void save_params(const std::string& path, const std::vector<ParamSpec>& specs, const Tensor& flat, ParamLayout layout,
                 const std::map<std::string, std::string>& metadata) {
  LOOM_CHECK(flat.numel() == param_count(specs), "flat buffer ", flat.str(), " for ", param_count(specs), " params");
  std::vector<std::vector<float>> transposed;  // storage of the Conv1D copies
  transposed.reserve(specs.size());
  std::vector<std::vector<uint16_t>> narrowed;  // bf16 / f16 Conv1D copies
  narrowed.reserve(specs.size());
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const ParamSpec& s : specs) {
    const Tensor src = param_view(flat, s);
    if (layout != ParamLayout::hf || !s.hf_transposed) {
      tensors.emplace_back(s.name, src);
      continue;
    }
    const int64_t rows = s.shape[0], cols = s.shape[1];  // HF holds (cols, rows)
    std::vector<float>& t = transposed.emplace_back(static_cast<size_t>(s.numel()));
    if (src.dtype() == DType::f32) {
      transpose_into(t.data(), src.data_as<float>(), cols, rows);
      tensors.emplace_back(s.name, Tensor(t.data(), DType::f32, {cols, rows}));
      continue;
    }
    // bf16 / f16: transposed through f32 (exact both ways), stored in its dtype.
    std::vector<float> wide(static_cast<size_t>(s.numel()));
    kernels::cast(Tensor(wide.data(), DType::f32, src.shape()), src);
    transpose_into(t.data(), wide.data(), cols, rows);
    std::vector<uint16_t>& low = narrowed.emplace_back(static_cast<size_t>(s.numel()));
    const Tensor out(low.data(), src.dtype(), {cols, rows});
    kernels::cast(out, Tensor(t.data(), DType::f32, {cols, rows}));
    tensors.emplace_back(s.name, out);
  }
  io::write_safetensors(path, tensors, metadata);
}

void save_params_streamed(const std::string& path, const std::vector<ParamSpec>& specs, const FlatReader& read) {
  std::vector<io::StreamedTensor> tensors;
  for (const ParamSpec& s : specs)
    tensors.push_back({s.name, DType::f32, s.shape, [&read, at = s.offset](int64_t first, Tensor out) {
                         read(at + first, out);
                       }});
  io::write_safetensors(path, tensors, {}, int64_t{4} << 20);
}

}  // namespace loom::model
