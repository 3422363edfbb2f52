// The MoE router's ops (ops.h): scores, capacity, the dispatch plan, the
// balancing statistics and the router's backward. Each token's arithmetic
// is in double in a fixed order; the ops that walk tokens one by one (E is
// small: 8 to 256 experts) run in the calling thread, so every result is
// the same for any thread count.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/validate.h"

namespace loom::kernels::cpu::LOOM_ISA {
namespace {

size_t at(int64_t i) { return static_cast<size_t>(i); }

// Every expert id of sel is in [0, E).
void check_sel(const char* op, const Tensor& sel, int64_t E) {
  const int32_t* s = sel.data_as<const int32_t>();
  const int64_t k = sel.size(1);
  for (int64_t i = 0; i < sel.numel(); ++i)
    if (s[i] < 0 || s[i] >= E)
      fail(op, ": sel[", i / k, ", ", i % k, "] = ", s[i], " is not an expert: allowed [0, ", E, ")");
}

// Row t's sum of scores (a sigmoid router's normaliser).
double row_sum(const float* scores, int64_t t, int64_t E) {
  double sum = 0;
  for (int64_t e = 0; e < E; ++e) sum += scores[t * E + e];
  return sum;
}

}  // namespace

void moe_router_scores(Tensor scores, Tensor lse, const Tensor& logits, bool sigmoid) {
  const int64_t N = logits.size(0), E = logits.size(1);
  if (E == 0) return;
  const float* l = logits.data_as<const float>();
  float* p = scores.data_as<float>();
  float* z = lse.data_as<float>();
  for (int64_t t = 0; t < N; ++t, l += E, p += E) {
    const float mx = *std::max_element(l, l + E);
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(static_cast<double>(l[e]) - mx);
    z[t] = static_cast<float>(mx + std::log(sum));
    for (int64_t e = 0; e < E; ++e)
      p[e] = sigmoid ? static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(l[e]))))
                     : static_cast<float>(std::exp(static_cast<double>(l[e]) - mx) / sum);
  }
}

void moe_capacity(Tensor keep, const Tensor& sel, const Tensor& scores, int64_t group_tokens, int64_t capacity) {
  const int64_t N = sel.size(0), k = sel.size(1), E = scores.size(1);
  check_sel("moe_capacity", sel, E);
  int32_t* kp = keep.data_as<int32_t>();
  std::fill(kp, kp + N * k, 1);
  if (capacity < 0) return;
  const int32_t* s = sel.data_as<const int32_t>();
  const float* p = scores.data_as<const float>();
  std::vector<std::vector<int64_t>> choices(at(E));  // per expert: its choices (t k + j) in the group
  for (int64_t g0 = 0; g0 < N; g0 += group_tokens) {
    for (auto& c : choices) c.clear();
    for (int64_t i = g0 * k; i < (g0 + group_tokens) * k; ++i) choices[at(s[i])].push_back(i);
    for (int64_t e = 0; e < E; ++e) {
      auto& c = choices[at(e)];
      if (static_cast<int64_t>(c.size()) <= capacity) continue;
      auto score = [&](int64_t i) { return p[(i / k) * E + e]; };
      std::stable_sort(c.begin(), c.end(), [&](int64_t a, int64_t b) { return score(a) > score(b); });
      for (size_t n = at(capacity); n < c.size(); ++n) kp[c[n]] = 0;
    }
  }
}

void moe_assign_rows(Tensor rows, Tensor counts, const Tensor& sel) {
  const int64_t n = sel.numel(), k = sel.size(1), E = counts.numel();
  check_sel("moe_assign_rows", sel, E);
  const int32_t* s = sel.data_as<const int32_t>();
  int32_t* r = rows.data_as<int32_t>();
  for (int64_t i = 0; i < n; ++i)
    if (r[i] != 0 && r[i] != 1)
      fail("moe_assign_rows: rows[", i / k, ", ", i % k, "] = ", r[i], " on entry: allowed 1 (kept) or 0 (dropped)");
  int64_t* c = counts.data_as<int64_t>();
  std::fill(c, c + E, 0);
  for (int64_t i = 0; i < n; ++i) c[s[i]] += r[i];
  std::vector<int64_t> cursor(at(E));
  std::exclusive_scan(c, c + E, cursor.begin(), int64_t{0});
  for (int64_t i = 0; i < n; ++i) r[i] = r[i] ? static_cast<int32_t>(cursor[at(s[i])]++) : -1;
}

