// loom models in GGUF files (gguf_model.h): names, keys, the llama Q/K row
// permutation, and the tensor types of each weight.
#include "model/gguf_model.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <optional>

#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/quant.h"

namespace loom::model {

std::optional<kernels::QuantType> gguf_quant_type(io::GgmlType t) {
  switch (t) {
    case io::GgmlType::q8_0: return kernels::QuantType::q8_0;
    case io::GgmlType::q4_0: return kernels::QuantType::q4_0;
    case io::GgmlType::q4_K: return kernels::QuantType::q4_K;
    case io::GgmlType::q6_K: return kernels::QuantType::q6_K;
    case io::GgmlType::q4_1: return kernels::QuantType::q4_1;
    case io::GgmlType::q5_0: return kernels::QuantType::q5_0;
    case io::GgmlType::q5_1: return kernels::QuantType::q5_1;
    case io::GgmlType::q2_K: return kernels::QuantType::q2_K;
    case io::GgmlType::q3_K: return kernels::QuantType::q3_K;
    case io::GgmlType::q5_K: return kernels::QuantType::q5_K;
    default: return std::nullopt;
  }
}
namespace {

using io::GgmlType;
using io::GgufValue;

constexpr std::array<std::pair<GgufWeights, std::string_view>, 14> kWeightNames{{
    {GgufWeights::f32, "f32"},       {GgufWeights::f16, "f16"},       {GgufWeights::bf16, "bf16"},
    {GgufWeights::q8_0, "q8_0"},     {GgufWeights::q4_0, "q4_0"},     {GgufWeights::q4_1, "q4_1"},
    {GgufWeights::q5_0, "q5_0"},     {GgufWeights::q5_1, "q5_1"},     {GgufWeights::q2_K, "q2_K"},
    {GgufWeights::q4_K, "q4_K"},     {GgufWeights::q5_K, "q5_K"},     {GgufWeights::q6_K, "q6_K"},
    {GgufWeights::q4_K_M, "q4_K_M"}, {GgufWeights::q5_K_M, "q5_K_M"},
}};

const std::map<std::string, std::string, std::less<>> kGpt2Layer = {
    {"ln_1.weight", "attn_norm.weight"},         {"ln_1.bias", "attn_norm.bias"},
    {"attn.c_attn.weight", "attn_qkv.weight"},   {"attn.c_attn.bias", "attn_qkv.bias"},
    {"attn.c_proj.weight", "attn_output.weight"}, {"attn.c_proj.bias", "attn_output.bias"},
    {"ln_2.weight", "ffn_norm.weight"},          {"ln_2.bias", "ffn_norm.bias"},
    {"mlp.c_fc.weight", "ffn_up.weight"},        {"mlp.c_fc.bias", "ffn_up.bias"},
    {"mlp.c_proj.weight", "ffn_down.weight"},    {"mlp.c_proj.bias", "ffn_down.bias"},
};
const std::map<std::string, std::string, std::less<>> kLlamaLayer = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
    {"block_sparse_moe.gate.weight", "ffn_gate_inp.weight"},
};
// Mixtral's experts.E.w1 (gate), w2 (down), w3 (up), stacked over E.
const std::map<std::string, std::string, std::less<>> kExpertStack = {
    {"w1.weight", "ffn_gate_exps.weight"}, {"w2.weight", "ffn_down_exps.weight"}, {"w3.weight", "ffn_up_exps.weight"}};

std::string_view arch_of(const ModelConfig& cfg) { return cfg.family == Family::gpt2 ? "gpt2" : "llama"; }

// "h.3.x" / "model.layers.3.x" -> (3, "x"); nullopt for a name outside the layers.
std::optional<std::pair<int64_t, std::string>> split_layer(const ModelConfig& cfg, const std::string& name) {
  const std::string prefix = cfg.family == Family::gpt2 ? "h." : "model.layers.";
  if (!name.starts_with(prefix)) return std::nullopt;
  const size_t dot = name.find('.', prefix.size());
  LOOM_CHECK(dot != std::string::npos, "parameter name ", name);
  return std::make_pair(std::stoll(name.substr(prefix.size(), dot - prefix.size())), name.substr(dot + 1));
}

// An expert's (stacked tensor's name, expert index), or nullopt.
std::optional<std::pair<std::string, int64_t>> expert_of(const std::string& rest) {
  constexpr std::string_view kExperts = "block_sparse_moe.experts.";
  if (!rest.starts_with(kExperts)) return std::nullopt;
  const size_t dot = rest.find('.', kExperts.size());
  const auto it = kExpertStack.find(rest.substr(dot + 1));
  LOOM_REQUIRE(it != kExpertStack.end(), "GGUF: expert parameter '", rest, "' has no llama.cpp counterpart");
  return std::make_pair(it->second, std::stoll(rest.substr(kExperts.size(), dot - kExperts.size())));
}

// llama.cpp's use_more_bits (llama-quant.cpp): the layers q4_K_M and q5_K_M store in q6_K.
bool use_more_bits(int64_t layer, int64_t n_layers) {
  return layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
}

GgmlType ggml_of(GgufWeights w) {
  switch (w) {
    case GgufWeights::f32: return GgmlType::f32;
    case GgufWeights::f16: return GgmlType::f16;
    case GgufWeights::bf16: return GgmlType::bf16;
    case GgufWeights::q8_0: return GgmlType::q8_0;
    case GgufWeights::q4_0: return GgmlType::q4_0;
    case GgufWeights::q4_K: case GgufWeights::q4_K_M: return GgmlType::q4_K;
    case GgufWeights::q6_K: return GgmlType::q6_K;
    case GgufWeights::q4_1: return GgmlType::q4_1;
    case GgufWeights::q5_0: return GgmlType::q5_0;
    case GgufWeights::q5_1: return GgmlType::q5_1;
    case GgufWeights::q2_K: return GgmlType::q2_K;
    case GgufWeights::q5_K: case GgufWeights::q5_K_M: return GgmlType::q5_K;
  }
  return GgmlType::f32;
}

// The type one GGUF tensor is meant for, before its rows are fitted to the
// type's block (gguf_model.h's rules).
GgmlType intended_type(const ModelConfig& cfg, const std::string& gguf_name, int ndim, GgufWeights w) {
  if (ndim == 1 || gguf_name.find("ffn_gate_inp") != std::string::npos) return GgmlType::f32;
  const bool quantized = gguf_quant_type(ggml_of(w)).has_value();
  if (gguf_name == "position_embd.weight") return quantized ? GgmlType::f16 : ggml_of(w);
  GgmlType t = ggml_of(w);
  if (w != GgufWeights::q4_K_M && w != GgufWeights::q5_K_M) return t;
  // llama.cpp's llama_tensor_get_type for Q4_K_M and Q5_K_M (the release
  // tests/interop pins, where gpt2's fused attn_qkv takes attn_v's rules).
  const bool eight_experts = cfg.n_expert == 8;
  const auto is = [&gguf_name](const char* suffix) { return gguf_name.ends_with(suffix); };
  const bool attn_v = is("attn_v.weight") || is("attn_qkv.weight");
  // The output matrix (token_embd where the head is tied to it, as llama.cpp
  // treats a file without output.weight).
  if (gguf_name == "output.weight" || (cfg.tie_embeddings && gguf_name == "token_embd.weight")) return GgmlType::q6_K;
  if (eight_experts && (is("attn_k.weight") || attn_v)) return GgmlType::q8_0;
  if (eight_experts && is("attn_output.weight")) return GgmlType::q5_K;
  const bool more_bits_tensor = is("ffn_down.weight") || attn_v || is("ffn_down_exps.weight");
  if (more_bits_tensor && gguf_name.starts_with("blk.")) {
    const int64_t layer = std::stoll(gguf_name.substr(4, gguf_name.find('.', 4) - 4));
    if (use_more_bits(layer, cfg.n_layer)) t = GgmlType::q6_K;
  }
  return t;
}

// t, or for rows of ne0 values that t's blocks do not divide, llama-quantize's
// fallback (q4_K -> q5_0, q5_K -> q5_1, q6_K -> q8_0, q2_K -> q4_0; another
// type -> q8_0), and f16 where that does not divide them either.
GgmlType fitted_type(GgmlType t, int64_t ne0) {
  if (ne0 % io::ggml_type_traits(t).block_size == 0) return t;
  GgmlType fallback = GgmlType::q8_0;
  if (t == GgmlType::q4_K) fallback = GgmlType::q5_0;
  if (t == GgmlType::q5_K) fallback = GgmlType::q5_1;
  if (t == GgmlType::q2_K) fallback = GgmlType::q4_0;
  return ne0 % io::ggml_type_traits(fallback).block_size == 0 ? fallback : GgmlType::f16;
}

// Says which matrices fell back from their type (llama-quantize says so per
// tensor): a file of "q4_K weights" that holds q8_0 ones should not surprise.
void warn_fallbacks(const std::vector<std::pair<std::string, std::string>>& fell, size_t matrices) {
  if (fell.empty()) return;
  std::string shown;
  for (size_t i = 0; i < fell.size() && i < 4; ++i) shown += concat(i ? ", " : "", fell[i].first, " ", fell[i].second);
  log_warn("gguf: ", fell.size(), " of ", matrices, " weight matrices are stored in another type than asked, their ",
           "rows not being a multiple of its block (", shown, fell.size() > 4 ? ", ..." : "", ")");
}

// One GGUF tensor and the loom rows it is made of: `sources` are (OC, IC)
// matrices (or vectors) stacked along the slowest GGUF dim.
struct Planned {
  std::string name;
  GgmlType type;
  std::vector<int64_t> ne;
  std::vector<Tensor> sources;
  bool permute = false;
};

// Writes one row of ne0 floats in `type` to out.
void write_row(io::GgufSink& out, GgmlType type, const float* row, int64_t ne0, std::vector<uint8_t>& buf,
               const std::string& name) {
  switch (type) {
    case GgmlType::f32: out.write(row, static_cast<size_t>(ne0) * 4); return;
    case GgmlType::f16:
    case GgmlType::bf16: {
      buf.resize(static_cast<size_t>(ne0) * 2);
      for (int64_t i = 0; i < ne0; ++i) {
        const uint16_t bits = type == GgmlType::f16 ? to_f16(row[i]).bits : to_bf16(row[i]).bits;
        std::memcpy(buf.data() + 2 * i, &bits, 2);
      }
      out.write(buf.data(), buf.size());
      return;
    }
    default: break;
  }
  const kernels::QuantType q = *gguf_quant_type(type);
  buf.resize(kernels::quant_row_bytes(q, ne0));
  try {
    kernels::quantize_row(q, row, buf.data(), ne0);
  } catch (const Error& e) {
    fail("GGUF: tensor '", name, "': ", e.what());
  }
  out.write(buf.data(), buf.size());
}

void fill_tensor(io::GgufSink& out, const Planned& p, int64_t head_size) {
  std::vector<uint8_t> buf;
  for (const Tensor& src : p.sources) {
    const int64_t ne0 = p.ne[0], rows = src.numel() / ne0;
    const float* data = src.data_as<const float>();
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t from = p.permute ? gguf_loom_row(r, head_size) : r;
      write_row(out, p.type, data + from * ne0, ne0, buf, p.name);
    }
  }
}

