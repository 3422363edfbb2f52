#include "model/params.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/rng.h"
#include "kernels/ops.h"

namespace loom::model {
namespace {

// Initial std of every weight matrix and embedding (GPT-2 / HF initializer_range).
constexpr float kInitStd = 0.02f;

// Builds the spec list of one tp rank: global shapes in, the rank's slices
// and offsets out.
class SpecList {
 public:
  explicit SpecList(TpRank tp) : tp_(tp) {}
  void add(std::string name, Shape shape, ParamInit init, float std = 0.f, bool hf_transposed = false,
           TpSplit split = {}) {
    ParamSpec spec{std::move(name), shape, offset_, init, std, hf_transposed, shape, split, tp_};
    if (split.dim >= 0) {
      if (split.extent == 0) spec.split.extent = shape[split.dim];
      LOOM_CHECK(spec.split.extent % (split.blocks * tp_.size) == 0, spec.name, " extent ", spec.split.extent);
      spec.shape[split.dim] = spec.split.extent / tp_.size;
    }
    offset_ += spec.shape.numel();
    specs_.push_back(std::move(spec));
  }
  void weight(std::string name, Shape shape, float std = kInitStd, bool hf_transposed = false, TpSplit split = {}) {
    add(std::move(name), shape, ParamInit::normal, std, hf_transposed, split);
  }
  ParamSpec& last() { return specs_.back(); }
  void reserve(int64_t n) { specs_.reserve(static_cast<size_t>(n)); }
  std::vector<ParamSpec> take() { return std::move(specs_); }

