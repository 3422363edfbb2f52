// QuantWeights (quant_weights.h): a GGUF file's quantized linears, held in
// their blocks for linear_forward_quantized.
#include "model/quant_weights.h"

#include <cstring>
#include <optional>

#include "core/error.h"
#include "model/blocks.h"
#include "model/config_json.h"
#include "model/gguf_model.h"
#include "model/params.h"

namespace loom::model {

using kernels::QuantType;

namespace {

// The linear weights a step multiplies (never looks up): the dense layers'
// and a Mixtral layer's routed experts (rows of the stacked tensor).
bool is_linear(const std::string& name) {
  if (name.find("block_sparse_moe.experts.") != std::string::npos)
    return name.ends_with(".w1.weight") || name.ends_with(".w2.weight") || name.ends_with(".w3.weight");
  if (name.find("shared_expert") != std::string::npos) return false;
  for (const char* suffix : {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight",
                             "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                             "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                             "mlp.down_proj.weight"})
    if (name.ends_with(suffix)) return true;
  return name == "lm_head.weight";
}

// Whether tp rank `local`'s slice of a weight of type `type` is whole
// blocks: rows always; a row-parallel slice's columns when each rank's
// count is a multiple of the block (else the rank holds it in f32).
bool slices_into_blocks(const ParamSpec& local, QuantType type) {
  return local.split.dim != 1 || local.shape[1] % kernels::quant_block_size(type) == 0;
}

// f(global spec, the rank's spec, its GGUF tensor, its name there, first
// row, type, tied head) for each linear of cfg that f holds quantized and
// whose tp slice is whole blocks; the names of those whose slice is not
// into *unsliced.
template <typename F>
void for_each_quantized(const io::GgufFile& file, const ModelConfig& cfg, TpRank tp, F f,
                        std::vector<std::string>* unsliced = nullptr) {
  std::vector<ParamSpec> specs = param_specs(cfg), mine = param_specs(cfg, tp);
  if (cfg.tie_embeddings) {  // the head multiplies by token_embd: held under the head's name, split as it is
    for (std::vector<ParamSpec>* list : {&specs, &mine}) {
      ParamSpec head = list->front();  // the embedding
      LOOM_CHECK(gguf_tensor_name(cfg, head.name) == "token_embd.weight", "for_each_quantized: ", head.name);
      head.name = "lm_head.weight";
      list->push_back(head);
    }
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    const ParamSpec& s = specs[i];
    if (!is_linear(s.name)) continue;
    const bool tied_head = cfg.tie_embeddings && s.name == "lm_head.weight";
    const std::string g = tied_head ? "token_embd.weight" : gguf_tensor_name(cfg, s.name);
    const io::GgufTensorInfo* t = file.find_tensor(g);
    const std::optional<QuantType> type = t != nullptr ? gguf_quant_type(t->type) : std::nullopt;
    if (!type) continue;  // missing: load_params_from_gguf says so
    if (!slices_into_blocks(mine[i], *type)) {
      if (unsliced != nullptr) unsliced->push_back(s.name);
      continue;
    }
    const int64_t cols = s.shape[s.shape.ndim() - 1], rows = s.numel() / cols;
    const GgufRows at = gguf_rows_of(cfg, s.name, rows);  // an expert: its slice of the stacked tensor
    LOOM_REQUIRE(t->ne[0] == cols && t->n_elements == at.in_tensor * cols, "GGUF file '", file.path(),
                 "': tensor '", g, "' has ", t->n_elements, " values in rows of ", t->ne[0], "; loom's ", s.name, " ",
                 s.shape.str(), at.expert < 0 ? "" : concat(" (one of ", cfg.n_expert, " experts)"),
                 " needs rows of ", cols);
    f(s, mine[i], *t, g, at.first, *type, tied_head);
  }
}

}  // namespace

QuantWeights::QuantWeights(io::GgufFile f, const ModelConfig& cfg, Pool& pool, TpRank tp) : file_(std::move(f)) {
  for_each_quantized(file_, cfg, tp, [&](const ParamSpec&, const ParamSpec& mine, const io::GgufTensorInfo& t,
                                         const std::string& g, int64_t first, QuantType type, bool tied_head) {
    hold(mine, t, first, type, gguf_rows_permuted(cfg, g), cfg.head_size(), pool);
    if (!tied_head) f32_bytes_ += mine.numel() * 4;
  }, &unsliced_);
}

QuantWeights::Footprint QuantWeights::footprint(const io::GgufFile& f, const ModelConfig& cfg, TpRank tp) {
  Footprint out;
  for_each_quantized(f, cfg, tp, [&](const ParamSpec&, const ParamSpec& mine, const io::GgufTensorInfo&,
                                     const std::string&, int64_t, QuantType type, bool tied_head) {
    const int64_t cols = mine.shape[mine.shape.ndim() - 1];
    out.blocks += mine.numel() / cols * static_cast<int64_t>(kernels::quant_row_bytes(type, cols));
    if (!tied_head) out.f32_bytes += mine.numel() * 4;
  });
  return out;
}

void QuantWeights::hold(const ParamSpec& mine, const io::GgufTensorInfo& t, int64_t first, QuantType type,
                        bool permute, int64_t head_size, Pool& pool) {
  const int64_t cols = mine.shape[mine.shape.ndim() - 1], rows = mine.numel() / cols, t_cols = t.ne[0];
  const int64_t qk = kernels::quant_block_size(type);
  const auto block_bytes = static_cast<int64_t>(kernels::quant_block_bytes(type));
  const auto row_bytes = static_cast<int64_t>(kernels::quant_row_bytes(type, cols));
  const auto t_row_bytes = static_cast<int64_t>(kernels::quant_row_bytes(type, t_cols));
  owned_.push_back(pool.empty(DType::u8, {rows, row_bytes}));
  const Tensor blocks = owned_.back();
  uint8_t* to = blocks.data_as<uint8_t>();
  // The rank's elements run by run (shard_runs), a row's piece at a time:
  // whole blocks, copied; a padding row (past the vocabulary) is zero blocks.
  for (const ShardRun& run : shard_runs(mine)) {
    for (int64_t e = 0; e < run.count;) {
      const int64_t l = run.local + e, col = l % cols, n = std::min(run.count - e, cols - col);
      LOOM_CHECK(col % qk == 0 && n % qk == 0, "QuantWeights: ", mine.name, " is not cut at its blocks");
      uint8_t* dst = to + l / cols * row_bytes + col / qk * block_bytes;
      const auto bytes = static_cast<size_t>(n / qk * block_bytes);
      if (run.global < 0) {
        std::memset(dst, 0, bytes);
      } else {
        const int64_t g = run.global + e, g_row = g / t_cols;
        const int64_t from = first + (permute ? gguf_row_of_loom(g_row, head_size) : g_row);
        std::memcpy(dst, t.data + from * t_row_bytes + g % t_cols / qk * block_bytes, bytes);
      }
      e += n;
    }
  }
  by_name_[mine.name] = {blocks, type};
  by_address_[blocks.data_as<const uint8_t>()] = {blocks, type};
  bytes_ += rows * row_bytes;
}

std::vector<std::string> QuantWeights::names() const {
  std::vector<std::string> out;
  for (const auto& [name, held] : by_name_) out.push_back(name);
  return out;
}

const Tensor& QuantWeights::blocks(const std::string& name) const {
  auto it = by_name_.find(name);
  LOOM_CHECK(it != by_name_.end(), "no quantized weight ", name);
  return it->second.blocks;
}

QuantType QuantWeights::type_of(const Tensor& w) const {
  const auto* p = w.data_as<const uint8_t>();
  auto it = by_address_.upper_bound(p);
  if (it != by_address_.begin()) {
    --it;
    const Tensor& b = it->second.blocks;
    if (p + w.nbytes() <= b.data_as<const uint8_t>() + b.nbytes() && w.size(-1) == b.size(-1)) return it->second.type;
  }
  LOOM_CHECK(false, "tensor ", w.str(), " is not one of the quantized weights of ", file_.path());
  return QuantType::q8_0;
}

void QuantWeights::substitute(ParamViews& views) const {
  for (const auto& [name, held] : by_name_)
    if (views.has(name)) views.substitute(name, held.blocks);
}

std::string QuantWeights::summary() const {
  std::map<std::string, int> count;
  for (const auto& [name, held] : by_name_) ++count[std::string(kernels::quant_name(held.type))];
  std::string s;
  for (const auto& [type, n] : count) s += concat(s.empty() ? "" : ", ", type, " ", n);
  return s;
}

int64_t ServingWeights::bytes() const {
  const auto all = static_cast<int64_t>(params.nbytes());
  return quant ? all - quant->f32_bytes() + quant->bytes() : all;
}

ServingWeights load_serving_weights(const ModelDir& dir, DType compute, bool dequantize, const std::string& what,
                                    Pool& pool, Pool* flat_pool) {
  ServingWeights w;
  const std::vector<ParamSpec> specs = param_specs(dir.config);
  if (dir.gguf && !dequantize) {
    auto quant = std::make_unique<QuantWeights>(io::GgufFile::open(dir.weights), dir.config, pool);
    if (!quant->empty()) {
      LOOM_REQUIRE(compute == DType::f32, what, " ", dtype_name(compute), ": '", dir.weights,
                   "' holds quantized weights (", quant->summary(), "), which compute with f32 activations; ",
                   "leave ", what, " at fp32, or pass --dequantize to compute in ", dtype_name(compute),
                   " from weights dequantized at load");
      // The quantized linears' places stay unwritten (never read, never resident).
      w.params = (flat_pool ? *flat_pool : pool).empty(DType::f32, {param_count(specs)});
      load_params_from_gguf(w.params, dir.config, quant->file(), quant.get());
      w.quant = std::move(quant);
      return w;
    }
  }
  OwnedTensor f32 = pool.empty(DType::f32, {param_count(specs)});
  load_model_params(dir, f32);
  w.params = params_in_dtype(std::move(f32), compute, pool);
  return w;
}

}  // namespace loom::model
