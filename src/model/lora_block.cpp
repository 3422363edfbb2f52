// LoRA inside a block (blocks.h, model/lora.h): the adapter's forward and
// backward beside its frozen linear, and which adapter sits on which of a
// family's linears.
#include <array>
#include <cmath>
#include <map>
#include <span>
#include <string>
#include <utility>

#include "core/error.h"
#include "core/log.h"
#include "core/rng.h"
#include "io/gguf.h"
#include "kernels/ops.h"
#include "model/blocks.h"
#include "model/config_json.h"
#include "model/gguf_model.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/quant_weights.h"

namespace loom::model {

// LoRA dropout's mask of an adapter's input x (N = B T rows, IC columns):
// element (n, c) is 0 with probability p, else 1 / (1 - p), from Philox
// keyed by the run's seed and the linear (p.key), counting the row's
// global sample and position and the column's global feature (this rank's
// columns of a row-parallel linear start at rank x IC): the same element
// gets the same draw under any layout (DESIGN.md §1.3).
void lora_dropout_mask(const Dims& d, const Tensor& mask, const LoraPair& p) {
  const int64_t N = mask.size(0), IC = mask.size(1), T = d.T;
  LOOM_CHECK(N == d.B * T && static_cast<int64_t>(d.lora.samples.size()) == d.B, "LoRA dropout over ", N,
             " rows with ", d.lora.samples.size(), " samples of ", T, " tokens");
  const int64_t feature0 = p.row && d.par.tp.size > 1 ? d.par.tp.rank * IC : 0;
  const auto threshold = static_cast<uint32_t>(std::ldexp(static_cast<double>(d.lora.dropout), 32));
  const float keep = 1.f / (1.f - d.lora.dropout);
  const std::array<uint32_t, 2> key{static_cast<uint32_t>(d.lora.seed),
                                    static_cast<uint32_t>(d.lora.seed >> 32) ^ (p.key * 0x9E3779B9u + 0x4C6F5241u)};
  float* m = mask.data_as<float>();
  const std::span<const int64_t> samples = d.lora.samples;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const auto k = static_cast<uint64_t>(samples[static_cast<size_t>(n / T)]);
    for (int64_t c = 0; c < IC;) {
      const int64_t g = feature0 + c;
      const std::array<uint32_t, 4> draw = philox4x32_10(
          {static_cast<uint32_t>(k), static_cast<uint32_t>(k >> 32), static_cast<uint32_t>(n % T),
           static_cast<uint32_t>(g / 4)},
          key);
      for (int64_t j = g % 4; j < 4 && c < IC; ++j, ++c)
        m[n * IC + c] = draw[static_cast<size_t>(j)] < threshold ? 0.f : keep;
    }
  }
}

