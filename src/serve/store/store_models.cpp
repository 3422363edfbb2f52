#include "serve/store/store_models.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "core/error.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "io/safetensors_index.h"
#include "model/gguf_model.h"
#include "serve/jinja/jinja.h"

namespace loom::serve {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const char* layout_name(model::ParamLayout l) { return l == model::ParamLayout::hf ? "hf" : "loom"; }

}  // namespace

std::string weights_quantization_level(const model::ModelDir& dir) {
  try {
    if (dir.gguf) {
      const io::GgufFile f = io::GgufFile::open(dir.weights);
      if (!f.has("general.file_type")) return "unknown";
      return std::string(io::gguf_file_type_name(f.get_int<uint32_t>("general.file_type")));
    }
    std::map<std::string, uint64_t> bytes;
    const auto count = [&bytes](const io::SafetensorsFile& f) {
      for (const auto& [name, info] : f.tensors()) bytes[io::safetensors_dtype_name(info.dtype)] += info.nbytes();
    };
    if (dir.sharded) {
      for (const io::SafetensorsFile& f : io::SafetensorsShards::open(dir.weights).files()) count(f);
    } else {
      count(io::SafetensorsFile::open(dir.weights));
    }
    const auto most = std::max_element(bytes.begin(), bytes.end(),
                                       [](const auto& a, const auto& b) { return a.second < b.second; });
    return most == bytes.end() ? "unknown" : most->first;
  } catch (const loom::Error&) {
    return "unknown";
  }
}

