// Reader: the file is mapped read-only and walked once; every count, length,
// type and offset is checked against the bytes that are really there before
// it is used, and metadata values are copied out so that nothing parsed
// later depends on file bytes that were not checked.
#include "io/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace loom::io {
namespace {

// The least bytes a key-value pair and a tensor info can take: a 1-byte
// key and a 1-byte value; a 1-byte name and one dimension.
constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;

// Text from the file, safe to print: non-printable bytes as \xNN, long
// text cut.
std::string printable(std::string_view s) {
  constexpr size_t kMax = 80;
  std::string out;
  for (size_t i = 0; i < s.size() && i < kMax; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      out += {'\\', 'x', kHex[c >> 4], kHex[c & 15]};
    }
  }
  if (s.size() > kMax) out += concat("... (", s.size(), " bytes)");
  return out;
}

uint64_t align_up(uint64_t offset, uint64_t alignment) {
  return offset + (alignment - offset % alignment) % alignment;
}

bool known_value_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::f64); }

// Bytes of a scalar; the least bytes a string (its length) or an array (its
// element type and count) takes.
uint64_t min_value_bytes(GgufValueType t) {
  switch (t) {
    case GgufValueType::u8: case GgufValueType::i8: case GgufValueType::boolean: return 1;
    case GgufValueType::u16: case GgufValueType::i16: return 2;
    case GgufValueType::u32: case GgufValueType::i32: case GgufValueType::f32: return 4;
    case GgufValueType::u64: case GgufValueType::i64: case GgufValueType::f64: case GgufValueType::string: return 8;
    case GgufValueType::array: return 12;
  }
  return 1;
}

}  // namespace

class GgufParser {
 public:
  GgufParser(GgufFile& file, const uint8_t* base) : f_(file), base_(base), size_(file.file_bytes_) {}

  void parse() {
    uint64_t n_tensors = 0, n_kv = 0;
    parse_header(n_tensors, n_kv);
    // No reserve() from the counts: they are checked against the file size,
    // but a large file could still make them ask for far more memory than
    // the entries that are really there take.
    for (uint64_t i = 0; i < n_kv; ++i) parse_kv(i);
    parse_alignment();
    check_vocabulary();
    for (uint64_t i = 0; i < n_tensors; ++i) parse_tensor_info(i);
    place_tensors();
  }

 private:
  std::string where() const { return concat("GGUF file '", f_.path_, "': "); }
  uint64_t left() const { return size_ - pos_; }

