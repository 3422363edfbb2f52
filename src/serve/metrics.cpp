#include "serve/metrics.h"

#include <cstdio>
#include <utility>

namespace loom::serve {
namespace {

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

void header(std::string& out, const std::string& name, const char* type, const char* help) {
  // Appended piece by piece: GCC 12 warns falsely (-Wrestrict) on chains of operator+.
  out += "# HELP ";
  out += name;
  out += ' ';
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

void sample(std::string& out, const std::string& name, const std::string& labels, double v) {
  out += name;
  if (!labels.empty()) {
    out += '{';
    out += labels;
    out += '}';
  }
  out += ' ';
  out += num(v);
  out += '\n';
}

// A label value with \, " and newlines escaped, as the format asks.
std::string quoted(const std::string& v) {
  std::string q = "\"";
  for (char c : v) {
    if (c == '\\' || c == '"') q += '\\';
    q += c == '\n' ? 'n' : c;
  }
  q += '"';
  return q;
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::write(std::string& out, const std::string& name, const std::string& help) const {
  header(out, name, "histogram", help.c_str());
  int64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    sample(out, name + "_bucket", "le=\"" + num(bounds_[i]) + "\"", static_cast<double>(cumulative));
  }
  sample(out, name + "_bucket", "le=\"+Inf\"", static_cast<double>(count_));
  sample(out, name + "_sum", "", sum_);
  sample(out, name + "_count", "", static_cast<double>(count_));
}

Metrics::Metrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}),
      tpot_({0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5}),
      e2e_({0.01, 0.05, 0.1, 0.3, 0.5, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240}) {}

void Metrics::response(int status) {
  std::lock_guard lk(mu_);
  ++responses_[status];
}

void Metrics::generation(double ttft, double tpot, double e2e) {
  std::lock_guard lk(mu_);
  if (ttft >= 0) ttft_.observe(ttft);
  if (tpot >= 0) tpot_.observe(tpot);
  e2e_.observe(e2e);
}

std::string Metrics::render(const std::vector<std::pair<std::string, LoopStats>>& loops) const {
  std::string out;
  header(out, "loom_http_responses_total", "counter", "HTTP responses by status code");
  {
    std::lock_guard lk(mu_);
    for (const auto& [status, n] : responses_)
      sample(out, "loom_http_responses_total", "code=\"" + std::to_string(status) + "\"", static_cast<double>(n));
    ttft_.write(out, "loom_time_to_first_token_seconds", "Time from receiving a request to its first token");
    tpot_.write(out, "loom_time_per_output_token_seconds", "Time per output token after the first, per request");
    e2e_.write(out, "loom_e2e_request_latency_seconds", "Time from receiving a generation request to its end");
  }
  header(out, "loom_models_loaded", "gauge", "Models loaded");
  sample(out, "loom_models_loaded", "", static_cast<double>(loops.size()));
  // One family at a time, a series per model.
  using Get = double (*)(const LoopStats&);
  const auto family = [&](const char* name, const char* type, const char* help, Get get, const char* extra = "") {
    header(out, name, type, help);
    for (const auto& [model, s] : loops) sample(out, name, "model=" + quoted(model) + extra, get(s));
  };
  family("loom_model_loaded", "gauge", "1 for each model loaded", [](const LoopStats&) { return 1.0; });
  family("loom_num_requests_running", "gauge", "Requests whose sequences are in the engine's batch",
         [](const LoopStats& s) { return double(s.running); });
  family("loom_num_requests_waiting", "gauge", "Requests queued, not yet running",
         [](const LoopStats& s) { return double(s.waiting); });
  family("loom_num_requests_in_flight", "gauge", "Requests accepted and not finished",
         [](const LoopStats& s) { return double(s.in_flight); });
  family("loom_kv_cache_blocks", "gauge", "KV cache blocks in all", [](const LoopStats& s) { return double(s.kv_blocks); });
  family("loom_kv_cache_used_blocks", "gauge", "KV cache blocks holding a sequence's tokens",
         [](const LoopStats& s) { return double(s.kv_used_blocks); });
  family("loom_kv_cache_usage_ratio", "gauge", "Share of the KV cache in use, 0 to 1", [](const LoopStats& s) {
    return s.kv_blocks > 0 ? double(s.kv_used_blocks) / double(s.kv_blocks) : 0.0;
  });
  family("loom_prefix_cache_hit_rate", "gauge", "Share of prompt tokens found in the prefix cache",
         [](const LoopStats& s) { return s.prefix_hit_rate; });
  family("loom_num_preemptions_total", "counter", "Sequences preempted (recomputed later) for lack of KV blocks",
         [](const LoopStats& s) { return double(s.preemptions); });
  family("loom_prompt_tokens_total", "counter", "Prompt tokens computed",
         [](const LoopStats& s) { return double(s.prompt_tokens); });
  family("loom_generation_tokens_total", "counter", "Tokens generated",
         [](const LoopStats& s) { return double(s.generation_tokens); });
  header(out, "loom_request_success_total", "counter", "Sequences finished, by finish reason");
  for (const auto& [model, s] : loops) {
    const std::string m = "model=" + quoted(model);
    sample(out, "loom_request_success_total", m + ",finished_reason=\"stop\"", double(s.finished_stop));
    sample(out, "loom_request_success_total", m + ",finished_reason=\"length\"", double(s.finished_length));
    sample(out, "loom_request_success_total", m + ",finished_reason=\"abort\"", double(s.finished_abort));
  }
  family("loom_engine_failed", "gauge", "1 once the model's engine failed (it then refuses work)",
         [](const LoopStats& s) { return s.failed ? 1.0 : 0.0; });
  return out;
}

}  // namespace loom::serve