 private:
  TpRank tp_;
  std::vector<ParamSpec> specs_;
  int64_t offset_ = 0;
};

// Megatron's splits (params.h TpSplit).
constexpr TpSplit kColumn{0, 1, 0};  // column-parallel: output rows
constexpr TpSplit kRow{1, 1, 0};     // row-parallel: input columns
TpSplit vocab_split(const ModelConfig& c, int tp) { return {0, 1, vocab_per_rank(c, tp) * tp}; }

// Residual-branch output projections are scaled by 1/sqrt(2 n_layer) (GPT-2
// paper §2.3): each block adds two of them to the residual stream.
float residual_std(const ModelConfig& c) { return kInitStd / std::sqrt(2.f * static_cast<float>(c.n_layer)); }

// The parts of the model a spec list holds (params.h PpStage): the
// embeddings (first stage), layers [first, end), the head (last stage).
struct Parts {
  bool embedding = true;
  int64_t first = 0, end = 0;
  bool head = true;
};

// A later stage's head reads its own copy of a tied embedding, after the
// final norm (params.h PpStage), initialised like stage 0's.
void embedding_copy(SpecList& s, const ModelConfig& c, int tp, const Parts& parts, const char* name) {
  if (!parts.head || parts.embedding || !c.tie_embeddings) return;
  s.weight(name, {c.vocab_size, c.n_embd}, kInitStd, false, vocab_split(c, tp));
  s.last().pp_copy = true;
}

void gpt2_specs(SpecList& s, const ModelConfig& c, int tp, const Parts& parts) {
  const int64_t C = c.n_embd, F = c.d_ff;
  s.reserve(12 * (parts.end - parts.first) + 5);  // 12 per layer (below), at most 5 others
  if (parts.embedding) {
    s.weight("wte.weight", {c.vocab_size, C}, kInitStd, false, vocab_split(c, tp));
    s.weight("wpe.weight", {c.max_seq_len, C});
  }
  for (int64_t i = parts.first; i < parts.end; ++i) {
    const std::string p = concat("h.", i, ".");
    s.add(p + "ln_1.weight", {C}, ParamInit::ones);
    s.add(p + "ln_1.bias", {C}, ParamInit::zeros);
    const TpSplit qkv{0, 3, 0};  // rows: q, k, v blocks, each split by heads
    s.weight(p + "attn.c_attn.weight", {3 * C, C}, kInitStd, true, qkv);
    s.add(p + "attn.c_attn.bias", {3 * C}, ParamInit::zeros, 0.f, false, qkv);
    s.weight(p + "attn.c_proj.weight", {C, C}, residual_std(c), true, kRow);
    s.add(p + "attn.c_proj.bias", {C}, ParamInit::zeros);
    s.add(p + "ln_2.weight", {C}, ParamInit::ones);
    s.add(p + "ln_2.bias", {C}, ParamInit::zeros);
    s.weight(p + "mlp.c_fc.weight", {F, C}, kInitStd, true, kColumn);
    s.add(p + "mlp.c_fc.bias", {F}, ParamInit::zeros, 0.f, false, kColumn);
    s.weight(p + "mlp.c_proj.weight", {C, F}, residual_std(c), true, kRow);
    s.add(p + "mlp.c_proj.bias", {C}, ParamInit::zeros);
  }
  if (parts.head) {
    s.add("ln_f.weight", {C}, ParamInit::ones);
    s.add("ln_f.bias", {C}, ParamInit::zeros);
    if (!c.tie_embeddings) s.weight("lm_head.weight", {c.vocab_size, C}, kInitStd, false, vocab_split(c, tp));
  }
  embedding_copy(s, c, tp, parts, "wte.weight");
}

// A Mixtral MoE layer's MLP (model/moe.h): the router, its loss-free
// balancing bias, the shared experts and the rank's experts (EpRank), each
// split over tp as a dense MLP is. The experts come last, so a layer's
// expert parameters are one run of the flat buffer.
void moe_specs(SpecList& s, const ModelConfig& c, const std::string& p, EpRank ep) {
  const int64_t C = c.n_embd, F = c.d_ff, E = c.n_expert;
  s.weight(p + "block_sparse_moe.gate.weight", {E, C});
  if (c.has_expert_bias()) s.add(p + "block_sparse_moe.gate.e_score_correction_bias", {E}, ParamInit::zeros);
  if (c.n_shared_expert > 0) {
    const int64_t Fs = c.n_shared_expert * F;
    const std::string q = p + "block_sparse_moe.shared_experts.";
    s.weight(q + "gate_proj.weight", {Fs, C}, kInitStd, false, kColumn);
    s.weight(q + "up_proj.weight", {Fs, C}, kInitStd, false, kColumn);
    s.weight(q + "down_proj.weight", {C, Fs}, residual_std(c), false, kRow);
  }
  const int64_t El = E / ep.size;
  for (int64_t e = ep.rank * El; e < (ep.rank + 1) * El; ++e) {
    const std::string q = concat(p, "block_sparse_moe.experts.", e, ".");
    s.weight(q + "w1.weight", {F, C}, kInitStd, false, kColumn);
    s.weight(q + "w2.weight", {C, F}, residual_std(c), false, kRow);
    s.weight(q + "w3.weight", {F, C}, kInitStd, false, kColumn);
  }
}

void llama_specs(SpecList& s, const ModelConfig& c, int tp, const Parts& parts, EpRank ep) {
  const int64_t C = c.n_embd, F = c.d_ff, KV = c.kv_dim();
  // 9 per layer (below; a MoE layer's experts besides), at most 4 others
  s.reserve((9 + (c.is_moe() ? 3 * c.n_expert / ep.size + 5 : 0)) * (parts.end - parts.first) + 4);
  if (parts.embedding) s.weight("model.embed_tokens.weight", {c.vocab_size, C}, kInitStd, false, vocab_split(c, tp));
  for (int64_t i = parts.first; i < parts.end; ++i) {
    const std::string p = concat("model.layers.", i, ".");
    s.add(p + "input_layernorm.weight", {C}, ParamInit::ones);
    s.weight(p + "self_attn.q_proj.weight", {C, C}, kInitStd, false, kColumn);
    s.weight(p + "self_attn.k_proj.weight", {KV, C}, kInitStd, false, kColumn);
    s.weight(p + "self_attn.v_proj.weight", {KV, C}, kInitStd, false, kColumn);
    s.weight(p + "self_attn.o_proj.weight", {C, C}, residual_std(c), false, kRow);
    s.add(p + "post_attention_layernorm.weight", {C}, ParamInit::ones);
    if (c.is_moe_layer(i)) {
      moe_specs(s, c, p, ep);
      continue;
    }
    s.weight(p + "mlp.gate_proj.weight", {F, C}, kInitStd, false, kColumn);
    s.weight(p + "mlp.up_proj.weight", {F, C}, kInitStd, false, kColumn);
    s.weight(p + "mlp.down_proj.weight", {C, F}, residual_std(c), false, kRow);
  }
  if (parts.head) {
    s.add("model.norm.weight", {C}, ParamInit::ones);
    if (!c.tie_embeddings) s.weight("lm_head.weight", {c.vocab_size, C}, kInitStd, false, vocab_split(c, tp));
  }
  embedding_copy(s, c, tp, parts, "model.embed_tokens.weight");
}

}  // namespace

ParamPart param_part(const ModelConfig& cfg, const std::string& name, int64_t* layer) {
  const std::string prefix = cfg.family == Family::gpt2 ? "h." : "model.layers.";
  if (name.rfind(prefix, 0) == 0) {
    if (layer) *layer = std::stoll(name.substr(prefix.size()));
    return ParamPart::layer;
  }
  if (name == "wte.weight" || name == "wpe.weight" || name == "model.embed_tokens.weight") return ParamPart::embedding;
  return ParamPart::head;
}

namespace {

// Checks what param_specs(cfg, tp, stage) checks, and returns the stage's parts.
Parts checked_parts(const ModelConfig& cfg, TpRank tp, PpStage stage, EpRank ep) {
  cfg.validate();
  LOOM_REQUIRE(ep.size >= 1 && ep.rank >= 0 && ep.rank < ep.size, "expert-parallel rank ", ep.rank, " of ", ep.size,
               " is invalid");
  LOOM_REQUIRE(ep.size == 1 || cfg.is_moe(), "parallel.ep = ", ep.size,
               " needs a mixture-of-experts model (model.n_expert > 0): a dense model has no experts to split");
  LOOM_REQUIRE(!cfg.is_moe() || cfg.n_expert % ep.size == 0, "parallel.ep = ", ep.size,
               " does not divide model.n_expert = ", cfg.n_expert, ": each ep rank holds n_expert / ep experts");
  LOOM_REQUIRE(tp.size >= 1 && tp.rank >= 0 && tp.rank < tp.size, "tensor-parallel rank ", tp.rank, " of ", tp.size,
               " is invalid");
  auto require_divides = [&](const char* key, int64_t value, const char* what) {
    LOOM_REQUIRE(value % tp.size == 0, "parallel.tp = ", tp.size, " does not divide model.", key, " = ", value,
                 ": tensor parallelism splits the ", what, " across the tp ranks, so tp must divide ", key);
  };
  require_divides("n_head", cfg.n_head, "attention heads");
  require_divides("n_kv_head", cfg.n_kv_head, "key/value heads");
  require_divides("d_ff", cfg.d_ff, "MLP's (and every expert's) hidden units");
  const int64_t L = cfg.n_layer;
  const int64_t n = stage.layer_count(L);
  LOOM_REQUIRE(stage.first_layer >= 0 && n >= 1 && stage.first_layer <= L - n, "pipeline stage of layers [",
               stage.first_layer, ", ", stage.first_layer + n, ") is invalid: model.n_layer = ", L,
               " layers, and every stage needs at least one");
  return {stage.holds_embedding(), stage.first_layer, stage.first_layer + n, stage.holds_head(L)};
}

std::vector<ParamSpec> specs_of(const ModelConfig& cfg, TpRank tp, const Parts& parts, EpRank ep) {
  SpecList s(tp);
  if (cfg.family == Family::gpt2) gpt2_specs(s, cfg, tp.size, parts);
  else llama_specs(s, cfg, tp.size, parts, ep);
  return s.take();
}

// Layers in [first, end) that are MoE layers ((l + 1) % moe_every == 0).
int64_t moe_layers_in(const ModelConfig& cfg, int64_t first, int64_t end) {
  if (!cfg.is_moe()) return 0;
  return end / cfg.moe_every - first / cfg.moe_every;
}

}  // namespace

// Only the stage's layers are built (a pipeline stage's list costs its own
// layers, not the whole model's), packed from offset 0.
std::vector<ParamSpec> param_specs(const ModelConfig& cfg, TpRank tp, PpStage stage, EpRank ep) {
  return specs_of(cfg, tp, checked_parts(cfg, tp, stage, ep), ep);
}

// Every dense layer has the same parameters, and so has every MoE layer: a
// stage's count is its parts without layers plus one dense and one MoE
// layer's count times how many it holds of each (each found as the
// difference of two short lists).
int64_t param_count(const ModelConfig& cfg, TpRank tp, PpStage stage, EpRank ep) {
  const Parts parts = checked_parts(cfg, tp, stage, ep);
  ModelConfig dense = cfg, moe = cfg;
  dense.n_expert = 0, moe.moe_every = 1;
  Parts none = parts, one = parts;
  none.end = none.first, one.end = one.first + 1;
  const int64_t base = param_count(specs_of(cfg, tp, none, ep));
  const int64_t dense_layer = param_count(specs_of(dense, tp, one, ep)) - base;
  const int64_t moe_layer = param_count(specs_of(moe, tp, one, ep)) - base;
  const int64_t n_moe = moe_layers_in(cfg, parts.first, parts.end);
  return base + n_moe * moe_layer + (parts.end - parts.first - n_moe) * dense_layer;
}

bool is_expert_param(const std::string& name) { return name.find(".block_sparse_moe.experts.") != std::string::npos; }

int64_t active_param_count(const ModelConfig& cfg) {
  const int64_t idle = cfg.n_expert - cfg.top_k, expert = 3 * cfg.d_ff * cfg.n_embd;
  return param_count(cfg) - moe_layers_in(cfg, 0, cfg.n_layer) * idle * expert;
}

int64_t param_count(const std::vector<ParamSpec>& specs) {
  int64_t n = 0;
  for (const ParamSpec& s : specs) n += s.numel();
  return n;
}

int64_t vocab_per_rank(const ModelConfig& cfg, int tp) { return (cfg.vocab_size + tp - 1) / tp; }

std::vector<ShardRun> shard_runs(const ParamSpec& spec) {
  if (spec.replicated()) return {{0, 0, spec.numel()}};
  const TpSplit& sp = spec.split;
  const int64_t block = sp.extent / sp.blocks;    // a block's global extent along the split dim
  const int64_t piece = block / spec.tp.size;     // the rank's part of each block
  const int64_t real = spec.global_shape[sp.dim];  // indices past it are padding
  // The split dim's local index i is global index g(i); elements inside it
  // are `inner` apart, the dims before it `outer` times over.
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < sp.dim; ++d) outer *= spec.shape[d];
  for (int d = sp.dim + 1; d < spec.shape.ndim(); ++d) inner *= spec.shape[d];
  const int64_t local_dim = spec.shape[sp.dim];
  std::vector<ShardRun> runs;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t b = 0; b < sp.blocks; ++b) {
      const int64_t g0 = b * block + spec.tp.rank * piece;  // first global index of the piece
      const int64_t n_real = std::clamp<int64_t>(real - g0, 0, piece);
      const int64_t local = (o * local_dim + b * piece) * inner;
      if (n_real > 0) runs.push_back({local, (o * real + g0) * inner, n_real * inner});
      if (n_real < piece) runs.push_back({local + n_real * inner, -1, (piece - n_real) * inner});
    }
  }
  return runs;
}

