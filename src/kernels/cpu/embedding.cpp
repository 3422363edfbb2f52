// Token + learned position embedding, forward and backward (ops.h), and its
// vocab-parallel shard (Megatron's VocabParallelEmbedding).
//
// The backward is a scatter-add (many (b, t) may share a token). It is made
// deterministic without atomics: the (b, t) indices are sorted by token, each
// token's rows are summed in f32 in (b, t) order by one thread, and the sum is
// added to dwte once. So every run gives the same bits for any thread count,
// and a bf16 dwte is rounded once per token rather than once per occurrence.
// A shard does the same over the tokens in its range, so the tp shards' dwte
// side by side are bitwise the full table's. dwpe by a positions tensor is the
// same scatter-add by position: for positions pos_offset + t a position's rows
// are (0, t), (1, t), ... in that order, the sums wpe_backward forms.
#include <algorithm>
#include <type_traits>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/rows.h"
#include "kernels/cpu/scratch.h"

namespace loom::kernels::cpu::LOOM_ISA {
namespace {

// Tokens accepted by check_tokens for a shard: any id >= 0 (the caller checks
// them against the whole vocabulary, ops.h).
constexpr int64_t kAnyToken = -1;

// tokens: (B, T) i32, every token in [0, V), or >= 0 for V = kAnyToken.
void check_tokens(const char* op, const Tensor& tokens, int64_t V) {
  const int32_t* tok = tokens.data_as<int32_t>();
  const int64_t T = tokens.size(1);
  for (int64_t i = 0; i < tokens.numel(); ++i) {
    if (V == kAnyToken && tok[i] < 0)
      fail(op, ": token ", tok[i], " at (b, t) = (", i / T, ", ", i % T, ") is negative: token ids are >= 0");
    if (V != kAnyToken && (tok[i] < 0 || tok[i] >= V))
      fail(op, ": token ", tok[i], " at (b, t) = (", i / T, ", ", i % T, ") is outside the vocabulary: allowed [0, ",
           V, ")");
  }
}

// positions: (B, T) i32, every one in [0, maxT).
void check_positions(const char* op, const Tensor& positions, int64_t maxT) {
  const int32_t* pos = positions.data_as<int32_t>();
  const int64_t T = positions.size(1);
  for (int64_t i = 0; i < positions.numel(); ++i)
    if (pos[i] < 0 || pos[i] >= maxT)
      fail(op, ": position ", pos[i], " at (b, t) = (", i / T, ", ", i % T,
           ") is outside the position table: allowed [0, ", maxT, ")");
}

// o = e + p in f16, through f32 (vectorised conversions, one rounding).
void add_rows_f16(f16* o, const f16* e, const f16* p, int64_t C) {
  constexpr int64_t kPiece = 256;
  alignas(64) float ef[kPiece], pf[kPiece];
  for (int64_t c0 = 0; c0 < C; c0 += kPiece) {
    const int64_t n = std::min(kPiece, C - c0);
    span_to_f32(ef, e + c0, n);
    span_to_f32(pf, p + c0, n);
    for (int64_t i = 0; i < n; ++i) ef[i] += pf[i];
    span_from_f32(o + c0, ef, n);
  }
}

// o = e + p, rounded once; a null term is zero (then o is a copy, no rounding).
template <typename E>
void embed_row(E* o, const E* e, const E* p, int64_t C) {
  if (e && p) {
    if constexpr (std::is_same_v<E, f16>) {
      add_rows_f16(o, e, p, C);
    } else {
      for (int64_t i = 0; i < C; ++i) o[i] = from_f32<E>(to_f32(e[i]) + to_f32(p[i]));
    }
  } else if (e || p) {
    const E* src = e ? e : p;
    std::copy(src, src + C, o);
  } else {
    std::fill(o, o + C, from_f32<E>(0.f));
  }
}

// y[b, t] = wte[tok - vocab_begin] (zero when tok is outside the table's
// rows) + wpe[positions ? positions[b, t] : pos_offset + t]. Operands validated.
void embed_rows(Tensor y, const Tensor& tokens, const Tensor& wte, int64_t vocab_begin, const Tensor& wpe,
                int64_t pos_offset, const int32_t* positions = nullptr) {
  const int64_t B = tokens.size(0), T = tokens.size(1), V_local = wte.size(0), C = wte.size(1);
  const int32_t* tok = tokens.data_as<int32_t>();
  dispatch_float(wte.dtype(), [&]<typename E>() {
    const E* te = wte.data_as<E>();
    const E* pe = wpe.defined() ? wpe.data_as<E>() : nullptr;
    E* out = y.data_as<E>();
#pragma omp parallel for schedule(static) if (B * T * C >= kMinParallel)
    for (int64_t bt = 0; bt < B * T; ++bt) {
      const int64_t row = static_cast<int64_t>(tok[bt]) - vocab_begin;
      const E* e = row >= 0 && row < V_local ? te + row * C : nullptr;
      const int64_t pos = positions ? positions[bt] : pos_offset + bt % T;
      embed_row(out + bt * C, e, pe ? pe + pos * C : nullptr, C);
    }
  });
}

// table[id - id_begin] += sum of dy rows with that id, over the ids in
// [id_begin, id_begin + table rows): the scatter-add of dwte by token and of
// dwpe by position.  dy: (N, C)  ids: (N)
void scatter_add_rows(Tensor table, const Tensor& dy, const int32_t* ids, int64_t N, int64_t C, int64_t id_begin) {
  const int64_t rows = table.size(0);
  // (local id, index) packed, sorted: groups by id, (b, t) order within.
  int64_t* order = thread_scratch<int64_t>(ScratchSlot::a, static_cast<size_t>(N));
  int64_t M = 0;  // rows whose id is in the table
  for (int64_t i = 0; i < N; ++i) {
    const int64_t row = static_cast<int64_t>(ids[i]) - id_begin;
    if (row >= 0 && row < rows) order[M++] = row * N + i;
  }
  std::sort(order, order + M);
  // Group g is order[starts[g], starts[g + 1]); at most M groups.
  int64_t* starts = thread_scratch<int64_t>(ScratchSlot::b, static_cast<size_t>(M) + 1);
  int64_t n_groups = 0;
  for (int64_t i = 0; i < M; ++i)
    if (i == 0 || order[i] / N != order[i - 1] / N) starts[n_groups++] = i;
  starts[n_groups] = M;
  const ThreadSlices<float> bufs(ScratchSlot::c, 2 * static_cast<size_t>(C));  // per thread: dy row, sum
#pragma omp parallel if (M * C >= kMinParallel)
  {
    float* buf = bufs.mine();
    float* acc = buf + C;
#pragma omp for schedule(dynamic, 16)
    for (int64_t g = 0; g < n_groups; ++g) {
      std::fill(acc, acc + C, 0.f);
      for (int64_t j = starts[g]; j < starts[g + 1]; ++j) {
        const float* d = load_row(dy, order[j] % N, C, buf);
        for (int64_t i = 0; i < C; ++i) acc[i] += d[i];
      }
      store_span(table, (order[starts[g]] / N) * C, C, acc, Store::add);
    }
  }
}

// dwpe[pos_offset + t] += sum over b of dy[b, t].  dy: (B, T, C)
void wpe_backward(Tensor dwpe, const Tensor& dy, int64_t B, int64_t T, int64_t C, int64_t pos_offset) {
  const ThreadSlices<float> bufs(ScratchSlot::c, 2 * static_cast<size_t>(C));  // per thread: dy row, sum
#pragma omp parallel if (B * T * C >= kMinParallel)
  {
    float* buf = bufs.mine();
    float* acc = buf + C;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      std::fill(acc, acc + C, 0.f);
      for (int64_t b = 0; b < B; ++b) {
        const float* d = load_row(dy, b * T + t, C, buf);
        for (int64_t i = 0; i < C; ++i) acc[i] += d[i];
      }
      store_span(dwpe, (pos_offset + t) * C, C, acc, Store::add);
    }
  }
}

// Both gradients of a validated backward; dwte holds rows [vocab_begin, ...).
// dwpe by positions[b, t] when they are defined, else by pos_offset + t.
void embed_backward(Tensor dwte, Tensor dwpe, const Tensor& dy, const Tensor& tokens, int64_t vocab_begin,
                    int64_t pos_offset, const Tensor& positions = Tensor()) {
  const int64_t B = tokens.size(0), T = tokens.size(1), C = dy.size(2);
  if (dwte.defined()) scatter_add_rows(dwte, dy, tokens.data_as<int32_t>(), B * T, C, vocab_begin);
  if (!dwpe.defined()) return;
  if (positions.defined()) {
    scatter_add_rows(dwpe, dy, positions.data_as<int32_t>(), B * T, C, 0);
  } else {
    wpe_backward(dwpe, dy, B, T, C, pos_offset);
  }
}

}  // namespace

