// Reader: every length, offset and field of the header is checked before it
// is used; the only file bytes trusted are those that passed the checks.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace loom::io {
namespace {

using nlohmann::json;

struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr std::array<DTypeName, 6> kDTypeNames{{{DType::f32, "F32"},
                                                {DType::bf16, "BF16"},
                                                {DType::f16, "F16"},
                                                {DType::i32, "I32"},
                                                {DType::i64, "I64"},
                                                {DType::u8, "U8"}}};
constexpr const char* kSupported = "F32, BF16, F16, I32, I64, U8";

// Reads exactly n bytes at offset; false on a short read (file shrank).
bool pread_all(int fd, void* dst, uint64_t n, uint64_t offset) {
  auto* p = static_cast<unsigned char*>(dst);
  while (n > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, uint64_t{1} << 30));
    const ssize_t got = ::pread(fd, p, chunk, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<uint64_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return true;
}

// nlohmann keeps the last of duplicate keys silently; this parse callback
// records the first duplicate key of any object so open() can reject it.
struct DuplicateKeyFinder {
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;

  bool operator()(int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (event == json::parse_event_t::key && !open_objects.empty() && parsed.is_string()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!open_objects.back().insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  }
};

class HeaderParser {
 public:
  HeaderParser(const std::string& path, uint64_t buffer_bytes) : path_(path), buffer_bytes_(buffer_bytes) {}

  void parse(const std::string& text, std::map<std::string, TensorInfo>& tensors,
             std::map<std::string, std::string>& metadata) {
    LOOM_REQUIRE(!text.empty() && text[0] == '{', where(), "header must be a JSON object starting with '{'");
    DuplicateKeyFinder finder;
    json root;
    try {
      root = json::parse(text, std::ref(finder));
    } catch (const json::exception& e) {
      fail(where(), "header is not valid JSON: ", e.what());
    }
    LOOM_REQUIRE(root.is_object(), where(), "header must be a JSON object");
    LOOM_REQUIRE(finder.duplicate.empty(), where(), "duplicate key '", finder.duplicate, "' in the header");
    for (const auto& [name, entry] : root.items()) {
      if (name == "__metadata__") {
        parse_metadata(entry, metadata);
      } else {
        tensors.emplace(name, parse_entry(name, entry));
      }
    }
    check_tiling(tensors);
  }

 private:
  std::string where() const { return concat("safetensors file '", path_, "': "); }

  void parse_metadata(const json& entry, std::map<std::string, std::string>& metadata) const {
    LOOM_REQUIRE(entry.is_object(), where(), "__metadata__ must be an object of string values");
    for (const auto& [key, value] : entry.items()) {
      LOOM_REQUIRE(value.is_string(), where(), "__metadata__ value of '", key, "' must be a string, got ",
                   value.type_name());
      metadata.emplace(key, value.get<std::string>());
    }
  }

  uint64_t unsigned_field(const std::string& name, const char* field, const json& v) const {
    LOOM_REQUIRE(v.is_number_unsigned(), where(), "tensor '", name, "': ", field,
                 " entries must be non-negative integers, got ", v.dump());
    return v.get<uint64_t>();
  }

