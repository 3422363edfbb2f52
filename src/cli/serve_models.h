// How `loom serve` turns a model (a directory, or a store model with its
// Modelfile defaults) into a serve::LoadedModel: weights in the serving
// dtype, an engine with its KV cache, and the engine loop that owns it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config_json.h"
#include "serve/api.h"
#include "infer/engine_args.h"
#include "serve/store/chat_template.h"
#include "serve/model_manager.h"
#include "serve/store/model_store.h"
#include "text/tokenizer.h"

namespace loom::cli {

// What each served model runs with: its engine, and the limits of its requests.
struct ServedModelArgs {
  infer::EngineArgs engine;
  int64_t max_queue = 256, max_n = 16, max_prompts = 64;
  std::string pooling = "mean";  // embeddings: mean | last (checked by CLI11)
};

// What a model brings besides its weights.
struct ModelExtras {
  std::string digest;  // the store manifest's ("" for a directory)
  serve::ChatTemplate chat;
  nlohmann::json parameters = nlohmann::json::object();  // Modelfile PARAMETERs (num_ctx sets the context)
  std::string system;
  nlohmann::json messages = nlohmann::json::array();
  // The model's own tokenizer (a GGUF file's, or the one a store model kept
  // from its directory), used instead of the server's.
  std::shared_ptr<const text::Tokenizer> tokenizer;
};

// A LoRA adapter served unmerged beside its base (`loom serve --lora
// NAME=DIR`): the name requests give as "model", and PEFT's adapter directory.
struct ServedAdapter {
  std::string name, dir;
};
// "NAME=DIR" as --lora takes it; loom::Error saying what is wrong.
ServedAdapter parse_served_adapter(const std::string& arg);

// The store's models, loaded on their first request (engine: copied). A
// model that carries its own tokenizer (a GGUF file's, or its directory's
// kept in the store) uses that one; the others, tok -- which the second form
// loads on the first such model only (loom run from any directory, with
// models that carry their own only, needs no GPT-2 files).
std::unique_ptr<serve::ModelManager> store_model_manager(const serve::ModelStore& store,
                                                         const text::Tokenizer& tok, const ServedModelArgs& served,
                                                         serve::ManagerOptions options);
using TokenizerSource = std::function<const text::Tokenizer&()>;
std::unique_ptr<serve::ModelManager> store_model_manager(const serve::ModelStore& store, TokenizerSource tok,
                                                         const ServedModelArgs& served, serve::ManagerOptions options);
serve::Catalog store_catalog(const serve::ModelStore& store);

std::shared_ptr<serve::LoadedModel> load_served_model(const std::string& name, const model::ModelDir& dir,
                                                      ModelExtras extras, const text::Tokenizer& tok,
                                                      const ServedModelArgs& a);
// The model, then each adapter as a model of its own name on the model's
// engine (LoadedModel::parent, adapter): requests for any of them are
// batched together, each row with its own adapter. An adapter directory
// that is not PEFT's LoRA, that loom cannot serve or that does not fit the
// model is a loom::Error naming it.
std::vector<std::shared_ptr<serve::LoadedModel>> load_served_models(const std::string& name,
                                                                    const model::ModelDir& dir, ModelExtras extras,
                                                                    const text::Tokenizer& tok,
                                                                    const ServedModelArgs& a,
                                                                    const std::vector<ServedAdapter>& adapters);

}  // namespace loom::cli