namespace {

void check_flat(const char* op, const Tensor& t, const std::vector<ParamSpec>& specs) {
  LOOM_CHECK(t.dtype() == DType::f32 && t.is_contiguous() && t.numel() == param_count(specs), op, ": buffer ",
             t.str(), " for ", param_count(specs), " parameters");
}

}  // namespace

void place_runs(Tensor whole_param, const Tensor& local, const ParamSpec& spec) {
  for (const ShardRun& r : shard_runs(spec))
    if (r.global >= 0) kernels::copy(whole_param.slice(0, r.global, r.count), local.slice(0, spec.offset + r.local, r.count));
}

void take_runs(Tensor local, const ParamSpec& spec, const Tensor& whole_param) {
  for (const ShardRun& r : shard_runs(spec)) {
    const Tensor out = local.slice(0, spec.offset + r.local, r.count);
    if (r.global < 0) kernels::fill(out, 0.f);
    else kernels::copy(out, whole_param.slice(0, r.global, r.count));
  }
}

void tp_slice(Tensor local, const ModelConfig& cfg, TpRank tp, const Tensor& global) {
  const std::vector<ParamSpec> whole = param_specs(cfg), mine = param_specs(cfg, tp);
  check_flat("tp_slice", local, mine);
  check_flat("tp_slice", global, whole);
  for (size_t i = 0; i < mine.size(); ++i)
    take_runs(local, mine[i], global.slice(0, whole[i].offset, whole[i].numel()));
}

