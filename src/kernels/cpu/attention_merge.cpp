// attention_merge (ops.h): ring attention's log-sum-exp merge of one block's
// partial attention into the running result. Rows (b, h, t) are
// independent: each is weighted and rescaled whole, in parallel when large.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/rows.h"

namespace loom::kernels::cpu::LOOM_ISA {

// acc, out: (B, T, NH, HS)  acc_lse, lse: (B, NH, T), all f32 contiguous.
void attention_merge(Tensor acc, Tensor acc_lse, const Tensor& out, const Tensor& lse) {
  const int64_t B = acc.size(0), T = acc.size(1), NH = acc.size(2), HS = acc.size(3);
  float* o = acc.data_as<float>();
  float* L = acc_lse.data_as<float>();
  const float* p = out.data_as<const float>();
  const float* l = lse.data_as<const float>();
#pragma omp parallel for collapse(2) schedule(static) if (acc.numel() >= kMinParallel)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t li = (b * NH + h) * T + t, oi = ((b * T + t) * NH + h) * HS;
        const float m = std::max(L[li], l[li]);
        if (m == -INFINITY) continue;  // neither part has keys yet: stays empty
        // L = -inf (no keys so far) gives wa = 0: the row becomes out's.
        const float wa = std::exp(L[li] - m), wb = std::exp(l[li] - m), s = wa + wb;
        for (int64_t d = 0; d < HS; ++d) o[oi + d] = (o[oi + d] * wa + p[oi + d] * wb) / s;
        L[li] = m + std::log(s);
      }
}

}  // namespace loom::kernels::cpu::LOOM_ISA
