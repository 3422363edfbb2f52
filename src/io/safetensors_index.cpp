#include "io/safetensors_index.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace loom::io {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json read_index(const std::string& path) {
  std::ifstream in(path);
  LOOM_REQUIRE(in, "cannot open '", path, "': ", fs::exists(path) ? "not readable" : "no such file");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::parse_error& e) {
    fail(path, ": not valid JSON: ", e.what());
  }
  LOOM_REQUIRE(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), path,
               ": key 'weight_map' is missing or not an object: a sharded checkpoint's index maps each tensor ",
               "name to its shard file");
  return j;
}

// A shard's name as the weight_map gives it: a file beside the index.
void require_shard_name(const std::string& index, const std::string& tensor, const json& shard) {
  LOOM_REQUIRE(shard.is_string(), index, ": weight_map['", tensor, "'] = ", shard.dump(),
               " is not a file name");
  const std::string name = shard.get<std::string>();
  LOOM_REQUIRE(!name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos, index,
               ": weight_map['", tensor, "'] = '", name, "' is not a file name: shards lie beside the index");
}

}  // namespace

SafetensorsShards SafetensorsShards::open(const std::string& index_path) {
  const json index = read_index(index_path);
  const fs::path dir = fs::path(index_path).parent_path();
  SafetensorsShards s;
  s.path_ = index_path;
  std::map<std::string, size_t> file_index;  // shard name -> files_ index
  for (const auto& [tensor, shard] : index["weight_map"].items()) {
    require_shard_name(index_path, tensor, shard);
    const std::string name = shard.get<std::string>();
    auto [it, added] = file_index.emplace(name, s.files_.size());
    if (added) {
      const fs::path p = dir / name;
      std::error_code ec;
      LOOM_REQUIRE(fs::is_regular_file(p, ec), index_path, ": shard '", name, "' (of tensor '", tensor,
                   "') is missing: expected the file '", p.string(), "'");
      s.files_.push_back(SafetensorsFile::open(p.string()));
    }
    LOOM_REQUIRE(s.files_[it->second].has(tensor), index_path, ": weight_map puts tensor '", tensor, "' in shard '",
                 name, "', which does not hold it");
    s.shard_of_[tensor] = it->second;
  }
  // A tensor of a shard the map does not send there: stored twice, or left
  // out of the map. transformers would read whichever shard it loads last.
  for (const SafetensorsFile& f : s.files_)
    for (const auto& [tensor, info] : f.tensors()) {
      const auto at = s.shard_of_.find(tensor);
      LOOM_REQUIRE(at != s.shard_of_.end(), index_path, ": tensor '", tensor, "' of shard '", f.path(),
                   "' is not in the weight_map: the index must name every tensor");
      LOOM_REQUIRE(&s.files_[at->second] == &f, index_path, ": tensor '", tensor, "' is in two shards, '",
                   s.files_[at->second].path(), "' (as the weight_map says) and '", f.path(), "'");
    }
  return s;
}

const SafetensorsFile* SafetensorsShards::find(const std::string& name) const {
  const auto it = shard_of_.find(name);
  return it == shard_of_.end() ? nullptr : &files_[it->second];
}

}  // namespace loom::io
