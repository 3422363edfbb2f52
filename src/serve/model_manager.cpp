#include "serve/model_manager.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "core/error.h"

namespace loom::serve {

using Clock = std::chrono::steady_clock;

ModelManager::ModelManager(ModelLoader loader, ModelNamer namer, ManagerOptions options)
    : loader_(std::move(loader)), namer_(std::move(namer)), options_(options), thread_([this] { run(); }) {}

ModelManager::~ModelManager() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  for (Wanted& w : wanted_)
    w.done(nullptr, ApiError(503, "ServiceUnavailableError", "", "the server is shutting down"));
}

void ModelManager::pin(std::shared_ptr<LoadedModel> m) {
  std::lock_guard lk(mu_);
  const std::string name = m->name;
  loaded_[name] = Entry{std::move(m), true, std::nullopt, Clock::now()};
}

void ModelManager::acquire(const std::string& name, Ready done) {
  const std::string canonical = namer_(name);
  // Read before taking the lock (a file read): what the store holds now.
  std::optional<std::optional<std::string>> stored;
  if (options_.current_digest) stored = options_.current_digest(canonical);
  std::shared_ptr<LoadedModel> ready;
  {
    std::lock_guard lk(mu_);
    if (stop_) throw ApiError(503, "ServiceUnavailableError", "", "the server is shutting down");
    auto it = loaded_.find(canonical);
    if (it != loaded_.end() && stored && !it->second.pinned && *stored != it->second.model->digest) {
      retire(it);
      it = loaded_.end();
    }
    if (it != loaded_.end()) {
      it->second.last_used = Clock::now();
      ready = it->second.model;
    } else {
      wanted_.push_back({canonical, std::move(done)});
    }
  }
  if (ready) done(std::move(ready), std::nullopt);
  else cv_.notify_all();
}

void ModelManager::release(const LoadedModel& m, std::optional<std::chrono::seconds> keep_alive,
                           Clock::time_point asked_at) {
  std::lock_guard lk(mu_);
  const auto it = loaded_.find(m.name);
  if (it == loaded_.end() || it->second.pinned || it->second.model.get() != &m) return;
  it->second.last_used = Clock::now();
  if (asked_at < it->second.keep_alive_at) return;  // a later request's keep_alive stands
  const std::chrono::seconds ka = keep_alive.value_or(options_.keep_alive);
  it->second.expires = ka.count() < 0 ? std::nullopt : std::optional(Clock::now() + ka);
  it->second.keep_alive_at = asked_at;
  cv_.notify_all();
}

bool ModelManager::unload(const std::string& name) {
  std::lock_guard lk(mu_);
  const auto it = loaded_.find(name);
  if (it == loaded_.end() || it->second.pinned) return false;
  it->second.expires = Clock::now();
  it->second.keep_alive_at = Clock::now();
  cv_.notify_all();
  return true;
}

// Out of loaded_: no new request gets it; expire() frees it once idle.
void ModelManager::retire(std::map<std::string, Entry>::iterator it) {
  retired_.push_back(std::move(it->second.model));
  loaded_.erase(it);
}

// About once a second: retire what the store no longer holds as loaded.
void ModelManager::check_store(std::unique_lock<std::mutex>& lk) {
  if (!options_.current_digest || Clock::now() - checked_ < std::chrono::seconds(1)) return;
  checked_ = Clock::now();
  std::vector<std::pair<std::string, std::string>> names;  // (name, digest) loaded now
  for (const auto& [name, e] : loaded_)
    if (!e.pinned) names.emplace_back(name, e.model->digest);
  lk.unlock();
  std::vector<std::pair<std::string, std::string>> gone;  // (name, the digest the store no longer has)
  for (const auto& [name, digest] : names)
    if (const auto now = options_.current_digest(name); !now || *now != digest) gone.emplace_back(name, digest);
  lk.lock();
  // Retired only if still the model read as stale (not one loaded since).
  for (const auto& [name, digest] : gone)
    if (auto it = loaded_.find(name); it != loaded_.end() && !it->second.pinned && it->second.model->digest == digest)
      retire(it);
}

bool ModelManager::idle(const Entry& e) {
  // The manager's reference only, and nothing running (a stream may end
  // after its request released the model).
  return e.model.use_count() == 1 && e.model->loop->stats().in_flight == 0;
}

