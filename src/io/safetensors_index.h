// Hugging Face sharded checkpoints, as transformers' save_pretrained writes
// a model over its shard size: model.safetensors.index.json
//   {"metadata": {"total_size": N}, "weight_map": {"tensor": "model-00001-of-00002.safetensors", ...}}
// beside the shard files it names. Every tensor is read from the shard the
// weight_map names; anything ambiguous is refused rather than guessed.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace loom::io {

inline constexpr const char* kSafetensorsIndexFile = "model.safetensors.index.json";

class SafetensorsShards {
 public:
  // Opens the index and every shard it names (each validated as
  // SafetensorsFile::open does). A loom::Error naming the index, the shard
  // and the tensor for: an index that is not of the form above, a shard
  // named with a directory (shards lie beside the index), a missing shard,
  // a weight_map tensor absent from its shard, a tensor in two shards, or a
  // shard tensor the weight_map does not name.
  static SafetensorsShards open(const std::string& index_path);

  const std::string& path() const { return path_; }  // the index
  // The shards, in the order the index first names them.
  const std::vector<SafetensorsFile>& files() const { return files_; }
  // The shard that holds tensor `name`; nullptr: none does.
  const SafetensorsFile* find(const std::string& name) const;

 private:
  std::string path_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> shard_of_;  // tensor -> files_ index
};

}  // namespace loom::io
