// Model assembly: memory layout, parameter views, embedding, final norm, lm
// head and loss around the per-family blocks (gpt2.cpp, llama.cpp).
#include "model/model.h"

#include <cstring>
#include <unordered_map>

#include "core/error.h"
#include "kernels/ops.h"
#include "model/blocks.h"

namespace loom::model {

using namespace loom::kernels;

namespace {

Tensor view_of(const Tensor& flat, const ParamSpec& spec) {
  return Tensor(flat.data_as<float>() + spec.offset, DType::f32, spec.shape);
}

const ParamSpec& find_spec(const std::vector<ParamSpec>& specs, const std::string& name) {
  for (const ParamSpec& s : specs)
    if (s.name == name) return s;
  fail("model has no parameter '", name, "': names follow Hugging Face (e.g. '", specs.front().name, "', ",
       specs.size(), " parameters in all)");
}

// Per-layer views of `flat` (the parameters or the gradients).
class Views {
 public:
  Views(const std::vector<ParamSpec>& specs, Tensor flat) : flat_(flat) {
    for (const ParamSpec& s : specs) index_.emplace(s.name, &s);
  }
  Tensor operator()(const std::string& name) const {
    auto it = index_.find(name);
    LOOM_CHECK(it != index_.end(), "no parameter ", name);
    return view_of(flat_, *it->second);
  }

  LayerWeights gpt2_layer(int64_t i, int64_t C) const {
    const std::string p = concat("h.", i, ".");
    LayerWeights w;
    w.norm1_w = (*this)(p + "ln_1.weight"), w.norm1_b = (*this)(p + "ln_1.bias");
    const Tensor qkv = (*this)(p + "attn.c_attn.weight"), qkv_b = (*this)(p + "attn.c_attn.bias");
    w.wq = qkv.slice(0, 0, C), w.wk = qkv.slice(0, C, C), w.wv = qkv.slice(0, 2 * C, C);
    w.bq = qkv_b.slice(0, 0, C), w.bk = qkv_b.slice(0, C, C), w.bv = qkv_b.slice(0, 2 * C, C);
    w.wo = (*this)(p + "attn.c_proj.weight"), w.bo = (*this)(p + "attn.c_proj.bias");
    w.norm2_w = (*this)(p + "ln_2.weight"), w.norm2_b = (*this)(p + "ln_2.bias");
    w.w_fc = (*this)(p + "mlp.c_fc.weight"), w.b_fc = (*this)(p + "mlp.c_fc.bias");
    w.w_out = (*this)(p + "mlp.c_proj.weight"), w.b_out = (*this)(p + "mlp.c_proj.bias");
    return w;
  }

  LayerWeights llama_layer(int64_t i) const {
    const std::string p = concat("model.layers.", i, ".");
    LayerWeights w;
    w.norm1_w = (*this)(p + "input_layernorm.weight");
    w.wq = (*this)(p + "self_attn.q_proj.weight"), w.wk = (*this)(p + "self_attn.k_proj.weight");
    w.wv = (*this)(p + "self_attn.v_proj.weight"), w.wo = (*this)(p + "self_attn.o_proj.weight");
    w.norm2_w = (*this)(p + "post_attention_layernorm.weight");
    w.w_fc = (*this)(p + "mlp.gate_proj.weight"), w.w_up = (*this)(p + "mlp.up_proj.weight");
    w.w_out = (*this)(p + "mlp.down_proj.weight");
    return w;
  }

