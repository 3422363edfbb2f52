#include "model/params.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/rng.h"

namespace loom::model {
namespace {

// Initial std of every weight matrix and embedding (GPT-2 / HF initializer_range).
constexpr float kInitStd = 0.02f;

class SpecList {
 public:
  void add(std::string name, Shape shape, ParamInit init, float std = 0.f, bool hf_transposed = false) {
    specs_.push_back({std::move(name), shape, offset_, init, std, hf_transposed});
    offset_ += shape.numel();
  }
  void weight(std::string name, Shape shape, float std = kInitStd, bool hf_transposed = false) {
    add(std::move(name), shape, ParamInit::normal, std, hf_transposed);
  }
  std::vector<ParamSpec> take() { return std::move(specs_); }

 private:
  std::vector<ParamSpec> specs_;
  int64_t offset_ = 0;
};

// Residual-branch output projections are scaled by 1/sqrt(2 n_layer) (GPT-2
// paper §2.3): each block adds two of them to the residual stream.
float residual_std(const ModelConfig& c) { return kInitStd / std::sqrt(2.f * static_cast<float>(c.n_layer)); }

void gpt2_specs(SpecList& s, const ModelConfig& c) {
  const int64_t C = c.n_embd, F = c.d_ff;
  s.weight("wte.weight", {c.vocab_size, C});
  s.weight("wpe.weight", {c.max_seq_len, C});
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = concat("h.", i, ".");
    s.add(p + "ln_1.weight", {C}, ParamInit::ones);
    s.add(p + "ln_1.bias", {C}, ParamInit::zeros);
    s.weight(p + "attn.c_attn.weight", {3 * C, C}, kInitStd, true);  // rows: q, k, v
    s.add(p + "attn.c_attn.bias", {3 * C}, ParamInit::zeros);
    s.weight(p + "attn.c_proj.weight", {C, C}, residual_std(c), true);
    s.add(p + "attn.c_proj.bias", {C}, ParamInit::zeros);
    s.add(p + "ln_2.weight", {C}, ParamInit::ones);
    s.add(p + "ln_2.bias", {C}, ParamInit::zeros);
    s.weight(p + "mlp.c_fc.weight", {F, C}, kInitStd, true);
    s.add(p + "mlp.c_fc.bias", {F}, ParamInit::zeros);
    s.weight(p + "mlp.c_proj.weight", {C, F}, residual_std(c), true);
    s.add(p + "mlp.c_proj.bias", {C}, ParamInit::zeros);
  }
  s.add("ln_f.weight", {C}, ParamInit::ones);
  s.add("ln_f.bias", {C}, ParamInit::zeros);
  if (!c.tie_embeddings) s.weight("lm_head.weight", {c.vocab_size, C});
}

void llama_specs(SpecList& s, const ModelConfig& c) {
  const int64_t C = c.n_embd, F = c.d_ff, KV = c.kv_dim();
  s.weight("model.embed_tokens.weight", {c.vocab_size, C});
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = concat("model.layers.", i, ".");
    s.add(p + "input_layernorm.weight", {C}, ParamInit::ones);
    s.weight(p + "self_attn.q_proj.weight", {C, C});
    s.weight(p + "self_attn.k_proj.weight", {KV, C});
    s.weight(p + "self_attn.v_proj.weight", {KV, C});
    s.weight(p + "self_attn.o_proj.weight", {C, C}, residual_std(c));
    s.add(p + "post_attention_layernorm.weight", {C}, ParamInit::ones);
    s.weight(p + "mlp.gate_proj.weight", {F, C});
    s.weight(p + "mlp.up_proj.weight", {F, C});
    s.weight(p + "mlp.down_proj.weight", {C, F}, residual_std(c));
  }
  s.add("model.norm.weight", {C}, ParamInit::ones);
  if (!c.tie_embeddings) s.weight("lm_head.weight", {c.vocab_size, C});
}

}  // namespace

std::vector<ParamSpec> param_specs(const ModelConfig& cfg) {
  cfg.validate();
  SpecList s;
  if (cfg.family == Family::gpt2) gpt2_specs(s, cfg);
  else llama_specs(s, cfg);
  return s.take();
}

int64_t param_count(const std::vector<ParamSpec>& specs) {
  int64_t n = 0;
  for (const ParamSpec& s : specs) n += s.numel();
  return n;
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
  const int64_t n = dst.numel();
  switch (spec.init) {
    case ParamInit::normal:
      rng_fill_normal(out, n, seed, rng_key(spec.name), static_cast<uint64_t>(row_begin * row_size), 0.f,
                      spec.init_std);
      break;
    case ParamInit::ones: std::fill(out, out + n, 1.f); break;
    case ParamInit::zeros: std::fill(out, out + n, 0.f); break;
  }
}

}  // namespace loom::model
