// CUDA matmul and linear (ops.h): every GEMM through cuBLASLt, with f32
// compute (no TF32: an f32 GEMM keeps f32's 24 bits, as the CPU's does) and
// the output's dtype f32, bf16 or f16; the bias grad, the mixed-dtype
// roundings are kernels here (the batch-invariant GEMV: linear_invariant.cu).
//
// Row-major to cuBLASLt's column-major: a row-major (R, C) matrix is the
// column-major (C, R) one with the same bytes, so c (M, N) = op(a) @ op(b)
// is computed as c^T (N, M) = op(b)^T @ op(a)^T: cuBLASLt's A is our b, its
// B our a, and m = N, n = M.
//
// Operands follow the CPU backend (cpu/matmul.cpp): an f32 operand paired
// with a bf16 one is rounded to bf16 first (PyTorch autocast's rule); an f16
// one paired with f32 is widened to f32; bf16 and f16 GEMMs take their
// inputs as they are (products exact in f32, sums in f32).
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "core/lru_cache.h"
#include "kernels/cuda/bias_grad.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cublaslt_api.h"
#include "kernels/cuda/cuda_ops.h"

namespace loom::kernels::cuda {
namespace {

#define LOOM_CUBLAS_CHECK(expr)                                                                             \
  do {                                                                                                      \
    const cublasStatus_t loom_cublas_status_ = (expr);                                                      \
    if (loom_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                                       \
      fail("cuBLASLt: ", #expr, " failed: ", cublaslt().cublasLtGetStatusName(loom_cublas_status_), ": ",   \
           cublaslt().cublasLtGetStatusString(loom_cublas_status_), " (", __FILE__, ":", __LINE__, ")");    \
  } while (0)

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLASLt's recommendation for Hopper

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: break;
  }
  LOOM_CHECK(false, "GEMM operand of dtype ", dtype_name(t));
  return CUDA_R_32F;
}

// The largest power of two up to 256 dividing the address: the alignment
// cuBLASLt may assume (its default, 256, would let it pick kernels that fault
// on a view that starts mid-tensor).
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al >>= 1;
  return al;
}

// One GEMM in cuBLASLt's terms (see the top), batched with strides (0: shared).
struct LtGemm {
  int64_t m = 0, n = 0, k = 0, batch = 1;
  const void* a = nullptr;  // cuBLASLt's A (our b)
  const void* b = nullptr;  // cuBLASLt's B (our a)
  void* c = nullptr;
  const void* bias = nullptr;  // length m, c's dtype
  void* aux = nullptr;         // set: c = GELU(the sum), aux the sum (GELU_AUX epilogue), c's dtype and ld
  DType ab = DType::f32, c_dtype = DType::f32;
  bool trans_a = false, trans_b = false;
  int64_t lda = 0, ldb = 0, ldc = 0, stride_a = 0, stride_b = 0, stride_c = 0;
  float alpha = 1.f, beta = 0.f;
};

// The last fields: the alignments of a, b, c, the bias and the GELU
// epilogue's aux (0: none), which the chosen kernel may assume.
using PlanKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int, int, bool, bool, int64_t, int64_t, int64_t,
                           int64_t, int64_t, int64_t, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t>;

// A GEMM's descriptors and chosen algorithm, kept for the next call of the
// same shape (cuBLASLt's heuristic query costs more than a small GEMM).
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

void destroy_plan(Plan& p) {
  const CublasLtApi& api = cublaslt();
  for (cublasLtMatrixLayout_t l : {p.a, p.b, p.c})
    if (l) api.cublasLtMatrixLayoutDestroy(l);
  if (p.op) api.cublasLtMatmulDescDestroy(p.op);
}

// Plans kept: a model's GEMMs need a few dozen; MoE's per-expert row counts
// vary by step, so the least recently used beyond this are destroyed (the
// descriptors are host objects: an enqueued GEMM no longer reads them).
constexpr size_t kMaxPlans = 1024;

struct Lt {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::mutex mutex;
  LruCache<PlanKey, Plan> plans{kMaxPlans, destroy_plan};
};