void add_arch_keys(io::GgufWriter& w, const ModelConfig& cfg) {
  const std::string a(arch_of(cfg));
  const auto u32 = [](int64_t v) { return GgufValue::u32(static_cast<uint32_t>(v)); };
  w.add(a + ".context_length", u32(cfg.max_seq_len));
  w.add(a + ".embedding_length", u32(cfg.n_embd));
  w.add(a + ".feed_forward_length", u32(cfg.d_ff));
  w.add(a + ".block_count", u32(cfg.n_layer));
  w.add(a + ".attention.head_count", u32(cfg.n_head));
  if (cfg.family == Family::gpt2) {
    w.add("gpt2.attention.layer_norm_epsilon", GgufValue::f32(cfg.norm_eps));
    return;
  }
  w.add("llama.attention.head_count_kv", u32(cfg.n_kv_head));
  w.add("llama.rope.freq_base", GgufValue::f32(cfg.rope_theta));
  w.add("llama.rope.dimension_count", u32(cfg.head_size()));
  w.add("llama.attention.layer_norm_rms_epsilon", GgufValue::f32(cfg.norm_eps));
  w.add("llama.vocab_size", u32(cfg.vocab_size));
  if (cfg.is_moe()) {
    w.add("llama.expert_count", u32(cfg.n_expert));
    w.add("llama.expert_used_count", u32(cfg.top_k));
  }
}