  TensorInfo parse_entry(const std::string& name, const json& entry) const {
    LOOM_REQUIRE(entry.is_object(), where(), "tensor '", name, "' must be an object with dtype, shape, data_offsets");
    for (const char* field : {"dtype", "shape", "data_offsets"})
      LOOM_REQUIRE(entry.contains(field), where(), "tensor '", name, "' has no ", field);
    const json& dtype = entry["dtype"];
    const json& shape = entry["shape"];
    const json& offsets = entry["data_offsets"];
    LOOM_REQUIRE(dtype.is_string(), where(), "tensor '", name, "': dtype must be a string, got ", dtype.dump());
    LOOM_REQUIRE(shape.is_array(), where(), "tensor '", name, "': shape must be an array, got ", shape.dump());
    LOOM_REQUIRE(offsets.is_array() && offsets.size() == 2, where(), "tensor '", name,
                 "': data_offsets must be [begin, end], got ", offsets.dump());
    TensorInfo info;
    try {
      info.dtype = safetensors_dtype_from_name(dtype.get<std::string>());
    } catch (const Error& e) {
      fail(where(), "tensor '", name, "': ", e.what());
    }
    LOOM_REQUIRE(shape.size() <= static_cast<size_t>(kMaxDims), where(), "tensor '", name, "': shape ",
                 shape.dump(), " has more than ", kMaxDims, " dims");
    std::array<int64_t, kMaxDims> dims{};
    uint64_t numel = 1;
    for (size_t i = 0; i < shape.size(); ++i) {
      const uint64_t d = unsigned_field(name, "shape", shape[i]);
      LOOM_REQUIRE(d <= static_cast<uint64_t>(INT64_MAX) && !__builtin_mul_overflow(numel, d, &numel) &&
                       numel <= static_cast<uint64_t>(INT64_MAX),
                   where(), "tensor '", name, "': shape ", shape.dump(), " overflows");
      dims[i] = static_cast<int64_t>(d);
    }
    info.shape = Shape::of(static_cast<int>(shape.size()), dims.data());
    info.begin = unsigned_field(name, "data_offsets", offsets[0]);
    info.end = unsigned_field(name, "data_offsets", offsets[1]);
    LOOM_REQUIRE(info.begin <= info.end, where(), "tensor '", name, "': data_offsets end ", info.end,
                 " < begin ", info.begin);
    LOOM_REQUIRE(info.end <= buffer_bytes_, where(), "tensor '", name, "': data_offsets end ", info.end,
                 " is past the end of the data buffer (", buffer_bytes_, " bytes)");
    uint64_t want = 0;
    LOOM_REQUIRE(!__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(info.dtype)), &want), where(),
                 "tensor '", name, "': shape ", shape.dump(), " overflows");
    LOOM_REQUIRE(want == info.nbytes(), where(), "tensor '", name, "': ", dtype.get<std::string>(), " shape ",
                 info.shape.str(), " needs ", want, " bytes but data_offsets [", info.begin, ", ", info.end,
                 "] hold ", info.nbytes());
    return info;
  }

  // The tensors, sorted by offsets, must cover [0, buffer) exactly: the
  // reference rejects gaps, overlaps and trailing bytes alike.
  void check_tiling(const std::map<std::string, TensorInfo>& tensors) const {
    std::vector<std::pair<const std::string*, const TensorInfo*>> order;
    for (const auto& [name, info] : tensors) order.emplace_back(&name, &info);
    std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
      return std::pair(a.second->begin, a.second->end) < std::pair(b.second->begin, b.second->end);
    });
    uint64_t covered = 0;
    const std::string* previous = nullptr;
    for (const auto& [name, info] : order) {
      LOOM_REQUIRE(info->begin >= covered, where(), "tensor '", *name, "' [", info->begin, ", ", info->end,
                   ") overlaps tensor '", previous ? *previous : "", "' (which ends at ", covered, ")");
      LOOM_REQUIRE(info->begin == covered, where(), "gap of ", info->begin - covered,
                   " unused bytes before tensor '", *name, "' at offset ", covered);
      covered = info->end;
      previous = name;
    }
    LOOM_REQUIRE(covered == buffer_bytes_, where(), buffer_bytes_ - covered,
                 " unused bytes after the last tensor: data buffer is ", buffer_bytes_, " bytes, tensors cover ",
                 covered);
  }

  const std::string& path_;
  uint64_t buffer_bytes_;
};

}  // namespace

std::string safetensors_dtype_name(DType t) {
  for (const auto& d : kDTypeNames)
    if (d.dtype == t) return d.name;
  LOOM_CHECK(false, "dtype without a safetensors name ", static_cast<int>(t));
}

