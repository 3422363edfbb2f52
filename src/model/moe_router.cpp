#include "model/moe_router.h"

#include <algorithm>
#include <cmath>

namespace loom::model {

namespace {

size_t at(int64_t i) { return static_cast<size_t>(i); }

}  // namespace

int64_t expert_capacity(float factor, int64_t tokens, int64_t k, int64_t E) {
  if (factor == 0.f) return -1;
  return static_cast<int64_t>(std::ceil(static_cast<double>(factor) * static_cast<double>(tokens * k) /
                                        static_cast<double>(E)));
}

double aux_loss(std::span<const float> count, std::span<const float> score_sum, int64_t E, int64_t k,
                int64_t group_tokens) {
  const auto groups = static_cast<int64_t>(count.size()) / E;
  const auto n = static_cast<double>(group_tokens);
  double total = 0;
  for (int64_t g = 0; g < groups; ++g) {
    double sum = 0;
    for (int64_t e = 0; e < E; ++e)
      sum += count[at(g * E + e)] / (n * static_cast<double>(k)) * (score_sum[at(g * E + e)] / n);
    total += static_cast<double>(E) * sum;
  }
  return groups > 0 ? total / static_cast<double>(groups) : 0.0;
}

double z_loss(std::span<const float> lse) {
  double sum = 0;
  for (float v : lse) sum += static_cast<double>(v) * v;
  return lse.empty() ? 0.0 : sum / static_cast<double>(lse.size());
}

std::vector<char> gathered_capacity(std::span<const GatheredChoice> all, int64_t E, int64_t group_len,
                                    int64_t groups, int64_t capacity) {
  std::vector<std::vector<int64_t>> bucket(at(groups * E));  // per (group, expert): gathered choice ids
  for (size_t c = 0; c < all.size(); ++c) bucket[at((all[c].place / group_len) * E + all[c].expert)].push_back(c);
  std::vector<char> kept(all.size(), 1);
  for (auto& b : bucket) {
    if (static_cast<int64_t>(b.size()) <= capacity) continue;
    std::sort(b.begin(), b.end(), [&](int64_t x, int64_t y) {
      const GatheredChoice &a = all[at(x)], &o = all[at(y)];
      return a.score > o.score || (a.score == o.score && a.place < o.place);
    });
    for (size_t m = at(capacity); m < b.size(); ++m) kept[at(b[m])] = 0;
  }
  return kept;
}

}  // namespace loom::model
