// Store models: made from a Modelfile (`loom create`, POST /api/create) and
// read back for serving. FROM names a model directory (loom's format, as
// `loom train` writes it, or Hugging Face's; relative to the Modelfile, ~/
// the home directory), a .gguf file (the extension in any case) or a model
// already in the store; the new model keeps the weights blob of
// what it came from (no copy for a store model, one for a directory) and
// takes the Modelfile's template, system prompt, parameters, messages and
// license over the inherited ones. A Hugging Face directory's
// tokenizer_config.json chat template (and its bos/eos tokens) comes along,
// and so does a directory's own tokenizer (its tokenizer.model, or its
// tokenizer.json with tokenizer_config.json), read once at create so a
// broken one is refused there, not when the model is first served.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "model/config_json.h"
#include "serve/store/chat_template.h"
#include "serve/store/model_store.h"
#include "serve/store/modelfile.h"
#include "text/tokenizer_files.h"

namespace loom::serve {

// loom::Error naming the Modelfile line for a FROM that is neither a model
// directory nor a store model, or a TEMPLATE the Jinja subset cannot parse.
// base_dir: where a relative FROM path starts (the Modelfile's directory);
// none: FROM names a store model only, never a path (the server's
// /api/create: a client may not make the server read its disk).
StoredModel create_model(ModelStore& store, const ModelName& name, const Modelfile& mf,
                         const std::optional<std::string>& base_dir, const std::string& where);

// What serving a store model needs.
struct ResolvedModel {
  model::ModelDir dir;  // config, the weights blob's path, its layout
  // As ollama's ModelDetails names them: "gguf" or "safetensors", and the
  // weights' type ("Q8_0", "Q4_K_M", "F32", "BF16", ...; "unknown").
  std::string format, quantization_level;
  ChatTemplate chat;    // the model's template, or the plain one
  std::string system;   // default system prompt ("" when none)
  nlohmann::json parameters = nlohmann::json::object();
  nlohmann::json messages = nlohmann::json::array();  // [{role, content}] put before a chat's own
  std::string license;
  // The blobs of the model's own tokenizer (file "" when it has none in its
  // layers: a .gguf model's is in the file, others use the server's).
  text::TokenizerFiles tokenizer;
};
ResolvedModel resolve_model(const ModelStore& store, const StoredModel& m);

// ollama's details.quantization_level of a model directory's (or .gguf
// file's) weights: the GGUF file's general.file_type ("Q8_0", "Q4_K_M"), or
// the dtype holding most of a safetensors file's bytes ("F32", "BF16");
// "unknown" when unreadable. Reads the weights' header.
std::string weights_quantization_level(const model::ModelDir& dir);

}  // namespace loom::serve