// y[b, t] = wte[tokens[b, t]] + wpe[pos_offset + t]
// tokens: (B, T) i32  wte: (V, C)  wpe: (maxT, C) in wte's dtype or undefined  y: (B, T, C) in wte's dtype
void embedding_forward(Tensor y, const Tensor& tokens, const Tensor& wte, const Tensor& wpe, int64_t pos_offset) {
  check_tokens("embedding_forward", tokens, wte.size(0));
  embed_rows(y, tokens, wte, 0, wpe, pos_offset);
}

// y[b, t] = wte[tokens[b, t]] + wpe[positions[b, t]]; positions: (B, T) i32 in [0, maxT).
void embedding_forward_at(Tensor y, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                          const Tensor& positions) {
  check_tokens("embedding_forward_at", tokens, wte.size(0));
  if (wpe.defined()) check_positions("embedding_forward_at", positions, wpe.size(0));
  embed_rows(y, tokens, wte, 0, wpe, 0, positions.data_as<int32_t>());
}

// dwte += scatter-add of dy by token; dwpe[pos_offset + t] += sum over b of dy[b, t].
// dy: (B, T, C) float  dwte: (V, C), dwpe: (maxT, C), each f32, bf16, f16 or undefined.
void embedding_backward(Tensor dwte, Tensor dwpe, const Tensor& dy, const Tensor& tokens, int64_t pos_offset) {
  if (dwte.defined()) check_tokens("embedding_backward", tokens, dwte.size(0));
  embed_backward(dwte, dwpe, dy, tokens, 0, pos_offset);
}

