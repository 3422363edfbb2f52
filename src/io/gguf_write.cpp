// Writer: GGUF v3 as llama.cpp's gguf writer lays it out (KVs, tensor infos,
// zero padding to the alignment, tensors packed in info order, each padded),
// written through AtomicFile so a failure leaves no partial file.
#include <array>
#include <cstring>

#include "core/atomic_file.h"
#include "core/error.h"
#include "io/gguf.h"

namespace loom::io {
namespace {

template <typename T>
void append(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

void append_string(std::string& out, std::string_view s) {
  append(out, static_cast<uint64_t>(s.size()));
  out.append(s);
}

uint64_t padding(uint64_t offset, uint64_t alignment) { return (alignment - offset % alignment) % alignment; }

void write_zeros(AtomicFile& file, uint64_t n) {
  static constexpr std::array<char, 4096> kZeros{};
  while (n > 0) {
    const size_t chunk = n < kZeros.size() ? static_cast<size_t>(n) : kZeros.size();
    file.write(kZeros.data(), chunk);
    n -= chunk;
  }
}

bool valid_alignment(uint32_t a) { return a != 0 && (a & (a - 1)) == 0 && a % 8 == 0; }

}  // namespace

void GgufSink::write(const void* data, size_t bytes) {
  if (bytes > expected_ - written_)
    fail(what_, ": the fill function wrote more than the tensor's ", expected_, " bytes");
  file_.write(data, bytes);
  written_ += bytes;
}

GgufWriter::GgufWriter(uint32_t alignment) : alignment_(alignment) {
  LOOM_REQUIRE(valid_alignment(alignment), "GGUF writer: alignment ", alignment,
               " must be a power of two and a multiple of 8");
}

void GgufWriter::add(std::string key, GgufValue value) {
  const std::string what = concat("GGUF writer: key '", key, "'");
  LOOM_REQUIRE(!key.empty(), "GGUF writer: a key must not be empty");
  LOOM_REQUIRE(key.size() <= kGgufMaxKeyBytes, what.substr(0, 80), "... is ", key.size(), " bytes (at most ",
               kGgufMaxKeyBytes, ")");
  for (char c : key) LOOM_REQUIRE(static_cast<unsigned char>(c) < 0x80, what, " is not ASCII");
  LOOM_REQUIRE(kv_index_.count(key) == 0, what, " is added twice");
  gguf_check_known_key(key, value, what);
  if (key == "general.alignment") {
    const auto a = value.as_int<uint32_t>(what);
    LOOM_REQUIRE(a == alignment_, what, " = ", a, " differs from the writer's alignment ", alignment_,
                 ": pass the alignment to the GgufWriter constructor");
  }
  kv_index_.emplace(key, kvs_.size());
  kvs_.push_back({std::move(key), std::move(value)});
}

uint64_t GgufWriter::tensor_bytes(GgmlType type, std::span<const int64_t> dims, const std::string& what) {
  LOOM_REQUIRE(ggml_type_supported(static_cast<uint32_t>(type)), what, ": ",
               ggml_type_describe(static_cast<uint32_t>(type)), " is not supported (loom writes ",
               ggml_supported_type_names(), ")");
  const GgmlTypeTraits& tr = ggml_type_traits(type);
  LOOM_REQUIRE(!dims.empty() && dims.size() <= static_cast<size_t>(kGgufMaxDims), what, " has ", dims.size(),
               " dimensions (GGUF allows 1 to ", kGgufMaxDims, ")");
  int64_t n = 1;
  for (size_t d = 0; d < dims.size(); ++d) {
    LOOM_REQUIRE(dims[d] >= 1, what, ": ne[", d, "] = ", dims[d], " (every dimension must be at least 1)");
    LOOM_REQUIRE(!__builtin_mul_overflow(n, dims[d], &n), what, ": the element count overflows 64 bits");
  }
  LOOM_REQUIRE(dims[0] % tr.block_size == 0, what, ": type ", tr.name, " stores blocks of ", tr.block_size,
               " values, but ne[0] = ", dims[0], " is not a multiple of ", tr.block_size);
  uint64_t nbytes = 0;
  LOOM_REQUIRE(!__builtin_mul_overflow(static_cast<uint64_t>(n / tr.block_size),
                                       static_cast<uint64_t>(tr.block_bytes), &nbytes),
               what, ": the size in bytes overflows 64 bits");
  return nbytes;
}

void GgufWriter::add_tensor_info(Tensor t) {
  const std::string what = concat("GGUF writer: tensor '", t.name, "'");
  LOOM_REQUIRE(!t.name.empty(), "GGUF writer: a tensor name must not be empty");
  LOOM_REQUIRE(t.name.size() <= kGgufMaxTensorNameWrite, what, " name is ", t.name.size(),
               " bytes (llama.cpp takes at most ", kGgufMaxTensorNameWrite, ")");
  LOOM_REQUIRE(tensor_index_.count(t.name) == 0, what, " is added twice");
  tensor_index_.emplace(t.name, tensors_.size());
  tensors_.push_back(std::move(t));
}

void GgufWriter::add_tensor(std::string name, GgmlType type, std::vector<int64_t> dims,
                            std::span<const uint8_t> bytes) {
  const uint64_t nbytes = tensor_bytes(type, dims, concat("GGUF writer: tensor '", name, "'"));
  LOOM_REQUIRE(bytes.size() == nbytes, "GGUF writer: tensor '", name, "' has ", bytes.size(),
               " bytes of data, but its type and dimensions take ", nbytes);
  add_tensor_info({std::move(name), type, std::move(dims), nbytes, bytes, nullptr});
}

void GgufWriter::add_tensor(std::string name, GgmlType type, std::vector<int64_t> dims, TensorFill fill) {
  const uint64_t nbytes = tensor_bytes(type, dims, concat("GGUF writer: tensor '", name, "'"));
  LOOM_REQUIRE(fill != nullptr, "GGUF writer: tensor '", name, "' has no fill function");
  add_tensor_info({std::move(name), type, std::move(dims), nbytes, {}, std::move(fill)});
}

std::string GgufWriter::header_bytes() const {
  const bool write_alignment = alignment_ != kGgufDefaultAlignment && kv_index_.count("general.alignment") == 0;
  std::string out = "GGUF";
  append(out, uint32_t{3});
  append(out, static_cast<uint64_t>(tensors_.size()));
  append(out, static_cast<uint64_t>(kvs_.size() + (write_alignment ? 1 : 0)));
  if (write_alignment) {
    append_string(out, "general.alignment");
    append(out, static_cast<uint32_t>(GgufValueType::u32));
    append(out, alignment_);
  }
  for (const GgufKv& kv : kvs_) {
    append_string(out, kv.key);
    append(out, static_cast<uint32_t>(kv.value.type()));
    out += kv.value.encoding();
  }
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    append_string(out, t.name);
    append(out, static_cast<uint32_t>(t.dims.size()));
    for (int64_t ne : t.dims) append(out, static_cast<uint64_t>(ne));
    append(out, static_cast<uint32_t>(t.type));
    append(out, offset);
    offset += t.nbytes + padding(t.nbytes, alignment_);
  }
  return out;
}

void GgufWriter::write(const std::string& path) const {
  if (kv_index_.count("general.quantization_version") == 0) {
    for (const Tensor& t : tensors_) {
      LOOM_REQUIRE(!ggml_type_is_quantized(t.type), "writing GGUF file '", path, "': tensor '", t.name, "' is ",
                   ggml_type_traits(t.type).name,
                   " but the file has no general.quantization_version (the spec requires it with quantized tensors)");
    }
  }
  if (const auto tokens = kv_index_.find("tokenizer.ggml.tokens"); tokens != kv_index_.end()) {
    const uint64_t n = kvs_[tokens->second].value.array_size();
    for (const char* key : {"tokenizer.ggml.scores", "tokenizer.ggml.token_type"}) {
      const auto it = kv_index_.find(key);
      LOOM_REQUIRE(it == kv_index_.end() || kvs_[it->second].value.array_size() == n, "writing GGUF file '", path,
                   "': ", key, " has ", kvs_[it->second].value.array_size(), " entries but tokenizer.ggml.tokens has ",
                   n);
    }
  }
  const std::string header = header_bytes();
  AtomicFile file(path);
  file.write(header);
  write_zeros(file, padding(header.size(), alignment_));
  for (const Tensor& t : tensors_) {
    if (t.fill) {
      const std::string what = concat("writing GGUF file '", path, "': tensor '", t.name, "'");
      GgufSink sink(file, what, t.nbytes);
      t.fill(sink);
      LOOM_REQUIRE(sink.written() == t.nbytes, what, ": the fill function wrote ", sink.written(), " of its ",
                   t.nbytes, " bytes");
    } else {
      file.write(t.bytes.data(), t.bytes.size());
    }
    write_zeros(file, padding(t.nbytes, alignment_));
  }
  file.commit();
}

}  // namespace loom::io