 private:
  Tensor flat_;
  std::unordered_map<std::string, const ParamSpec*> index_;
};

// Allocates activation tensors from one pool and keeps their storage.
struct Allocator {
  Pool& pool;
  std::vector<OwnedTensor>& owned;
  Tensor operator()(Shape shape, DType dtype = DType::f32) {
    owned.push_back(pool.empty(dtype, shape));
    return owned.back();
  }
};

void check_batch(const char* what, const Tensor& t, int64_t B, int64_t T) {
  LOOM_REQUIRE(t.dtype() == DType::i32 && t.ndim() == 2 && t.size(0) == B && t.size(1) == T && t.is_contiguous() &&
                   t.device().is_cpu(),
               "Model::forward: ", what, " is ", t.str(), ", expected contiguous CPU i32(", B, ", ", T,
               ") (the batch and sequence length the model was built for)");
}

}  // namespace

Model::Model(const ModelConfig& cfg, int64_t B, int64_t T, Pools& pools)
    : cfg_(cfg), B_(B), T_(T), specs_(model::param_specs(cfg)), state_(std::make_unique<ModelState>()) {
  LOOM_REQUIRE(B >= 1, "batch size ", B, " is invalid: allowed values are >= 1");
  LOOM_REQUIRE(T >= 1 && T <= cfg.max_seq_len, "sequence length ", T, " is invalid: allowed values are 1 to ",
               "model.max_seq_len = ", cfg.max_seq_len);
  const int64_t P = param_count(specs_);
  params_ = pools[MemTag::params].empty(DType::f32, {P});
  grads_ = pools[MemTag::grads].zeros(DType::f32, {P});

  ModelState& st = *state_;
  const bool gpt2 = cfg.family == Family::gpt2;
  const int64_t C = cfg.n_embd, HS = cfg.head_size(), NH = cfg.n_head, NKV = cfg.n_kv_head, F = cfg.d_ff;
  const int64_t L = cfg.n_layer, V = cfg.vocab_size;
  st.dims = {B, T, C, NH, NKV, HS, F, cfg.norm_eps, cfg.rope_theta};
  Allocator alloc{pools[MemTag::activations], st.owned};

  st.tokens = alloc({B, T}, DType::i32);
  st.targets = alloc({B, T}, DType::i32);
  st.pos = alloc({T}, DType::i32);
  for (int64_t t = 0; t < T; ++t) st.pos.data_as<int32_t>()[t] = static_cast<int32_t>(t);
  for (int64_t l = 0; l <= L; ++l) st.resid.push_back(alloc({B, T, C}));
  for (int64_t l = 0; l < L; ++l) {
    LayerActs a;
    a.norm1 = alloc({B, T, C}), a.rstd1 = alloc({B * T});
    if (gpt2) a.mean1 = alloc({B * T});
    a.q = alloc({B, T, NH, HS}), a.k = alloc({B, T, NKV, HS}), a.v = alloc({B, T, NKV, HS});
    a.att = alloc({B, T, NH, HS}), a.lse = alloc({B, NH, T});
    a.res1 = alloc({B, T, C});
    a.norm2 = alloc({B, T, C}), a.rstd2 = alloc({B * T});
    if (gpt2) a.mean2 = alloc({B * T});
    a.fc = alloc({B, T, F}), a.act = alloc({B, T, F});
    if (!gpt2) a.up = alloc({B, T, F});
    st.acts.push_back(a);
  }
  st.normf = alloc({B, T, C}), st.rstdf = alloc({B * T});
  if (gpt2) st.meanf = alloc({B * T});
  st.logits = alloc({B, T, V});
  st.dres = alloc({B, T, C}), st.dnormf = alloc({B, T, C});
  Scratch& s = st.s;
  s.dnorm = alloc({B, T, C});
  s.dq = alloc({B, T, NH, HS}), s.dk = alloc({B, T, NKV, HS}), s.dv = alloc({B, T, NKV, HS});
  if (!gpt2) s.dq_rot = alloc({B, T, NH, HS}), s.dk_rot = alloc({B, T, NKV, HS});
  s.datt = alloc({B, T, NH, HS});
  s.dfc = alloc({B, T, F}), s.dact = alloc({B, T, F});
  if (!gpt2) s.dup = alloc({B, T, F});

  const Views pv(specs_, params_), gv(specs_, grads_);
  for (int64_t l = 0; l < L; ++l) {
    st.w.push_back(gpt2 ? pv.gpt2_layer(l, C) : pv.llama_layer(l));
    st.g.push_back(gpt2 ? gv.gpt2_layer(l, C) : gv.llama_layer(l));
  }
  const char* wte = gpt2 ? "wte.weight" : "model.embed_tokens.weight";
  st.wte = pv(wte), st.dwte = gv(wte);
  if (gpt2) st.wpe = pv("wpe.weight"), st.dwpe = gv("wpe.weight");
  const char* normf = gpt2 ? "ln_f.weight" : "model.norm.weight";
  st.normf_w = pv(normf), st.dnormf_w = gv(normf);
  if (gpt2) st.normf_b = pv("ln_f.bias"), st.dnormf_b = gv("ln_f.bias");
  st.lm_head = cfg.tie_embeddings ? st.wte : pv("lm_head.weight");
  st.dlm_head = cfg.tie_embeddings ? st.dwte : gv("lm_head.weight");
}

Model::~Model() = default;

Tensor Model::param(const std::string& name) const { return view_of(params_, find_spec(specs_, name)); }
Tensor Model::grad(const std::string& name) const { return view_of(grads_, find_spec(specs_, name)); }

void Model::init_params(uint64_t seed) {
  for (const ParamSpec& s : specs_) init_param(view_of(params_, s), s, seed);
}

void Model::load_params(const io::SafetensorsFile& file, ParamLayout layout) {
  for (const ParamSpec& s : specs_) {
    LOOM_REQUIRE(file.has(s.name), file.path(), ": tensor '", s.name, "' is missing (model family ",
                 family_name(cfg_.family), " needs ", specs_.size(), " tensors)");
    const io::TensorInfo& info = file.info(s.name);
    const bool transposed = layout == ParamLayout::hf && s.hf_transposed;
    const Shape want = transposed ? Shape{s.shape[1], s.shape[0]} : s.shape;
    LOOM_REQUIRE(info.dtype == DType::f32, file.path(), ": tensor '", s.name, "' has dtype ",
                 dtype_name(info.dtype), ": allowed dtype is F32");
    LOOM_REQUIRE(info.shape == want, file.path(), ": tensor '", s.name, "' has shape ", info.shape.str(),
                 ", expected ", want.str(), " for this model config");
    const Tensor dst = view_of(params_, s);
    if (!transposed) {
      file.read(s.name, dst);
      continue;
    }
    std::vector<float> tmp(static_cast<size_t>(s.numel()));
    file.read(s.name, Tensor(tmp.data(), DType::f32, want));
    const int64_t rows = s.shape[0], cols = s.shape[1];  // dst (rows, cols) = tmp (cols, rows)^T
    float* d = dst.data_as<float>();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) d[r * cols + c] = tmp[static_cast<size_t>(c * rows + r)];
  }
}

