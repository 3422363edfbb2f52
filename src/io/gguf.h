// GGUF files (ggml's docs/gguf.md, versions 3 and 2): a reader that validates
// every field before it trusts it, and an atomic writer.
//
// Layout (all little-endian):
//   "GGUF", u32 version, u64 tensor_count, u64 kv_count,
//   kv_count x  { string key, u32 value_type, value },
//   tensor_count x { string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type,
//                    u64 offset },
//   zero padding to general.alignment (default 32), then the data section:
//   each tensor at data_start + offset, offset a multiple of the alignment.
// A string is u64 length + bytes; an array is u32 element type, u64 count,
// the elements. Dimensions are in ggml order: ne[0] varies fastest (a
// row-major (rows, cols) matrix is ne = {cols, rows}).
//
// What the reader accepts beyond the spec's words, and why:
//  * versions 2 and 3 (same layout; 3 only allowed big-endian files, which
//    are refused here: a version that reads as 0x03000000 says so);
//  * tensor names of at most 64 bytes (the spec's limit; llama.cpp itself
//    takes at most 63, which is what GgufWriter writes);
//  * arrays of arrays nested at most kGgufMaxArrayDepth deep (the spec sets
//    no depth; a bound keeps a crafted file from exhausting the stack);
//  * no zero dimension: an empty tensor holds no weights, and a zero
//    dimension is the shape of known division-by-zero advisories;
//  * general.alignment a power of two and a multiple of 8 (the spec says a
//    multiple of 8; mmap'd tensor data must be aligned to it);
//  * tensors anywhere in the data section at aligned offsets, not
//    overlapping (llama.cpp further wants them packed in info order: the
//    writer packs them so).
// Memory: metadata values are copied (each value's bytes once: no reader
// structure costs more than a small multiple of the file bytes that
// describe it), tensor data is mmap'd read-only and never copied. As with
// any mmap, another process truncating the file while it is open turns an
// access to the lost pages into SIGBUS.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom {
class AtomicFile;
}

namespace loom::io {

inline constexpr uint32_t kGgufDefaultAlignment = 32;
inline constexpr int kGgufMaxDims = 4;                 // GGML_MAX_DIMS
inline constexpr size_t kGgufMaxTensorNameRead = 64;   // the spec's limit
inline constexpr size_t kGgufMaxTensorNameWrite = 63;  // llama.cpp's (GGML_MAX_NAME - 1)
inline constexpr size_t kGgufMaxKeyBytes = 65535;
inline constexpr int kGgufMaxArrayDepth = 4;

// Tensor types loom reads and writes (ggml's numbering). Others (q8_1, the
// iq* types, integer and f64 tensors) are refused with their number.
enum class GgmlType : uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q2_K = 10,
  q3_K = 11,
  q4_K = 12,
  q5_K = 13,
  q6_K = 14,
  q8_K = 15,
  bf16 = 30,
};

// A block of block_size consecutive values (along ne[0]) takes block_bytes.
struct GgmlTypeTraits {
  std::string_view name;  // "q4_K"
  int64_t block_size;
  int64_t block_bytes;
};
// True for the types above.
bool ggml_type_supported(uint32_t type);
// "f32, f16, bf16, q4_0, ...".
std::string ggml_supported_type_names();
// loom::Error for an unsupported type, naming its number (and ggml's name
// for it where it has one) and the supported types.
const GgmlTypeTraits& ggml_type_traits(GgmlType type);
// "q4_K", or "type 16 (iq2_xxs)", "type 4" for types loom does not support.
std::string ggml_type_describe(uint32_t type);
bool ggml_type_is_quantized(GgmlType type);

// llama.cpp's general.file_type (enum llama_ftype): what most of a file's
// matrices are stored as. The values loom writes, and the ones it names.
enum class GgufFileType : uint32_t {
  all_f32 = 0,
  mostly_f16 = 1,
  mostly_q4_0 = 2,
  mostly_q4_1 = 3,
  mostly_q8_0 = 7,
  mostly_q5_0 = 8,
  mostly_q5_1 = 9,
  mostly_q2_K = 10,
  mostly_q4_K_S = 14,
  mostly_q4_K_M = 15,
  mostly_q5_K_S = 16,
  mostly_q5_K_M = 17,
  mostly_q6_K = 18,
  mostly_bf16 = 32,
};
// ollama's name of a general.file_type (its FileType.String): "F32", "Q4_K_M", ...;
// "unknown" for a number llama.cpp does not define.
std::string_view gguf_file_type_name(uint32_t file_type);

enum class GgufValueType : uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};
// "u8", ..., "bool", "string", "array"; "type 13" for an unknown number.
std::string gguf_value_type_name(uint32_t type);
inline std::string gguf_value_type_name(GgufValueType type) {
  return gguf_value_type_name(static_cast<uint32_t>(type));
}

