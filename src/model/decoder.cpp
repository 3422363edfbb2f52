// Decoder (decoder.h): the training blocks run on views, with an attention
// step of their own. For a chunk of T tokens at positions [P, P + T), layer
// l's block writes its k, v straight into rows [P, P + T) of the cache
// (B = 1 makes those rows contiguous) and its attention step attends over
// rows [0, P + T): attention_forward with Tq = T < Tk = P + T.
#include "model/decoder.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/ops.h"
#include "model/family.h"
#include "model/steps.h"

namespace loom::model {

using namespace loom::kernels;

namespace {

// Attention against a contiguous per-layer KV cache of one sequence: the
// new tokens' k, v are the cache's rows [length - T, length) (the decoder
// points the block's k, v there), and each query attends over rows
// [0, its position]. Inference only: no backward.
class ContiguousCacheAttention final : public AttentionStep {
 public:
  std::vector<Tensor> k_cache, v_cache;  // n_layer of (1, capacity, NKV, HS)
  int64_t length = 0;                    // tokens in the cache once this chunk's are written

  void forward(const AttentionArgs& a) override {
    const size_t l = static_cast<size_t>(a.layer);
    const int64_t T = a.q.size(1);
    LOOM_CHECK(a.k.data() == k_cache[l].slice(1, length - T, T).data() &&
                   a.v.data() == v_cache[l].slice(1, length - T, T).data(),
               "layer ", a.layer, "'s new k, v are not the cache's rows ", length - T, " to ", length - 1);
    attention_forward(a.out, a.lse, a.q, k_cache[l].slice(1, 0, length), v_cache[l].slice(1, 0, length));
  }
  void backward(const AttentionArgs& a, const AttentionGrads&) override {
    LOOM_CHECK(false, "the decoder's cache attention has no backward (layer ", a.layer, "): decoding does not train");
  }
};

}  // namespace

struct DecoderState {
  std::vector<OwnedTensor> owned;
  ContiguousCacheAttention attention;  // holds the KV cache
  const BlockFamily* family = nullptr;
  LayerActs acts;                        // one layer's, for max_chunk rows: (1, max_chunk, ...)
  Tensor tokens, pos;                    // (1, max_chunk), (max_chunk) i32
  Tensor x, y;                           // (1, max_chunk, C): block input and output
  Tensor normf, logits;                  // (1, 1, C), (1, V): the last position only
  std::vector<LayerWeights> w;
  HeadWeights head;
};

namespace {

// The first T rows of a (1, rows, ...) buffer: contiguous since B = 1.
Tensor first(const Tensor& t, int64_t T) { return t.defined() ? t.slice(1, 0, T) : Tensor(); }

}  // namespace

Decoder::Decoder(const ModelConfig& cfg, const Tensor& params, Pools& pools, const DecoderSizes& sizes)
    : cfg_(cfg), specs_(param_specs(cfg)), st_(std::make_unique<DecoderState>()) {
  LOOM_REQUIRE(sizes.max_chunk >= 1, "decoder chunk ", sizes.max_chunk, " is invalid: allowed values are >= 1");
  LOOM_REQUIRE(sizes.capacity >= 0 && sizes.capacity <= cfg.max_seq_len, "decoder capacity ", sizes.capacity,
               " is invalid: allowed values are 1 to model.max_seq_len = ", cfg.max_seq_len, " (0: max_seq_len)");
  LOOM_CHECK(params.dtype() == DType::f32 && params.numel() == param_count(specs_) && params.is_contiguous(),
             "params ", params.str(), " for ", param_count(specs_), " parameters");
  capacity_ = sizes.capacity > 0 ? sizes.capacity : cfg.max_seq_len;
  max_chunk_ = std::min(sizes.max_chunk, capacity_);
  const int64_t M = max_chunk_, C = cfg.n_embd, NH = cfg.n_head, NKV = cfg.n_kv_head, HS = cfg.head_size();
  const int64_t F = cfg.d_ff;
  DecoderState& st = *st_;
  auto alloc = [&](MemTag tag, Shape shape, DType dtype = DType::f32) {
    st.owned.push_back(pools[tag].empty(dtype, shape));
    return Tensor(st.owned.back());
  };
  st.family = &block_family(cfg.family);
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    st.attention.k_cache.push_back(alloc(MemTag::kv_cache, {1, capacity_, NKV, HS}));
    st.attention.v_cache.push_back(alloc(MemTag::kv_cache, {1, capacity_, NKV, HS}));
  }
  // Inference needs no saved statistics (mean, rstd, lse stay undefined).
  LayerActs& a = st.acts;
  a.norm1 = alloc(MemTag::activations, {1, M, C});
  a.q = alloc(MemTag::activations, {1, M, NH, HS});
  a.att = alloc(MemTag::activations, {1, M, NH, HS});
  a.res1 = alloc(MemTag::activations, {1, M, C});
  a.norm2 = alloc(MemTag::activations, {1, M, C});
  a.fc = alloc(MemTag::activations, {1, M, F});
  a.act = alloc(MemTag::activations, {1, M, F});
  if (cfg.family == Family::llama) a.up = alloc(MemTag::activations, {1, M, F});
  st.tokens = alloc(MemTag::activations, {1, M}, DType::i32);
  st.pos = alloc(MemTag::activations, {M}, DType::i32);
  st.x = alloc(MemTag::activations, {1, M, C});
  st.y = alloc(MemTag::activations, {1, M, C});
  st.normf = alloc(MemTag::activations, {1, 1, C});
  st.logits = alloc(MemTag::activations, {1, cfg.vocab_size});
  const ParamViews pv(specs_, params);
  for (int64_t l = 0; l < cfg.n_layer; ++l) st.w.push_back(pv.layer(cfg, l));
  st.head = pv.head(cfg);
}