namespace {

// The first n x cols elements of a flat buffer as (n, cols).
Tensor leading(const Tensor& buf, int64_t n, int64_t cols) {
  LOOM_CHECK(buf.defined() && n * cols <= buf.numel(), "LoRA buffer ", buf.str(), " for ", n, " x ", cols);
  return buf.flatten().slice(0, 0, n * cols).reshape({n, cols});
}

bool dropping(const Dims& d) { return d.lora.dropout > 0.f && !d.lora.samples.empty(); }

// What the adapter reads: x, or under dropout x times its mask (the mask
// left in d.lora.mask for the backward).
Tensor adapter_input(const Dims& d, const Tensor& x, const LoraPair& p) {
  if (!dropping(d)) return x;
  const int64_t N = x.size(0), IC = x.size(1);
  const Tensor mask = leading(d.lora.mask, N, IC), xdrop = leading(d.lora.xdrop, N, IC);
  lora_dropout_mask(d, mask, p);
  kernels::mul(xdrop, x, mask);
  return xdrop;
}

// u = scale (x A^T): (N, r) in the compute dtype.
Tensor lora_down(const Dims& d, const Tensor& x, const LoraPair& p) {
  const Tensor u = d.lora.u.slice(0, 0, x.size(0));
  kernels::linear_forward(u, x, p.a, Tensor());
  kernels::scale(u, d.lora.scale);
  return u;
}

// Serving (LoraPair::served), the SGMV idea on the CPU: each adapter's runs
// of rows gathered into one block (a step's sequences come in any order),
// its update computed over the block and added back to each run. Every GEMM
// is row-wise (linear_forward_invariant where the step is batch
// invariant), so a row's bits depend on its adapter alone, not on which
// adapters the step's other rows use or where they sit.
void served_lora_forward(const Dims& d, const Tensor& y, const Tensor& x, const LoraPair* served) {
  const auto gemm = d.batch_invariant ? kernels::linear_forward_invariant : kernels::linear_forward;
  const int64_t IC = x.size(1), OC = y.size(1);
  for (size_t id = 1; id < d.lora.scales.size(); ++id) {
    const LoraPair& p = served[id];
    if (!p.a.defined()) continue;
    // f(rows of the step, the same rows of the gathered block) for each run of this adapter.
    const auto each_run = [&](auto f) {
      int64_t at = 0;
      for (const LoraRun& run : d.lora.runs) {
        if (run.adapter != static_cast<int32_t>(id)) continue;
        f(run.begin, at, run.end - run.begin);
        at += run.end - run.begin;
      }
      return at;
    };
    int64_t runs = 0, first = 0;
    const int64_t n = each_run([&](int64_t begin, int64_t, int64_t) { first = runs++ == 0 ? begin : first; });
    if (n == 0) continue;
    const Tensor in = runs == 1 ? x.slice(0, first, n) : leading(d.lora.xbuf, n, IC);
    if (runs > 1)
      each_run([&](int64_t begin, int64_t at, int64_t len) {
        kernels::copy(in.slice(0, at, len), x.slice(0, begin, len));
      });
    const Tensor u = leading(d.lora.u, n, p.a.size(0)), up = leading(d.lora.ybuf, n, OC);
    gemm(u, in, p.a, Tensor());
    kernels::scale(u, d.lora.scales[id]);
    gemm(up, u, p.b, Tensor());
    each_run([&](int64_t begin, int64_t at, int64_t len) {
      const Tensor rows = y.slice(0, begin, len);
      kernels::add(rows, rows, up.slice(0, at, len));
    });
  }
}

}  // namespace

void lora_forward(const Dims& d, Tensor y, const Tensor& x, const LoraPair& p) {
  if (p.served != nullptr) return served_lora_forward(d, y, x, p.served);
  if (!p.defined()) return;
  LOOM_CHECK(d.lora.u.defined() && x.size(0) <= d.lora.u.size(0), "lora_forward: ", x.str(), " with buffer ",
             d.lora.u.str());
  const Tensor u = lora_down(d, adapter_input(d, x, p), p);
  kernels::matmul(y, u, p.b, {.trans_b = true, .beta = 1.f});  // y (N, OC) += u (N, r) @ B^T
}

// Under tp: `partial`'s gradient (+= by f) into a zeroed buffer, summed
// over tp, then added into whole (undefined: not trained).
template <typename F>
void add_summed_over_tp(const Dims& d, const Tensor& whole, const Tensor& like, F f) {
  const Tensor buf = d.lora.dwhole.slice(0, 0, like.numel()).reshape(like.shape());
  kernels::fill(buf, 0.f);
  f(buf);
  d.par.tp.ops->all_reduce_sum(buf);
  if (whole.defined()) kernels::add(whole, whole, buf);
}