std::vector<LoadedStatus> ModelManager::loaded() const {
  std::lock_guard lk(mu_);
  std::vector<LoadedStatus> out;
  const auto now = Clock::now();
  for (const auto& [name, e] : loaded_) {
    LoadedStatus s{name, e.model->digest, e.model->bytes, std::nullopt, e.model->loop->stats().in_flight};
    if (e.expires)
      s.expires = std::chrono::system_clock::now() +
                  std::chrono::duration_cast<std::chrono::system_clock::duration>(*e.expires - now);
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<std::shared_ptr<LoadedModel>> ModelManager::models() const {
  std::lock_guard lk(mu_);
  std::vector<std::shared_ptr<LoadedModel>> out = retired_;  // drain covers what still runs on them
  for (const auto& [name, e] : loaded_) out.push_back(e.model);
  return out;
}

bool ModelManager::drain(std::chrono::milliseconds grace) {
  // Every loop at once, against one deadline.
  std::vector<std::thread> drains;
  std::atomic<bool> clean{true};
  for (const std::shared_ptr<LoadedModel>& m : models())
    drains.emplace_back([m, grace, &clean] {
      if (!m->loop->drain(grace)) clean = false;
    });
  for (std::thread& t : drains) t.join();
  return clean;
}

void ModelManager::run() {
  std::unique_lock lk(mu_);
  while (!stop_) {
    if (!wanted_.empty()) {
      Wanted w = std::move(wanted_.front());
      wanted_.pop_front();
      if (auto it = loaded_.find(w.name); it != loaded_.end()) {
        auto m = it->second.model;
        lk.unlock();
        w.done(std::move(m), std::nullopt);
        lk.lock();
        continue;
      }
      wanted_.push_front(std::move(w));
      load(wanted_.front().name, lk);
      continue;
    }
    check_store(lk);
    expire(lk);
    cv_.wait_for(lk, std::chrono::milliseconds(250));
  }
}

// Loads name (unlocked while it loads) and hands it to everyone who wants it.
void ModelManager::load(const std::string& name, std::unique_lock<std::mutex>& lk) {
  std::shared_ptr<LoadedModel> m;
  std::optional<ApiError> error;
  make_room(0, lk);  // the count first, so idle models go before the new one takes memory
  lk.unlock();
  try {
    m = loader_(name);
  } catch (const ApiError& e) {
    error = e;
  } catch (const std::exception& e) {
    error = ApiError(500, "InternalServerError", "model", "cannot load model '" + name + "': " + e.what());
  }
  lk.lock();
  if (m) {
    make_room(m->bytes, lk);
    loaded_[name] = Entry{m, false, Clock::now() + options_.keep_alive, Clock::now()};
  }
  std::vector<Ready> waiting;
  for (auto it = wanted_.begin(); it != wanted_.end();)
    if (it->name == name) {
      waiting.push_back(std::move(it->done));
      it = wanted_.erase(it);
    } else {
      ++it;
    }
  lk.unlock();
  for (Ready& done : waiting) done(m, error);
  lk.lock();
}

// Unloads the least recently used idle models until bytes more fit the
// budget and the count limit.
void ModelManager::make_room(int64_t bytes, std::unique_lock<std::mutex>& lk) {
  const auto over = [&] {
    int64_t used = 0;
    for (const auto& [n, e] : loaded_) used += e.model->bytes;
    for (const auto& m : retired_) used += m->bytes;  // still in memory until their requests end
    const bool too_many = static_cast<int64_t>(loaded_.size()) + 1 > options_.max_loaded;
    return too_many || (options_.memory_budget_bytes > 0 && used + bytes > options_.memory_budget_bytes);
  };
  while (over()) {
    auto lru = loaded_.end();
    for (auto it = loaded_.begin(); it != loaded_.end(); ++it)
      if (!it->second.pinned && idle(it->second) &&
          (lru == loaded_.end() || it->second.last_used < lru->second.last_used))
        lru = it;
    if (lru == loaded_.end()) return;  // everything else is busy or pinned: over budget until one is idle
    std::shared_ptr<LoadedModel> gone = std::move(lru->second.model);
    loaded_.erase(lru);
    lk.unlock();
    gone.reset();  // the engine and its memory go here, outside the lock
    lk.lock();
  }
}

void ModelManager::expire(std::unique_lock<std::mutex>& lk) {
  const auto now = Clock::now();
  std::vector<std::shared_ptr<LoadedModel>> gone;
  for (auto it = retired_.begin(); it != retired_.end();)
    if (it->use_count() == 1 && (*it)->loop->stats().in_flight == 0) {
      gone.push_back(std::move(*it));
      it = retired_.erase(it);
    } else {
      ++it;
    }
  for (auto it = loaded_.begin(); it != loaded_.end();) {
    const Entry& e = it->second;
    if (!e.pinned && e.expires && *e.expires <= now && idle(e)) {
      gone.push_back(std::move(it->second.model));
      it = loaded_.erase(it);
    } else {
      ++it;
    }
  }
  lk.unlock();
  gone.clear();  // the engines (their threads joined, their memory freed) go outside the lock
  lk.lock();
}

}  // namespace loom::serve
