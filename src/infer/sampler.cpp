#include "infer/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/rng.h"

namespace loom::infer {

void SamplerConfig::validate() const {
  LOOM_REQUIRE(std::isfinite(temperature) && temperature >= 0.f, "temperature = ", temperature,
               " is invalid: allowed values are >= 0 (0 is greedy)");
  LOOM_REQUIRE(top_k >= 0, "top-k = ", top_k, " is invalid: allowed values are >= 0 (0 keeps every token)");
  LOOM_REQUIRE(top_p > 0.f && top_p <= 1.f, "top-p = ", top_p, " is invalid: allowed values are in (0, 1]");
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
  std::vector<int32_t> ids(static_cast<size_t>(V));
  for (int32_t i = 0; i < V; ++i) ids[i] = i;
  const int64_t k = cfg.top_k > 0 ? std::min(cfg.top_k, V) : V;
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), more_likely);
  ids.resize(static_cast<size_t>(k));
  // softmax(logits / temperature) over the kept tokens, in double.
  const double top = logits[ids[0]], inv_t = 1.0 / cfg.temperature;
  std::vector<double> p(ids.size());
  double sum = 0;
  for (size_t i = 0; i < ids.size(); ++i) sum += p[i] = std::exp((logits[ids[i]] - top) * inv_t);
  size_t keep = ids.size();
  if (cfg.top_p < 1.f) {
    double mass = 0;
    for (keep = 0; keep < ids.size();)
      if ((mass += p[keep++] / sum) >= cfg.top_p) break;
  }
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += p[i];
  std::vector<TokenProb> out(keep);
  for (size_t i = 0; i < keep; ++i) out[i] = {ids[i], static_cast<float>(p[i] / kept)};
  return out;
}

Sampler::Sampler(const SamplerConfig& cfg) : cfg_(cfg) { cfg_.validate(); }

int32_t Sampler::sample(std::span<const float> logits) {
  const uint64_t draw = draws_++;  // every call uses up its draw: token i depends on (seed, i) only
  const std::vector<TokenProb> dist = sampling_distribution(cfg_, logits);
  if (dist.size() == 1) return dist[0].token;
  const double u = rng_uniform(cfg_.seed, rng_key("sampler"), draw);
  double cum = 0;
  for (const TokenProb& t : dist)
    if (u < (cum += t.prob)) return t.token;
  return dist.back().token;  // u beyond the rounded total
}

}  // namespace loom::infer
