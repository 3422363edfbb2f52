// Writer: the layout the reference writer produces (huggingface/safetensors,
// tensor.rs `prepare`), written to a temporary file and renamed into place so
// a crash never leaves a half-written file under the final name (DESIGN §7).

#include <algorithm>
#include <cstring>
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

using Entry = std::pair<std::string, Tensor>;

std::string header_json(const std::vector<const Entry*>& order, const std::map<std::string, std::string>& metadata,
                        const std::string& path) {
  nlohmann::ordered_json root = nlohmann::ordered_json::object();
  if (!metadata.empty()) root["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const Entry* e : order) {
    const Tensor& t = e->second;
    nlohmann::ordered_json entry;
    entry["dtype"] = safetensors_dtype_name(t.dtype());
    entry["shape"] = nlohmann::ordered_json::array();
    for (int i = 0; i < t.ndim(); ++i) entry["shape"].push_back(t.size(i));
    entry["data_offsets"] = {offset, offset + t.nbytes()};
    offset += t.nbytes();
    root[e->first] = std::move(entry);
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

std::vector<const Entry*> checked_order(const std::vector<Entry>& tensors, const std::string& path) {
  std::set<std::string> names;
  std::vector<const Entry*> order;
  for (const Entry& e : tensors) {
    const std::string where = concat("writing safetensors file '", path, "': tensor '", e.first, "' ");
    LOOM_REQUIRE(e.first != "__metadata__", where, "uses the reserved name __metadata__");
    LOOM_REQUIRE(names.insert(e.first).second, where, "appears twice");
    LOOM_REQUIRE(e.second.device().is_cpu(), where, "is on ", device_name(e.second.device()), ", not the CPU");
    LOOM_REQUIRE(e.second.is_contiguous(), where, e.second.str(), " is not contiguous");
    LOOM_REQUIRE(e.second.nbytes() == 0 || e.second.data() != nullptr, where, "has no data");
    order.push_back(&e);
  }
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    const int ra = dtype_rank(a->second.dtype()), rb = dtype_rank(b->second.dtype());
    return ra != rb ? ra > rb : a->first < b->first;
  });
  return order;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::vector<const Entry*> order = checked_order(tensors, path);
  const std::string header = header_json(order, metadata, path);
  AtomicFile file(path);
  unsigned char n[8];
  for (int i = 0; i < 8; ++i) n[i] = static_cast<unsigned char>(static_cast<uint64_t>(header.size()) >> (8 * i));
  file.write(n, 8);
  file.write(header);
  for (const Entry* e : order)
    if (e->second.nbytes() > 0) file.write(e->second.data(), e->second.nbytes());
  file.commit();
}

}  // namespace loom::io
