// Which models `loom serve` has loaded, as ollama manages them: a model is
// loaded on its first request (on the manager's own thread: the HTTP threads
// never wait for it), stays while requests use it and then for its
// keep_alive (5 minutes by default; a negative one keeps it, 0 unloads it as
// soon as it is idle), and several stay loaded within a memory budget, the
// least recently used idle one unloaded first to make room. A model pinned
// at start (`loom serve --model DIR`) is never unloaded.
//
// A request holds a shared_ptr to its LoadedModel: unloading drops the
// manager's reference, and the engine goes when the last request using it
// ends.
//
// A request is served by what the store holds now, as ollama re-reads the
// manifest per request: with ManagerOptions::current_digest, a loaded model
// whose digest the store no longer has (re-created: another digest;
// removed: none) is retired (its requests in flight finish on it, then it
// goes) and the request loads the model anew (or gets the 404). The
// manager also checks its loaded models about once a second, so a removed
// model leaves memory without waiting for a request.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "serve/engine_loop.h"
#include "serve/openai/openai_request.h"

namespace loom::serve {

// One model ready to serve: what requests are checked against, the engine
// loop that runs them, the Modelfile's defaults, and whatever owns the
// weights and the engine (opaque here).
struct LoadedModel {
  std::string name;    // as the store names it ("quickstart:latest"), or --served-model-name
  std::string digest;  // the manifest's, "" for a directory
  ServedModel served;
  bool templated = false;  // a chat template of its own (ollama's /api/generate then wraps the prompt in it)
  nlohmann::json parameters = nlohmann::json::object();  // Modelfile PARAMETERs (ollama names)
  std::string system;
  nlohmann::json messages = nlohmann::json::array();
  model::ModelConfig config{};  // for /api/show
  // ollama's details: "gguf" or "safetensors", and the weights' type ("Q8_0", "BF16"; serve::ResolvedModel's).
  std::string format, quantization_level;
  std::string template_source;  // its own chat template ("" for loom's plain one)
  int64_t bytes = 0;  // weights + KV cache
  std::shared_ptr<void> owner;  // weights, engine (destroyed after loop)
  std::shared_ptr<EngineLoop> loop;  // a LoRA adapter's is its base's
  // A LoRA adapter served unmerged on its base's engine: the base's name,
  // and the adapter's id there (infer::GenerationParams::adapter); its
  // owner holds the base. "" and 0 for a model.
  std::string parent;
  int32_t adapter = 0;
  std::chrono::steady_clock::time_point loaded_at{};

  ~LoadedModel() { loop.reset(); }  // the loop stops before the engine it drives goes
};

// Loads a model by name: an ApiError (404 for an unknown one) or a
// loom::Error (a broken model: 500) when it cannot.
using ModelLoader = std::function<std::shared_ptr<LoadedModel>(const std::string& name)>;
// What a name means: the canonical name ("x" -> "x:latest"), or an ApiError.
using ModelNamer = std::function<std::string(const std::string& name)>;

struct ManagerOptions {
  int64_t memory_budget_bytes = 0;  // 0: no budget
  std::chrono::seconds keep_alive{300};
  int64_t max_loaded = 4;
  // The digest the store holds for a canonical name now, nullopt when it
  // holds no such model; unset: models never change (a --model directory).
  std::function<std::optional<std::string>(const std::string& name)> current_digest{};
};

struct LoadedStatus {
  std::string name, digest;
  int64_t bytes = 0;
  std::optional<std::chrono::system_clock::time_point> expires;  // none: kept (pinned or keep_alive < 0)
  int64_t in_flight = 0;
};

class ModelManager {
 public:
  using Ready = std::function<void(std::shared_ptr<LoadedModel>, std::optional<ApiError>)>;

  ModelManager(ModelLoader loader, ModelNamer namer, ManagerOptions options);
  ~ModelManager();  // stops the manager's thread; models go with their last request
  ModelManager(const ModelManager&) = delete;
  ModelManager& operator=(const ModelManager&) = delete;

  // A model loaded already (pinned: never unloaded), e.g. --model DIR.
  void pin(std::shared_ptr<LoadedModel> m);
  // done(model, nullopt) once the model is loaded, or done(nullptr, error);
  // called on the manager's thread, or at once in this one when the model
  // is loaded already. The name is canonicalised first (ApiError thrown
  // here for a malformed one).
  void acquire(const std::string& name, Ready done);
  // After a request that came at asked_at: the model stays keep_alive from
  // now (negative: kept; 0: unloaded as soon as it is idle), unless a
  // request that came later set it already (the last keep_alive asked for
  // wins: a long request ending after an unload does not undo it).
  // A retired model (another now has its name) is not touched.
  void release(const LoadedModel& m, std::optional<std::chrono::seconds> keep_alive,
               std::chrono::steady_clock::time_point asked_at);
  // Unloads now if idle, else as soon as it is (keep_alive 0, asked now);
  // false when it is not loaded.
  bool unload(const std::string& name);
  std::vector<LoadedStatus> loaded() const;
  // SIGTERM: every loaded loop drains (refuses new work, waits up to grace).
  bool drain(std::chrono::milliseconds grace);
  // What is loaded, for /metrics.
  std::vector<std::shared_ptr<LoadedModel>> models() const;
  std::string canonical(const std::string& name) const { return namer_(name); }

 private:
  struct Entry {
    std::shared_ptr<LoadedModel> model;
    bool pinned = false;
    std::optional<std::chrono::steady_clock::time_point> expires;  // none: kept
    std::chrono::steady_clock::time_point last_used{};
    std::chrono::steady_clock::time_point keep_alive_at{};  // when the keep_alive in force was asked for
  };
  struct Wanted {
    std::string name;
    Ready done;
  };

  void run();
  void retire(std::map<std::string, Entry>::iterator it);
  void check_store(std::unique_lock<std::mutex>& lk);
  void load(const std::string& name, std::unique_lock<std::mutex>& lk);
  void make_room(int64_t bytes, std::unique_lock<std::mutex>& lk);
  void expire(std::unique_lock<std::mutex>& lk);
  static bool idle(const Entry& e);

  const ModelLoader loader_;
  const ModelNamer namer_;
  const ManagerOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Entry> loaded_;
  std::vector<std::shared_ptr<LoadedModel>> retired_;  // stale, still serving requests in flight
  std::chrono::steady_clock::time_point checked_{};    // the last check_store()
  std::deque<Wanted> wanted_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace loom::serve
