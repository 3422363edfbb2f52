// PagedRunner (paged_runner.h): the training blocks over a ragged batch of
// B = 1, T = N rows. Each layer's block computes q, k, v for all N rows into
// the step's buffers; its attention step writes k, v into their cache slots
// and attends per sequence through the block tables.
#include "model/paged_runner.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/ops.h"
#include "model/family.h"
#include "model/lora.h"
#include "model/moe.h"
#include "model/quant_weights.h"
#include "model/steps.h"

namespace loom::model {

using namespace loom::kernels;

namespace {

// Attention over the paged cache: the new rows' k, v go to their slots
// first, then every row attends over its sequence's cached keys up to its
// own position. Inference only: no backward.
class PagedAttention final : public AttentionStep {
 public:
  std::vector<Tensor> k_cache, v_cache;  // n_layer of (NB, BS, NKV, HS)
  Tensor slots, block_tables, seq_lens, query_start;

  void forward(const AttentionArgs& a) override {
    const size_t l = static_cast<size_t>(a.layer);
    const int64_t N = a.q.size(1), NH = a.q.size(2), NKV = a.k.size(2), HS = a.q.size(3);
    kv_cache_write(k_cache[l], v_cache[l], a.k.reshape({N, NKV, HS}), a.v.reshape({N, NKV, HS}), slots);
    paged_attention_forward(a.out.reshape({N, NH, HS}), a.q.reshape({N, NH, HS}), k_cache[l], v_cache[l],
                            block_tables, seq_lens, query_start);
  }
  void backward(const AttentionArgs& a, const AttentionGrads&) override {
    LOOM_CHECK(false, "paged attention has no backward (layer ", a.layer, "): serving does not train");
  }
};

// The first n rows of a (1, rows, ...) buffer: contiguous since B = 1.
Tensor first(const Tensor& t, int64_t n) { return t.defined() ? t.slice(1, 0, n) : Tensor(); }

template <typename T>
Tensor host_view(std::span<const T> s, DType dtype, Shape shape) {
  return Tensor(const_cast<T*>(s.data()), dtype, std::move(shape));  // read only
}

}  // namespace

void PagedRunnerSizes::validate() const {
  LOOM_REQUIRE(num_blocks >= 2, "KV cache blocks ", num_blocks, " are too few: at least 2 (block 0 is reserved)");
  LOOM_REQUIRE(block_size >= 1, "KV block size ", block_size, " is invalid: allowed values are >= 1");
  LOOM_REQUIRE(max_tokens >= 1, "tokens per step ", max_tokens, " is invalid: allowed values are >= 1");
  LOOM_REQUIRE(max_logit_rows >= 1, "logit rows per step ", max_logit_rows, " is invalid: allowed values are >= 1");
  LOOM_REQUIRE(dtype_is_float(kv_dtype), "KV cache dtype ", dtype_name(kv_dtype), " is invalid: allowed f32, bf16, f16");
}

int64_t kv_block_bytes(const ModelConfig& cfg, int64_t block_size, DType kv_dtype) {
  int64_t bytes = 2 * static_cast<int64_t>(dtype_size(kv_dtype));
  for (const int64_t f : {cfg.n_layer, block_size, cfg.n_kv_head, cfg.head_size()})
    LOOM_REQUIRE(f >= 0 && !__builtin_mul_overflow(bytes, f, &bytes), "a KV cache block of ", block_size,
                 " tokens of this model does not fit in 64-bit sizes: use a smaller block size");
  return bytes;
}

int64_t decode_weight_bytes(const ModelConfig& cfg, DType compute, const QuantWeights* quant, int64_t S) {
  const BlockFamily& family = block_family(cfg.family);
  const auto elem = static_cast<int64_t>(dtype_size(compute));
  auto matrix = [&](const std::string& name, int64_t numel) {
    return quant != nullptr && quant->holds(name) ? static_cast<int64_t>(quant->blocks(name).nbytes()) : numel * elem;
  };
  int64_t bytes = 0;
  for (const ParamSpec& s : param_specs(cfg)) {
    if (s.name == family.embedding_name)
      bytes += S * s.shape[1] * elem + (cfg.tie_embeddings ? matrix("lm_head.weight", s.numel()) : 0);
    else if (family.position_name != nullptr && s.name == family.position_name)
      bytes += S * s.shape[1] * elem;
    else
      bytes += matrix(s.name, s.numel());
  }
  return bytes;
}

struct PagedRunner::State {
  std::vector<OwnedTensor> owned;
  PagedAttention attention;  // holds the KV cache
  const BlockFamily* family = nullptr;
  LayerActs acts;            // one layer's, for max_tokens rows: (1, M, ...)
  Tensor tokens, positions;  // (1, M) i32
  Tensor x, y;               // (1, M, C)
  Tensor last, normf, logits;  // (1, R, C) x2, (R, V)
  Tensor hidden;               // (R, C) f32: the last step's hidden rows
  int64_t num_hidden = 0;
  std::vector<LayerWeights> w;
  HeadWeights head;
  const QuantWeights* quant = nullptr;  // the linears served in their blocks, or none
  MoeRun moe_run;  // MoE models: routing per token, no capacity (model/moe.h)
  std::unique_ptr<MoeMlp> moe_mlp;
  // LoRA adapters served unmerged (add_adapter): each one's parameters and
  // per-layer pairs; per layer and adapted linear, its pair in every
  // adapter by id (LoraPair::served); each id's scale; the step's runs.
  struct Adapter {
    OwnedTensor params;
    std::vector<LayerWeights> layers;
  };
  Pools* pools = nullptr;
  std::vector<Adapter> adapters;
  std::vector<std::vector<std::vector<LoraPair>>> served;  // [layer][module][id]
  std::vector<float> scales{0.f};                          // by id (0: none)
  std::vector<LoraRun> runs;
  Tensor lora_u, lora_x, lora_y;  // LoraContext::u, xbuf and ybuf, flat
};

namespace {

// LayerWeights' adapted linears, in one order.
constexpr LoraPair LayerWeights::*kLoraLinears[] = {&LayerWeights::lora_q,  &LayerWeights::lora_k,
                                                    &LayerWeights::lora_v,  &LayerWeights::lora_o,
                                                    &LayerWeights::lora_fc, &LayerWeights::lora_up,
                                                    &LayerWeights::lora_out};

}  // namespace

PagedRunner::PagedRunner(const ModelConfig& cfg, const Tensor& params, Pools& pools, const PagedRunnerSizes& sizes,
                         const QuantWeights* quant)
    : cfg_(cfg), sizes_(sizes), compute_(params.dtype()), specs_(param_specs(cfg)), st_(std::make_unique<State>()) {
  sizes_.validate();
  LOOM_CHECK(dtype_is_float(params.dtype()) && params.numel() == param_count(specs_) && params.is_contiguous(),
             "params ", params.str(), " for ", param_count(specs_), " parameters");
  const int64_t M = sizes_.max_tokens, R = sizes_.max_logit_rows, C = cfg.n_embd, NH = cfg.n_head;
  const int64_t NKV = cfg.n_kv_head, HS = cfg.head_size(), F = cfg.d_ff;
  State& st = *st_;
  st.pools = &pools;
  auto alloc = [&](MemTag tag, Shape shape, DType dtype) {
    st.owned.push_back(pools[tag].zeros(dtype, shape));
    return Tensor(st.owned.back());
  };
  st.family = &block_family(cfg.family);
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    st.attention.k_cache.push_back(alloc(MemTag::kv_cache, {sizes_.num_blocks, sizes_.block_size, NKV, HS}, sizes_.kv_dtype));
    st.attention.v_cache.push_back(alloc(MemTag::kv_cache, {sizes_.num_blocks, sizes_.block_size, NKV, HS}, sizes_.kv_dtype));
  }
  LayerActs& a = st.acts;  // inference: no saved statistics
  a.norm1 = alloc(MemTag::activations, {1, M, C}, compute_);
  a.q = alloc(MemTag::activations, {1, M, NH, HS}, compute_);
  a.k = alloc(MemTag::activations, {1, M, NKV, HS}, compute_);
  a.v = alloc(MemTag::activations, {1, M, NKV, HS}, compute_);
  a.att = alloc(MemTag::activations, {1, M, NH, HS}, compute_);
  a.res1 = alloc(MemTag::activations, {1, M, C}, compute_);
  a.norm2 = alloc(MemTag::activations, {1, M, C}, compute_);
  a.fc = alloc(MemTag::activations, {1, M, F}, compute_);
  a.act = alloc(MemTag::activations, {1, M, F}, compute_);
  if (cfg.family == Family::llama) a.up = alloc(MemTag::activations, {1, M, F}, compute_);
  if (cfg.is_moe()) {
    st.moe_run.cfg = &cfg_, st.moe_run.training = false;
    st.moe_mlp = std::make_unique<MoeMlp>(st.moe_run);
    const MoeSizes z = moe_sizes(cfg, M, 0, 0, 1, 1);
    const MoeAlloc moe_alloc = [&](Shape shape, DType dtype) { return alloc(MemTag::activations, shape, dtype); };
    moe_kept_acts(a.moe, z, moe_alloc, compute_);
    moe_dropped_acts(a.moe, z, moe_alloc, compute_);
  }
  st.tokens = alloc(MemTag::activations, {1, M}, DType::i32);
  st.positions = alloc(MemTag::activations, {1, M}, DType::i32);
  st.x = alloc(MemTag::activations, {1, M, C}, compute_);
  st.y = alloc(MemTag::activations, {1, M, C}, compute_);
  st.last = alloc(MemTag::activations, {1, R, C}, compute_);
  st.normf = alloc(MemTag::activations, {1, R, C}, compute_);
  st.logits = alloc(MemTag::activations, {R, cfg.vocab_size}, DType::f32);  // the sampler's
  st.hidden = alloc(MemTag::activations, {R, C}, DType::f32);
  ParamViews pv(specs_, params);
  if (quant != nullptr && !quant->empty()) {
    LOOM_REQUIRE(compute_ == DType::f32, "quantized weights (", quant->summary(), ") compute with f32 activations, ",
                 "not ", dtype_name(compute_), ": serve them with dtype fp32, or dequantize them to ",
                 dtype_name(compute_));
    st.quant = quant;
    quant->substitute(pv);
  }
  for (int64_t l = 0; l < cfg.n_layer; ++l) st.w.push_back(pv.layer(cfg, l));
  st.head = pv.head(cfg);
  if (st.quant != nullptr && st.quant->holds("lm_head.weight")) st.head.lm_head = st.quant->blocks("lm_head.weight");
}

