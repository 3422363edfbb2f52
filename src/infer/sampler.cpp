#include "infer/sampler.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <string>

#include "core/error.h"
#include "core/rng.h"

namespace loom::infer {

void SamplerConfig::validate() const {
  LOOM_REQUIRE(std::isfinite(temperature) && temperature >= 0.f, "temperature = ", temperature,
               " is invalid: allowed values are >= 0 (0 is greedy)");
  LOOM_REQUIRE(top_k >= 0, "top-k = ", top_k, " is invalid: allowed values are >= 0 (0 keeps every token)");
  LOOM_REQUIRE(top_p > 0.f && top_p <= 1.f, "top-p = ", top_p, " is invalid: allowed values are in (0, 1]");
  LOOM_REQUIRE(min_p >= 0.f && min_p <= 1.f, "min-p = ", min_p, " is invalid: allowed values are in [0, 1]");
  LOOM_REQUIRE(presence_penalty >= -2.f && presence_penalty <= 2.f, "presence_penalty = ", presence_penalty,
               " is invalid: allowed values are in [-2, 2]");
  LOOM_REQUIRE(frequency_penalty >= -2.f && frequency_penalty <= 2.f, "frequency_penalty = ", frequency_penalty,
               " is invalid: allowed values are in [-2, 2]");
  LOOM_REQUIRE(std::isfinite(repetition_penalty) && repetition_penalty > 0.f, "repetition_penalty = ",
               repetition_penalty, " is invalid: allowed values are > 0 (1 is none)");
  LOOM_REQUIRE(repetition_window >= -1, "repeat_last_n = ", repetition_window,
               " is invalid: allowed values are -1 (every token), 0 (none) or the last N tokens");
}

void apply_penalties(const SamplerConfig& cfg, std::span<float> logits, std::span<const int32_t> prompt,
                     std::span<const int32_t> output) {
  const auto V = static_cast<int64_t>(logits.size());
  auto check = [V](int32_t t) {
    LOOM_REQUIRE(t >= 0 && t < V, "token ", t, " is outside the vocabulary: allowed ids are 0 to ", V - 1);
  };
  if (cfg.repetition_penalty != 1.f) {
    std::vector<bool> seen(static_cast<size_t>(V), false);
    // The window's tokens: the last of the output, then the prompt's last.
    const auto total = static_cast<int64_t>(prompt.size() + output.size());
    const int64_t window = cfg.repetition_window < 0 ? total : std::min(cfg.repetition_window, total);
    const auto from_output = std::min<int64_t>(window, static_cast<int64_t>(output.size()));
    for (std::span<const int32_t> part : {prompt.last(static_cast<size_t>(window - from_output)),
                                          output.last(static_cast<size_t>(from_output))})
      for (int32_t t : part) check(t), seen[static_cast<size_t>(t)] = true;
    for (int64_t t = 0; t < V; ++t)
      if (seen[static_cast<size_t>(t)])
        logits[t] = logits[t] > 0.f ? logits[t] / cfg.repetition_penalty : logits[t] * cfg.repetition_penalty;
  }
  if (cfg.presence_penalty != 0.f || cfg.frequency_penalty != 0.f) {
    std::vector<int32_t> count(static_cast<size_t>(V), 0);
    for (int32_t t : output) check(t), ++count[static_cast<size_t>(t)];
    for (int64_t t = 0; t < V; ++t)
      if (const int32_t c = count[static_cast<size_t>(t)]; c > 0)
        logits[t] -= cfg.presence_penalty + cfg.frequency_penalty * static_cast<float>(c);
  }
}

std::vector<TokenProb> sampling_distribution(const SamplerConfig& cfg, std::span<const float> logits) {
  LOOM_REQUIRE(!logits.empty(), "sampling_distribution: no logits");
  const int64_t V = static_cast<int64_t>(logits.size());
  auto more_likely = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  if (cfg.temperature == 0.f) {
    int32_t best = 0;
    for (int32_t i = 1; i < V; ++i)
      if (more_likely(i, best)) best = i;
    return {{best, 1.f}};
  }
  // Tokens at -inf (removed by a grammar) have no probability and sort last:
  // leaving them out changes neither the order nor the draw, only the cost.
  std::vector<int32_t> ids;
  ids.reserve(static_cast<size_t>(V));
  for (int32_t i = 0; i < V; ++i)
    if (logits[i] != -std::numeric_limits<float>::infinity()) ids.push_back(i);
  LOOM_REQUIRE(!ids.empty(), "sampling_distribution: every token is -inf");
  const auto n = static_cast<int64_t>(ids.size());
  const int64_t k = cfg.top_k > 0 ? std::min(cfg.top_k, n) : n;
  if (k == n) {
    std::sort(ids.begin(), ids.end(), more_likely);  // a strict total order: the same as partial_sort
  } else {
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), more_likely);
    // Every token tied with the k-th stays (vLLM's apply_top_k_top_p drops only logits < the k-th value). The
    // ties left after the first k have higher ids than those in it, so in id order they extend the total order.
    const float kth = logits[ids[static_cast<size_t>(k - 1)]];
    const auto tied_end = std::partition(ids.begin() + k, ids.end(), [&](int32_t i) { return logits[i] == kth; });
    std::sort(ids.begin() + k, tied_end);
    ids.erase(tied_end, ids.end());
  }
  // softmax(logits / temperature) over the kept tokens, in double.
  const double top = logits[ids[0]], inv_t = 1.0 / cfg.temperature;
  std::vector<double> p(ids.size());
  double sum = 0;
  for (size_t i = 0; i < ids.size(); ++i) sum += p[i] = std::exp((logits[ids[i]] - top) * inv_t);
  size_t keep = ids.size();
  if (cfg.min_p > 0.f) {  // p[0] is the most likely token's
    const double floor = cfg.min_p * p[0];
    keep = static_cast<size_t>(std::find_if(p.begin(), p.end(), [floor](double q) { return q < floor; }) - p.begin());
    sum = 0;
    for (size_t i = 0; i < keep; ++i) sum += p[i];
  }
  if (cfg.top_p < 1.f) {
    double mass = 0;
    const size_t kept = keep;
    for (keep = 0; keep < kept;)
      if ((mass += p[keep++] / sum) >= cfg.top_p) break;
  }
  while (keep > 1 && p[keep - 1] == 0) --keep;  // tokens a grammar removed (-inf), or past double's range
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += p[i];
  std::vector<TokenProb> out(keep);
  for (size_t i = 0; i < keep; ++i) out[i] = {ids[i], static_cast<float>(p[i] / kept)};
  return out;
}

