// Reading a loom model out of a GGUF file (gguf_model.h): the config from the
// architecture's keys, the parameters from the tensors, dequantized to f32.
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/quant.h"
#include "model/gguf_model.h"
#include "model/params.h"
#include "model/quant_weights.h"

namespace loom::model {
namespace {

using io::GgmlType;

std::string where(const io::GgufFile& f) { return concat("GGUF file '", f.path(), "'"); }

int64_t get_count(const io::GgufFile& f, const std::string& key) {
  const auto v = f.get_int<int64_t>(key);
  LOOM_REQUIRE(v > 0, where(f), ": key '", key, "' is ", v, "; it must be positive");
  return v;
}

// The keys loom cannot honour: a rope scaling, a partial rotary dimension.
void require_plain_rope(const io::GgufFile& f, const ModelConfig& cfg) {
  for (const char* key : {"llama.rope.scaling.type", "llama.rope.scaling.factor"}) {
    if (!f.has(key)) continue;
    if (std::string(key).ends_with("type") && f.get_string(key) == "none") continue;
    fail(where(f), ": key '", key, "': RoPE scaling is not implemented in loom");
  }
  if (f.has("llama.rope.dimension_count")) {
    const auto d = f.get_int<int64_t>("llama.rope.dimension_count");
    LOOM_REQUIRE(d == cfg.head_size(), where(f), ": key 'llama.rope.dimension_count' is ", d,
                 " but the head size is ", cfg.head_size(), ": partial rotary embeddings are not implemented in loom");
  }
}

// Every tensor of the file is one of the model's: a tensor loom would not
// read changes the model (Llama 3.1's RoPE frequency factors, attention
// biases, blocks past block_count) and is refused by name, as llama.cpp
// refuses a tensor count it does not expect.
void require_no_other_tensors(const io::GgufFile& f, const ModelConfig& cfg) {
  std::set<std::string, std::less<>> known;
  for (const ParamSpec& s : param_specs(cfg)) known.insert(gguf_tensor_name(cfg, s.name));
  for (const io::GgufTensorInfo& t : f.tensors()) {
    if (known.count(t.name) != 0) continue;
    const std::string why = t.name == "rope_freqs.weight" ? "Llama 3.1-style RoPE frequency factors (rope scaling)"
                            : t.name.ends_with(".bias") ? "a bias this model family has no place for"
                            : t.name.starts_with("blk.") ? concat("a tensor of no block of the ", cfg.n_layer,
                                                                  " the keys describe, or one loom has no place for")
                                                         : "a tensor loom has no place for";
    fail(where(f), ": tensor '", t.name, "' is ", why, ": not implemented in loom (loading without it would give ",
         "another model)");
  }
}

// dst = the n values of `bytes` (type t) as f32.
void to_floats(float* dst, const uint8_t* bytes, GgmlType t, int64_t n, const std::string& name) {
  switch (t) {
    case GgmlType::f32: std::memcpy(dst, bytes, static_cast<size_t>(n) * 4); return;
    case GgmlType::f16:
    case GgmlType::bf16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t bits = 0;
        std::memcpy(&bits, bytes + 2 * i, 2);
        dst[i] = t == GgmlType::f16 ? from_f16(f16{bits}) : from_bf16(bf16{bits});
      }
      return;
    default:
      if (const auto q = gguf_quant_type(t)) return kernels::dequantize_row(*q, bytes, dst, n);
  }
  fail("tensor '", name, "' has type ", io::ggml_type_describe(static_cast<uint32_t>(t)),
       ", which loom cannot compute with: it reads f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_K, q3_K, ",
       "q4_K, q5_K and q6_K");
}


// The rank's elements of a parameter (place: its spec, whose offset is in
// flat; a tp slice, or the whole) from its global rows of ne0 values, each
// read by read_row(dst, global row): whole rows straight into place, a
// row-parallel slice's columns through one row of scratch; padding 0.
template <typename ReadRow>
void read_place(Tensor flat, const ParamSpec& place, int64_t ne0, ReadRow read_row) {
  float* dst = flat.data_as<float>() + place.offset;
  std::vector<float> row;
  int64_t row_in = -1;  // the global row in `row`
  for (const ShardRun& run : shard_runs(place)) {
    for (int64_t e = 0; e < run.count;) {
      const int64_t g = run.global + e, col = g % ne0;
      const int64_t n = run.global < 0 ? run.count - e : std::min(run.count - e, ne0 - col);
      float* to = dst + run.local + e;
      if (run.global < 0) {
        std::fill(to, to + n, 0.f);
      } else if (n == ne0) {
        read_row(to, g / ne0);
      } else {
        if (row_in != g / ne0) row.resize(static_cast<size_t>(ne0)), read_row(row.data(), row_in = g / ne0);
        std::copy(row.data() + col, row.data() + col + n, to);
      }
      e += n;
    }
  }
}
}  // namespace

