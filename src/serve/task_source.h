// A response body computed on a thread of its own: for work the HTTP
// threads must not wait for (creating a store model copies and hashes its
// weights). The task returns the status and the whole body.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "serve/http/http_server.h"

namespace loom::serve {

class TaskSource : public BodySource {
 public:
  using Task = std::function<std::pair<int, std::string>()>;
  explicit TaskSource(Task task, std::string content_type = "application/json")
      : state_(std::make_shared<State>()), content_type_(std::move(content_type)) {
    state_->task = std::move(task);
  }
  void start(std::function<void()> wake) override {
    // Detached: the task finishes even if the client goes away (a model is
    // created whole or not at all), and owns what it needs through state.
    std::thread([state = state_, wake] {
      std::pair<int, std::string> result = state->task();
      {
        std::lock_guard lk(state->mu);
        state->result = std::move(result);
        state->done = true;
      }
      wake();
    }).detach();
  }
  bool pull(std::string& out) override {
    std::lock_guard lk(state_->mu);
    if (!state_->done) return false;
    out = state_->result.second;
    return true;
  }
  void cancel() override {}
  int status() const override {
    std::lock_guard lk(state_->mu);
    return state_->result.first;
  }
  std::string content_type() const override { return content_type_; }

 private:
  struct State {
    std::mutex mu;
    Task task;
    std::pair<int, std::string> result{200, ""};
    bool done = false;
  };
  std::shared_ptr<State> state_;
  std::string content_type_;
};

}  // namespace loom::serve
