#include "model/moe_router.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace loom::model {

namespace {

size_t at(int64_t i) { return static_cast<size_t>(i); }

// A sigmoid score's normalised share of its row (the aux loss's P for a
// sigmoid router), and the row's sum.
double row_sum(std::span<const float> scores, int64_t t, int64_t E) {
  double sum = 0;
  for (int64_t e = 0; e < E; ++e) sum += scores[at(t * E + e)];
  return sum;
}

}  // namespace

void router_scores(std::span<float> scores, std::span<float> lse, std::span<const float> logits, RouterShape s,
                   RouterScore score) {
  const int64_t E = s.E;
  for (int64_t t = 0; t < s.N; ++t) {
    const float* l = logits.data() + t * E;
    float* p = scores.data() + t * E;
    const float mx = *std::max_element(l, l + E);
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(static_cast<double>(l[e]) - mx);
    lse[at(t)] = static_cast<float>(mx + std::log(sum));
    for (int64_t e = 0; e < E; ++e)
      p[e] = score == RouterScore::softmax ? static_cast<float>(std::exp(static_cast<double>(l[e]) - mx) / sum)
                                           : static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(l[e]))));
  }
}

int64_t expert_capacity(float factor, int64_t tokens, int64_t k, int64_t E) {
  if (factor == 0.f) return -1;
  return static_cast<int64_t>(std::ceil(static_cast<double>(factor) * static_cast<double>(tokens * k) /
                                        static_cast<double>(E)));
}

void apply_capacity(std::span<int32_t> keep, std::span<const int32_t> sel, std::span<const float> scores,
                    RouterShape s, int64_t group_tokens, int64_t capacity) {
  const int64_t E = s.E, k = s.k;
  LOOM_CHECK(group_tokens > 0 && s.N % group_tokens == 0, "routing groups of ", group_tokens, " tokens for ", s.N);
  std::fill(keep.begin(), keep.end(), 1);
  if (capacity < 0) return;
  std::vector<std::vector<int64_t>> choices(at(E));  // per expert: its choices (t k + j) in the group
  for (int64_t g0 = 0; g0 < s.N; g0 += group_tokens) {
    for (auto& c : choices) c.clear();
    for (int64_t i = g0 * k; i < (g0 + group_tokens) * k; ++i) choices[at(sel[at(i)])].push_back(i);
    for (int64_t e = 0; e < E; ++e) {
      auto& c = choices[at(e)];
      if (static_cast<int64_t>(c.size()) <= capacity) continue;
      auto score = [&](int64_t i) { return scores[at((i / k) * E + e)]; };
      std::stable_sort(c.begin(), c.end(), [&](int64_t a, int64_t b) { return score(a) > score(b); });
      for (size_t n = at(capacity); n < c.size(); ++n) keep[at(c[n])] = 0;
    }
  }
}

GroupStats group_stats(std::span<const int32_t> sel, std::span<const float> scores, RouterShape s,
                       int64_t group_tokens, RouterScore score) {
  const int64_t E = s.E, k = s.k;
  GroupStats g;
  g.groups = s.N / group_tokens, g.group_tokens = group_tokens, g.local_tokens = group_tokens;
  g.count.assign(at(g.groups * E), 0.0);
  g.prob.assign(at(g.groups * E), 0.0);
  for (int64_t t = 0; t < s.N; ++t) {
    const int64_t grp = t / group_tokens;
    for (int64_t j = 0; j < k; ++j) g.count[at(grp * E + sel[at(t * k + j)])] += 1;
    const double norm = score == RouterScore::softmax ? 1.0 : row_sum(scores, t, E);
    for (int64_t e = 0; e < E; ++e) g.prob[at(grp * E + e)] += scores[at(t * E + e)] / norm;
  }
  for (double& p : g.prob) p /= static_cast<double>(group_tokens);
  return g;
}

double aux_loss(const GroupStats& g, RouterShape s) {
  const int64_t E = s.E;
  double total = 0;
  for (int64_t grp = 0; grp < g.groups; ++grp) {
    double sum = 0;
    for (int64_t e = 0; e < E; ++e)
      sum += g.count[at(grp * E + e)] / static_cast<double>(g.group_tokens * s.k) * g.prob[at(grp * E + e)];
    total += static_cast<double>(E) * sum;
  }
  return g.groups > 0 ? total / static_cast<double>(g.groups) : 0.0;
}

double z_loss(std::span<const float> lse) {
  double sum = 0;
  for (float v : lse) sum += static_cast<double>(v) * v;
  return lse.empty() ? 0.0 : sum / static_cast<double>(lse.size());
}

void router_backward(std::span<float> dlogits, const RouterGradArgs& a, RouterShape s, RouterScore score,
                     bool normalise) {
  const int64_t E = s.E, k = s.k;
  std::vector<double> ds(at(E));
  for (int64_t t = 0; t < s.N; ++t) {
    const float* p = a.scores.data() + t * E;
    std::fill(ds.begin(), ds.end(), 0.0);
    // Through the combine weights: w_j = p_j / S (normalised) or p_j.
    double S = 0, wdw = 0;
    for (int64_t j = 0; j < k; ++j) {
      S += p[a.sel[at(t * k + j)]];
      wdw += static_cast<double>(a.weight[at(t * k + j)]) * a.dweight[at(t * k + j)];
    }
    for (int64_t j = 0; j < k; ++j) {
      const double dw = a.dweight[at(t * k + j)];
      ds[at(a.sel[at(t * k + j)])] += normalise ? (dw - wdw) / S : dw;
    }
    // The aux loss: d/dP_e of E f_e P_e averaged over groups, P_e a mean over the group's tokens.
    if (a.aux_scale != 0 && a.stats) {
      const GroupStats& g = *a.stats;
      const int64_t grp = t / g.local_tokens;
      const double c = a.aux_scale * static_cast<double>(E) /
                       (static_cast<double>(g.groups) * static_cast<double>(g.group_tokens) *
                        static_cast<double>(g.group_tokens * k));
      if (score == RouterScore::softmax) {
        for (int64_t e = 0; e < E; ++e) ds[at(e)] += c * g.count[at(grp * E + e)];
      } else {  // P uses p_e / sum(p): its gradient wrt each p
        const double sum = row_sum(a.scores, t, E);
        double dot = 0;
        for (int64_t e = 0; e < E; ++e) dot += g.count[at(grp * E + e)] * p[e] / sum;
        for (int64_t e = 0; e < E; ++e) ds[at(e)] += c * (g.count[at(grp * E + e)] - dot) / sum;
      }
    }
    float* dl = dlogits.data() + t * E;
    if (score == RouterScore::softmax) {
      double dot = 0;
      for (int64_t e = 0; e < E; ++e) dot += ds[at(e)] * p[e];
      for (int64_t e = 0; e < E; ++e) dl[e] = static_cast<float>(p[e] * (ds[at(e)] - dot));
    } else {
      for (int64_t e = 0; e < E; ++e) dl[e] = static_cast<float>(ds[at(e)] * p[e] * (1.0 - p[e]));
    }
    // The z-loss: d lse^2 / d logit_e = 2 lse softmax_e, averaged over N.
    if (a.z_scale != 0) {
      const double lse = a.lse[at(t)], c = a.z_scale * 2.0 * lse / static_cast<double>(s.N);
      for (int64_t e = 0; e < E; ++e)
        dl[e] += static_cast<float>(c * std::exp(static_cast<double>(a.logits[at(t * E + e)]) - lse));
    }
  }
}

}  // namespace loom::model