DType safetensors_dtype_from_name(const std::string& name) {
  for (const auto& d : kDTypeNames)
    if (name == d.name) return d.dtype;
  fail("unsupported dtype '", name, "': supported are ", kSupported);
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  const std::string where = concat("safetensors file '", path, "': ");
  f.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  LOOM_REQUIRE(f.fd_ >= 0, where, "cannot open: ", std::strerror(errno));
  struct stat st {};
  LOOM_REQUIRE(::fstat(f.fd_, &st) == 0, where, "cannot stat: ", std::strerror(errno));
  LOOM_REQUIRE(S_ISREG(st.st_mode), where, "not a regular file");
  f.file_bytes_ = static_cast<uint64_t>(st.st_size);
  LOOM_REQUIRE(f.file_bytes_ >= 8, where, "file is ", f.file_bytes_,
               " bytes, shorter than the 8-byte header length");
  std::array<unsigned char, 8> raw{};
  LOOM_REQUIRE(pread_all(f.fd_, raw.data(), 8, 0), where, "cannot read the header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | raw[i];
  LOOM_REQUIRE(n <= kSafetensorsMaxHeaderBytes, where, "header length ", n, " exceeds the limit of ",
               kSafetensorsMaxHeaderBytes, " bytes");
  LOOM_REQUIRE(n <= f.file_bytes_ - 8, where, "header length ", n, " runs past the end of the file (",
               f.file_bytes_, " bytes)");
  std::string text(n, '\0');
  LOOM_REQUIRE(pread_all(f.fd_, text.data(), n, 8), where, "cannot read the ", n, "-byte header");
  f.data_start_ = 8 + n;
  HeaderParser(path, f.file_bytes_ - f.data_start_).parse(text, f.tensors_, f.metadata_);
  return f;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept { *this = std::move(o); }

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    close();
    path_ = std::move(o.path_);
    fd_ = std::exchange(o.fd_, -1);
    file_bytes_ = o.file_bytes_;
    data_start_ = o.data_start_;
    tensors_ = std::move(o.tensors_);
    metadata_ = std::move(o.metadata_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { close(); }

void SafetensorsFile::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it != tensors_.end()) return it->second;
  std::string some;
  int listed = 0;
  for (const auto& [n, _] : tensors_) {
    if (listed == 5) {
      some += concat(", ... (", tensors_.size(), " in all)");
      break;
    }
    some += concat(listed++ ? ", " : "", "'", n, "'");
  }
  fail("safetensors file '", path_, "': no tensor named '", name, "'; it has ",
       tensors_.empty() ? std::string("no tensors") : some);
}

void SafetensorsFile::read(const std::string& name, Tensor dst) const {
  const TensorInfo& t = info(name);
  const std::string where = concat("safetensors file '", path_, "': tensor '", name, "' ");
  LOOM_REQUIRE(fd_ >= 0, where, "read from a closed file");
  LOOM_REQUIRE(dst.device().is_cpu(), where, "must be read into a CPU tensor, got ", device_name(dst.device()));
  LOOM_REQUIRE(dst.dtype() == t.dtype && dst.shape() == t.shape, where, "is ", dtype_name(t.dtype),
               t.shape.str(), " but the destination is ", dst.str());
  LOOM_REQUIRE(dst.is_contiguous(), where, "destination ", dst.str(), " is not contiguous");
  if (t.nbytes() == 0) return;
  LOOM_REQUIRE(dst.data() != nullptr, where, "destination has no data");
  LOOM_REQUIRE(pread_all(fd_, dst.data(), t.nbytes(), data_start_ + t.begin), where,
               "could not be read: the file is shorter than when it was opened");
}

void SafetensorsFile::read_range(const std::string& name, int64_t first, Tensor dst) const {
  const TensorInfo& t = info(name);
  const std::string where = concat("safetensors file '", path_, "': tensor '", name, "' ");
  LOOM_REQUIRE(fd_ >= 0, where, "read from a closed file");
  LOOM_REQUIRE(dst.device().is_cpu() && dst.is_contiguous() && dst.dtype() == t.dtype, where, "is ",
               dtype_name(t.dtype), " but the destination is ", dst.str());
  const int64_t n = t.shape.numel();
  LOOM_REQUIRE(first >= 0 && first <= n && dst.numel() <= n - first, where, "has ", n, " elements: ", dst.numel(),
               " elements from element ", first, " are outside it");
  if (dst.numel() == 0) return;
  const uint64_t elem = dtype_size(t.dtype);
  LOOM_REQUIRE(pread_all(fd_, dst.data(), static_cast<uint64_t>(dst.numel()) * elem,
                         data_start_ + t.begin + static_cast<uint64_t>(first) * elem),
               where, "could not be read: the file is shorter than when it was opened");
}

}  // namespace loom::io