Lt& lt() {
  static Lt* state = [] {
    auto* s = new Lt;  // lives for the process: cuBLASLt must not be torn down after the driver
    LOOM_CUBLAS_CHECK(cublaslt().cublasLtCreate(&s->handle));
    LOOM_CUDA_CHECK(cudaMalloc(&s->workspace, kWorkspaceBytes));
    return s;
  }();
  return *state;
}

cublasLtMatrixLayout_t layout(DType t, int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
  const CublasLtApi& api = cublaslt();
  cublasLtMatrixLayout_t l = nullptr;
  LOOM_CUBLAS_CHECK(
      api.cublasLtMatrixLayoutCreate(&l, cuda_type(t), static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    LOOM_CUBLAS_CHECK(
        api.cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
    LOOM_CUBLAS_CHECK(
        api.cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  }
  return l;
}

// Destroys what a plan it holds has created, unless kept (make_plan's
// failures leave nothing behind).
struct PlanGuard {
  Plan& p;
  bool keep = false;
  ~PlanGuard() {
    if (!keep) destroy_plan(p);
  }
};

Plan make_plan(Lt& s, const LtGemm& g, uint32_t al_a, uint32_t al_b, uint32_t al_c) {
  const CublasLtApi& api = cublaslt();
  Plan p;
  PlanGuard guard{p};
  LOOM_CUBLAS_CHECK(api.cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  LOOM_CUBLAS_CHECK(api.cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  LOOM_CUBLAS_CHECK(api.cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  if (g.bias || g.aux) {
    const cublasLtEpilogue_t epi = !g.aux ? CUBLASLT_EPILOGUE_BIAS
                                   : g.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                            : CUBLASLT_EPILOGUE_GELU_AUX;
    LOOM_CUBLAS_CHECK(api.cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  }
  // The pointers before the heuristic, which reads their alignment.
  if (g.bias)
    LOOM_CUBLAS_CHECK(
        api.cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias));
  if (g.aux) {
    LOOM_CUBLAS_CHECK(api.cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &g.ldc,
                                                         sizeof g.ldc));
    LOOM_CUBLAS_CHECK(
        api.cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof g.aux));
  }
  p.a = layout(g.ab, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.lda, g.batch, g.stride_a);
  p.b = layout(g.ab, g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.ldb, g.batch, g.stride_b);
  p.c = layout(g.c_dtype, g.m, g.n, g.ldc, g.batch, g.stride_c);
  cublasLtMatmulPreference_t pref = nullptr;
  LOOM_CUBLAS_CHECK(api.cublasLtMatmulPreferenceCreate(&pref));
  const std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, cublasStatus_t (*)(cublasLtMatmulPreference_t)> pref_owner(
      pref, api.cublasLtMatmulPreferenceDestroy);
  const uint64_t ws = kWorkspaceBytes;
  LOOM_CUBLAS_CHECK(
      api.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  LOOM_CUBLAS_CHECK(
      api.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
  LOOM_CUBLAS_CHECK(
      api.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
  LOOM_CUBLAS_CHECK(
      api.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c));
  LOOM_CUBLAS_CHECK(
      api.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      api.cublasLtMatmulAlgoGetHeuristic(s.handle, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0)
    fail("cuBLASLt has no algorithm for a ", dtype_name(g.ab), " GEMM m=", g.m, " n=", g.n, " k=", g.k,
         " batch=", g.batch, " to ", dtype_name(g.c_dtype), (g.bias ? " with bias" : ""),
         (g.aux ? " and GELU" : ""), " (",
         st != CUBLAS_STATUS_SUCCESS ? api.cublasLtGetStatusString(st) : "its heuristic returned none", ")");
  p.algo = result.algo;
  guard.keep = true;
  return p;
}

// Everything a plan depends on (the pointers only by their alignment).
PlanKey plan_key(const LtGemm& g) {
  const uint32_t al_bias = g.bias ? alignment_of(g.bias) : 0u, al_aux = g.aux ? alignment_of(g.aux) : 0u;
  return {g.m,        g.n,        g.k,        g.batch, static_cast<int>(g.ab), static_cast<int>(g.c_dtype),
          g.trans_a,  g.trans_b,  g.lda,      g.ldb,   g.ldc,
          g.stride_a, g.stride_b, g.stride_c, al_bias, alignment_of(g.a),      alignment_of(g.b),
          alignment_of(g.c), al_aux};
}

void run(const LtGemm& g) {
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  const CublasLtApi& api = cublaslt();
  Lt& s = lt();
  const uint32_t al_a = alignment_of(g.a), al_b = alignment_of(g.b), al_c = alignment_of(g.c);
  const PlanKey key = plan_key(g);
  // Held until the GEMM is enqueued: the plan's descriptor carries this
  // call's bias and aux pointers, which another thread's call would change.
  std::lock_guard lock(s.mutex);
  const Plan* plan = &s.plans.get_or_make(key, [&] { return make_plan(s, g, al_a, al_b, al_c); });
  if (g.bias)
    LOOM_CUBLAS_CHECK(
        api.cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias));
  if (g.aux)
    LOOM_CUBLAS_CHECK(
        api.cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof g.aux));
  LOOM_CUBLAS_CHECK(api.cublasLtMatmul(s.handle, plan->op, &g.alpha, g.a, plan->a, g.b, plan->b, &g.beta, g.c,
                                      plan->c, g.c, plan->c, &plan->algo, s.workspace, kWorkspaceBytes, stream()));
}

int64_t leading(const Tensor& t) {  // product of all but the last two dims
  int64_t n = 1;
  for (int d = 0; d + 2 < t.ndim(); ++d) n *= t.size(d);
  return n;
}

Tensor as_matrix(const Tensor& t) {  // (..., C) -> (prod(...), C)
  int64_t rows = 1;
  for (int d = 0; d + 1 < t.ndim(); ++d) rows *= t.size(d);
  return t.reshape({rows, t.size(-1)});
}

template <typename TO, typename TI>
__global__ void convert_kernel(TO* out, const TI* in, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    out[i] = from_float<TO>(to_float(in[i]));
}

template <typename TO>
__global__ void add_f32_kernel(TO* out, const float* in, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    out[i] = from_float<TO>(to_float(out[i]) + in[i]);
}

// c = bias + beta c, rounded once (the CPU's order); c is not read at beta 0.
template <typename T>
__global__ void scale_add_bias_kernel(T* c, const T* bias, float beta, int64_t n, int64_t cols) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    float v = bias ? to_float(bias[i % cols]) : 0.f;
    if (beta != 0.f) v += beta * to_float(c[i]);
    c[i] = from_float<T>(v);
  }
}

// A GEMM with k = 0, which cuBLASLt refuses: c = beta c (+ bias), any beta.
void no_products(const Tensor& c, const Tensor& bias, float beta) {
  if (c.numel() == 0 || (beta == 1.f && !bias.defined())) return;
  with_float_type(c.dtype(), [&](auto ct) {
    using TC = decltype(ct);
    scale_add_bias_kernel<<<grid_for(c.numel()), 256, 0, stream()>>>(
        ptr<TC>(c), bias.defined() ? ptr<const TC>(bias) : nullptr, beta, c.numel(), c.size(-1));
    LOOM_CUDA_LAUNCHED();
  });
}

// c = alpha op(a) op(b) (+ bias) + beta c on checked device operands.
// c = alpha op(a) op(b) + beta c (+ bias) in cuBLASLt's terms (see the top),
// for operands of one dtype (c's may differ) and a bias of c's.
LtGemm lt_gemm(const Tensor& c, const Tensor& a, const Tensor& b, bool ta, bool tb, float alpha, float beta,
               const Tensor& bias) {
  LtGemm g;
  g.ab = a.dtype();
  g.c_dtype = c.dtype();
  g.batch = leading(c);
  g.m = c.size(-1);  // N
  g.n = c.size(-2);  // M
  g.k = a.size(ta ? -2 : -1);
  g.a = b.data();
  g.b = a.data();
  g.c = c.data();
  g.bias = bias.defined() ? bias.data() : nullptr;
  g.trans_a = tb;
  g.trans_b = ta;
  g.lda = b.size(-1);
  g.ldb = a.size(-1);
  g.ldc = c.size(-1);
  g.stride_a = b.ndim() > 2 ? b.size(-2) * b.size(-1) : 0;
  g.stride_b = a.ndim() > 2 ? a.size(-2) * a.size(-1) : 0;
  g.stride_c = c.size(-2) * c.size(-1);
  g.alpha = alpha;
  g.beta = beta;
  return g;
}

void gemm(Tensor c, Tensor a, Tensor b, bool ta, bool tb, float alpha, float beta, Tensor bias = {}) {
  DeviceTemp ta_tmp, tb_tmp, bias_tmp, bias_copy, c_tmp;
  if (a.dtype() != b.dtype()) {  // backward with an f32 gradient (see the top)
    const DType half = a.dtype() == DType::f32 ? b.dtype() : a.dtype();
    const DType to = half == DType::bf16 ? DType::bf16 : DType::f32;
    if (a.dtype() != to) a = converted(a, to, ta_tmp);
    if (b.dtype() != to) b = converted(b, to, tb_tmp);
  }
  const Tensor c_out = c;
  // cuBLASLt writes f32 operands' products to an f32 c only, and its bias
  // epilogue reads a bias of c's dtype: a 16-bit c of f32 operands (an f32
  // gradient with f16 weights), or of an f32 bias, goes through an f32 c
  // (holding c where beta reads it), so that it is rounded once, as on the CPU.
  if (c.dtype() != DType::f32 && (a.dtype() == DType::f32 || (bias.defined() && bias.dtype() == DType::f32))) {
    if (beta != 0.f) {
      c = converted(c, DType::f32, c_tmp);
    } else {
      c_tmp = DeviceTemp(static_cast<size_t>(c.numel()) * sizeof(float));
      c = Tensor(c_tmp.as<void>(), DType::f32, c.shape(), c.device());
    }
  }
  if (bias.defined() && bias.dtype() != c.dtype()) bias = converted(bias, c.dtype(), bias_tmp);
  // Some of cuBLASLt's kernels read the bias 16 bytes at a time whatever the
  // alignment its heuristic was told (a misaligned-address fault that ends the
  // CUDA context): a bias view less aligned (a packed parameter buffer whose
  // widths are not multiples of 8) is copied to fresh, aligned memory.
  if (bias.defined() && alignment_of(bias.data()) < 16) bias = converted(bias, bias.dtype(), bias_copy);
  const LtGemm g = lt_gemm(c, a, b, ta, tb, alpha, beta, bias);
  if (g.k == 0) no_products(c, bias, beta);
  else run(g);
  if (c.data() != c_out.data()) {
    // c was redirected to f32: round once into the caller's c.
    with_float_type(c_out.dtype(), [&](auto o) {
      using TO = decltype(o);
      convert_kernel<<<grid_for(c.numel()), 256, 0, stream()>>>(ptr<TO>(c_out), ptr<const float>(c), c.numel());
      LOOM_CUDA_LAUNCHED();
    });
  }
}

Tensor matrix_of_batch(const Tensor& t, int64_t i) {  // t: (..., R, C) -> batch i as (R, C)
  if (t.ndim() == 2) return t;
  return t.reshape({leading(t), t.size(-2), t.size(-1)}).slice(0, i, 1).reshape({t.size(-2), t.size(-1)});
}

// out += alpha op(x) op(y); a 2-D out of batched x, y sums the batches
// (the gradient of an operand every batch shares), rounded once.
void accumulate(Tensor out, const Tensor& x, const Tensor& y, bool tx, bool ty, float alpha) {
  if (out.ndim() > 2 || (x.ndim() == 2 && y.ndim() == 2)) return gemm(out, x, y, tx, ty, alpha, 1.f);
  if (tx && !ty && x.ndim() > 2 && y.ndim() > 2)  // sum_i x_i^T y_i: one GEMM with K = batch * rows
    return gemm(out, as_matrix(x), as_matrix(y), true, false, alpha, 1.f);
  Tensor sum = out;
  DeviceTemp workspace;
  if (out.dtype() != DType::f32) {
    workspace = DeviceTemp(static_cast<size_t>(out.numel()) * sizeof(float));
    LOOM_CUDA_CHECK(cudaMemsetAsync(workspace.as<void>(), 0, out.numel() * sizeof(float), stream()));
    sum = Tensor(workspace.as<void>(), DType::f32, out.shape(), out.device());
  }
  const int64_t batch = std::max(leading(x), leading(y));
  for (int64_t i = 0; i < batch; ++i) gemm(sum, matrix_of_batch(x, i), matrix_of_batch(y, i), tx, ty, alpha, 1.f);
  if (out.dtype() != DType::f32) {
    with_float_type(out.dtype(), [&](auto o) {
      using TO = decltype(o);
      add_f32_kernel<<<grid_for(out.numel()), 256, 0, stream()>>>(ptr<TO>(out), workspace.as<const float>(),
                                                                   out.numel());
      LOOM_CUDA_LAUNCHED();
    });
  }
}

}  // namespace

Tensor converted(const Tensor& t, DType to, DeviceTemp& temp) {
  LOOM_CHECK(temp.as<void>() == nullptr, "converted: its temporary is in use (it may hold t)");
  temp = DeviceTemp(static_cast<size_t>(t.numel()) * dtype_size(to));
  with_float_type(to, [&](auto o) {
    with_float_type(t.dtype(), [&](auto i) {
      using TO = decltype(o);
      using TI = decltype(i);
      convert_kernel<<<grid_for(t.numel()), 256, 0, stream()>>>(temp.as<TO>(), ptr<const TI>(t), t.numel());
      LOOM_CUDA_LAUNCHED();
    });
  });
  return Tensor(temp.as<void>(), to, t.shape(), t.device());
}

void matmul(Tensor c, const Tensor& a, const Tensor& b, const MatmulOpts& opts) {
  gemm(c, a, b, opts.trans_a, opts.trans_b, opts.alpha, opts.beta);
}

// c = alpha op(a) op(b): d op(a) = alpha dc op(b)^T, d op(b) = alpha op(a)^T dc.
void matmul_backward(Tensor da, Tensor db, const Tensor& dc, const Tensor& a, const Tensor& b,
                     const MatmulOpts& opts) {
  const float alpha = opts.alpha;
  if (da.defined()) {
    if (!opts.trans_a) accumulate(da, dc, b, false, !opts.trans_b, alpha);
    else accumulate(da, b, dc, opts.trans_b, true, alpha);
  }
  if (db.defined()) {
    if (!opts.trans_b) accumulate(db, a, dc, !opts.trans_a, false, alpha);
    else accumulate(db, dc, a, true, opts.trans_a, alpha);
  }
}

// y (N, OC) = x (N, IC) @ w^T + bias
void linear_forward(Tensor y, const Tensor& x, const Tensor& w, const Tensor& bias) {
  gemm(as_matrix(y), as_matrix(x), w, false, true, 1.f, 0.f, bias);
}

// The GEMMs (plan_key) whose GELU epilogue cuBLASLt refused: they take the
// unfused path from then on, other shapes and alignments still try it.
struct GeluRefusals {
  std::mutex mutex;
  LruCache<PlanKey, bool> keys{256};
  bool warned = false;
};

GeluRefusals& gelu_refusals() {
  static GeluRefusals* r = new GeluRefusals;  // for the process, like lt()
  return *r;
}

// One GEMM with the GELU_AUX(_BIAS) epilogue: pre = x w^T + bias, y =
// GELU(pre), x w^T rounded to bf16 / f16 before the bias (cuBLASLt's way:
// docs/numerics.md); 16-bit only (NVIDIA does not state the epilogue's GELU
// error, which f32's tolerance might not cover). Where it does not apply
// (f32, mixed dtypes, no products, an aux ld cuBLASLt refuses) or cuBLASLt
// has no kernel for it (then never again for that GEMM in this process; a
// warning the first time), linear_forward then gelu_forward.
void linear_gelu_forward(Tensor y, Tensor pre, const Tensor& x, const Tensor& w, const Tensor& bias) {
  const Tensor pre2 = as_matrix(pre), x2 = as_matrix(x);
  const bool fits = x.dtype() != DType::f32 && x.dtype() == w.dtype() && pre.dtype() == x.dtype() &&
                    (!bias.defined() || (bias.dtype() == pre.dtype() && alignment_of(bias.data()) >= 16)) &&
                    x2.size(1) > 0 && pre2.size(0) > 0 && pre2.size(1) % 8 == 0;
  if (fits) {
    LtGemm g = lt_gemm(as_matrix(y), x2, w, false, true, 1.f, 0.f, bias);
    g.aux = pre.data();
    const PlanKey key = plan_key(g);
    GeluRefusals& refusals = gelu_refusals();
    bool refused = false;
    {
      std::lock_guard lock(refusals.mutex);
      refused = refusals.keys.contains(key);
    }
    if (!refused) {
      try {
        return run(g);
      } catch (const Error& e) {
        std::lock_guard lock(refusals.mutex);
        refusals.keys.get_or_make(key, [] { return true; });
        if (!std::exchange(refusals.warned, true))
          std::fprintf(stderr, "warning: cuBLASLt's GELU epilogue failed for a %s GEMM (%s): it takes the GEMM, "
                               "then the GELU kernel, and so does every GEMM of that shape from now on\n",
                       std::string(dtype_name(x.dtype())).c_str(), e.what());
      }
    }
  }
  linear_forward(pre, x, w, bias);
  gelu_forward(y, pre);
}

void linear_backward(Tensor dx, Tensor dw, Tensor dbias, const Tensor& dy, const Tensor& x, const Tensor& w) {
  const Tensor dy2 = as_matrix(dy);  // (N, OC)
  // An f32 gradient of bf16 weights is rounded to bf16 for both GEMMs (see
  // the top): once, here, rather than by each (the LM head's is the logits').
  DeviceTemp dy_bf16;
  const Tensor dy_ab = dy2.dtype() == DType::f32 && w.dtype() == DType::bf16 && x.dtype() == DType::bf16 &&
                               (dx.defined() || dw.defined())
                           ? converted(dy2, DType::bf16, dy_bf16)
                           : dy2;
  if (dx.defined()) gemm(as_matrix(dx), dy_ab, w, false, false, 1.f, 1.f);  // dx += dy @ w
  if (dw.defined()) gemm(dw, dy_ab, as_matrix(x), true, false, 1.f, 1.f);   // dw += dy^T @ x
  if (dbias.defined()) bias_grad(dbias, dy2);
}

void grouped_linear_forward(Tensor y, const Tensor& x, std::span<const Tensor> w, std::span<const int64_t> offsets,
                            bool invariant) {
  for (size_t g = 0; g < w.size(); ++g) {
    const int64_t r0 = offsets[g], n = offsets[g + 1] - r0;
    if (n == 0) continue;
    const Tensor yg = y.slice(0, r0, n), xg = x.slice(0, r0, n);
    if (invariant) linear_forward_invariant(yg, xg, w[g], Tensor());
    else gemm(yg, xg, w[g], false, true, 1.f, 0.f);
  }
}

void grouped_linear_backward(Tensor dx, std::span<const Tensor> dw, const Tensor& dy, const Tensor& x,
                             std::span<const Tensor> w, std::span<const int64_t> offsets) {
  for (size_t g = 0; g < w.size(); ++g) {
    const int64_t r0 = offsets[g], n = offsets[g + 1] - r0;
    if (n == 0) continue;
    const Tensor dyg = dy.slice(0, r0, n), xg = x.slice(0, r0, n);
    if (dx.defined()) gemm(dx.slice(0, r0, n), dyg, w[g], false, false, 1.f, 1.f);
    if (!dw.empty() && dw[g].defined()) gemm(dw[g], dyg, xg, true, false, 1.f, 1.f);
  }
}

}  // namespace loom::kernels::cuda