// One metadata value, held as the bytes that encode it in a file (after its
// type tag; an array's element type and count included), so a value read
// from one file is written to another unchanged.
class GgufValue {
 public:
  static GgufValue u8(uint8_t v);
  static GgufValue i8(int8_t v);
  static GgufValue u16(uint16_t v);
  static GgufValue i16(int16_t v);
  static GgufValue u32(uint32_t v);
  static GgufValue i32(int32_t v);
  static GgufValue u64(uint64_t v);
  static GgufValue i64(int64_t v);
  static GgufValue f32(float v);
  static GgufValue f64(double v);
  static GgufValue boolean(bool v);
  static GgufValue string(std::string_view v);
  // T: uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, uint64_t,
  // int64_t, float or double.
  template <typename T>
  static GgufValue array(std::span<const T> values);
  static GgufValue bool_array(const std::vector<bool>& values);
  static GgufValue string_array(std::span<const std::string> values);
  // Each item must itself be an array (the items' element types may differ).
  static GgufValue array_of_arrays(std::span<const GgufValue> items);
  // A value of `type` whose encoding `bytes` the caller has validated (the
  // reader).
  static GgufValue from_encoding(GgufValueType type, std::string bytes);

  GgufValueType type() const { return type_; }
  bool is_array() const { return type_ == GgufValueType::array; }
  GgufValueType element_type() const;  // arrays only
  uint64_t array_size() const;         // arrays only
  // "u32", "string", "array of string", "array of array".
  std::string type_description() const;
  const std::string& encoding() const { return bytes_; }

  // Typed access; `context` starts the message of a type or range error
  // ("GGUF file 'm.gguf': key 'llama.block_count'"). Integers of any width
  // and signedness are returned if their value fits in T; floats are f32 or
  // f64; an array's element type must match (never reinterpreted).
  template <typename T>
  T as_int(std::string_view context) const;
  double as_float(std::string_view context) const;
  bool as_bool(std::string_view context) const;
  std::string_view as_string(std::string_view context) const;
  // Views into this value's bytes: valid while the value lives.
  std::vector<std::string_view> as_string_array(std::string_view context) const;
  std::vector<int64_t> as_int_array(std::string_view context) const;
  std::vector<double> as_float_array(std::string_view context) const;
  // The items of an array of arrays.
  std::vector<GgufValue> as_array_of_arrays(std::string_view context) const;

 private:
  GgufValue(GgufValueType type, std::string bytes) : type_(type), bytes_(std::move(bytes)) {}
  const char* array_data() const { return bytes_.data() + 12; }
  [[noreturn]] void type_error(std::string_view context, std::string_view wanted) const;

  GgufValueType type_ = GgufValueType::u8;
  std::string bytes_;
};

// loom::Error (starting with `context`) if `key` is one whose type the spec
// or llama.cpp fixes (general.alignment u32, general.architecture string,
// tokenizer.ggml.tokens / merges arrays of string, tokenizer.ggml.scores
// array of f32, tokenizer.ggml.token_type array of i32, ...) and `value`
// has another type.
void gguf_check_known_key(std::string_view key, const GgufValue& value, std::string_view context);

struct GgufKv {
  std::string key;
  GgufValue value;
};

struct GgufTensorInfo {
  std::string name;
  GgmlType type = GgmlType::f32;
  int n_dims = 0;
  std::array<int64_t, kGgufMaxDims> ne{1, 1, 1, 1};  // ggml order; 1 past n_dims
  int64_t n_elements = 0;
  uint64_t offset = 0;  // in the data section
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;  // inside the read-only mapping

  std::span<const int64_t> dims() const { return {ne.data(), static_cast<size_t>(n_dims)}; }
  std::span<const uint8_t> bytes() const { return {data, static_cast<size_t>(nbytes)}; }
};

// An open, fully validated GGUF file. Move-only; unmaps on destruction.
class GgufFile {
 public:
  // Maps and validates `path`; loom::Error naming the file, the field and
  // the value for anything malformed.
  static GgufFile open(const std::string& path);

  GgufFile(GgufFile&& o) noexcept;
  GgufFile& operator=(GgufFile&& o) noexcept;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;
  ~GgufFile();

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t file_bytes() const { return file_bytes_; }
  uint64_t data_offset() const { return data_offset_; }  // of the data section, in the file

  // In file order.
  const std::vector<GgufKv>& kvs() const { return kvs_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }

  bool has(std::string_view key) const { return find(key) != nullptr; }
  const GgufValue* find(std::string_view key) const;  // nullptr if absent
  const GgufValue& value(std::string_view key) const;  // loom::Error if absent

