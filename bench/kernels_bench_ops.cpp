// `loom bench kernels`: the memory-bound ops of the kernel table (ops.h) at
// the shapes a gpt2-124m training step (B 4, T 128: 512 rows of C 768) and a
// decode step (32 sequences, one row each, at position 256) use, forward and
// backward where the op has both, f32 and bf16 (every float operand in the
// case's dtype; saved statistics f32).
//
// These ops move bytes rather than multiply: each case reports GB/s of the
// bytes the op must move (every input read once, every output written once,
// a gradient that is accumulated counted once; saved statistics and ids
// included), by the formula tests/ref/bench_torch_kernels.py uses for the
// same case, so the two GB/s figures compare like for like (their ratio is
// the inverse ratio of the times). Timing as the other cases (measure): the
// best of repeats over --seconds.
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "bench/kernels_bench.h"
#include "core/memory.h"
#include "kernels/cpu_isa.h"
#include "kernels/ops.h"

namespace loom::bench {
namespace {

using namespace loom::kernels;

// gpt2-124m (also in bench_torch_kernels.py).
constexpr int64_t kB = 4, kT = 128, kRows = kB * kT, kC = 768, kV = 50257, kMaxT = 1024, kLayers = 12;
constexpr int64_t kHeads = 12, kHs = 64, kF = 4 * kC;
constexpr int64_t kSwigluF = 2048;  // a Llama MLP at C = 768: 8 C / 3
constexpr int64_t kSeqs = 32, kDecodePos = 256;
constexpr float kEps = 1e-5f, kTheta = 10000.f;
constexpr DType kDtypes[] = {DType::f32, DType::bf16};

// The rows a row-wise op sees in a training step and in a decode step.
struct RowsCase {
  const char* name;
  int64_t rows;
  bool train;  // backward cases run only here
};
constexpr RowsCase kRowsCases[] = {{"train_b4t128", kRows, true}, {"decode_s32", kSeqs, false}};

struct Case {
  std::string op, dtype, name, shape;
  double bytes;  // that the op must move
};

std::string dims(std::initializer_list<int64_t> d) {
  std::string s;
  for (int64_t v : d) {
    if (!s.empty()) s += 'x';
    s += std::to_string(v);
  }
  return s;
}

// A case's operands: allocated once the case is selected, freed when it has been measured.
class Operands {
 public:
  explicit Operands(Pools& pools) : pool_(pools[MemTag::workspace]) {}
  Tensor random(DType dtype, Shape shape, uint64_t seed) {
    Tensor t = keep(pool_.empty(dtype, shape));
    fill_random(t, seed);
    return t;
  }
  Tensor zeros(DType dtype, Shape shape) { return keep(pool_.zeros(dtype, shape)); }
  // i32 ids: id(i) for element i in flat order.
  template <typename Id>
  Tensor ids(Shape shape, const Id& id) {
    Tensor t = keep(pool_.empty(DType::i32, shape));
    for (int64_t i = 0; i < t.numel(); ++i) t.data_as<int32_t>()[i] = static_cast<int32_t>(id(i));
    return t;
  }

 private:
  Tensor keep(OwnedTensor t) {
    owned_.push_back(std::move(t));
    return owned_.back();
  }
  Pool& pool_;
  std::vector<OwnedTensor> owned_;
};

// Distinct token ids, the same in bench_torch_kernels.py: (i * 7919) mod V.
int64_t token_id(int64_t i) { return i * 7919 % kV; }

class Runner {
 public:
  Runner(Pools& p, const KernelBenchOptions& opts) : pools(p), opts_(opts) {}
  bool wants(const std::string& op, const std::string& dtype, const std::string& name) const {
    return selected(opts_, op, dtype, name);
  }
  bool wants(const std::string& op, DType dtype, const std::string& name) const {
    return wants(op, std::string(dtype_name(dtype)), name);
  }
  void time(const Case& c, const std::function<void()>& run) {
    const Timing t = measure(run, opts_.min_seconds);
    print(c, t);
    ++measured_;
  }
  int64_t measured() const { return measured_; }
  Pools& pools;

