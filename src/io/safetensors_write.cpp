// Writer: the layout the reference writer produces (huggingface/safetensors,
// tensor.rs `prepare`), written to a temporary file and renamed into place so
// a crash never leaves a half-written file under the final name (DESIGN §7).

#include <algorithm>
#include <cstring>
#include <functional>
#include <set>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "io/safetensors.h"

namespace loom::io {
namespace {

// The reference sorts by its Dtype enum descending (the enum is declared in
// order of growing alignment), then by name.
int dtype_rank(DType t) {
  switch (t) {
    case DType::u8: return 0;
    case DType::f16: return 1;
    case DType::bf16: return 2;
    case DType::i32: return 3;
    case DType::f32: return 4;
    case DType::i64: return 5;
  }
  LOOM_CHECK(false, "unknown dtype ", static_cast<int>(t));
}

// A tensor to write: its name, dtype and shape, and how its bytes get to the file.
struct Item {
  const std::string* name;
  DType dtype;
  Shape shape;
  uint64_t bytes;
  std::function<void(AtomicFile&)> write;
};

std::string header_json(const std::vector<const Item*>& order, const std::map<std::string, std::string>& metadata,
                        const std::string& path) {
  nlohmann::ordered_json root = nlohmann::ordered_json::object();
  if (!metadata.empty()) root["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const Item* e : order) {
    nlohmann::ordered_json entry;
    entry["dtype"] = safetensors_dtype_name(e->dtype);
    entry["shape"] = nlohmann::ordered_json::array();
    for (int i = 0; i < e->shape.ndim(); ++i) entry["shape"].push_back(e->shape[i]);
    entry["data_offsets"] = {offset, offset + e->bytes};
    offset += e->bytes;
    root[*e->name] = std::move(entry);
  }
  std::string text;
  try {
    text = root.dump();
  } catch (const nlohmann::json::exception& e) {
    fail("writing safetensors file '", path, "': a name or metadata string is not valid UTF-8: ", e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

std::vector<const Item*> checked_order(const std::vector<Item>& items, const std::string& path) {
  std::set<std::string> names;
  std::vector<const Item*> order;
  for (const Item& e : items) {
    const std::string where = concat("writing safetensors file '", path, "': tensor '", *e.name, "' ");
    LOOM_REQUIRE(*e.name != "__metadata__", where, "uses the reserved name __metadata__");
    LOOM_REQUIRE(names.insert(*e.name).second, where, "appears twice");
    order.push_back(&e);
  }
  std::sort(order.begin(), order.end(), [](const Item* a, const Item* b) {
    const int ra = dtype_rank(a->dtype), rb = dtype_rank(b->dtype);
    return ra != rb ? ra > rb : *a->name < *b->name;
  });
  return order;
}

void write_items(const std::string& path, const std::vector<Item>& items,
                 const std::map<std::string, std::string>& metadata) {
  const std::vector<const Item*> order = checked_order(items, path);
  const std::string header = header_json(order, metadata, path);
  AtomicFile file(path);
  unsigned char n[8];
  for (int i = 0; i < 8; ++i) n[i] = static_cast<unsigned char>(static_cast<uint64_t>(header.size()) >> (8 * i));
  file.write(n, 8);
  file.write(header);
  for (const Item* e : order)
    if (e->bytes > 0) e->write(file);
  file.commit();
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<Item> items;
  for (const std::pair<std::string, Tensor>& e : tensors) {
    const Tensor& t = e.second;
    const std::string where = concat("writing safetensors file '", path, "': tensor '", e.first, "' ");
    LOOM_REQUIRE(t.device().is_cpu(), where, "is on ", device_name(t.device()), ", not the CPU");
    LOOM_REQUIRE(t.is_contiguous(), where, t.str(), " is not contiguous");
    LOOM_REQUIRE(t.nbytes() == 0 || t.data() != nullptr, where, "has no data");
    items.push_back(
        {&e.first, t.dtype(), t.shape(), t.nbytes(), [&t](AtomicFile& f) { f.write(t.data(), t.nbytes()); }});
  }
  write_items(path, items, metadata);
}

void write_safetensors(const std::string& path, const std::vector<StreamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata, int64_t buffer_bytes) {
  std::vector<uint8_t> buffer;
  std::vector<Item> items;
  for (const StreamedTensor& t : tensors) {
    const int64_t elem = static_cast<int64_t>(dtype_size(t.dtype));
    const int64_t numel = t.shape.numel();
    items.push_back({&t.name, t.dtype, t.shape, static_cast<uint64_t>(numel * elem), [&, elem, numel](AtomicFile& f) {
                       const int64_t step = std::max<int64_t>(1, buffer_bytes / elem);
                       buffer.resize(static_cast<size_t>(std::min(step, numel) * elem));
                       for (int64_t at = 0; at < numel; at += step) {
                         const int64_t n = std::min(step, numel - at);
                         t.fill(at, Tensor(buffer.data(), t.dtype, {n}));
                         f.write(buffer.data(), static_cast<size_t>(n * elem));
                       }
                     }});
  }
  write_items(path, items, metadata);
}

}  // namespace loom::io