void lora_backward(const Dims& d, Tensor dx, const LoraPair& g, const Tensor& dy, const Tensor& x, const LoraPair& p,
                   bool row) {
  if (!p.defined()) return;
  const bool tp = d.par.tp.ops != nullptr, drop = dropping(d);
  const Tensor in = adapter_input(d, x, p);  // x, or x masked: the forward's mask again
  const Tensor u = lora_down(d, in, p);      // the forward's bits again (under a row-parallel W: this rank's part)
  const Tensor du = d.lora.du.slice(0, 0, x.size(0));
  kernels::fill(du, 0.f);
  if (tp && row)  // dB = dy^T (sum over ranks of u): summed over tp
    add_summed_over_tp(d, g.b, p.b, [&](const Tensor& db) { kernels::linear_backward(du, db, Tensor(), dy, u, p.b); });
  else
    kernels::linear_backward(du, g.b, Tensor(), dy, u, p.b);  // du = dy B, dB += dy^T u
  kernels::scale(du, d.lora.scale);                          // d(x A^T) = scale du
  // Under dropout the input's gradient is (du A) times the mask.
  const Tensor dxa = drop ? leading(d.lora.dxdrop, x.size(0), x.size(1)) : dx;
  if (drop) kernels::fill(dxa, 0.f);
  if (tp && !row)  // du is this rank's part (its rows of B): dA summed over tp
    add_summed_over_tp(d, g.a, p.a,
                       [&](const Tensor& da) { kernels::linear_backward(dxa, da, Tensor(), du, in, p.a); });
  else
    kernels::linear_backward(dxa, g.a, Tensor(), du, in, p.a);  // dx += du A, dA += du^T x
  if (!drop) return;
  kernels::mul(dxa, dxa, leading(d.lora.mask, x.size(0), x.size(1)));
  kernels::add(dx, dx, dxa);
}

FrozenWeights::FrozenWeights(const ModelConfig& cfg, OwnedTensor flat, TpRank tp)
    : specs_(param_specs(cfg, tp)), flat_(std::move(flat)) {
  LOOM_CHECK(flat_.numel() == param_count(specs_) && flat_.ndim() == 1, "FrozenWeights: ", Tensor(flat_).str(),
             " for ", param_count(specs_), " parameters");
  views_ = std::make_unique<ParamViews>(specs_, flat_);
}

FrozenWeights::FrozenWeights(const ModelConfig& cfg, std::unique_ptr<QuantWeights> quant, Pool& pool, TpRank tp)
    : quant_(std::move(quant)) {
  const std::vector<ParamSpec> all = param_specs(cfg, tp);
  int64_t offset = 0;
  for (const ParamSpec& s : all) {
    if (quant_->holds(s.name)) continue;  // its blocks stand in
    specs_.push_back(s);
    specs_.back().offset = offset;
    offset += s.numel();
  }
  flat_ = pool.empty(DType::f32, {offset});
  load_params_from_gguf(flat_, cfg, quant_->file(), quant_.get(), specs_);  // straight into their places
  views_ = std::make_unique<ParamViews>(specs_, flat_);
  std::map<std::string, const ParamSpec*> by_name;
  for (const ParamSpec& s : all) by_name[s.name] = &s;
  for (const std::string& name : quant_->names())  // a tied head ("lm_head.weight") reads wte's f32 rows
    if (by_name.count(name) > 0) views_->substitute(name, quant_->blocks(name));
}
FrozenWeights::~FrozenWeights() = default;