void tp_assemble(Tensor global, const ModelConfig& cfg, int tp, std::span<const Tensor> ranks) {
  const std::vector<ParamSpec> whole = param_specs(cfg);
  check_flat("tp_assemble", global, whole);
  LOOM_CHECK(static_cast<int>(ranks.size()) == tp, "tp_assemble: ", ranks.size(), " buffers for tp = ", tp);
  for (int r = 0; r < tp; ++r) {
    const std::vector<ParamSpec> specs = param_specs(cfg, {tp, r});
    check_flat("tp_assemble", ranks[r], specs);
    for (size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].replicated() && r != 0) continue;
      place_runs(global.slice(0, whole[i].offset, whole[i].numel()), ranks[r], specs[i]);
    }
  }
}

void init_param(Tensor dst, const ParamSpec& spec, uint64_t seed, int64_t row_begin) {
  LOOM_CHECK(dst.dtype() == DType::f32 && dst.is_contiguous() && dst.device().is_cpu(), "init_param: dst ",
             dst.str());
  const int64_t rows = spec.shape[0];
  const int64_t row_size = spec.numel() / std::max<int64_t>(rows, 1);
  LOOM_CHECK(dst.ndim() == spec.shape.ndim() && row_begin >= 0 && row_begin + dst.size(0) <= rows, "init_param: ",
             spec.name, " ", spec.shape.str(), " rows [", row_begin, ", +", dst.size(0), ") dst ", dst.str());
  for (int d = 1; d < dst.ndim(); ++d) LOOM_CHECK(dst.size(d) == spec.shape[d], "init_param: ", spec.name);
  float* out = dst.data_as<float>();
  const int64_t begin = row_begin * row_size, end = begin + dst.numel();  // the rank's flat elements
  const bool random = spec.init == ParamInit::normal || spec.init == ParamInit::uniform;
  if (!random) {
    std::fill(out, out + dst.numel(), spec.init == ParamInit::ones ? 1.f : 0.f);
    for (const ShardRun& r : shard_runs(spec)) {  // padding stays 0
      const int64_t lo = std::max(begin, r.local), hi = std::min(end, r.local + r.count);
      if (r.global < 0 && lo < hi) std::fill(out + lo - begin, out + hi - begin, 0.f);
    }
    return;
  }
  for (const ShardRun& r : shard_runs(spec)) {
    const int64_t lo = std::max(begin, r.local), hi = std::min(end, r.local + r.count);
    if (lo >= hi) continue;
    if (r.global < 0) std::fill(out + lo - begin, out + hi - begin, 0.f);
    else if (spec.init == ParamInit::normal)
      rng_fill_normal(out + lo - begin, hi - lo, seed, rng_key(spec.name), static_cast<uint64_t>(r.global + lo - r.local),
                      0.f, spec.init_std);
    else
      rng_fill_uniform(out + lo - begin, hi - lo, seed, rng_key(spec.name),
                       static_cast<uint64_t>(r.global + lo - r.local), -spec.init_std, spec.init_std);
  }
}

OwnedTensor params_in_dtype(OwnedTensor flat, DType dtype, Pool& pool) {
  if (dtype == flat.dtype()) return flat;
  OwnedTensor out = pool.empty(dtype, flat.shape());
  kernels::cast(out, flat);
  return out;
}

}  // namespace loom::model