ModelConfig model_config_from_gguf(const io::GgufFile& f) {
  const std::string arch(f.get_string("general.architecture"));
  ModelConfig cfg;
  if (arch == "gpt2") cfg.family = Family::gpt2;
  else if (arch == "llama") cfg.family = Family::llama;
  else fail(where(f), ": general.architecture is '", arch, "'; loom runs gpt2 and llama");
  cfg.n_layer = get_count(f, arch + ".block_count");
  cfg.n_embd = get_count(f, arch + ".embedding_length");
  cfg.n_head = get_count(f, arch + ".attention.head_count");
  cfg.n_kv_head = cfg.n_head;
  cfg.d_ff = get_count(f, arch + ".feed_forward_length");
  cfg.max_seq_len = get_count(f, arch + ".context_length");
  const io::GgufTensorInfo& embd = f.tensor("token_embd.weight");
  LOOM_REQUIRE(embd.n_dims == 2 && embd.ne[0] == cfg.n_embd, where(f), ": token_embd.weight has dims (", embd.ne[0],
               ", ", embd.ne[1], "); expected (", cfg.n_embd, ", n_vocab)");
  cfg.vocab_size = embd.ne[1];
  cfg.tie_embeddings = f.find_tensor("output.weight") == nullptr;
  if (cfg.family == Family::gpt2) {
    cfg.norm_eps = static_cast<float>(f.get_float("gpt2.attention.layer_norm_epsilon"));
  } else {
    if (f.has("llama.attention.head_count_kv")) cfg.n_kv_head = get_count(f, "llama.attention.head_count_kv");
    if (f.has("llama.rope.freq_base")) cfg.rope_theta = static_cast<float>(f.get_float("llama.rope.freq_base"));
    cfg.norm_eps = static_cast<float>(f.get_float("llama.attention.layer_norm_rms_epsilon"));
    if (f.has("llama.expert_count") && f.get_int<int64_t>("llama.expert_count") > 0) {
      cfg.n_expert = get_count(f, "llama.expert_count");
      cfg.top_k = get_count(f, "llama.expert_used_count");
      cfg.capacity_factor = 0.f;  // dropless: every token reaches its experts, as in llama.cpp
    }
  }
  try {
    cfg.validate();
  } catch (const Error& e) {
    fail(where(f), ": the model its keys describe is not valid: ", e.what());
  }
  if (cfg.family == Family::llama) require_plain_rope(f, cfg);
  require_no_other_tensors(f, cfg);
  return cfg;
}

void load_params_from_gguf(Tensor flat, const ModelConfig& cfg, const io::GgufFile& f, const QuantWeights* skip,
                           std::span<const ParamSpec> layout) {
  const std::vector<ParamSpec> specs = param_specs(cfg);
  const std::span<const ParamSpec> into = layout.empty() ? std::span<const ParamSpec>(specs) : layout;
  std::map<std::string, const ParamSpec*> place;
  int64_t count = 0;
  for (const ParamSpec& s : into) {
    LOOM_CHECK(s.offset >= 0 && s.offset + s.numel() <= flat.numel(), "load_params_from_gguf: ", s.name, " at ",
               s.offset, " runs past ", flat.str());
    place[s.name] = &s, count += s.numel();
  }
  LOOM_CHECK(flat.dtype() == DType::f32 && flat.numel() == count, "load_params_from_gguf: ", flat.str());
  for (const ParamSpec& s : specs) {
    if (skip != nullptr && skip->holds(s.name)) continue;
    LOOM_CHECK(place.count(s.name) > 0 && place.at(s.name)->global_numel() == s.numel(),
               "load_params_from_gguf: the layout has no place of ", s.numel(), " values for ", s.name);
    const std::string g = gguf_tensor_name(cfg, s.name);
    const io::GgufTensorInfo* t = f.find_tensor(g);
    LOOM_REQUIRE(t != nullptr, where(f), ": tensor '", g, "' (loom's ", s.name, ") is missing");
    const int64_t ne0 = s.shape[s.shape.ndim() - 1], rows = s.numel() / ne0;
    const GgufRows at = gguf_rows_of(cfg, s.name, rows);  // an expert: one slice of the stacked tensor
    const int64_t t_rows = t->n_elements / std::max<int64_t>(t->ne[0], 1);
    LOOM_REQUIRE(t->ne[0] == ne0 && t_rows == at.in_tensor, where(f), ": tensor '", g, "' has ", t->n_elements,
                 " values in rows of ", t->ne[0], "; loom's ", s.name, " ", s.shape.str(), " needs rows of ", ne0);
    const auto& traits = io::ggml_type_traits(t->type);
    const size_t row_bytes = static_cast<size_t>(ne0 / traits.block_size * traits.block_bytes);
    const bool permute = gguf_rows_permuted(cfg, g);
    // Loom row r of the parameter, as f32, into dst.
    const auto read_row = [&](float* dst, int64_t r) {
      const int64_t from = at.first + (permute ? gguf_row_of_loom(r, cfg.head_size()) : r);
      to_floats(dst, t->data + static_cast<size_t>(from) * row_bytes, t->type, ne0, g);
    };
    read_place(flat, *place.at(s.name), ne0, read_row);
  }
}

}  // namespace loom::model