std::unique_ptr<FrozenWeights> load_frozen_base(const ModelDir& dir, DType dtype, Pools& pools, TpRank tp) {
  const ModelConfig& cfg = dir.config;
  const int64_t P = param_count(cfg);
  Pool& params = pools[MemTag::params];
  // What is read on the way (f32 before a cast or a slice, the f32 places
  // of quantized linears, never written) stays out of the params tag.
  MemoryTracker tracker;
  Pool staging(MemTag::workspace, Device::cpu(), tracker);
  const bool sliced = tp.size > 1, direct = !sliced && dtype == DType::f32;
  if (dir.gguf && dtype == DType::f32) {  // QLoRA: the blocks, and the rest read into its own places (no f32 whole)
    auto quant = std::make_unique<QuantWeights>(io::GgufFile::open(dir.weights), cfg, params, tp);
    if (!quant->empty()) {
      const double rest = static_cast<double>(param_count(cfg, tp) - quant->f32_bytes() / 4) * 4.0;  // read in f32
      require_fits_memory(pools, rest, concat("the base model '", dir.weights, "' (its ", quant->summary(),
                          " matrices in their blocks, the rest read in f32)"), "fine-tune a smaller base model");
      if (!quant->unsliced().empty() && tp.rank == 0)
        log_info("lora.base '", dir.weights, "': under parallel.tp = ", tp.size, ", ", quant->unsliced().size(),
                 " quantized matrices (", quant->unsliced().front(), ", ...) are dequantized to f32 on each rank: ",
                 "a rank's columns of them are not whole blocks");
      return std::make_unique<FrozenWeights>(cfg, std::move(quant), params, tp);
    }
  }
  require_fits_memory(pools, static_cast<double>(P) * 4.0, concat("the base model '", dir.weights, "' (", P,
                      " parameters, read in f32)"), "fine-tune a smaller base model");
  OwnedTensor whole = (direct ? params : staging).empty(DType::f32, {P});
  load_model_params(dir, whole);
  if (direct) return std::make_unique<FrozenWeights>(cfg, std::move(whole));
  OwnedTensor local;
  if (sliced) {
    local = (dtype == DType::f32 ? params : staging).empty(DType::f32, {param_count(cfg, tp)});
    tp_slice(local, cfg, tp, whole);
  } else {
    local = std::move(whole);
  }
  if (dtype != DType::f32) local = params_in_dtype(std::move(local), dtype, params);
  return std::make_unique<FrozenWeights>(cfg, std::move(local), tp);
}

FrozenBytes frozen_base_bytes(const ModelDir& dir, DType dtype, TpRank tp) {
  const int64_t P = param_count(dir.config, tp);  // the rank's
  if (dir.gguf && dtype == DType::f32) {
    const QuantWeights::Footprint q = QuantWeights::footprint(io::GgufFile::open(dir.weights), dir.config, tp);
    if (q.blocks > 0) return {q.blocks + P * 4 - q.f32_bytes, true};  // the blocks, the rest compact in f32
  }
  return {P * static_cast<int64_t>(dtype_size(dtype)), false};
}

LayerWeights with_lora(LayerWeights w, const ParamViews& adapters, const ModelConfig& cfg, int64_t i) {
  const std::string p = layer_prefix(cfg, i);
  // module: its index among the block's HF linears (dropout's key, with the layer).
  const auto pair = [&](const char* name, uint32_t module, bool row = false) {
    const std::string a = concat(p, name, ".lora_A.weight"), b = concat(p, name, ".lora_B.weight");
    if (!adapters.has(a)) return LoraPair{};
    LoraPair out{adapters(a), adapters(b)};
    out.key = static_cast<uint32_t>(i) * 8u + module, out.row = row;
    return out;
  };
  if (cfg.family == Family::gpt2) {
    const LoraPair qkv = pair("attn.c_attn", 0);
    if (qkv.defined()) {
      const int64_t C = qkv.b.size(0) / 3;
      for (auto [to, at] : {std::pair{&w.lora_q, 0}, {&w.lora_k, 1}, {&w.lora_v, 2}}) {
        *to = qkv;  // one input, one mask
        to->b = qkv.b.slice(0, at * C, C);
      }
    }
    w.lora_o = pair("attn.c_proj", 1, true);
    w.lora_fc = pair("mlp.c_fc", 2);
    w.lora_out = pair("mlp.c_proj", 3, true);
    return w;
  }
  w.lora_q = pair("self_attn.q_proj", 0), w.lora_k = pair("self_attn.k_proj", 1);
  w.lora_v = pair("self_attn.v_proj", 2), w.lora_o = pair("self_attn.o_proj", 3, true);
  w.lora_fc = pair("mlp.gate_proj", 4), w.lora_up = pair("mlp.up_proj", 5);
  w.lora_out = pair("mlp.down_proj", 6, true);
  return w;
}

}  // namespace loom::model