  void need(uint64_t n, std::string_view what) const {
    if (n > left())
      fail(where(), what, " needs ", n, " bytes at offset ", pos_, ", but the file ends after ", left(),
           " (it is ", size_, " bytes: truncated or a wrong length)");
  }
  template <typename T>
  T read(std::string_view what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  // A u64 length and that many bytes.
  std::string_view read_string(std::string_view what) {
    const uint64_t n = read<uint64_t>(what);
    if (n > left())
      fail(where(), what, ": string length ", n, " exceeds the ", left(), " bytes left in the file");
    std::string_view s(reinterpret_cast<const char*>(base_ + pos_), n);
    pos_ += n;
    return s;
  }

  void parse_header(uint64_t& n_tensors, uint64_t& n_kv) {
    if (size_ < 4) fail(where(), "the file is ", size_, " bytes: too short to start with the magic \"GGUF\"");
    if (std::memcmp(base_, "GGUF", 4) != 0)
      fail(where(), "not a GGUF file: it starts with \"",
           printable(std::string_view(reinterpret_cast<const char*>(base_), 4)), "\", not \"GGUF\"");
    pos_ = 4;
    const auto version = read<uint32_t>("the version");
    check_version(version);
    f_.version_ = version;
    n_tensors = read<uint64_t>("tensor_count");
    n_kv = read<uint64_t>("kv_count");
    if (n_kv > left() / kMinKvBytes)
      fail(where(), "kv_count = ", n_kv, " cannot be right: a key-value pair takes at least ", kMinKvBytes,
           " bytes and only ", left(), " bytes follow the header");
    if (n_tensors > left() / kMinTensorInfoBytes)
      fail(where(), "tensor_count = ", n_tensors, " cannot be right: a tensor info takes at least ",
           kMinTensorInfoBytes, " bytes and only ", left(), " bytes follow the header");
  }

  void check_version(uint32_t v) const {
    if (v == 2 || v == 3) return;
    if (v != 0 && (v & 0xffffu) == 0) {
      fail(where(), "version reads as ", v, " (0x", std::hex, v, std::dec,
           "): the file is big-endian (byte-swapped); loom reads little-endian GGUF files only");
    }
    if (v == 1)
      fail(where(), "version 1 is not supported (GGUF v1 has 32-bit counts and lengths): loom reads versions 2 and 3; "
                    "convert the file with a current llama.cpp");
    fail(where(), "version ", v, " is not supported: loom reads versions 2 and 3");
  }

  void parse_kv(uint64_t i) {
    const std::string pair = concat("key-value pair #", i);
    const std::string_view key = read_string(pair + " key");
    check_key(key, pair);
    const std::string what = concat("key '", printable(key), "'");
    if (const GgufValue* prev = f_.find(key); prev != nullptr)
      fail(where(), "duplicate ", what, " (pairs #", f_.kv_index_.find(key)->second, " and #", i, ")");
    const auto type = read<uint32_t>(what + " value type");
    if (!known_value_type(type))
      fail(where(), what, ": unknown value type ", type, " (GGUF value types are 0 to 12)");
    const uint64_t start = pos_;
    skip_value(static_cast<GgufValueType>(type), 0, what);
    GgufValue value = GgufValue::from_encoding(static_cast<GgufValueType>(type),
                                               std::string(reinterpret_cast<const char*>(base_ + start), pos_ - start));
    gguf_check_known_key(key, value, where() + what);
    f_.kv_index_.emplace(std::string(key), f_.kvs_.size());
    f_.kvs_.push_back({std::string(key), std::move(value)});
  }

  void check_key(std::string_view key, const std::string& pair) const {
    if (key.empty()) fail(where(), pair, " has an empty key");
    if (key.size() > kGgufMaxKeyBytes)
      fail(where(), pair, ": key '", printable(key), "' is ", key.size(), " bytes (at most ", kGgufMaxKeyBytes, ")");
    for (size_t j = 0; j < key.size(); ++j) {
      if (static_cast<unsigned char>(key[j]) >= 0x80)
        fail(where(), pair, ": key '", printable(key), "' is not ASCII (byte ", j, ")");
    }
  }

  // Checks a value of type t at pos_ and moves past it; depth: the number of
  // arrays it is inside.
  void skip_value(GgufValueType t, int depth, const std::string& what) {
    if (t == GgufValueType::string) {
      read_string(what);
    } else if (t == GgufValueType::array) {
      skip_array(depth + 1, what);
    } else {
      need(min_value_bytes(t), what + " value");
      if (t == GgufValueType::boolean && base_[pos_] > 1)
        fail(where(), what, ": bool value ", +base_[pos_], " (a GGUF bool is 0 or 1)");
      pos_ += min_value_bytes(t);
    }
  }

  void skip_array(int level, const std::string& what) {
    if (level > kGgufMaxArrayDepth)
      fail(where(), what, ": arrays nested ", level, " deep (loom reads at most ", kGgufMaxArrayDepth, ")");
    const auto element = read<uint32_t>(what + " array element type");
    if (!known_value_type(element))
      fail(where(), what, ": unknown array element type ", element, " (GGUF value types are 0 to 12)");
    const auto et = static_cast<GgufValueType>(element);
    const uint64_t count = read<uint64_t>(what + " array length");
    if (count > left() / min_value_bytes(et))
      fail(where(), what, ": array length ", count, " cannot be right: each ", gguf_value_type_name(et),
           " element takes at least ", min_value_bytes(et), " bytes and ", left(), " bytes are left in the file");
    if (et == GgufValueType::string || et == GgufValueType::array) {
      for (uint64_t k = 0; k < count; ++k) skip_element(et, level, what, k);
    } else if (et == GgufValueType::boolean) {
      for (uint64_t k = 0; k < count; ++k, ++pos_) {
        if (base_[pos_] > 1)
          fail(where(), what, "[", k, "]: bool value ", +base_[pos_], " (a GGUF bool is 0 or 1)");
      }
    } else {
      pos_ += count * min_value_bytes(et);
    }
  }

  void skip_element(GgufValueType et, int level, const std::string& what, uint64_t k) {
    if (et == GgufValueType::array) {
      skip_array(level + 1, concat(what, "[", k, "]"));
      return;
    }
    const uint64_t n = read<uint64_t>(what);  // the count check left room for every length
    if (n > left())
      fail(where(), what, "[", k, "]: string length ", n, " exceeds the ", left(), " bytes left in the file");
    pos_ += n;
  }

  void parse_alignment() {
    const GgufValue* a = f_.find("general.alignment");
    if (a == nullptr) return;
    const auto v = a->as_int<uint32_t>(where() + "key 'general.alignment'");
    if (v == 0 || (v & (v - 1)) != 0 || v % 8 != 0)
      fail(where(), "general.alignment = ", v, " must be a power of two and a multiple of 8");
    f_.alignment_ = v;
  }

  // The vocabulary's parallel arrays must be as long as the token list:
  // readers index them by token id.
  void check_vocabulary() const {
    const GgufValue* tokens = f_.find("tokenizer.ggml.tokens");
    if (tokens == nullptr) return;
    for (const char* key : {"tokenizer.ggml.scores", "tokenizer.ggml.token_type"}) {
      const GgufValue* v = f_.find(key);
      if (v != nullptr && v->array_size() != tokens->array_size())
        fail(where(), key, " has ", v->array_size(), " entries but tokenizer.ggml.tokens has ", tokens->array_size());
    }
  }

  void parse_tensor_info(uint64_t i) {
    const std::string_view name = read_string(concat("tensor #", i, " name"));
    check_tensor_name(name, i);
    GgufTensorInfo t;
    t.name = std::string(name);
    const std::string what = concat("tensor '", printable(name), "'");
    const auto n_dims = read<uint32_t>(what + " n_dims");
    if (n_dims < 1 || n_dims > kGgufMaxDims)
      fail(where(), what, ": n_dims = ", n_dims, " (must be 1 to ", kGgufMaxDims, ")");
    t.n_dims = static_cast<int>(n_dims);
    t.n_elements = 1;
    for (int d = 0; d < t.n_dims; ++d) {
      const auto ne = read<uint64_t>(concat(what, " ne[", d, "]"));
      if (ne == 0) fail(where(), what, ": ne[", d, "] = 0 (loom refuses empty tensors)");
      if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(where(), what, ": ne[", d, "] = ", ne, " is larger than 2^63-1");
      t.ne[d] = static_cast<int64_t>(ne);
      if (__builtin_mul_overflow(t.n_elements, t.ne[d], &t.n_elements))
        fail(where(), what, ": the element count ", dims_text(t), " overflows 64 bits");
    }
    const auto type = read<uint32_t>(what + " type");
    if (!ggml_type_supported(type))
      fail(where(), what, ": ", ggml_type_describe(type), " is not supported (loom reads ",
           ggml_supported_type_names(), ")");
    t.type = static_cast<GgmlType>(type);
    t.nbytes = tensor_nbytes(t, what);
    t.offset = read<uint64_t>(what + " offset");
    if (t.offset % f_.alignment_ != 0)
      fail(where(), what, ": offset ", t.offset, " is not a multiple of the alignment ", f_.alignment_);
    f_.tensor_index_.emplace(t.name, f_.tensors_.size());
    f_.tensors_.push_back(std::move(t));
  }

  static std::string dims_text(const GgufTensorInfo& t) {
    std::string s = "[";
    for (int d = 0; d < t.n_dims; ++d) s += concat(d ? ", " : "", t.ne[d]);
    return s + "]";
  }

  uint64_t tensor_nbytes(const GgufTensorInfo& t, const std::string& what) const {
    const GgmlTypeTraits& tr = ggml_type_traits(t.type);
    if (t.ne[0] % tr.block_size != 0)
      fail(where(), what, ": type ", tr.name, " stores blocks of ", tr.block_size, " values, but ne[0] = ", t.ne[0],
           " is not a multiple of ", tr.block_size);
    const uint64_t blocks = static_cast<uint64_t>(t.n_elements / tr.block_size);
    uint64_t nbytes = 0;
    if (__builtin_mul_overflow(blocks, static_cast<uint64_t>(tr.block_bytes), &nbytes) || nbytes > size_)
      fail(where(), what, ": ", dims_text(t), " of ", tr.name, " is ", blocks, " blocks of ", tr.block_bytes,
           " bytes: more than the whole file (", size_, " bytes)");
    return nbytes;
  }

  void check_tensor_name(std::string_view name, uint64_t i) const {
    if (name.empty()) fail(where(), "tensor #", i, " has an empty name");
    if (name.size() > kGgufMaxTensorNameRead)
      fail(where(), "tensor #", i, " name '", printable(name), "' is ", name.size(), " bytes (at most ",
           kGgufMaxTensorNameRead, ")");
    if (const GgufTensorInfo* prev = f_.find_tensor(name); prev != nullptr)
      fail(where(), "duplicate tensor name '", printable(name), "' (tensors #", f_.tensor_index_.find(name)->second,
           " and #", i, ")");
  }

  void place_tensors() {
    f_.data_offset_ = align_up(pos_, f_.alignment_);
    if (f_.tensors_.empty()) return;
    if (f_.data_offset_ > size_)
      fail(where(), "the data section starts at offset ", f_.data_offset_, " (tensor infos end at ", pos_,
           ", aligned to ", f_.alignment_, "), past the end of the file (", size_, " bytes)");
    const uint64_t data_bytes = size_ - f_.data_offset_;
    for (GgufTensorInfo& t : f_.tensors_) {
      if (t.offset > data_bytes || t.nbytes > data_bytes - t.offset)
        fail(where(), "tensor '", printable(t.name), "': its ", t.nbytes, " bytes at offset ", t.offset,
             " of the data section run past its end (the data section is ", data_bytes, " bytes, from offset ",
             f_.data_offset_, " of a ", size_, "-byte file)");
      t.data = base_ + f_.data_offset_ + t.offset;
    }
    std::vector<const GgufTensorInfo*> order;
    for (const GgufTensorInfo& t : f_.tensors_) order.push_back(&t);
    std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
    for (size_t k = 1; k < order.size(); ++k) {
      const GgufTensorInfo& a = *order[k - 1];
      const GgufTensorInfo& b = *order[k];
      if (a.offset + a.nbytes > b.offset)
        fail(where(), "tensors '", printable(a.name), "' (bytes ", a.offset, " to ", a.offset + a.nbytes, ") and '",
             printable(b.name), "' (from ", b.offset, ") overlap in the data section");
    }
  }

  GgufFile& f_;
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

GgufFile GgufFile::open(const std::string& path) {
  GgufFile f;
  f.path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open GGUF file '", path, "': ", std::strerror(errno));
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const std::string why = S_ISDIR(st.st_mode) ? "it is a directory" : "not a regular file";
    ::close(fd);
    fail("cannot read GGUF file '", path, "': ", why);
  }
  f.file_bytes_ = static_cast<uint64_t>(st.st_size);
  if (f.file_bytes_ > 0) {
    void* map = ::mmap(nullptr, f.file_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);
    if (map == MAP_FAILED) fail("cannot map GGUF file '", path, "': ", std::strerror(err));
    f.map_ = map;
  } else {
    ::close(fd);
  }
  GgufParser(f, static_cast<const uint8_t*>(f.map_)).parse();
  return f;
}

GgufFile::GgufFile(GgufFile&& o) noexcept { *this = std::move(o); }

GgufFile& GgufFile::operator=(GgufFile&& o) noexcept {
  if (this == &o) return *this;
  release();
  path_ = std::move(o.path_);
  map_ = std::exchange(o.map_, nullptr);
  file_bytes_ = std::exchange(o.file_bytes_, 0);
  version_ = o.version_;
  alignment_ = o.alignment_;
  data_offset_ = o.data_offset_;
  kvs_ = std::move(o.kvs_);
  tensors_ = std::move(o.tensors_);
  kv_index_ = std::move(o.kv_index_);
  tensor_index_ = std::move(o.tensor_index_);
  return *this;
}

GgufFile::~GgufFile() { release(); }

void GgufFile::release() {
  if (map_ != nullptr) ::munmap(map_, file_bytes_);
  map_ = nullptr;
}

std::string GgufFile::context(std::string_view key) const { return concat("GGUF file '", path_, "': key '", key, "'"); }

const GgufValue* GgufFile::find(std::string_view key) const {
  const auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kvs_[it->second].value;
}

const GgufValue& GgufFile::value(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) fail("GGUF file '", path_, "' has no key '", key, "'");
  return *v;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensorInfo& GgufFile::tensor(std::string_view name) const {
  const GgufTensorInfo* t = find_tensor(name);
  if (t == nullptr) fail("GGUF file '", path_, "' has no tensor '", name, "'");
  return *t;
}

}  // namespace loom::io
