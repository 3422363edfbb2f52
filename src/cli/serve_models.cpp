#include "cli/serve_models.h"

#include <algorithm>
#include <chrono>

#include "cli/engine_setup.h"
#include "cli/model_tokenizer.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"
#include "io/gguf.h"
#include "serve/harmony.h"
#include "serve/store/store_models.h"
#include "infer/engine.h"
#include "model/lora.h"
#include "model/paged_runner.h"
#include "text/tokenizer_files.h"

namespace loom::cli {
namespace {

// The weights and the engine a LoadedModel's loop drives.
struct Owned {
  Pools pools;
  std::shared_ptr<const text::Tokenizer> tokenizer;  // the model's own, when it has one
  model::ServingWeights weights;
  std::unique_ptr<infer::Engine> engine;
};

// What requests are checked against and rendered with: the model's
// limits, its template and what the template says of its answers. A
// harmony model also ends its answers with <|return|> or <|call|>, and its
// grammars may write the markers its output shows.
serve::ServedModel served_model(const std::string& name, const model::ModelDir& dir, const serve::ChatTemplate& chat,
                                const text::Tokenizer& tok, const ServedModelArgs& a, int64_t max_model_len,
                                const serve::HarmonyTokens& harmony) {
  std::vector<int32_t> eos;
  if (tok.eos_id() >= 0) eos.push_back(tok.eos_id());
  // And an HF model's generation_config.json ids, which transformers' generate and vLLM stop at too.
  std::vector<int32_t> ends = dir.eos_token_ids;
  ends.insert(ends.end(), harmony.end.begin(), harmony.end.end());
  for (int32_t t : ends)
    if (std::find(eos.begin(), eos.end(), t) == eos.end()) eos.push_back(t);
  return serve::ServedModel{
      .name = name,
      .max_model_len = max_model_len,
      .vocab_size = dir.config.vocab_size,
      .eos_token_ids = eos,
      .tokenizer = &tok,
      .max_n = a.max_n,
      .max_prompts = a.max_prompts,
      .render_chat = serve::chat_renderer(chat),
      .chat_stop = chat.stop,
      .renders_tools = serve::template_renders_tools(chat.source),
      .tool_format = serve::tool_format_of(chat.source),
      .thinks = serve::template_thinks(chat.source),
      .think_tags = serve::think_tags_of(chat.source),
      .embedding_pooling = a.pooling == "last" ? infer::Pooling::last : infer::Pooling::mean,
      .grammar_vocab = std::make_shared<infer::GrammarVocab>(tok, dir.config.vocab_size, harmony.shown)};
}

// Reads PEFT's adapter directory and adds it to the engine, which computes
// in `dtype`; the bytes it holds there.
int64_t add_adapter(infer::Engine& engine, DType dtype, const model::ModelConfig& cfg, const ServedAdapter& s,
                    const std::string& model_name) {
  try {
    std::string base_model;
    const model::LoraConfig lora = model::read_peft_config(s.dir, cfg, &base_model);
    Pools pools;
    const OwnedTensor weights = pools[MemTag::workspace].empty(DType::f32, {model::lora_param_count(cfg, lora)});
    model::load_peft_adapter(s.dir, cfg, lora, weights);
    engine.add_adapter(lora, weights);
    log_info("serve: adapter ", s.name, " (", s.dir, ") on model ", model_name, ": rank ", lora.rank, ", alpha ",
             lora.alpha, ", ", model::lora_module_names(cfg, lora).size(), " linears per layer",
             base_model.empty() ? std::string() : concat(", trained on ", base_model));
    return weights.numel() * static_cast<int64_t>(dtype_size(dtype));
  } catch (const loom::Error& e) {
    fail("--lora ", s.name, "=", s.dir, ": ", e.what());
  }
}

// Adapter `id` of base's engine as a model of its own: base's limits,
// template and defaults under its name, base's loop.
std::shared_ptr<serve::LoadedModel> adapter_model(const std::shared_ptr<serve::LoadedModel>& base,
                                                  const std::string& name, int32_t id, int64_t bytes) {
  auto ad = std::make_shared<serve::LoadedModel>();
  ad->name = name;
  ad->served = base->served;
  ad->served.name = name;
  ad->templated = base->templated, ad->template_source = base->template_source;
  ad->parameters = base->parameters, ad->system = base->system, ad->messages = base->messages;
  ad->config = base->config;
  ad->format = base->format, ad->quantization_level = base->quantization_level;
  ad->bytes = bytes;
  ad->owner = base;  // the base (its engine) stays while the adapter does
  ad->loop = base->loop;
  ad->parent = base->name;
  ad->adapter = id;
  ad->loaded_at = base->loaded_at;
  return ad;
}

}  // namespace

ServedAdapter parse_served_adapter(const std::string& arg) {
  const size_t eq = arg.find('=');
  LOOM_REQUIRE(eq != std::string::npos && eq > 0 && eq + 1 < arg.size(), "--lora '", arg, "' is invalid: give ",
               "NAME=DIR, the name requests use as \"model\" and a PEFT adapter directory");
  return {arg.substr(0, eq), arg.substr(eq + 1)};
}

std::shared_ptr<serve::LoadedModel> load_served_model(const std::string& name, const model::ModelDir& dir,
                                                      ModelExtras extras, const text::Tokenizer& server_tok,
                                                      const ServedModelArgs& a) {
  return load_served_models(name, dir, std::move(extras), server_tok, a, {}).front();
}

std::vector<std::shared_ptr<serve::LoadedModel>> load_served_models(const std::string& name,
                                                                    const model::ModelDir& dir, ModelExtras extras,
                                                                    const text::Tokenizer& server_tok,
                                                                    const ServedModelArgs& a,
                                                                    const std::vector<ServedAdapter>& adapters) {
  const text::Tokenizer& tok = extras.tokenizer ? *extras.tokenizer : server_tok;
  LOOM_REQUIRE(dir.config.vocab_size >= tok.vocab_size(), "model ", name, ": vocab_size ", dir.config.vocab_size,
               " is smaller than the tokenizer's ", tok.vocab_size(), " tokens");
  infer::EngineArgs e = a.engine;  // a Modelfile's PARAMETER num_ctx is the model's context
  if (extras.parameters.contains("num_ctx")) e.max_model_len = extras.parameters["num_ctx"].get<int64_t>();
  auto owned = std::make_shared<Owned>();
  owned->tokenizer = extras.tokenizer;
  owned->weights = load_weights(dir, e, owned->pools);
  if (owned->weights.quant) log_info("serve: model ", name, ": ", weights_description(owned->weights, e.dtype));
  owned->engine = std::make_unique<infer::Engine>(dir.config, owned->weights.params, owned->pools,
                                                  e.config(dir.config),
                                                  owned->weights.quant_or_null());
  std::vector<int64_t> adapter_bytes;  // before the loop starts: the engine is this thread's until then
  for (const ServedAdapter& s : adapters)
    adapter_bytes.push_back(add_adapter(*owned->engine, owned->weights.params.dtype(), dir.config, s, name));
  // A harmony model (gpt-oss): its output shows the markers its reader needs (harmony.h).
  serve::HarmonyTokens harmony;
  if (serve::tool_format_of(extras.chat.source) == serve::ToolFormat::harmony && !extras.chat.is_plain)
    harmony = serve::harmony_tokens(tok);
  auto m = std::make_shared<serve::LoadedModel>();
  m->name = name;
  m->digest = extras.digest;
  m->served = served_model(name, dir, extras.chat, tok, a, owned->engine->config().max_model_len, harmony);
  m->templated = !extras.chat.is_plain;
  m->config = dir.config;
  m->format = dir.gguf ? "gguf" : "safetensors";
  m->quantization_level = serve::weights_quantization_level(dir);
  if (m->templated) m->template_source = extras.chat.source;
  m->parameters = std::move(extras.parameters);
  m->system = std::move(extras.system);
  m->messages = std::move(extras.messages);
  // Everything the model holds: its weights, and all the engine allocated
  // beside them (KV cache, the logits buffer and other working buffers:
  // max_num_batched_tokens x vocab x 4 B of logits alone), and the
  // vocabulary constrained decoding walks.
  const MemoryReport held = owned->pools.report();
  m->bytes = owned->weights.bytes() +
             std::max<int64_t>(static_cast<int64_t>(held.current_total - held[MemTag::params].current),
                               owned->engine->runner().kv_cache_bytes()) +
             m->served.grammar_vocab->memory_bytes();
  m->loop = std::make_unique<serve::EngineLoop>(
      *owned->engine, &tok, serve::LoopOptions{.max_waiting = a.max_queue, .shown_tokens = std::move(harmony.shown)});
  m->owner = std::move(owned);
  m->loaded_at = std::chrono::steady_clock::now();
  std::vector<std::shared_ptr<serve::LoadedModel>> out{m};
  for (size_t k = 0; k < adapters.size(); ++k)
    out.push_back(adapter_model(m, adapters[k].name, static_cast<int32_t>(k + 1), adapter_bytes[k]));
  return out;
}

std::unique_ptr<serve::ModelManager> store_model_manager(const serve::ModelStore& store,
                                                         const text::Tokenizer& tok, const ServedModelArgs& served,
                                                         serve::ManagerOptions options) {
  return store_model_manager(store, [&tok]() -> const text::Tokenizer& { return tok; }, served, options);
}

std::unique_ptr<serve::ModelManager> store_model_manager(const serve::ModelStore& store, TokenizerSource tok,
                                                         const ServedModelArgs& served, serve::ManagerOptions options) {
  options.current_digest = [&store](const std::string& n) -> std::optional<std::string> {
    try {
      const std::optional<serve::StoredModel> m = store.get(serve::ModelName::parse(n));
      return m ? std::optional(m->digest) : std::nullopt;
    } catch (const loom::Error&) {
      return std::nullopt;  // a manifest being rewritten or broken: not the model that was loaded
    }
  };
  return std::make_unique<serve::ModelManager>(
      [&store, tok, served](const std::string& n) {
        const std::optional<serve::StoredModel> m = store.get(serve::ModelName::parse(n));
        if (!m) throw serve::ApiError(404, "NotFoundError", "model", "model '" + n + "' not found");
        serve::ResolvedModel r = serve::resolve_model(store, *m);
        ModelExtras extras{m->digest, std::move(r.chat), std::move(r.parameters), std::move(r.system),
                           std::move(r.messages), nullptr};
        if (!r.tokenizer.file.empty())  // a model directory's own, kept in the store
          extras.tokenizer = text::load_tokenizer_files(r.tokenizer);
        else if (r.dir.gguf && io::GgufFile::open(r.dir.weights).has("tokenizer.ggml.model"))
          extras.tokenizer = model_tokenizer(r.dir, "");  // the file's own, else the server's
        log_info("serve: loading model ", n);
        return load_served_model(n, r.dir, std::move(extras), extras.tokenizer ? *extras.tokenizer : tok(), served);
      },
      [&store](const std::string& n) {
        try {
          return store.existing_name(serve::ModelName::parse(n)).str();  // FOO is the stored foo, loaded once
        } catch (const loom::Error& e) {
          throw serve::bad_request("model", e.what());
        }
      },
      options);
}

serve::Catalog store_catalog(const serve::ModelStore& store) {
  return [&store] {
    std::vector<serve::CatalogEntry> out;
    for (const serve::StoredModel& m : store.list())
      out.push_back({m.name.str(), m.modified, m.manifest.total_size(), m.digest, nlohmann::json::object(), ""});
    return out;
  };
}

}  // namespace loom::cli