// Mixtral's MoE is what llama.cpp's llama architecture runs: every layer,
// softmax router, renormalised top-k, no shared experts or bias.
void require_llama_cpp_moe(const ModelConfig& cfg) {
  if (!cfg.is_moe()) return;
  LOOM_REQUIRE(cfg.moe_every == 1 && cfg.n_shared_expert == 0 && cfg.router_score == RouterScore::softmax &&
                   cfg.norm_topk_prob && !cfg.has_expert_bias(),
               "GGUF: llama.cpp's llama architecture runs Mixtral's MoE (every layer, softmax router, renormalised "
               "top-k, no shared experts, no routing bias); this model has moe_every = ", cfg.moe_every,
               ", n_shared_expert = ", cfg.n_shared_expert, ", router_score = ", router_score_name(cfg.router_score),
               ", norm_topk_prob = ", cfg.norm_topk_prob, ", aux_free_rate = ", cfg.aux_free_rate);
}

}  // namespace

GgufWeights gguf_weights_from_name(std::string_view name) {
  std::string allowed;
  for (const auto& [w, n] : kWeightNames) {
    if (n == name) return w;
    allowed += (allowed.empty() ? "" : ", ") + std::string(n);
  }
  if (name == "q3_K")
    fail("GGUF weight type 'q3_K' is invalid: loom reads and serves q3_K but does not write it (llama-quantize's ",
         "Q3_K_M does); allowed values are ", allowed);
  fail("GGUF weight type '", name, "' is invalid: allowed values are ", allowed);
}