namespace {

int32_t draw_from(const std::vector<TokenProb>& dist, uint64_t seed, uint64_t draw) {
  if (dist.size() == 1) return dist[0].token;
  const double u = rng_uniform(seed, rng_key("sampler"), draw);
  double cum = 0;
  for (const TokenProb& t : dist)
    if (u < (cum += t.prob)) return t.token;
  return dist.back().token;  // u beyond the rounded total
}

// log_softmax of the raw logits for token and the top n, in double.
void fill_logprobs(SampleResult& r, std::span<const float> logits, int64_t n) {
  const auto V = static_cast<int64_t>(logits.size());
  const double top = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - top);
  const double log_z = top + std::log(sum);
  r.logprob = static_cast<float>(logits[r.token] - log_z);
  if (n <= 0) return;
  std::vector<int32_t> ids(static_cast<size_t>(V));
  for (int32_t i = 0; i < V; ++i) ids[i] = i;
  const int64_t k = std::min(n, V);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  for (int64_t i = 0; i < k; ++i) r.top.push_back({ids[i], static_cast<float>(logits[ids[i]] - log_z)});
}

// allowed (V, or empty: all) less banned; allowed itself when that leaves no token.
std::vector<uint8_t> without(std::span<const uint8_t> allowed, std::span<const int32_t> banned, size_t V) {
  std::vector<uint8_t> mask(allowed.begin(), allowed.end());
  if (allowed.empty()) mask.assign(V, 1);
  for (int32_t t : banned)
    if (t >= 0 && static_cast<size_t>(t) < V) mask[static_cast<size_t>(t)] = 0;
  if (std::find(mask.begin(), mask.end(), uint8_t{1}) != mask.end()) return mask;
  return allowed.empty() ? std::vector<uint8_t>{} : std::vector<uint8_t>(allowed.begin(), allowed.end());
}

}  // namespace