 private:
  void print(const Case& c, const Timing& t) {
    const double gbps = c.bytes / t.best / 1e9;
    const char* isa = cpu_isa_name(cpu_isa());
    if (opts_.json) {
      std::printf("{\"op\":\"%s\",\"dtype\":\"%s\",\"case\":\"%s\",\"shape\":\"%s\",\"bytes\":%.0f,\"seconds\":%.6g,"
                  "\"median_seconds\":%.6g,\"reps\":%d,\"gb_per_s\":%.2f,\"threads\":%d,\"isa\":\"%s\"}\n",
                  c.op.c_str(), c.dtype.c_str(), c.name.c_str(), c.shape.c_str(), c.bytes, t.best, t.median, t.reps,
                  gbps, opts_.threads, isa);
    } else {
      if (measured_ == 0)
        std::printf("\n%-22s %-12s %-18s %-16s %10s %10s %9s\n", "op", "dtype", "case", "shape", "best_ms",
                    "median_ms", "GB/s");
      std::printf("%-22s %-12s %-18s %-16s %10.4f %10.4f %9.2f\n", c.op.c_str(), c.dtype.c_str(), c.name.c_str(),
                  c.shape.c_str(), t.best * 1e3, t.median * 1e3, gbps);
    }
    std::fflush(stdout);
  }
  const KernelBenchOptions& opts_;
  int64_t measured_ = 0;
};

std::string dt(DType d) { return std::string(dtype_name(d)); }

// layernorm (GPT-2) and rmsnorm (Llama) over C, forward at both steps, backward in training.
void bench_norms(Runner& r) {
  for (DType d : kDtypes) {
    const double s = static_cast<double>(dtype_size(d));
    for (const RowsCase& c : kRowsCases) {
      const int64_t N = c.rows;
      const double nc = static_cast<double>(N * kC), stats = 4.0 * static_cast<double>(N);
      const std::string shape = dims({N, kC});
      Operands o(r.pools);
      if (r.wants("layernorm_fwd", d, c.name) || (c.train && r.wants("layernorm_bwd", d, c.name))) {
        const Tensor x = o.random(d, {N, kC}, 1), w = o.random(d, {kC}, 2), b = o.random(d, {kC}, 3);
        const Tensor y = o.zeros(d, {N, kC}), mean = o.zeros(DType::f32, {N}), rstd = o.zeros(DType::f32, {N});
        layernorm_forward(y, mean, rstd, x, w, b, kEps);
        if (r.wants("layernorm_fwd", d, c.name))
          r.time({"layernorm_fwd", dt(d), c.name, shape, (2 * nc + 2 * kC) * s + 2 * stats},
                 [&] { layernorm_forward(y, mean, rstd, x, w, b, kEps); });
        if (c.train && r.wants("layernorm_bwd", d, c.name)) {
          const Tensor dy = o.random(d, {N, kC}, 4), dx = o.zeros(d, {N, kC});
          const Tensor dw = o.zeros(d, {kC}), db = o.zeros(d, {kC});
          r.time({"layernorm_bwd", dt(d), c.name, shape, (3 * nc + 3 * kC) * s + 2 * stats},
                 [&] { layernorm_backward(dx, dw, db, dy, x, w, mean, rstd); });
        }
      }
      if (r.wants("rmsnorm_fwd", d, c.name) || (c.train && r.wants("rmsnorm_bwd", d, c.name))) {
        const Tensor x = o.random(d, {N, kC}, 1), w = o.random(d, {kC}, 2);
        const Tensor y = o.zeros(d, {N, kC}), rstd = o.zeros(DType::f32, {N});
        rmsnorm_forward(y, rstd, x, w, kEps);
        if (r.wants("rmsnorm_fwd", d, c.name))
          r.time({"rmsnorm_fwd", dt(d), c.name, shape, (2 * nc + kC) * s + stats},
                 [&] { rmsnorm_forward(y, rstd, x, w, kEps); });
        if (c.train && r.wants("rmsnorm_bwd", d, c.name)) {
          const Tensor dy = o.random(d, {N, kC}, 4), dx = o.zeros(d, {N, kC}), dw = o.zeros(d, {kC});
          r.time({"rmsnorm_bwd", dt(d), c.name, shape, (3 * nc + 2 * kC) * s + stats},
                 [&] { rmsnorm_backward(dx, dw, dy, x, w, rstd); });
        }
      }
    }
  }
}

// GELU on the MLP's (N, 4C) and SwiGLU on a Llama MLP's (N, F) at the same C.
void bench_activations(Runner& r) {
  for (DType d : kDtypes) {
    const double s = static_cast<double>(dtype_size(d));
    for (const RowsCase& c : kRowsCases) {
      const int64_t N = c.rows;
      Operands o(r.pools);
      const double ng = static_cast<double>(N * kF), nw = static_cast<double>(N * kSwigluF);
      if (r.wants("gelu_fwd", d, c.name) || (c.train && r.wants("gelu_bwd", d, c.name))) {
        const Tensor x = o.random(d, {N, kF}, 1), y = o.zeros(d, {N, kF});
        if (r.wants("gelu_fwd", d, c.name))
          r.time({"gelu_fwd", dt(d), c.name, dims({N, kF}), 2 * ng * s}, [&] { gelu_forward(y, x); });
        if (c.train && r.wants("gelu_bwd", d, c.name)) {
          const Tensor dy = o.random(d, {N, kF}, 2), dx = o.zeros(d, {N, kF});
          r.time({"gelu_bwd", dt(d), c.name, dims({N, kF}), 3 * ng * s}, [&] { gelu_backward(dx, dy, x); });
        }
      }
      if (r.wants("swiglu_fwd", d, c.name) || (c.train && r.wants("swiglu_bwd", d, c.name))) {
        const Tensor gate = o.random(d, {N, kSwigluF}, 3), up = o.random(d, {N, kSwigluF}, 4);
        const Tensor y = o.zeros(d, {N, kSwigluF});
        if (r.wants("swiglu_fwd", d, c.name))
          r.time({"swiglu_fwd", dt(d), c.name, dims({N, kSwigluF}), 3 * nw * s},
                 [&] { swiglu_forward(y, gate, up); });
        if (c.train && r.wants("swiglu_bwd", d, c.name)) {
          const Tensor dy = o.random(d, {N, kSwigluF}, 5);
          const Tensor dgate = o.zeros(d, {N, kSwigluF}), dup = o.zeros(d, {N, kSwigluF});
          r.time({"swiglu_bwd", dt(d), c.name, dims({N, kSwigluF}), 5 * nw * s},
                 [&] { swiglu_backward(dgate, dup, dy, gate, up); });
        }
      }
    }
  }
}

// RoPE on q (B, T, NH, HS): training positions 0..T-1 shared by the batch
// (pos (T)); decode, each sequence's one row at position 256 (pos (S, 1)).
void bench_rope(Runner& r) {
  for (DType d : kDtypes) {
    const double s = static_cast<double>(dtype_size(d));
    for (const RowsCase& c : kRowsCases) {
      const int64_t B = c.train ? kB : kSeqs, T = c.train ? kT : 1;
      const Shape shape{B, T, kHeads, kHs};
      const double n = static_cast<double>(B * T * kHeads * kHs), ids = 4.0 * static_cast<double>(c.train ? T : B);
      if (!r.wants("rope_fwd", d, c.name) && !(c.train && r.wants("rope_bwd", d, c.name))) continue;
      Operands o(r.pools);
      const Tensor pos = c.train ? o.ids({T}, [](int64_t i) { return i; })
                                 : o.ids({B, T}, [](int64_t) { return kDecodePos; });
      const Tensor x = o.random(d, shape, 1), y = o.zeros(d, shape);
      const std::string sh = dims({B, T, kHeads, kHs});
      if (r.wants("rope_fwd", d, c.name))
        r.time({"rope_fwd", dt(d), c.name, sh, 2 * n * s + ids}, [&] { rope_forward(y, x, pos, kTheta); });
      if (c.train && r.wants("rope_bwd", d, c.name)) {
        const Tensor dy = o.random(d, shape, 2), dx = o.zeros(d, shape);
        r.time({"rope_bwd", dt(d), c.name, sh, 2 * n * s + ids}, [&] { rope_backward(dx, dy, pos, kTheta); });
      }
    }
  }
}

// Softmax where a step would run one: over the (T) scores of each of the
// B NH T attention rows (the unfused attention torch runs), forward and
// backward; over the vocabulary of each decode row (sampling), forward.
void bench_softmax(Runner& r) {
  struct SoftmaxCase {
    const char* name;
    int64_t rows, cols;
    bool backward;
  };
  constexpr SoftmaxCase cases[] = {{"train_scores_b4t128", kB * kHeads * kT, kT, true},
                                   {"decode_vocab_s32", kSeqs, kV, false}};
  for (DType d : kDtypes) {
    const double s = static_cast<double>(dtype_size(d));
    for (const SoftmaxCase& c : cases) {
      if (!r.wants("softmax_fwd", d, c.name) && !(c.backward && r.wants("softmax_bwd", d, c.name))) continue;
      Operands o(r.pools);
      const double n = static_cast<double>(c.rows * c.cols);
      const Tensor x = o.random(d, {c.rows, c.cols}, 1), y = o.zeros(d, {c.rows, c.cols});
      softmax_forward(y, x);
      if (r.wants("softmax_fwd", d, c.name))
        r.time({"softmax_fwd", dt(d), c.name, dims({c.rows, c.cols}), 2 * n * s}, [&] { softmax_forward(y, x); });
      if (c.backward && r.wants("softmax_bwd", d, c.name)) {
        const Tensor dy = o.random(d, {c.rows, c.cols}, 2), dx = o.zeros(d, {c.rows, c.cols});
        r.time({"softmax_bwd", dt(d), c.name, dims({c.rows, c.cols}), 3 * n * s},
               [&] { softmax_backward(dx, dy, y); });
      }
    }
  }
}

// The loss of a training step: logits (512, V) -> mean loss and dlogits
// (in logits' dtype; a separate buffer, as torch's).
void bench_cross_entropy(Runner& r) {
  const char* name = "train_b4t128";
  for (DType d : kDtypes) {
    if (!r.wants("cross_entropy_fwd_bwd", d, name)) continue;
    Operands o(r.pools);
    const Tensor logits = o.random(d, {kRows, kV}, 1), dlogits = o.zeros(d, {kRows, kV});
    const Tensor targets = o.ids({kRows}, token_id);
    const double bytes = 2.0 * static_cast<double>(kRows * kV * dtype_size(d)) + 4.0 * kRows;
    r.time({"cross_entropy_fwd_bwd", dt(d), name, dims({kRows, kV}), bytes},
           [&] { cross_entropy_forward_backward(dlogits, Tensor(), logits, targets); });
  }
}

// gpt2-124m's parameters in Hugging Face order (lm_head tied to wte):
// 124,439,808 floats in 148 tensors.
std::vector<int64_t> gpt2_param_sizes() {
  std::vector<int64_t> sizes = {kV * kC, kMaxT * kC};
  for (int64_t l = 0; l < kLayers; ++l)  // ln_1, c_attn, attn c_proj, ln_2, c_fc, mlp c_proj: weight, bias
    for (int64_t n : {kC, kC, 3 * kC * kC, 3 * kC, kC * kC, kC, kC, kC, kF * kC, kF, kC * kF, kC}) sizes.push_back(n);
  sizes.push_back(kC), sizes.push_back(kC);  // ln_f
  return sizes;
}

// One AdamW step over every parameter of gpt2-124m, one call per tensor as
// train::AdamW makes over its flat buffers: f32 (f32 grads), and bf16 mixed
// precision (bf16 grads in, the bf16 compute copy of the params written).
// Then the casts of those parameters between f32 and bf16.
void bench_training_state(Runner& r) {
  const char* name = "gpt2_124m";
  const std::vector<int64_t> sizes = gpt2_param_sizes();
  int64_t n = 0;
  for (int64_t k : sizes) n += k;
  const std::string shape = std::to_string(n) + "_in_" + std::to_string(sizes.size());
  for (DType d : kDtypes) {
    if (!r.wants("adamw_step", d, name)) continue;
    Operands o(r.pools);
    const Tensor p = o.random(DType::f32, {n}, 1), g = o.random(d, {n}, 2);
    const Tensor m = o.zeros(DType::f32, {n}), v = o.zeros(DType::f32, {n});
    const Tensor copy = d == DType::f32 ? Tensor() : o.zeros(d, {n});
    AdamWConfig cfg;
    cfg.lr = 6e-4f, cfg.weight_decay = 0.1f, cfg.step = 0;
    // p, m, v read and written, g read, the copy written.
    const double grad_bytes = static_cast<double>(dtype_size(d)), copy_bytes = copy.defined() ? grad_bytes : 0.0;
    const double bytes = static_cast<double>(n) * (24.0 + grad_bytes + copy_bytes);
    r.time({"adamw_step", dt(d), name, shape, bytes}, [&] {
      ++cfg.step;
      int64_t off = 0;
      for (int64_t k : sizes) {
        adamw_step(p.slice(0, off, k), m.slice(0, off, k), v.slice(0, off, k), g.slice(0, off, k),
                   copy.defined() ? copy.slice(0, off, k) : Tensor(), cfg);
        off += k;
      }
    });
  }
  for (const auto& [from, to] : {std::pair{DType::f32, DType::bf16}, std::pair{DType::bf16, DType::f32}}) {
    const std::string conv = dt(from) + "_to_" + dt(to);
    if (!r.wants("cast", conv, name)) continue;
    Operands o(r.pools);
    const Tensor src = o.random(from, {n}, 3), dst = o.zeros(to, {n});
    r.time({"cast", conv, name, shape, static_cast<double>(n) * 6.0}, [&] { cast(dst, src); });
  }
}

// Token + position embedding: training (B, T) tokens at positions 0..T-1,
// forward and backward (the scatter-add into dwte and dwpe); decode, 32
// sequences' one token each at position 256 (embedding_forward_at).
void bench_embedding(Runner& r) {
  for (DType d : kDtypes) {
    const double s = static_cast<double>(dtype_size(d));
    for (const RowsCase& c : kRowsCases) {
      const int64_t B = c.train ? kB : kSeqs, T = c.train ? kT : 1, N = B * T;
      const double nc = static_cast<double>(N * kC), tc = static_cast<double>(T * kC);  // T distinct positions
      if (!r.wants("embedding_fwd", d, c.name) && !(c.train && r.wants("embedding_bwd", d, c.name))) continue;
      Operands o(r.pools);
      const Tensor tokens = o.ids({B, T}, token_id), y = o.zeros(d, {B, T, kC});
      const Tensor wte = o.random(d, {kV, kC}, 1), wpe = o.random(d, {kMaxT, kC}, 2);
      const std::string shape = dims({B, T, kC});
      if (r.wants("embedding_fwd", d, c.name)) {
        // wte rows and the positions' wpe rows read, y written; the ids (and positions) read.
        const double bytes = (2 * nc + tc) * s + (c.train ? 4.0 : 8.0) * static_cast<double>(N);
        const Tensor positions = o.ids({B, T}, [](int64_t) { return kDecodePos; });
        r.time({"embedding_fwd", dt(d), c.name, shape, bytes}, [&] {
          if (c.train) embedding_forward(y, tokens, wte, wpe);
          else embedding_forward_at(y, tokens, wte, wpe, positions);
        });
      }
      if (c.train && r.wants("embedding_bwd", d, c.name)) {
        // dy read; the N (distinct) dwte rows and T dwpe rows read and written; the ids read.
        const Tensor dy = o.random(d, {B, T, kC}, 3), dwte = o.zeros(d, {kV, kC}), dwpe = o.zeros(d, {kMaxT, kC});
        const double bytes = (3 * nc + 2 * tc) * s + 4.0 * static_cast<double>(N);
        r.time({"embedding_bwd", dt(d), c.name, shape, bytes}, [&] { embedding_backward(dwte, dwpe, dy, tokens); });
      }
    }
  }
}

// The residual add of a block, in place as the model runs it: x = x + r.
void bench_add(Runner& r) {
  for (DType d : kDtypes) {
    for (const RowsCase& c : kRowsCases) {
      if (!r.wants("add", d, c.name)) continue;
      Operands o(r.pools);
      const Tensor x = o.random(d, {c.rows, kC}, 1), res = o.random(d, {c.rows, kC}, 2);
      const double bytes = 3.0 * static_cast<double>(c.rows * kC * dtype_size(d));
      r.time({"add", dt(d), c.name, dims({c.rows, kC}), bytes}, [&] { add(x, x, res); });
    }
  }
}

}  // namespace

int64_t bench_op_cases(Pools& pools, const KernelBenchOptions& opts) {
  Runner r(pools, opts);
  bench_norms(r);
  bench_activations(r);
  bench_rope(r);
  bench_softmax(r);
  bench_cross_entropy(r);
  bench_training_state(r);
  bench_embedding(r);
  bench_add(r);
  return r.measured();
}

}  // namespace loom::bench