std::string_view gguf_weights_name(GgufWeights w) {
  for (const auto& [k, n] : kWeightNames)
    if (k == w) return n;
  return "?";
}

io::GgufFileType gguf_file_type(GgufWeights w) {
  using T = io::GgufFileType;
  switch (w) {
    case GgufWeights::f32: return T::all_f32;
    case GgufWeights::f16: return T::mostly_f16;
    case GgufWeights::q4_0: return T::mostly_q4_0;
    case GgufWeights::q8_0: return T::mostly_q8_0;
    case GgufWeights::q4_K: return T::mostly_q4_K_S;
    case GgufWeights::q4_K_M: return T::mostly_q4_K_M;
    case GgufWeights::q6_K: return T::mostly_q6_K;
    case GgufWeights::bf16: return T::mostly_bf16;
    case GgufWeights::q4_1: return T::mostly_q4_1;
    case GgufWeights::q5_0: return T::mostly_q5_0;
    case GgufWeights::q5_1: return T::mostly_q5_1;
    case GgufWeights::q2_K: return T::mostly_q2_K;
    case GgufWeights::q5_K: return T::mostly_q5_K_S;
    case GgufWeights::q5_K_M: return T::mostly_q5_K_M;
  }
  return T::all_f32;
}

bool gguf_rows_permuted(const ModelConfig& cfg, const std::string& gguf_name) {
  return cfg.family == Family::llama && (gguf_name.ends_with("attn_q.weight") || gguf_name.ends_with("attn_k.weight"));
}

int64_t gguf_loom_row(int64_t r, int64_t head_size) {
  const int64_t h = r / head_size, j = r % head_size;
  return h * head_size + (j % 2) * (head_size / 2) + j / 2;
}

int64_t gguf_row_of_loom(int64_t r, int64_t head_size) {
  const int64_t h = r / head_size, j = r % head_size, half = head_size / 2;
  return h * head_size + 2 * (j % half) + j / half;
}

