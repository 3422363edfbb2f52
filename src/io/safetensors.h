// Hugging Face safetensors files: a bounds-checked reader and an atomic writer.
//
// Layout: u64 little-endian N, N bytes of UTF-8 JSON header
//   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value"}}   (optional)
// then the data buffer; offsets are relative to its start. The reader rejects
// every file the reference implementation (huggingface/safetensors) rejects:
// the tensors must tile the buffer exactly, with no gap, overlap or tail.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace loom::io {

// Largest accepted header, as in the reference implementation.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

struct TensorInfo {
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0;  // [begin, end): bytes of the data buffer
  uint64_t end = 0;
  uint64_t nbytes() const { return end - begin; }
};

// "F32" <-> DType::f32 etc.; an unknown name throws loom::Error listing the
// supported ones.
std::string safetensors_dtype_name(DType t);
DType safetensors_dtype_from_name(const std::string& name);

// An open, fully validated safetensors file. Tensors are read on demand with
// pread into caller memory (not mmap: a file truncated by another process
// would turn an mmap access into SIGBUS; pread turns it into a short read,
// reported as loom::Error). Move-only; closes the file on destruction.
class SafetensorsFile {
 public:
  // Reads and validates the header; throws loom::Error naming the file and
  // the problem for anything malformed.
  static SafetensorsFile open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& o) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& o) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has(const std::string& name) const { return tensors_.count(name) > 0; }
  const TensorInfo& info(const std::string& name) const;  // loom::Error if absent

  // Copies tensor `name` into dst: a contiguous CPU tensor of the same dtype
  // and shape.
  void read(const std::string& name, Tensor dst) const;
  // Copies dst.numel() elements of tensor `name`, flattened, from element
  // `first` on into dst (contiguous CPU, same dtype); the range must lie
  // inside the tensor.
  void read_range(const std::string& name, int64_t first, Tensor dst) const;

 private:
  SafetensorsFile() = default;
  void close();

  std::string path_;
  int fd_ = -1;
  uint64_t file_bytes_ = 0;
  uint64_t data_start_ = 0;  // 8 + N
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` (contiguous CPU tensors, unique names) to path atomically:
// path + ".tmp", fsync, rename. Ordered as the reference writer orders them:
// by dtype descending (I64, F32, I32, BF16, F16, U8), then by name; the
// header is padded with spaces to a multiple of 8 bytes.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// A tensor written part by part: fill(first, out) puts its elements
// [first, first + out.numel()) in out (a 1-D CPU buffer of its dtype).
struct StreamedTensor {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  std::function<void(int64_t first, Tensor out)> fill;
};
// The same file from tensors produced part by part through one buffer of
// about buffer_bytes (at least an element): what a checkpoint of state that
// does not fit in memory (an offloaded run's) writes with.
void write_safetensors(const std::string& path, const std::vector<StreamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata, int64_t buffer_bytes);

}  // namespace loom::io
