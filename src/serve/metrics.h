// GET /metrics of `loom serve`: Prometheus' text format (version 0.0.4).
// What the HTTP side counts (responses by status, per-generation latencies)
// lives here; what the engine loop counts (running and waiting requests,
// tokens, finish reasons, KV cache, preemptions) is read from its LoopStats
// snapshot when the page is rendered, so the two never disagree about it.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "serve/engine_loop.h"

namespace loom::serve {

// A cumulative histogram with fixed upper bounds (seconds).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // name_bucket{le="..."}, name_sum, name_count lines.
  void write(std::string& out, const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bound, not cumulative; the last is +Inf
  double sum_ = 0;
  int64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  // Every response, by status.
  void response(int status);
  // A generation that ended: seconds to the first token (< 0: none came),
  // per output token after it (< 0: fewer than two tokens), and in all.
  void generation(double ttft, double tpot, double e2e);
  // The page: the HTTP side's counts, and each loaded model's loop (its
  // series labelled model="name"; a model's counters restart when it is
  // loaded again, which Prometheus' rate() takes as a counter reset).
  std::string render(const std::vector<std::pair<std::string, LoopStats>>& loops) const;

 private:
  mutable std::mutex mu_;
  std::map<int, int64_t> responses_;
  Histogram ttft_, tpot_, e2e_;
};

}  // namespace loom::serve