// dwte as embedding_backward; dwpe[positions[b, t]] += dy[b, t], each position's rows summed in (b, t) order.
void embedding_backward_at(Tensor dwte, Tensor dwpe, const Tensor& dy, const Tensor& tokens,
                           const Tensor& positions) {
  if (dwte.defined()) check_tokens("embedding_backward_at", tokens, dwte.size(0));
  if (dwpe.defined()) check_positions("embedding_backward_at", positions, dwpe.size(0));
  embed_backward(dwte, dwpe, dy, tokens, 0, 0, positions);
}

// y[b, t] = (token in the shard's rows ? wte[tok - vocab_begin] : 0) + wpe[pos_offset + t]
// tokens: (B, T) i32 >= 0  wte: (V_local, C)  wpe: (maxT, C) or undefined  y: (B, T, C), in wte's dtype
void embedding_shard_forward(Tensor y, const Tensor& tokens, const Tensor& wte, int64_t vocab_begin,
                             const Tensor& wpe, int64_t pos_offset) {
  check_tokens("embedding_shard_forward", tokens, kAnyToken);
  embed_rows(y, tokens, wte, vocab_begin, wpe, pos_offset);
}

// y[b, t] = (token in the shard's rows ? wte[tok - vocab_begin] : 0) + wpe[positions[b, t]]
void embedding_shard_forward_at(Tensor y, const Tensor& tokens, const Tensor& wte, int64_t vocab_begin,
                                const Tensor& wpe, const Tensor& positions) {
  check_tokens("embedding_shard_forward_at", tokens, kAnyToken);
  if (wpe.defined()) check_positions("embedding_shard_forward_at", positions, wpe.size(0));
  embed_rows(y, tokens, wte, vocab_begin, wpe, 0, positions.data_as<int32_t>());
}

// dwte += scatter-add of dy over the tokens in the shard's rows; dwpe[pos_offset + t] += sum over b of dy[b, t].
// dy: (B, T, C) float  dwte: (V_local, C), dwpe: (maxT, C), each f32, bf16, f16 or undefined.
void embedding_shard_backward(Tensor dwte, Tensor dwpe, const Tensor& dy, const Tensor& tokens, int64_t vocab_begin,
                              int64_t pos_offset) {
  check_tokens("embedding_shard_backward", tokens, kAnyToken);
  embed_backward(dwte, dwpe, dy, tokens, vocab_begin, pos_offset);
}

// dwte as embedding_shard_backward; dwpe as embedding_backward_at.
void embedding_shard_backward_at(Tensor dwte, Tensor dwpe, const Tensor& dy, const Tensor& tokens,
                                 int64_t vocab_begin, const Tensor& positions) {
  check_tokens("embedding_shard_backward_at", tokens, kAnyToken);
  if (dwpe.defined()) check_positions("embedding_shard_backward_at", positions, dwpe.size(0));
  embed_backward(dwte, dwpe, dy, tokens, vocab_begin, 0, positions);
}

}  // namespace loom::kernels::cpu::LOOM_ISA
