#include "serve/ollama/ollama_api.h"

#include <chrono>
#include <thread>
#include <filesystem>
#include <utility>

#include "core/error.h"
#include "core/sha256.h"
#include "model/config_json.h"
#include "model/params.h"
#include "serve/embeddings.h"
#include "serve/ollama/ollama_format.h"
#include "serve/openai/openai_response.h"
#include "serve/store/store_models.h"
#include "serve/task_source.h"

namespace loom::serve {
namespace {

using json = nlohmann::json;


// A store model's details; {} for a model the store cannot read (a broken model still lists).
json stored_details(const ModelStore& store, const StoredModel& m) {
  try {
    const ResolvedModel r = resolve_model(store, m);
    return ollama_details(r.dir.config, r.format, r.quantization_level, "");
  } catch (const loom::Error&) {
    return json::object();
  }
}

std::string hex(const std::string& digest) { return digest.rfind("sha256:", 0) == 0 ? digest.substr(7) : digest; }

}  // namespace

json ollama_details(const model::ModelConfig& c, const std::string& format, const std::string& quantization_level,
                    const std::string& parent_model) {
  const std::string family = c.family == model::Family::llama ? "llama" : "gpt2";
  return {{"parent_model", parent_model},
          {"format", format},
          {"family", family},
          {"families", json::array({family})},
          {"parameter_size", human_count(model::param_count(model::param_specs(c)))},
          {"quantization_level", quantization_level}};
}

// A loaded model's details: a store model's as the store resolves it, else (a --model directory, an adapter)
// what load_served_models read of its weights.
json OllamaApi::loaded_details(const std::string& name) const {
  if (store_ != nullptr) {
    try {
      if (const std::optional<StoredModel> m = store_->get(ModelName::parse(name))) return stored_details(*store_, *m);
    } catch (const loom::Error&) {
    }
  }
  for (const std::shared_ptr<LoadedModel>& m : models_.models())
    if (m->name == name) return ollama_details(m->config, m->format, m->quantization_level, m->parent);
  return json::object();
}

// A store model's digest is its manifest's; a --model directory has none, and ollama's CLI shows the first 12
// characters of one (ListHandler's m.Digest[:12]): the hash of what the model is served as, the same on
// every start with the same directory and flags.
std::string OllamaApi::served_digest(const LoadedModel& m) const {
  if (!m.digest.empty()) return hex(m.digest);
  const json identity = {{"name", m.name},         {"config", model::model_config_to_json(m.config)},
                         {"parent", m.parent},     {"template", m.template_source},
                         {"system", m.system},     {"parameters", m.parameters},
                         {"messages", m.messages}};
  return sha256_hex(identity.dump());
}

OllamaApi::OllamaApi(Api& api, ModelManager& models, ModelStore* store) : api_(api), models_(models), store_(store) {}

OllamaApi::~OllamaApi() { wait_for_tasks(std::chrono::minutes(10)); }

bool OllamaApi::wait_for_tasks(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (tasks_.load() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return tasks_.load() == 0;
}

HttpResponse OllamaApi::handle(const HttpRequest& req) {
  try {
    return route(req);
  } catch (const ApiError& e) {
    return ollama_error(e);
  } catch (const StoreError& e) {  // the store's disk, not the request: ollama answers its own disk failures 500
    return ollama_error(ApiError(500, "InternalServerError", "", e.what()));
  } catch (const loom::Error& e) {
    return ollama_error(bad_request("", e.what()));
  } catch (const std::filesystem::filesystem_error& e) {  // reading or cleaning the store's folders failed
    return ollama_error(ApiError(500, "InternalServerError", "", std::string("the model store failed: ") + e.what()));
  } catch (const std::exception& e) {
    return ollama_error(ApiError(500, "InternalServerError", "", std::string("internal error: ") + e.what()));
  }
}

HttpResponse OllamaApi::route(const HttpRequest& req) {
  const std::string& p = req.path;
  const auto is = [&](const char* path, const char* method) { return p == path && req.method == method; };
  if (is("/api/generate", "POST") || is("/api/chat", "POST")) return generate(req, p == "/api/chat");
  if (is("/api/embed", "POST") || is("/api/embeddings", "POST")) return embed(req, p == "/api/embed");
  if (is("/api/tags", "GET")) return tags();
  if (is("/api/show", "POST")) return show(req);
  if (is("/api/ps", "GET")) return ps();
  if (is("/api/create", "POST")) return create(req);
  if (is("/api/delete", "DELETE")) return remove(req);
  if (is("/api/copy", "POST")) return copy(req);
  if (is("/api/pull", "POST")) return pull(req);
  if (is("/api/push", "POST"))
    throw bad_request("model", "loom serve pushes to no registry: its models stay in this machine's store");
  if (is("/api/version", "GET")) return json_response(200, {{"version", "0.1.0-loom"}});
  for (const char* known : {"/api/generate", "/api/chat", "/api/embed", "/api/embeddings", "/api/tags", "/api/show", "/api/ps", "/api/create",
                            "/api/delete", "/api/copy", "/api/version", "/api/pull", "/api/push"})
    if (p == known) throw ApiError(405, "MethodNotAllowed", "", p + " does not take " + req.method);
  throw ApiError(404, "NotFoundError", "", "no route " + req.method + " " + p);
}

ModelStore& OllamaApi::store() const {
  if (store_ == nullptr)
    throw bad_request("", "this server serves one model directory (--model); start loom serve without --model "
                          "to use the model store");
  return *store_;
}

HttpResponse OllamaApi::generate(const HttpRequest& req, bool chat) {
  nlohmann::ordered_json body = parse_body(req.body);
  const std::string model = required_string(body, "model");
  const std::optional<std::chrono::seconds> keep_alive = parse_keep_alive(body);
  auto format = std::make_unique<OllamaFormat>(body, chat);
  if (!format->generates() && keep_alive && keep_alive->count() == 0) {
    const std::string name = models_.canonical(model);
    models_.unload(name);
    json j = {{"model", name}, {"created_at", rfc3339(std::chrono::system_clock::now())}, {"done", true},
              {"done_reason", "unload"}};
    if (chat) j["message"] = {{"role", "assistant"}, {"content", ""}};
    else j["response"] = "";
    return json_response(200, j);
  }
  if (format->generates()) format->precheck();  // answered now, not after loading the model
  const bool stream = flag(body, "stream", true);
  auto source = std::make_shared<GenerationSource>(models_, model, std::move(format), api_.draw_seed(), keep_alive,
                                                   req.received);
  return api_.generation(req, std::move(source), stream, "application/x-ndjson");
}

HttpResponse OllamaApi::embed(const HttpRequest& req, bool batch) {
  nlohmann::ordered_json body = parse_body(req.body);
  const std::string model = required_string(body, "model");
  const std::optional<std::chrono::seconds> keep_alive = parse_keep_alive(body);
  auto format = std::make_unique<EmbeddingFormat>(
      std::move(body), batch ? EmbedRoute::ollama_embed : EmbedRoute::ollama_embeddings, std::string());
  format->precheck();  // answered now, not after loading the model
  auto source = std::make_shared<GenerationSource>(models_, model, std::move(format), api_.draw_seed(), keep_alive,
                                                   req.received);
  return api_.generation(req, std::move(source), false, "");
}

HttpResponse OllamaApi::tags() const {
  json models = json::array();
  if (store_ == nullptr) {
    for (const auto& m : models_.models())
      models.push_back({{"name", m->name}, {"model", m->name}, {"modified_at", rfc3339(std::chrono::system_clock::now())},
                        {"size", m->bytes}, {"digest", served_digest(*m)},
                        {"details", ollama_details(m->config, m->format, m->quantization_level, m->parent)}});
    return json_response(200, {{"models", models}});
  }
  for (const StoredModel& m : store_->list())
    models.push_back({{"name", m.name.str()},
                      {"model", m.name.str()},
                      {"modified_at", rfc3339(std::chrono::system_clock::from_time_t(m.modified))},
                      {"size", m.manifest.total_size()},
                      {"digest", hex(m.digest)},
                      {"details", stored_details(*store_, m)}});
  return json_response(200, {{"models", models}});
}

}  // namespace loom::serve