  // Typed getters: loom::Error naming the file and the key when the key is
  // absent, has another type (the message names it) or is out of T's range.
  template <typename T>
  T get_int(std::string_view key) const {
    return value(key).as_int<T>(context(key));
  }
  double get_float(std::string_view key) const { return value(key).as_float(context(key)); }
  bool get_bool(std::string_view key) const { return value(key).as_bool(context(key)); }
  std::string_view get_string(std::string_view key) const { return value(key).as_string(context(key)); }
  std::vector<std::string_view> get_string_array(std::string_view key) const {
    return value(key).as_string_array(context(key));
  }
  std::vector<int64_t> get_int_array(std::string_view key) const { return value(key).as_int_array(context(key)); }
  std::vector<double> get_float_array(std::string_view key) const {
    return value(key).as_float_array(context(key));
  }

  const GgufTensorInfo* find_tensor(std::string_view name) const;  // nullptr if absent
  const GgufTensorInfo& tensor(std::string_view name) const;      // loom::Error if absent

 private:
  friend class GgufParser;
  GgufFile() = default;
  std::string context(std::string_view key) const;
  void release();

  std::string path_;
  void* map_ = nullptr;
  uint64_t file_bytes_ = 0;
  uint32_t version_ = 0;
  uint32_t alignment_ = kGgufDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<GgufKv> kvs_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> kv_index_, tensor_index_;
};

// A canonical JSON description of a file (for comparison with other
// parsers: tests/interop/gguf_hf_parse.mjs prints the same form):
//   {"version": 3, "tensor_data_offset": "N",
//    "metadata": [{"key": k, "type": "u32", "value": "7"}, ...],
//    "tensors": [{"name": n, "type": 12, "dims": ["4096", ...],
//                 "offset": "0"}, ...]}
// Integers are decimal strings (64-bit values survive JSON), floats numbers
// (or "nan", "inf", "-inf"), arrays {"element_type": t, "values": [...]}
// (an array of arrays: "values" holds the inner arrays' values only).
std::string gguf_describe_json(const GgufFile& file);

// Where a tensor callback writes its bytes; exactly the tensor's size must
// arrive (more is an error at once, less when the callback returns).
class GgufSink {
 public:
  void write(const void* data, size_t bytes);
  uint64_t written() const { return written_; }

 private:
  friend class GgufWriter;
  GgufSink(AtomicFile& file, const std::string& what, uint64_t expected)
      : file_(file), what_(what), expected_(expected) {}
  AtomicFile& file_;
  const std::string& what_;
  uint64_t expected_;
  uint64_t written_ = 0;
};

// Builds a GGUF v3 file: KVs in the order added, then the tensor infos and
// the tensors, packed in the order added, each starting at a multiple of the
// alignment and padded with zeros to the next one (the last one too, as
// llama.cpp's writer does). general.alignment is written only when it is
// not the default 32 (absent means 32, by the spec). Every argument is
// checked when it is added; write() is atomic (path + ".tmp", fsync,
// rename), so a failure or crash leaves no partial file under `path`.
class GgufWriter {
 public:
  // alignment: a power of two, a multiple of 8.
  explicit GgufWriter(uint32_t alignment = kGgufDefaultAlignment);

  // key: non-empty ASCII, at most 65535 bytes, not added before.
  // general.alignment may be added only as the constructor's value (u32).
  void add(std::string key, GgufValue value);

  using TensorFill = std::function<void(GgufSink& out)>;
  // dims in ggml order (ne[0] fastest), 1 to 4 of them, each >= 1, ne[0] a
  // multiple of the type's block size; bytes.size() must be the tensor's
  // size. The bytes are not copied: they must stay valid until write().
  void add_tensor(std::string name, GgmlType type, std::vector<int64_t> dims, std::span<const uint8_t> bytes);
  // A temporary would be gone by write().
  void add_tensor(std::string name, GgmlType type, std::vector<int64_t> dims, std::vector<uint8_t>&& bytes) = delete;
  // As above, the bytes produced by `fill` during write() (so a model is
  // never held twice in memory).
  void add_tensor(std::string name, GgmlType type, std::vector<int64_t> dims, TensorFill fill);

  // The size in bytes of a tensor of `type` and `dims`, with the checks of
  // add_tensor (`what` starts the message).
  static uint64_t tensor_bytes(GgmlType type, std::span<const int64_t> dims, const std::string& what);

  // A file with a quantized tensor must carry general.quantization_version
  // (the spec's rule): loom::Error otherwise.
  void write(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> dims;
    uint64_t nbytes;
    std::span<const uint8_t> bytes;
    TensorFill fill;
  };
  void add_tensor_info(Tensor t);
  std::string header_bytes() const;

  uint32_t alignment_;
  std::vector<GgufKv> kvs_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<Tensor> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace loom::io