PagedRunner::~PagedRunner() = default;

int32_t PagedRunner::add_adapter(const LoraConfig& lora, const Tensor& adapters) {
  State& st = *st_;
  const std::vector<LoraModule> modules = lora_modules(cfg_, lora);  // the model can carry them
  const std::vector<ParamSpec> specs = lora_param_specs(cfg_, lora);
  LOOM_REQUIRE(adapters.dtype() == DType::f32 && adapters.is_contiguous() && adapters.numel() == param_count(specs),
               "add_adapter: ", adapters.str(), " for ", param_count(specs), " f32 adapter parameters (rank ",
               lora.rank, ")");
  State::Adapter ad;
  ad.params = (*st.pools)[MemTag::params].empty(compute_, {adapters.numel()});
  cast(ad.params, adapters.flatten());
  const ParamViews views(specs, ad.params);
  for (int64_t l = 0; l < cfg_.n_layer; ++l) ad.layers.push_back(with_lora(LayerWeights{}, views, cfg_, l));
  // The step's buffers: (max_tokens x rank) for u, (max_tokens x widest
  // adapted linear's input, output) for gathered rows and an update. Made
  // before anything is recorded, so a failure leaves the runner as it was.
  int64_t width = 0, depth = 0;
  for (const LoraModule& m : modules) width = std::max(width, m.out), depth = std::max(depth, m.in);
  const int64_t M = sizes_.max_tokens;
  const auto grow = [&](Tensor& buf, int64_t per_row) {  // a larger buffer when this adapter needs one
    if (buf.defined() && buf.numel() >= M * per_row) return;
    st.owned.push_back((*st.pools)[MemTag::activations].zeros(compute_, {M * per_row}));
    buf = st.owned.back();
  };
  grow(st.lora_u, lora.rank);
  grow(st.lora_y, width);
  grow(st.lora_x, depth);
  st.adapters.push_back(std::move(ad));
  st.scales.push_back(lora.scale());
  // Every layer's linears point at their pairs by id, where any adapter has one.
  const size_t K = st.adapters.size() + 1;
  st.served.assign(static_cast<size_t>(cfg_.n_layer), std::vector<std::vector<LoraPair>>(std::size(kLoraLinears)));
  for (size_t l = 0; l < st.served.size(); ++l)
    for (size_t m = 0; m < std::size(kLoraLinears); ++m) {
      std::vector<LoraPair>& by_id = st.served[l][m];
      by_id.resize(K);
      bool any = false;
      for (size_t k = 1; k < K; ++k) {
        by_id[k] = st.adapters[k - 1].layers[l].*kLoraLinears[m];
        any = any || by_id[k].defined();
      }
      LoraPair& linear = st.w[l].*kLoraLinears[m];
      linear = LoraPair{};
      linear.served = any ? by_id.data() : nullptr;
    }
  return static_cast<int32_t>(st.adapters.size());
}

