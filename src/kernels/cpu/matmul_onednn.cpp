// oneDNN backend of the CPU GEMM (see matmul.cpp for why oneDNN).
//
// Creating a oneDNN primitive descriptor and primitive costs tens of
// microseconds to milliseconds (kernel generation), so each problem (shape,
// dtypes, transposes, broadcast, alpha, beta, bias) gets one primitive,
// created on first use and kept in a process-wide cache behind a mutex.
// Executing a primitive concurrently from several threads is safe because
// the primitives use a user scratchpad: each calling thread passes its own
// scratchpad (scratch.h slot d) and thread_local stream, so no state is shared during
// execution. The ISA is oneDNN's own dispatch (avx512_core_bf16 on Zen 4),
// capped with loom's level by kernels/cpu_isa.cpp (dnnl_set_max_cpu_isa,
// not an environment variable: DESIGN.md §1.5).
#include "kernels/cpu/matmul_onednn.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <unordered_map>

#include "core/error.h"
#include "kernels/cpu/scratch.h"

namespace loom::kernels::cpu {
namespace {

using dnnl::memory;

// Everything a primitive is specialised on. Floats as bits: exact equality.
struct GemmKey {
  int64_t batch, m, n, k;
  bool a_batched, b_batched, trans_a, trans_b, has_bias;
  DType ab, c_dtype, bias_dtype;
  uint32_t alpha_bits, beta_bits;