namespace {

// A .gguf file, its extension in any case (FROM ./MODEL.GGUF), as ollama takes it.
bool is_gguf_file(const fs::path& p) {
  std::error_code ec;
  return model::is_gguf_path(p.string()) && fs::is_regular_file(p, ec);
}

// FROM's path: ~/ is the home directory (ollama's expandPath), a relative path starts at base_dir.
fs::path from_path(const std::string& from, const std::string& base_dir) {
  const char* home = std::getenv("HOME");
  if (from.starts_with("~/") && home != nullptr && *home != '\0') return fs::path(home) / from.substr(2);
  const fs::path p(from);
  return p.is_absolute() ? p : fs::path(base_dir) / p;
}

// A model created before its config layer recorded the level: read from its weights once per blob and process
// (a GGUF file's header holds its vocabulary: megabytes, not to be read on every /api/tags).
std::string old_model_quantization_level(const model::ModelDir& dir, const std::string& weights_digest) {
  static std::mutex mu;
  static std::map<std::string, std::string> levels;  // weights digest -> level; blobs never change
  {
    const std::lock_guard lock(mu);
    if (const auto it = levels.find(weights_digest); it != levels.end()) return it->second;
  }
  std::string level = weights_quantization_level(dir);
  const std::lock_guard lock(mu);
  return levels.emplace(weights_digest, std::move(level)).first->second;
}

// The config layer: the model's loom config, the weights' parameter layout
// and the special tokens its template names.
// The weights layer of a GGUF model is the file itself ("format": "gguf"):
// its tensors, tokenizer and template are read from it at load, as ollama does.
std::string config_layer(const model::ModelDir& dir, const ChatTemplate& chat) {
  json c = {{"config", model::model_config_to_json(dir.config)},
            {"layout", layout_name(dir.layout)},
            {"bos_token", chat.bos_token},
            {"eos_token", chat.eos_token}};
  if (dir.gguf) c["format"] = "gguf";
  c["quantization_level"] = weights_quantization_level(dir);  // read once here, not per /api/tags
  if (!dir.eos_token_ids.empty()) c["eos_token_ids"] = dir.eos_token_ids;  // generation_config.json's
  return c.dump(2);
}

// A directory's own tokenizer, if it has one, after reading it as serving
// will (a broken tokenizer is refused here, naming the Modelfile's FROM).
void add_tokenizer_layers(std::vector<LayerSource>& layers, const std::string& dir, const std::string& where,
                          int from_line) {
  const text::TokenizerFiles own = text::tokenizer_files_in(dir);
  if (own.file.empty()) return;
  try {
    (void)text::load_tokenizer_files(own);
  } catch (const loom::Error& e) {
    throw loom::Error(where + ":" + std::to_string(from_line) + ": FROM: the model's tokenizer: " + e.what());
  }
  layers.push_back({own.sentencepiece ? kMediaTokenizerModel : kMediaTokenizerJson, own.file, "", ""});
  if (!own.config.empty()) layers.push_back({kMediaTokenizerConfig, own.config, "", ""});
}

// The layers FROM gives: a directory's (or a .gguf file's) config and
// weights (and its chat template), or a store model's layers as they are.
std::vector<LayerSource> from_layers(ModelStore& store, const Modelfile& mf, const std::optional<std::string>& base_dir,
                                     const std::string& where) {
  const fs::path path = base_dir ? from_path(mf.from, *base_dir) : fs::path(mf.from);
  if (base_dir && (fs::is_directory(path) || is_gguf_file(path))) {
    const model::ModelDir dir = model::load_model_dir(path.string());
    // One weights layer: the shards of a sharded checkpoint would need one each.
    if (dir.sharded)
      throw loom::Error(where + ":" + std::to_string(mf.from_line) + ": FROM '" + mf.from + "' is a sharded " +
                        "checkpoint (" + dir.weights + "), which the store does not take yet: write it as one file " +
                        "with loom convert --model " + mf.from + " --to hf --out DIR (or --to gguf) and create " +
                        "the model FROM that");
    const ChatTemplate chat = ChatTemplate::for_model_dir(path.string());
    std::vector<LayerSource> layers = {{kMediaConfig, "", config_layer(dir, chat), ""},
                                       {kMediaWeights, dir.weights, "", ""}};
    if (!chat.is_plain)
      layers.push_back({kMediaTemplate, "", chat.source, ""});
    if (!dir.gguf) add_tokenizer_layers(layers, path.string(), where, mf.from_line);
    return layers;
  }
  std::optional<ModelName> name;
  try {
    name = ModelName::parse(mf.from);
  } catch (const loom::Error&) {
  }
  const std::optional<StoredModel> m = name ? store.get(*name) : std::nullopt;
  if (!m && !base_dir)
    throw loom::Error(where + ":" + std::to_string(mf.from_line) + ": FROM '" + mf.from +
                      "' is not a model in the store " + store.root() + " (loom list shows them)");
  if (!m)
    throw loom::Error(where + ":" + std::to_string(mf.from_line) + ": FROM '" + mf.from +
                      "' is neither a model directory or .gguf file (" + path.string() + ") nor a model in the store " +
                      store.root() + " (loom list shows them)");
  std::vector<LayerSource> layers;
  for (const Layer& l : m->manifest.layers) layers.push_back({l.media_type, "", "", l.digest});
  return layers;
}

// Replaces (or adds) the layer of that media type.
void set_layer(std::vector<LayerSource>& layers, const char* media, std::string bytes) {
  for (LayerSource& l : layers)
    if (l.media_type == media) {
      l = {media, "", std::move(bytes), ""};
      return;
    }
  layers.push_back({media, "", std::move(bytes), ""});
}

}  // namespace

