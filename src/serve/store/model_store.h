// The local model store of `loom serve`, `loom create`, `loom list`, ...
// (~/.loom/models by default, --models DIR), laid out as ollama's:
//
//   ROOT/blobs/sha256-<hex>              content-addressed: a file's name is its digest
//   ROOT/manifests/<name>/<tag>          JSON: the layers (media type, digest, size) of one model
//
// A model is a manifest naming blobs: its loom config (with the weights'
// parameter layout), its safetensors weights, and optionally a chat
// template, a system prompt, default parameters, messages and a license.
// Two models with the same weights share one blob; a blob is removed only
// when no manifest names it any more. Every write is atomic (a temporary
// file renamed into place) and writers take ROOT/.lock, so a `loom rm`
// collecting blobs never removes one a concurrent `loom create` is adding.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace loom::serve {

// The store's own disk failed (read-only, full, no permission): the message
// gives the reason. Over HTTP it is the server's problem (500, as ollama
// answers its own disk failures), never blamed on the request.
class StoreError : public loom::Error {
 public:
  using loom::Error::Error;
};

// "name[:tag]" (tag "latest" when absent): name is one or more parts of
// letters, digits, '.', '_' and '-' separated by '/', each starting with a
// letter or digit; loom::Error otherwise, naming what is wrong.
struct ModelName {
  std::string name, tag;
  static ModelName parse(std::string_view text);
  std::string str() const { return name + ":" + tag; }
  bool operator==(const ModelName&) const = default;
};

inline constexpr const char* kMediaConfig = "application/vnd.loom.model.config";     // JSON: config and layout
inline constexpr const char* kMediaWeights = "application/vnd.loom.model.weights";   // safetensors
inline constexpr const char* kMediaTemplate = "application/vnd.loom.model.template"; // Jinja chat template
inline constexpr const char* kMediaSystem = "application/vnd.loom.model.system";     // text
inline constexpr const char* kMediaParams = "application/vnd.loom.model.params";     // JSON object
inline constexpr const char* kMediaMessages = "application/vnd.loom.model.messages"; // JSON list
inline constexpr const char* kMediaLicense = "application/vnd.loom.model.license";   // text
// A model directory's own tokenizer: its tokenizer.model, or its
// tokenizer.json and the tokenizer_config.json beside it (not for a .gguf
// file: that carries its tokenizer in its metadata).
inline constexpr const char* kMediaTokenizerModel = "application/vnd.loom.model.tokenizer.model";  // SentencePiece
inline constexpr const char* kMediaTokenizerJson = "application/vnd.loom.model.tokenizer.json";
inline constexpr const char* kMediaTokenizerConfig = "application/vnd.loom.model.tokenizer_config";  // JSON

struct Layer {
  std::string media_type, digest;  // digest: "sha256:<hex>"
  int64_t size = 0;
};

struct Manifest {
  std::vector<Layer> layers;
  const Layer* find(std::string_view media_type) const;
  int64_t total_size() const;
  nlohmann::json to_json() const;
  static Manifest from_json(const nlohmann::json& j, const std::string& where);
};

struct StoredModel {
  ModelName name;
  Manifest manifest;
  std::string digest;     // of the manifest's bytes ("sha256:<hex>")
  int64_t modified = 0;   // unix seconds of the manifest file
};

// One layer of a model being created: its content from a file, from bytes,
// or an existing blob (digest set: a layer of another model).
struct LayerSource {
  std::string media_type;
  std::string file, bytes, digest;
};

class ModelStore {
 public:
  // Opens the store at root, creating it if missing; with create false a
  // missing store stays missing and reads as empty (loom list, show: reading
  // never makes directories).
  explicit ModelStore(std::string root, bool create = true);
  const std::string& root() const { return root_; }

  std::string blob_path(const std::string& digest) const;
  std::string read_blob(const std::string& digest) const;

  // Adds the layers' blobs (a blob already present is kept) and writes (or
  // replaces) name's manifest, as one step under the store's lock; a
  // replaced manifest's blobs that no manifest names any more are removed
  // (copy onto an existing name too). Every
  // write (put_model, copy, remove) first removes the *.tmp files a writer
  // killed mid-write left.
  StoredModel put_model(const ModelName& name, const std::vector<LayerSource>& layers);
  std::optional<StoredModel> get(const ModelName& name) const;
  // The stored spelling of name: names match in any case (ollama's
  // getExistingName), so `FOO` finds, replaces or removes the model `foo`;
  // name itself when no model matches.
  ModelName existing_name(const ModelName& name) const;
  std::vector<StoredModel> list() const;  // sorted by name
  // to (replaced if present) names from's layers; false when from is
  // missing (checked under the lock: it may go between a caller's check and
  // the copy).
  bool copy(const ModelName& from, const ModelName& to);
  // Removes the manifest, then every blob no manifest names; false when
  // there was no such model.
  bool remove(const ModelName& name);

 private:
  std::string manifest_path(const ModelName& name) const;
  Layer put_layer(const LayerSource& src);
  void write_manifest(const ModelName& name, const Manifest& m);
  std::optional<Manifest> replaced_manifest(const ModelName& name) const;
  void collect_garbage(const Manifest* only = nullptr);
  void collect_leftovers();

  std::string root_;
};

// ~/.loom/models (HOME from the environment, passed in by main).
std::string default_store_root(const char* home);

}  // namespace loom::serve