  auto tie() const {
    return std::tie(batch, m, n, k, a_batched, b_batched, trans_a, trans_b, has_bias, ab, c_dtype, bias_dtype,
                    alpha_bits, beta_bits);
  }
  bool operator<(const GemmKey& o) const { return tie() < o.tie(); }
};

struct GemmPrimitive {
  dnnl::matmul prim;
  memory::desc a_md, b_md, c_md, bias_md, scratchpad_md;
};

// Training and serving use a bounded set of shapes; a program that keeps
// producing new ones (e.g. every decode batch size) must not grow forever.
constexpr size_t kCacheCapacity = 1024;

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

memory::data_type dnnl_type(DType t) {
  switch (t) {
    case DType::f32: return memory::data_type::f32;
    case DType::bf16: return memory::data_type::bf16;
    default: LOOM_CHECK(false, "gemm: no oneDNN type for ", dtype_name(t));
  }
}

// A row-major matrix (rows, cols), optionally read transposed, with a leading
// batch dim when the problem is batched (oneDNN wants equal ranks).
memory::desc matrix_desc(const GemmKey& key, int64_t batch, int64_t rows, int64_t cols, bool trans, DType t) {
  // Logical (rows, cols); stored as (cols, rows) when trans.
  const memory::dims strides = trans ? memory::dims{1, rows} : memory::dims{cols, 1};
  if (key.batch == 1) return memory::desc({rows, cols}, dnnl_type(t), strides);
  return memory::desc({batch, rows, cols}, dnnl_type(t), {rows * cols, strides[0], strides[1]});
}

std::shared_ptr<GemmPrimitive> create_primitive(const GemmKey& key) {
  auto p = std::make_shared<GemmPrimitive>();
  p->a_md = matrix_desc(key, key.a_batched ? key.batch : 1, key.m, key.k, key.trans_a, key.ab);
  p->b_md = matrix_desc(key, key.b_batched ? key.batch : 1, key.k, key.n, key.trans_b, key.ab);
  p->c_md = matrix_desc(key, key.batch, key.m, key.n, false, key.c_dtype);
  if (key.has_bias) p->bias_md = matrix_desc(key, 1, 1, key.n, false, key.bias_dtype);

  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  float alpha, beta;
  std::memcpy(&alpha, &key.alpha_bits, sizeof alpha);
  std::memcpy(&beta, &key.beta_bits, sizeof beta);
  // oneDNN: dst = output_scale * (a @ b + bias) + sum_scale * dst. Bias is
  // only used with alpha = 1 (linear), where both readings agree.
  if (alpha != 1.f) attr.set_output_scales(0, {alpha});
  if (beta != 0.f) {
    dnnl::post_ops ops;
    ops.append_sum(beta);
    attr.set_post_ops(ops);
  }
  try {
    const auto desc = key.has_bias ? dnnl::matmul::desc(p->a_md, p->b_md, p->bias_md, p->c_md)
                                   : dnnl::matmul::desc(p->a_md, p->b_md, p->c_md);
    const dnnl::matmul::primitive_desc pd(desc, attr, cpu_engine());
    p->scratchpad_md = pd.scratchpad_desc();
    p->prim = dnnl::matmul(pd);
  } catch (const dnnl::error& e) {
    // oneDNN 2.6 has bf16 GEMMs only on CPUs with AVX-512 (avx512_core and
    // up): elsewhere a bf16 run is a user choice this machine cannot serve.
    if (e.status == dnnl_unimplemented && key.ab == DType::bf16)
      fail("matmul: this CPU has no bf16 GEMM at the level oneDNN runs at (oneDNN needs AVX-512 for bf16)");
    LOOM_CHECK(false, "oneDNN matmul creation failed: ", e.what(), " (batch ", key.batch, ", m ", key.m, ", n ",
               key.n, ", k ", key.k, ", ", dtype_name(key.ab), " -> ", dtype_name(key.c_dtype), ")");
  }
  return p;
}

std::shared_ptr<GemmPrimitive> cached_primitive(const GemmKey& key) {
  static std::mutex mutex;
  static std::map<GemmKey, std::shared_ptr<GemmPrimitive>> cache;
  std::lock_guard lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  // In-flight users hold their own shared_ptr, so clearing is safe.
  if (cache.size() >= kCacheCapacity) cache.clear();
  return cache.emplace(key, create_primitive(key)).first->second;
}

float load(const void* p, DType t, int64_t i) {
  return t == DType::f32 ? static_cast<const float*>(p)[i] : from_bf16(static_cast<const bf16*>(p)[i]);
}
void store(void* p, DType t, int64_t i, float x) {
  if (t == DType::f32) static_cast<float*>(p)[i] = x;
  else static_cast<bf16*>(p)[i] = to_bf16(x);
}

// K = 0: the product is empty, c = bias + beta * c (oneDNN rejects zero dims).
void gemm_empty_k(const Gemm& g) {
  for (int64_t i = 0; i < g.batch * g.m; ++i) {
    for (int64_t j = 0; j < g.n; ++j) {
      const int64_t at = i * g.n + j;
      float v = g.bias ? load(g.bias, g.bias_dtype, j) : 0.f;
      if (g.beta != 0.f) v += g.beta * load(g.c, g.c_dtype, at);
      store(g.c, g.c_dtype, at, v);
    }
  }
}

}  // namespace

void gemm_run(const Gemm& g) {
  if (g.batch == 0 || g.m == 0 || g.n == 0) return;
  if (g.k == 0) return gemm_empty_k(g);

  GemmKey key{g.batch, g.m, g.n, g.k, g.a_batched, g.b_batched, g.trans_a, g.trans_b, g.bias != nullptr,
              g.ab, g.c_dtype, g.bias ? g.bias_dtype : DType::f32, 0, 0};
  std::memcpy(&key.alpha_bits, &g.alpha, sizeof g.alpha);
  std::memcpy(&key.beta_bits, &g.beta, sizeof g.beta);
  LOOM_CHECK(g.batch == 1 || g.a_batched || g.b_batched, "gemm: batch ", g.batch, " but no batched operand");
  // Batched a @ shared b is one (batch*M, K) @ (K, N) GEMM: bigger, faster,
  // one primitive for every batch count with the same rows.
  if (key.batch > 1 && key.a_batched && !key.b_batched && !key.trans_a) {
    key.m *= key.batch;
    key.batch = 1;
  }
  if (key.batch == 1) key.a_batched = key.b_batched = false;

  const std::shared_ptr<GemmPrimitive> p = cached_primitive(key);
  thread_local dnnl::stream stream(cpu_engine());
  dnnl::engine& engine = cpu_engine();
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, memory(p->a_md, engine, const_cast<void*>(g.a))},
      {DNNL_ARG_WEIGHTS, memory(p->b_md, engine, const_cast<void*>(g.b))},
      {DNNL_ARG_DST, memory(p->c_md, engine, g.c)},
  };
  if (g.bias) args.emplace(DNNL_ARG_BIAS, memory(p->bias_md, engine, const_cast<void*>(g.bias)));
  if (const size_t bytes = p->scratchpad_md.get_size(); bytes > 0)
    // Slot d: matmul.cpp holds slots a and b around this call.
    args.emplace(DNNL_ARG_SCRATCHPAD,
                 memory(p->scratchpad_md, engine, thread_scratch<std::byte>(ScratchSlot::d, bytes)));
  try {
    p->prim.execute(stream, args);
    stream.wait();
  } catch (const dnnl::error& e) {
    LOOM_CHECK(false, "oneDNN matmul execution failed: ", e.what());
  }
}

const std::string& onednn_bf16_unsupported_reason() {
  static const std::string reason = [] {
    bf16 a{0}, c{0};
    Gemm g;
    g.a = g.b = &a;
    g.c = &c;
    g.ab = g.c_dtype = DType::bf16;
    g.m = g.n = g.k = 1;
    try {
      gemm_run(g);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  }();
  return reason;
}

}  // namespace loom::kernels::cpu