int32_t PagedRunner::num_adapters() const { return static_cast<int32_t>(st_->adapters.size()); }

int64_t PagedRunner::kv_cache_bytes() const {
  int64_t bytes = 0;
  for (const Tensor& t : st_->attention.k_cache) bytes += 2 * t.nbytes();  // and its v
  return bytes;
}

void PagedRunner::copy_blocks(std::span<const std::pair<int32_t, int32_t>> src_dst) {
  for (const auto& [src, dst] : src_dst) {
    LOOM_REQUIRE(src >= 0 && src < sizes_.num_blocks && dst >= 0 && dst < sizes_.num_blocks && src != dst,
                 "copy_blocks: block ", src, " to ", dst, " is invalid: ids are 0 to ", sizes_.num_blocks - 1,
                 " and differ");
    for (size_t l = 0; l < st_->attention.k_cache.size(); ++l)
      for (const Tensor& cache : {st_->attention.k_cache[l], st_->attention.v_cache[l]})
        copy(cache.slice(0, dst, 1), cache.slice(0, src, 1));
  }
}

namespace {

// The batch's sizes against each other and the runner's limits, and each
// row's position against its sequence's length (the attention kernel
// places row j of s at seq_len - q_len + j).
void check_batch(const PagedBatch& b, const PagedRunnerSizes& sizes, int64_t max_seq_len, int32_t num_adapters) {
  const auto N = static_cast<int64_t>(b.tokens.size()), S = static_cast<int64_t>(b.seq_lens.size());
  LOOM_REQUIRE(N >= 1 && N <= sizes.max_tokens, "paged step: ", N, " tokens; allowed 1 to ", sizes.max_tokens);
  LOOM_REQUIRE(static_cast<int64_t>(b.positions.size()) == N && static_cast<int64_t>(b.slots.size()) == N,
               "paged step: ", b.positions.size(), " positions and ", b.slots.size(), " slots for ", N, " tokens");
  LOOM_REQUIRE(S >= 1 && static_cast<int64_t>(b.query_start.size()) == S + 1 && b.max_blocks >= 1 &&
                   static_cast<int64_t>(b.block_tables.size()) == S * b.max_blocks,
               "paged step: ", S, " sequences with ", b.query_start.size(), " query starts and ",
               b.block_tables.size(), " block-table entries for max_blocks ", b.max_blocks);
  LOOM_REQUIRE(b.query_start[0] == 0 && b.query_start[S] == N, "paged step: query_start runs from ",
               b.query_start[0], " to ", b.query_start[S], "; it must run from 0 to ", N);
  for (int64_t s = 0; s < S; ++s) {
    const int32_t begin = b.query_start[s], end = b.query_start[s + 1], len = b.seq_lens[s];
    LOOM_REQUIRE(begin <= end && end - begin <= len && len <= max_seq_len, "paged step: sequence ", s, " has rows ",
                 begin, " to ", end, " and length ", len, " (at most model.max_seq_len = ", max_seq_len, ")");
    for (int32_t r = begin; r < end; ++r)
      LOOM_REQUIRE(b.positions[r] == len - (end - begin) + (r - begin), "paged step: row ", r, " of sequence ", s,
                   " is at position ", b.positions[r], "; its sequence's length puts it at ",
                   len - (end - begin) + (r - begin));
  }
  const auto R = static_cast<int64_t>(b.logit_rows.size()), H = static_cast<int64_t>(b.hidden_rows.size());
  LOOM_REQUIRE(R + H <= sizes.max_logit_rows, "paged step: ", R, " logit rows and ", H,
               " hidden rows; allowed 0 to ", sizes.max_logit_rows, " together");
  for (int32_t r : b.logit_rows) LOOM_REQUIRE(r >= 0 && r < N, "paged step: logit row ", r, " is not a row of ", N);
  for (int32_t r : b.hidden_rows) LOOM_REQUIRE(r >= 0 && r < N, "paged step: hidden row ", r, " is not a row of ", N);
  LOOM_REQUIRE(b.adapters.empty() || static_cast<int64_t>(b.adapters.size()) == S, "paged step: ", b.adapters.size(),
               " adapters for ", S, " sequences");
  for (int32_t id : b.adapters)
    LOOM_REQUIRE(id >= 0 && id <= num_adapters, "paged step: adapter ", id, " is invalid: the runner has ",
                 num_adapters, " (ids 1 to ", num_adapters, "; 0: none)");
}

// The step's rows in runs of one adapter: consecutive sequences with the same one.
void adapter_runs(const PagedBatch& b, std::vector<LoraRun>& runs) {
  runs.clear();
  for (size_t s = 0; s < b.adapters.size(); ++s) {
    const int64_t begin = b.query_start[s], end = b.query_start[s + 1];
    if (!runs.empty() && runs.back().adapter == b.adapters[s]) runs.back().end = end;
    else runs.push_back({begin, end, b.adapters[s]});
  }
}

}  // namespace