StoredModel create_model(ModelStore& store, const ModelName& name, const Modelfile& mf,
                         const std::optional<std::string>& base_dir, const std::string& where) {
  std::vector<LayerSource> layers = from_layers(store, mf, base_dir, where);
  // An empty TEMPLATE or SYSTEM is one not given (the model keeps what it inherits), as ollama's create
  // reads them: an empty template would render every chat as nothing.
  if (mf.has_template && !mf.chat_template.empty()) {
    try {
      (void)jinja::Template::parse(mf.chat_template);
    } catch (const loom::Error& e) {
      // A template from the API's fields has no line (0): the field is named instead.
      const std::string at = mf.template_line > 0 ? where + ":" + std::to_string(mf.template_line) + ": TEMPLATE"
                                                  : std::string("template");
      // ollama's own templates are Go templates ({{ .Prompt }}): loom reads Jinja, as Hugging Face's chat
      // templates are written; say so rather than show a bare Jinja parse error.
      const bool go = mf.chat_template.find("{{ .") != std::string::npos ||
                      mf.chat_template.find("{{- .") != std::string::npos ||
                      mf.chat_template.find("{{ if .") != std::string::npos ||
                      mf.chat_template.find("{{- if .") != std::string::npos;
      throw loom::Error(at + ": " + e.what() +
                        (go ? std::string(" (this looks like an ollama Go template, such as {{ .Prompt }}: loom reads "
                                          "templates as Jinja, as Hugging Face's chat templates are written; Go "
                                          "templates are not read. Write it in Jinja, over messages, or leave "
                                          "TEMPLATE out to use the model's own)")
                            : std::string()));
    }
    set_layer(layers, kMediaTemplate, mf.chat_template);
  }
  if (mf.has_system && !mf.system.empty()) set_layer(layers, kMediaSystem, mf.system);
  if (mf.has_license) set_layer(layers, kMediaLicense, mf.license);
  if (!mf.parameters.empty()) {
    json params = json::object();
    for (const LayerSource& l : layers)  // inherited parameters, then the Modelfile's over them
      if (l.media_type == kMediaParams) params = json::parse(l.digest.empty() ? l.bytes : store.read_blob(l.digest));
    for (const auto& [k, v] : mf.parameters.items()) params[k] = v;
    set_layer(layers, kMediaParams, params.dump(2));
  }
  if (!mf.messages.empty()) {
    json messages = json::array();
    for (const auto& [role, content] : mf.messages) messages.push_back({{"role", role}, {"content", content}});
    set_layer(layers, kMediaMessages, messages.dump(2));
  }
  return store.put_model(name, layers);
}

ResolvedModel resolve_model(const ModelStore& store, const StoredModel& m) {
  const std::string where = "model '" + m.name.str() + "'";
  const Layer* config = m.manifest.find(kMediaConfig);
  const Layer* weights = m.manifest.find(kMediaWeights);
  LOOM_REQUIRE(config != nullptr && weights != nullptr, where, " has no config or weights layer: recreate it");
  const json c = json::parse(store.read_blob(config->digest), nullptr, false);
  LOOM_REQUIRE(c.is_object() && c.contains("config"), where, ": its config layer is not loom's");
  ResolvedModel r;
  r.dir.config = model::model_config_from_json(c["config"], where);
  r.dir.weights = store.blob_path(weights->digest);
  r.dir.layout = c.value("layout", "loom") == "hf" ? model::ParamLayout::hf : model::ParamLayout::loom;
  r.dir.gguf = c.value("format", "") == "gguf";
  r.format = r.dir.gguf ? "gguf" : "safetensors";
  r.quantization_level = c.contains("quantization_level") ? c.value("quantization_level", "unknown")
                                                          : old_model_quantization_level(r.dir, weights->digest);
  if (c.contains("eos_token_ids")) r.dir.eos_token_ids = c["eos_token_ids"].get<std::vector<int32_t>>();
  r.chat = ChatTemplate::plain();
  if (const Layer* t = m.manifest.find(kMediaTemplate)) {
    r.chat.source = store.read_blob(t->digest);
    r.chat.bos_token = c.value("bos_token", "");
    r.chat.eos_token = c.value("eos_token", "");
    r.chat.stop = r.chat.eos_token.empty() ? std::vector<std::string>{} : std::vector<std::string>{r.chat.eos_token};
    r.chat.origin = where + "'s template";
    r.chat.is_plain = false;
  }
  if (const Layer* s = m.manifest.find(kMediaSystem)) r.system = store.read_blob(s->digest);
  if (const Layer* l = m.manifest.find(kMediaLicense)) r.license = store.read_blob(l->digest);
  if (const Layer* p = m.manifest.find(kMediaParams)) r.parameters = json::parse(store.read_blob(p->digest));
  if (const Layer* msg = m.manifest.find(kMediaMessages)) r.messages = json::parse(store.read_blob(msg->digest));
  const Layer* spm = m.manifest.find(kMediaTokenizerModel);
  if (const Layer* tok = spm != nullptr ? spm : m.manifest.find(kMediaTokenizerJson)) {
    r.tokenizer = {.file = store.blob_path(tok->digest), .config = "", .sentencepiece = tok == spm};
    if (const Layer* tc = m.manifest.find(kMediaTokenizerConfig)) r.tokenizer.config = store.blob_path(tc->digest);
  }
  return r;
}

}  // namespace loom::serve