GgufRows gguf_rows_of(const ModelConfig& cfg, const std::string& name, int64_t rows) {
  const auto layer = split_layer(cfg, name);
  const auto e = layer ? expert_of(layer->second) : std::nullopt;
  if (!e) return {0, rows, -1};
  return {e->second * rows, rows * cfg.n_expert, e->second};
}

std::string gguf_tensor_name(const ModelConfig& cfg, const std::string& name) {
  static const std::map<std::string, std::string, std::less<>> kOutside = {
      {"wte.weight", "token_embd.weight"},          {"wpe.weight", "position_embd.weight"},
      {"ln_f.weight", "output_norm.weight"},        {"ln_f.bias", "output_norm.bias"},
      {"model.embed_tokens.weight", "token_embd.weight"}, {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"}};
  const auto layer = split_layer(cfg, name);
  if (!layer) {
    const auto it = kOutside.find(name);
    LOOM_REQUIRE(it != kOutside.end(), "GGUF: parameter '", name, "' has no llama.cpp counterpart");
    return it->second;
  }
  const std::string blk = concat("blk.", layer->first, ".");
  if (const auto e = expert_of(layer->second)) return blk + e->first;
  const auto& table = cfg.family == Family::gpt2 ? kGpt2Layer : kLlamaLayer;
  const auto it = table.find(layer->second);
  LOOM_REQUIRE(it != table.end(), "GGUF: parameter '", name, "' has no llama.cpp counterpart");
  return blk + it->second;
}

void gguf_add_model(io::GgufWriter& w, const ModelConfig& cfg, const Tensor& flat, GgufWeights weights,
                    const std::string& name) {
  require_llama_cpp_moe(cfg);
  const std::vector<ParamSpec> specs = param_specs(cfg);
  LOOM_CHECK(flat.dtype() == DType::f32 && flat.numel() == param_count(specs), "gguf_add_model: flat ", flat.str());
  w.add("general.architecture", GgufValue::string(arch_of(cfg)));
  w.add("general.name", GgufValue::string(name));
  w.add("general.file_type", GgufValue::u32(static_cast<uint32_t>(gguf_file_type(weights))));
  if (gguf_quant_type(ggml_of(weights))) w.add("general.quantization_version", GgufValue::u32(2));
  add_arch_keys(w, cfg);
  std::vector<Planned> plan;
  std::map<std::string, size_t> stacked;  // expert tensor -> its plan entry
  std::vector<std::pair<std::string, std::string>> fell;  // tensors stored in another type than intended
  size_t matrices = 0;
  for (const ParamSpec& s : specs) {
    const Tensor src = flat.slice(0, s.offset, s.numel()).reshape(s.shape);
    const std::string g = gguf_tensor_name(cfg, s.name);
    if (const auto it = stacked.find(g); it != stacked.end()) {
      plan[it->second].sources.push_back(src);
      plan[it->second].ne.back() += 1;
      continue;
    }
    Planned p{g, GgmlType::f32, {}, {src}, gguf_rows_permuted(cfg, g)};
    for (int d = s.shape.ndim() - 1; d >= 0; --d) p.ne.push_back(s.shape[d]);
    if (g.ends_with("_exps.weight")) {
      p.ne.push_back(1);
      stacked.emplace(g, plan.size());
    }
    const GgmlType want = intended_type(cfg, g, s.shape.ndim(), weights);
    p.type = fitted_type(want, p.ne[0]);
    matrices += s.shape.ndim() > 1 ? 1 : 0;
    if (p.type != want)
      fell.emplace_back(g, concat(io::ggml_type_traits(want).name, " -> ", io::ggml_type_traits(p.type).name, " (",
                                  p.ne[0], " values a row)"));
    plan.push_back(std::move(p));
  }
  warn_fallbacks(fell, matrices);
  const int64_t hs = cfg.head_size();
  for (Planned& p : plan) {
    auto shared = std::make_shared<Planned>(p);
    w.add_tensor(p.name, p.type, p.ne, [shared, hs](io::GgufSink& out) { fill_tensor(out, *shared, hs); });
  }
}

}  // namespace loom::model