void moe_group_stats(Tensor count, Tensor score_sum, const Tensor& sel, const Tensor& scores, int64_t group_tokens,
                     bool sigmoid) {
  const int64_t N = sel.size(0), k = sel.size(1), E = scores.size(1), G = N / group_tokens;
  check_sel("moe_group_stats", sel, E);
  const int32_t* s = sel.data_as<const int32_t>();
  const float* p = scores.data_as<const float>();
  std::vector<double> c(at(E)), sum(at(E));
  for (int64_t g = 0; g < G; ++g) {
    std::fill(c.begin(), c.end(), 0.0), std::fill(sum.begin(), sum.end(), 0.0);
    for (int64_t t = g * group_tokens; t < (g + 1) * group_tokens; ++t) {
      for (int64_t j = 0; j < k; ++j) c[at(s[t * k + j])] += 1;
      const double norm = sigmoid ? row_sum(p, t, E) : 1.0;
      for (int64_t e = 0; e < E; ++e) sum[at(e)] += p[t * E + e] / norm;
    }
    for (int64_t e = 0; e < E; ++e) {
      count.data_as<float>()[g * E + e] = static_cast<float>(c[at(e)]);
      score_sum.data_as<float>()[g * E + e] = static_cast<float>(sum[at(e)]);
    }
  }
}

void moe_router_backward(Tensor dlogits, const MoeRouterGrad& a) {
  const int64_t N = a.scores.size(0), E = a.scores.size(1), k = a.sel.size(1);
  check_sel("moe_router_backward", a.sel, E);
  const float* scores = a.scores.data_as<const float>();
  const float* logits = a.logits.data_as<const float>();
  const float* lse = a.lse.data_as<const float>();
  const float* weight = a.weight.data_as<const float>();
  const float* dweight = a.dweight.data_as<const float>();
  const int32_t* sel = a.sel.data_as<const int32_t>();
  const float* count = a.aux_scale != 0 ? a.count.data_as<const float>() : nullptr;
  // d aux / d P_e for a token of group g: aux_scale E / (groups x group_tokens x group_tokens k) x count[g][e].
  const int64_t groups = count ? N / a.local_tokens : 0;
  const double c_aux = count ? a.aux_scale * static_cast<double>(E) /
                                   (static_cast<double>(groups) * static_cast<double>(a.group_tokens) *
                                    static_cast<double>(a.group_tokens * k))
                             : 0.0;
  std::vector<double> ds(at(E));
  for (int64_t t = 0; t < N; ++t) {
    const float* p = scores + t * E;
    std::fill(ds.begin(), ds.end(), 0.0);
    // Through the combine weights: w_j = p_j / S (normalised) or p_j.
    double S = 0, wdw = 0;
    for (int64_t j = 0; j < k; ++j) {
      S += p[sel[t * k + j]];
      wdw += static_cast<double>(weight[t * k + j]) * dweight[t * k + j];
    }
    for (int64_t j = 0; j < k; ++j) {
      const double dw = dweight[t * k + j];
      ds[at(sel[t * k + j])] += a.normalise ? (dw - wdw) / S : dw;
    }
    if (count) {
      const float* cnt = count + (t / a.local_tokens) * E;
      if (!a.sigmoid) {
        for (int64_t e = 0; e < E; ++e) ds[at(e)] += c_aux * cnt[e];
      } else {  // P uses p_e / sum(p): its gradient wrt each p
        const double sum = row_sum(scores, t, E);
        double dot = 0;
        for (int64_t e = 0; e < E; ++e) dot += cnt[e] * p[e] / sum;
        for (int64_t e = 0; e < E; ++e) ds[at(e)] += c_aux * (cnt[e] - dot) / sum;
      }
    }
    float* dl = dlogits.data_as<float>() + t * E;
    if (!a.sigmoid) {
      double dot = 0;
      for (int64_t e = 0; e < E; ++e) dot += ds[at(e)] * p[e];
      for (int64_t e = 0; e < E; ++e) dl[e] = static_cast<float>(p[e] * (ds[at(e)] - dot));
    } else {
      for (int64_t e = 0; e < E; ++e) dl[e] = static_cast<float>(ds[at(e)] * p[e] * (1.0 - p[e]));
    }
    // The z-loss: d lse^2 / d logit_e = 2 lse softmax_e, averaged over N.
    if (a.z_scale != 0) {
      const double l = lse[t], c = a.z_scale * 2.0 * l / static_cast<double>(N);
      for (int64_t e = 0; e < E; ++e)
        dl[e] += static_cast<float>(c * std::exp(static_cast<double>(logits[t * E + e]) - l));
    }
  }
}

}  // namespace loom::kernels::cpu::LOOM_ISA