float Model::forward(const Tensor& tokens, const Tensor& targets) {
  ModelState& st = *state_;
  const Dims& d = st.dims;
  const bool gpt2 = cfg_.family == Family::gpt2;
  check_batch("tokens", tokens, B_, T_);
  std::memcpy(st.tokens.data(), tokens.data(), tokens.nbytes());
  has_targets_ = targets.defined();
  if (has_targets_) {
    check_batch("targets", targets, B_, T_);
    std::memcpy(st.targets.data(), targets.data(), targets.nbytes());
  }
  embedding_forward(st.resid[0], st.tokens, st.wte, st.wpe);  // (B,T,C); Llama: no wpe
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    if (gpt2) gpt2_block_forward(st.resid[l + 1], st.resid[l], st.w[l], st.acts[l], d);
    else llama_block_forward(st.resid[l + 1], st.resid[l], st.w[l], st.acts[l], st.pos, d);
  }
  const Tensor& x = st.resid[cfg_.n_layer];
  if (gpt2) layernorm_forward(st.normf, st.meanf, st.rstdf, x, st.normf_w, st.normf_b, d.eps);
  else rmsnorm_forward(st.normf, st.rstdf, x, st.normf_w, d.eps);
  linear_forward(rows_of(st.logits, cfg_.vocab_size), rows_of(st.normf, d.C), st.lm_head, Tensor());  // (N, V)
  if (!has_targets_) return 0.f;
  return cross_entropy_forward_backward(Tensor(), Tensor(), st.logits, st.targets);
}

Tensor Model::logits() const { return state_->logits; }

void Model::backward(float dloss) {
  LOOM_REQUIRE(has_targets_, "Model::backward: the last forward had no targets (or backward already ran): call ",
               "forward(tokens, targets) first");
  has_targets_ = false;
  ModelState& st = *state_;
  const Dims& d = st.dims;
  const bool gpt2 = cfg_.family == Family::gpt2;
  const int64_t V = cfg_.vocab_size, C = d.C;
  // dlogits overwrite the logits in place: (B, T, V)
  cross_entropy_forward_backward(st.logits, Tensor(), st.logits, st.targets, -100, dloss);
  fill(st.dnormf, 0.f);
  linear_backward(rows_of(st.dnormf, C), st.dlm_head, Tensor(), rows_of(st.logits, V), rows_of(st.normf, C),
                  st.lm_head);  // tied: the lm-head gradient adds into dwte
  fill(st.dres, 0.f);
  const Tensor& x = st.resid[cfg_.n_layer];
  if (gpt2) layernorm_backward(st.dres, st.dnormf_w, st.dnormf_b, st.dnormf, x, st.normf_w, st.meanf, st.rstdf);
  else rmsnorm_backward(st.dres, st.dnormf_w, st.dnormf, x, st.normf_w, st.rstdf);
  for (int64_t l = cfg_.n_layer - 1; l >= 0; --l) {
    if (gpt2) gpt2_block_backward(st.dres, st.resid[l], st.w[l], st.g[l], st.acts[l], st.s, d);
    else llama_block_backward(st.dres, st.resid[l], st.w[l], st.g[l], st.acts[l], st.s, st.pos, d);
  }
  embedding_backward(st.dwte, st.dwpe, st.dres, st.tokens);
}

void Model::zero_grads() { fill(grads_, 0.f); }

}  // namespace loom::model
