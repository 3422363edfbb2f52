// loom serve: models behind an OpenAI-compatible HTTP API (serve/api.h) and
// ollama's (serve/ollama_api.h), on loopback by default. With --model DIR
// one model directory is served (loaded at start, never unloaded); without
// it the models of the store (--models, ~/.loom/models by default) are
// loaded on their first request and unloaded after their keep_alive, within
// --memory-budget-mb. The server listens at once and answers /health with
// 503 while it starts; each model's engine runs on its own thread
// (serve::EngineLoop), the HTTP connections on Asio threads. SIGTERM or
// Ctrl-C drains: new requests get 503, those in flight finish within
// --drain-seconds (then are aborted), and loom exits 0; a second signal
// exits at once.
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "cli/model_tokenizer.h"
#include "cli/commands.h"
#include "cli/engine_setup.h"
#include "cli/serve_models.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu_isa.h"
#include "model/config_json.h"
#include "core/log.h"
#include "core/stop_signal.h"
#include "core/threads.h"
#include "serve/api.h"
#include "serve/model_manager.h"
#include "serve/store/model_store.h"
#include "serve/ollama/ollama_api.h"
#include "serve/store/store_models.h"
#include "text/tokenizer_files.h"

namespace loom::cli {
namespace {

struct ServeArgs {
  std::string model_dir, name, tokenizer, chat_template, models_dir;  // tokenizer: model_tokenizer()'s --tokenizer
  std::vector<std::string> lora;  // NAME=DIR each (parse_served_adapter)
  serve::HttpOptions http{};
  serve::ApiOptions api{};
  ServedModelArgs served{};
  double max_body_mb = 8, timeout_s = 30, drain_s = 30, memory_budget_mb = 0, keep_alive_s = 300;
  int64_t max_loaded = 4;
  int threads = 1;  // the engine's compute threads; add_serve_command sets main()'s default
};

void check_args(const ServeArgs& a) {
  const ServedModelArgs& e = a.served;
  e.engine.validate();
  LOOM_REQUIRE(e.max_queue >= 1 && e.max_n >= 1 && e.max_prompts >= 1, "--max-queue, --max-n and --max-prompts must be "
               ">= 1 (given ", e.max_queue, ", ", e.max_n, ", ", e.max_prompts, ")");
  LOOM_REQUIRE(a.max_body_mb > 0 && a.timeout_s > 0 && a.drain_s >= 0 && a.memory_budget_mb >= 0,
               "--max-body-mb and --timeout must be > 0, --drain-seconds and --memory-budget-mb >= 0 (given ",
               a.max_body_mb, ", ", a.timeout_s, ", ", a.drain_s, ", ", a.memory_budget_mb, ")");
  LOOM_REQUIRE(a.http.threads >= 1 && a.http.threads <= 64, "--http-threads = ", a.http.threads,
               " is invalid: allowed 1 to 64");
  LOOM_REQUIRE(a.http.max_connections >= 1 && a.max_loaded >= 1, "--max-connections and --max-loaded must be >= 1");
  LOOM_REQUIRE(a.threads >= 1, "--threads = ", a.threads, " is invalid: allowed >= 1");
  LOOM_REQUIRE(a.lora.empty() || !a.model_dir.empty(), "--lora needs --model: adapters are served on the model ",
               "directory given there (the store's models take none)");
}

// --lora's adapters: names of their own, none the model's.
std::vector<ServedAdapter> served_adapters(const ServeArgs& a) {
  // A name and name:latest are one name to clients.
  const auto bare = [](const std::string& n) { return n.ends_with(":latest") ? n.substr(0, n.size() - 7) : n; };
  std::vector<ServedAdapter> out;
  for (const std::string& arg : a.lora) {
    ServedAdapter s = parse_served_adapter(arg);
    LOOM_REQUIRE(bare(s.name) != bare(a.name), "--lora ", arg, ": '", s.name,
                 "' is the model's own name; give the adapter another");
    for (const ServedAdapter& o : out)
      LOOM_REQUIRE(bare(o.name) != bare(s.name), "--lora ", arg, ": the name '", s.name, "' is given twice");
    out.push_back(std::move(s));
  }
  return out;
}

// Serving on its threads until stopped; stopped and joined when it goes out
// of scope, whatever happened.
struct Running {
  serve::HttpServer& server;
  std::thread thread;
  explicit Running(serve::HttpServer& s) : server(s), thread([&s] { s.run(); }) {}
  ~Running() {
    server.stop();
    thread.join();
  }
};

serve::ApiError not_found(const std::string& name) {
  return serve::ApiError(404, "NotFoundError", "model", "The model `" + name + "` does not exist.");
}

// The manager of --model DIR's one model and its --lora adapters, loaded
// now and pinned: only their names (or name:latest) name them.
std::unique_ptr<serve::ModelManager> directory_models(const ServeArgs& a, const text::Tokenizer& tok) {
  const model::ModelDir dir = model::load_model_dir(a.model_dir);
  ModelExtras extras;
  extras.chat = a.chat_template.empty() ? serve::ChatTemplate::for_model_dir(a.model_dir)
                                        : serve::ChatTemplate::from_file(a.chat_template, a.model_dir);
  auto models = load_served_models(a.name, dir, std::move(extras), tok, a.served, served_adapters(a));
  std::vector<std::string> names;
  for (const auto& m : models) names.push_back(m->name);
  auto manager = std::make_unique<serve::ModelManager>(
      [](const std::string& n) -> std::shared_ptr<serve::LoadedModel> { throw not_found(n); },
      [names](const std::string& n) {
        for (const std::string& name : names)
          if (n == name || n == name + ":latest") return name;
        throw not_found(n);
      },
      serve::ManagerOptions{});
  for (auto& m : models) manager->pin(std::move(m));
  return manager;
}

serve::Catalog catalog_of(const ServeArgs& a, const serve::ModelStore* store) {
  if (store == nullptr)
    return [name = a.name, adapters = served_adapters(a), created = static_cast<int64_t>(std::time(nullptr))] {
      std::vector<serve::CatalogEntry> out{{name, created, 0, "", nlohmann::json::object(), ""}};
      for (const ServedAdapter& s : adapters) out.push_back({s.name, created, 0, "", nlohmann::json::object(), name});
      return out;
    };
  return store_catalog(*store);
}

void run_serve(ServeArgs a) {
  check_args(a);
  set_num_threads(a.threads);
  a.http.max_body_bytes = static_cast<int64_t>(a.max_body_mb * (1 << 20));
  a.http.request_timeout = a.http.write_timeout = std::chrono::milliseconds(static_cast<int64_t>(a.timeout_s * 1000));
  const bool from_store = a.model_dir.empty();
  namespace fs = std::filesystem;
  if (!from_store && a.name.empty() && model::is_gguf_path(a.model_dir))
    a.name = fs::path(a.model_dir).stem().string();  // m.gguf serves as "m", as ollama names it
  if (!from_store && a.name.empty()) a.name = fs::path(a.model_dir).lexically_normal().filename().string();
  if (!from_store && a.name.empty()) a.name = fs::path(a.model_dir).lexically_normal().parent_path().filename().string();
  const StopSignals stop("draining: new requests get 503, those in flight finish");
  const std::unique_ptr<text::Tokenizer> tokenizer =
      from_store ? text::load_tokenizer(a.tokenizer.empty() ? kDefaultTokenizerDir : a.tokenizer)
                 : model_tokenizer(model::load_model_dir(a.model_dir), a.tokenizer);
  const text::Tokenizer& tok = *tokenizer;
  std::unique_ptr<serve::ModelStore> store;
  if (from_store)
    store = std::make_unique<serve::ModelStore>(a.models_dir.empty() ? serve::default_store_root(std::getenv("HOME"))
                                                                    : a.models_dir);
  std::unique_ptr<serve::ModelManager> models;  // outlives the server: its threads reach the models until stopped
  std::unique_ptr<serve::OllamaApi> ollama;
  serve::Api api(a.api);
  serve::HttpServer server(
      a.http, [&api](const serve::HttpRequest& r) { return api.handle(r); },
      [&api](int status, const std::string& message, const std::string& path) {
        return api.error_response(status, message, path);
      });
  const Running running(server);
  log_info("serve: listening on http://", a.http.host, ":", server.port(), " (starting; ", kernels::cpu_isa_describe(),
           ")");
  serve::ManagerOptions options;
  options.memory_budget_bytes = static_cast<int64_t>(a.memory_budget_mb * (1 << 20));
  options.keep_alive = std::chrono::seconds(static_cast<int64_t>(a.keep_alive_s));
  options.max_loaded = a.max_loaded;
  models = from_store ? store_model_manager(*store, tok, a.served, options) : directory_models(a, tok);
  ollama = std::make_unique<serve::OllamaApi>(api, *models, store.get());
  api.ready(*models, catalog_of(a, store.get()), [&ollama](const serve::HttpRequest& r) { return ollama->handle(r); });
  if (from_store)
    log_info("serve: ready: the models of ", store->root(), " at http://", a.http.host, ":", server.port(), "/v1");
  else
    log_info("serve: ready: model '", a.name, "' at http://", a.http.host, ":", server.port(), "/v1 (context ",
             models->models().front()->served.max_model_len, " tokens)");
  while (stop.received() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  api.draining();
  const bool clean = models->drain(std::chrono::milliseconds(static_cast<int64_t>(a.drain_s * 1000)));
  // The last tokens are still being written: give the responses a moment to end.
  for (int i = 0; i < 100 && api.active() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  // A model being created finishes (whole or not at all) while the server still runs.
  if (!ollama->wait_for_tasks(std::chrono::milliseconds(static_cast<int64_t>(a.drain_s * 1000))))
    log_warn("serve: a model create was still running at exit");
  log_info("serve: ", signal_name(stop.received()), ": ", clean ? "every request finished" : "requests aborted after "
           "--drain-seconds", "; stopped");
}

// The flags of each served model: its engine's (engine_setup.h), and the
// limits of its requests.
void add_served_model_options(CLI::App& cmd, ServedModelArgs& e) {
  add_engine_options(cmd, e.engine);
  cmd.add_option("--max-queue", e.max_queue, "requests waiting beyond those running; more get 429")
      ->capture_default_str();
  cmd.add_option("--max-n", e.max_n, "largest n a request may ask")->capture_default_str();
  cmd.add_option("--max-prompts", e.max_prompts, "prompts one request may hold")->capture_default_str();
  cmd.add_option("--pooling", e.pooling, "embeddings (/v1/embeddings, /api/embed): the final hidden states of "
                                        "every input token averaged (mean) or the last token's (last)")
      ->check(CLI::IsMember({"mean", "last"}))
      ->capture_default_str();
}

}  // namespace

void add_serve_command(CLI::App& app, int default_threads) {
  CLI::App* cmd = app.add_subcommand("serve", "Serve models over OpenAI's HTTP API (/v1/completions, "
                                              "/v1/chat/completions, /v1/embeddings, /v1/models) and ollama's (/api/generate, "
                                              "/api/chat, /api/tags, ...), with /health and /metrics");
  auto a = std::make_shared<ServeArgs>();
  a->threads = default_threads;
  cmd->add_option("--model", a->model_dir, "serve this model directory (loom_config.json or config.json, "
                                           "model.safetensors) or .gguf file instead of the store's models");
  cmd->add_option("--models", a->models_dir, "the model store (default ~/.loom/models)");
  cmd->add_option("--lora", a->lora, "with --model: serve a LoRA adapter (PEFT's directory) unmerged as NAME=DIR, "
                                     "requested as model NAME and batched with the model's requests; repeatable");
  cmd->add_option("--served-model-name", a->name, "with --model: the name clients give as \"model\" (default: the "
                                                  "directory's)");
  cmd->add_option("--host", a->http.host, "address to listen on (0.0.0.0: every interface)")->capture_default_str();
  cmd->add_option("--port", a->http.port, "port (0: any free one, printed)")->capture_default_str();
  cmd->add_option("--api-key", a->api.api_key, "require 'Authorization: Bearer KEY' on /v1/ and /api/ routes");
  cmd->add_option("--chat-template", a->chat_template, "with --model: a Jinja file for chat (default: the directory's "
                                                       "tokenizer_config.json chat_template, else a plain "
                                                       "User:/Assistant: template)");
  cmd->add_option("--tokenizer", a->tokenizer, kTokenizerHelp)
      ->capture_default_str();
  add_served_model_options(*cmd, a->served);
  cmd->add_option("--keep-alive", a->keep_alive_s, "seconds a store model stays loaded after its last request")
      ->capture_default_str();
  cmd->add_option("--memory-budget-mb", a->memory_budget_mb, "store models loaded at once within this memory (0: no "
                                                             "budget; the least recently used idle one goes first)");
  cmd->add_option("--max-loaded", a->max_loaded, "store models loaded at once at most")->capture_default_str();
  cmd->add_option("--max-body-mb", a->max_body_mb, "request body limit (413 beyond)")->capture_default_str();
  cmd->add_option("--max-connections", a->http.max_connections, "open connections at most (503 beyond)")
      ->capture_default_str();
  cmd->add_option("--timeout", a->timeout_s, "seconds a client has to send a request, and to take each write")
      ->capture_default_str();
  cmd->add_option("--drain-seconds", a->drain_s, "on SIGTERM, how long requests in flight may take to finish")
      ->capture_default_str();
  cmd->add_option("--threads", a->threads, "compute threads of the models")->capture_default_str();
  cmd->add_option("--http-threads", a->http.threads, "threads serving connections (the models have their own)")
      ->capture_default_str();
  cmd->add_flag("!--no-access-log", a->api.access_log, "no line per request on stderr");
  cmd->add_option("--allow-origin", a->api.allow_origins,
                  "an origin browsers may call the API from (CORS), e.g. http://localhost:3000; repeat for more, "
                  "'*' for any (default: none)");
  cmd->callback([a] { run_serve(*a); });
}

}  // namespace loom::cli