Tensor PagedRunner::step(const PagedBatch& b) {
  check_batch(b, sizes_, cfg_.max_seq_len, num_adapters());
  State& st = *st_;
  const auto N = static_cast<int64_t>(b.tokens.size()), S = static_cast<int64_t>(b.seq_lens.size());
  const auto R = static_cast<int64_t>(b.logit_rows.size()), H = static_cast<int64_t>(b.hidden_rows.size());
  const int64_t C = cfg_.n_embd;
  st.num_hidden = 0;
  // Every linear of the blocks and the LM head batch invariant (unless the
  // sizes say otherwise): a row's logits must not depend on the step's other rows.
  Dims d{1, N, C, cfg_.n_head, cfg_.n_kv_head, cfg_.head_size(), cfg_.d_ff, cfg_.norm_eps, cfg_.rope_theta};
  d.batch_invariant = sizes_.batch_invariant;
  d.quant = st.quant;
  adapter_runs(b, st.runs);
  d.lora.runs = st.runs, d.lora.scales = st.scales;
  d.lora.u = st.lora_u, d.lora.xbuf = st.lora_x, d.lora.ybuf = st.lora_y;
  const Tensor tok = first(st.tokens, N), pos = first(st.positions, N);
  copy(tok, host_view(b.tokens, DType::i32, {1, N}));
  copy(pos, host_view(b.positions, DType::i32, {1, N}));
  PagedAttention& attention = st.attention;
  attention.slots = host_view(b.slots, DType::i64, {N});
  attention.block_tables = host_view(b.block_tables, DType::i32, {S, b.max_blocks});
  attention.seq_lens = host_view(b.seq_lens, DType::i32, {S});
  attention.query_start = host_view(b.query_start, DType::i32, {S + 1});
  Tensor x = first(st.x, N), y = first(st.y, N);
  embedding_forward_at(x, tok, st.head.wte, st.head.wpe, pos);  // (1,N,C); Llama: no wpe
  const LayerActs& m = st.acts;
  LayerActs a;
  a.norm1 = first(m.norm1, N), a.q = first(m.q, N), a.k = first(m.k, N), a.v = first(m.v, N);
  a.att = first(m.att, N), a.res1 = first(m.res1, N), a.norm2 = first(m.norm2, N);
  a.fc = first(m.fc, N), a.act = first(m.act, N), a.up = first(m.up, N);
  a.moe = m.moe;  // the MoE step uses its buffers' leading rows
  const BlockFamily& f = *st.family;
  const Tensor row_pos = pos.reshape({N});
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    const MlpStep& mlp = cfg_.is_moe_layer(l) ? *st.moe_mlp : f.mlp();
    f.forward(y, x, st.w[static_cast<size_t>(l)], a, {d, attention, mlp, row_pos, l});
    std::swap(x, y);
  }
  if (R + H == 0) return st.logits.slice(0, 0, 0);  // a step of prompt chunks only: nothing wanted
  // The wanted rows, logits' first, through the final norm together (the
  // norm is per row); then the LM head over the first R only.
  const Tensor rows = rows_of(x, C), last = first(st.last, R + H), normf = first(st.normf, R + H);
  for (int64_t r = 0; r < R + H; ++r) {
    const int32_t row = r < R ? b.logit_rows[r] : b.hidden_rows[r - R];
    copy(last.slice(1, r, 1).reshape({1, C}), rows.slice(0, row, 1));
  }
  f.norm_forward(normf, Tensor(), Tensor(), last, st.head.normf_w, st.head.normf_b, d.eps);
  if (H > 0) {
    cast(st.hidden.slice(0, 0, H), rows_of(normf, C).slice(0, R, H));
    st.num_hidden = H;
  }
  const Tensor logits = st.logits.slice(0, 0, R);
  if (R > 0) block_linear(d, logits, rows_of(normf, C).slice(0, 0, R), st.head.lm_head, Tensor());  // (R, V)
  return logits;
}

Tensor PagedRunner::hidden() const { return st_->hidden.slice(0, 0, st_->num_hidden); }

}  // namespace loom::model