SampleResult sample_at(const SamplerConfig& cfg, std::span<const float> logits, std::span<const int32_t> prompt,
                       std::span<const int32_t> output, uint64_t draw, int64_t top_logprobs,
                       std::span<const uint8_t> allowed) {
  cfg.validate();
  LOOM_REQUIRE(top_logprobs >= 0, "top_logprobs = ", top_logprobs, " is invalid: allowed values are >= 0");
  LOOM_REQUIRE(allowed.empty() || allowed.size() == logits.size(), "sample_at: a mask of ", allowed.size(),
               " tokens for ", logits.size(), " logits");
  SampleResult r;
  const bool penalised = cfg.repetition_penalty != 1.f || cfg.presence_penalty != 0.f || cfg.frequency_penalty != 0.f;
  if (penalised || !allowed.empty()) {
    std::vector<float> adjusted(logits.begin(), logits.end());
    for (size_t t = 0; t < allowed.size(); ++t)
      if (allowed[t] == 0) adjusted[t] = -std::numeric_limits<float>::infinity();
    apply_penalties(cfg, adjusted, prompt, output);
    r.token = draw_from(sampling_distribution(cfg, adjusted), cfg.seed, draw);
  } else {
    r.token = draw_from(sampling_distribution(cfg, logits), cfg.seed, draw);
  }
  fill_logprobs(r, logits, top_logprobs);
  return r;
}

std::vector<SampleResult> sample_rows(std::span<const float> logits, int64_t V, std::span<const SamplerConfig> cfgs,
                                      std::span<const std::span<const int32_t>> prompts,
                                      std::span<const std::span<const int32_t>> outputs,
                                      std::span<const uint64_t> draws, std::span<const int64_t> top_logprobs) {
  const auto R = static_cast<int64_t>(cfgs.size());
  LOOM_REQUIRE(V >= 1 && static_cast<int64_t>(logits.size()) == R * V && prompts.size() == cfgs.size() &&
                   outputs.size() == cfgs.size() && draws.size() == cfgs.size() && top_logprobs.size() == cfgs.size(),
               "sample_rows: ", logits.size(), " logits for ", R, " rows of ", V, " with ", prompts.size(), " prompts, ",
               outputs.size(), " outputs, ", draws.size(), " draws and ", top_logprobs.size(), " logprob counts");
  std::vector<SampleRow> rows;
  for (int64_t r = 0; r < R; ++r)
    rows.push_back({cfgs[r], logits.subspan(r * V, V), prompts[r], outputs[r], draws[r], top_logprobs[r]});
  return sample_rows(rows);
}

std::vector<SampleResult> sample_rows(std::span<const SampleRow> rows) {
  const auto R = static_cast<int64_t>(rows.size());
  std::vector<SampleResult> out(rows.size());
  std::vector<std::string> errors(rows.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t r = 0; r < R; ++r) {
    try {
      const SampleRow& w = rows[r];
      std::vector<uint8_t> mask;
      if (w.allowed_of) w.allowed_of(mask);
      std::span<const uint8_t> allowed = w.allowed_of ? std::span<const uint8_t>(mask) : w.allowed;
      if (!w.banned.empty()) mask = without(allowed, w.banned, w.logits.size()), allowed = mask;
      out[r] = sample_at(w.cfg, w.logits, w.prompt, w.output, w.draw, w.top_logprobs, allowed);
    } catch (const std::exception& e) {
      errors[r] = e.what();
    }
  }
  for (int64_t r = 0; r < R; ++r) LOOM_REQUIRE(errors[r].empty(), "row ", r, ": ", errors[r]);
  return out;
}

Sampler::Sampler(const SamplerConfig& cfg) : cfg_(cfg) { cfg_.validate(); }

int32_t Sampler::sample(std::span<const float> logits) {
  const uint64_t draw = draws_++;  // every call uses up its draw: token i depends on (seed, i) only
  return draw_from(sampling_distribution(cfg_, logits), cfg_.seed, draw);
}

}  // namespace loom::infer