Decoder::~Decoder() = default;

Tensor Decoder::prefill(std::span<const int32_t> tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  LOOM_REQUIRE(n >= 1, "Decoder::prefill: no tokens given: allowed is at least 1");
  const char* limit = capacity() == cfg_.max_seq_len ? "model.max_seq_len" : "the decoder's capacity";
  LOOM_REQUIRE(n <= capacity() - pos_, "Decoder::prefill: ", n, " tokens do not fit the KV cache: ", pos_, " of ",
               capacity(), " positions (", limit, ") are used");
  for (int32_t t : tokens)
    LOOM_REQUIRE(t >= 0 && t < cfg_.vocab_size, "Decoder::prefill: token ", t,
                 " is outside the vocabulary: allowed ids are 0 to ", cfg_.vocab_size - 1);
  for (int64_t i = 0; i < n; i += max_chunk_) forward_chunk(tokens.subspan(i, std::min(max_chunk_, n - i)));
  return st_->logits.reshape({cfg_.vocab_size});
}

void Decoder::forward_chunk(std::span<const int32_t> tokens) {
  DecoderState& st = *st_;
  const int64_t T = static_cast<int64_t>(tokens.size()), P = pos_, C = cfg_.n_embd;
  const Dims d{1, T, C, cfg_.n_head, cfg_.n_kv_head, cfg_.head_size(), cfg_.d_ff, cfg_.norm_eps, cfg_.rope_theta};
  const Tensor tok = first(st.tokens, T), pos = st.pos.slice(0, 0, T);
  kernels::copy(tok, Tensor(const_cast<int32_t*>(tokens.data()), DType::i32, {1, T}));  // from the caller's memory
  kernels::arange(pos, P);
  Tensor x = first(st.x, T), y = first(st.y, T);
  embedding_forward(x, tok, st.head.wte, st.head.wpe, P);  // (1,T,C); Llama: no wpe
  const LayerActs& m = st.acts;
  LayerActs a;
  a.norm1 = first(m.norm1, T), a.q = first(m.q, T), a.att = first(m.att, T), a.res1 = first(m.res1, T);
  a.norm2 = first(m.norm2, T), a.fc = first(m.fc, T), a.act = first(m.act, T), a.up = first(m.up, T);
  ContiguousCacheAttention& attention = st.attention;
  attention.length = P + T;
  const BlockFamily& f = *st.family;
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    const size_t i = static_cast<size_t>(l);
    a.k = attention.k_cache[i].slice(1, P, T), a.v = attention.v_cache[i].slice(1, P, T);  // (1,T,NKV,HS)
    f.forward(y, x, st.w[i], a, {d, attention, f.mlp(), pos, l});
    std::swap(x, y);
  }
  const Tensor last = x.slice(1, T - 1, 1);  // (1,1,C)
  f.norm_forward(st.normf, Tensor(), Tensor(), last, st.head.normf_w, st.head.normf_b, d.eps);
  linear_forward(st.logits, rows_of(st.normf, C), st.head.lm_head, Tensor());  // (1, V)
  pos_ = P + T;
}

}  // namespace loom::model
