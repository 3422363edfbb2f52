// Token + learned position embedding, forward and backward (ops.h), and its
// vocab-parallel shard, as cpu/embedding.cpp computes them.
//
// Ids are checked before anything is written, with the CPU backend's
// messages: a forward checks them on the device (BadIdFlag, then the bad
// id's value is read back to name it); a backward copies them to the host
// anyway (below), and checks them there.
//
// The backward is a scatter-add made deterministic without atomics, in the
// CPU's order: the (b, t) indices are bucketed by id on the host (a counting
// sort, so each bucket keeps (b, t) order), the buckets are uploaded, and
// one block per bucket and range of columns sums its dy rows in order in f32
// and adds the sum into the table once (a 16-bit table is rounded once per
// id, not once per occurrence). So the result has the CPU's bits wherever
// the f32 adds do.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace loom::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// Threads for a block that covers C columns, one each (a multiple of 32).
int col_threads(int64_t C) { return static_cast<int>(std::clamp<int64_t>((C + 31) / 32 * 32, 32, kThreads)); }

// ---- id checks --------------------------------------------------------------------

// What an id is checked as, and its message (cpu/embedding.cpp's words).
enum class IdKind {
  token,      // in [0, V)
  any_token,  // >= 0 (a shard: the caller checks the whole vocabulary)
  position,   // in [0, maxT)
};

// The CPU backend's error for id `value` at flat index i of a (B, T) id tensor.
[[noreturn]] void fail_id(const char* op, IdKind kind, int32_t value, int64_t i, int64_t T, int64_t limit) {
  switch (kind) {
    case IdKind::any_token:
      fail(op, ": token ", value, " at (b, t) = (", i / T, ", ", i % T, ") is negative: token ids are >= 0");
    case IdKind::token:
      fail(op, ": token ", value, " at (b, t) = (", i / T, ", ", i % T, ") is outside the vocabulary: allowed [0, ",
           limit, ")");
    case IdKind::position:
      break;
  }
  fail(op, ": position ", value, " at (b, t) = (", i / T, ", ", i % T, ") is outside the position table: allowed [0, ",
       limit, ")");
}

// The range an id of `kind` must lie in: [0, limit), or [0, inf) for any_token.
int64_t id_end(IdKind kind, int64_t limit) {
  return kind == IdKind::any_token ? std::numeric_limits<int64_t>::max() : limit;
}

// Reports every index i with ids[i] outside [0, end) (the flag keeps the first).
__global__ void find_bad_ids_kernel(unsigned long long* flag, const int32_t* ids, int64_t n, int64_t end) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t v = ids[i];
    if (v < 0 || v >= end) report_bad_id(flag, i);
  }
}

// An id check enqueued on the device; raise() waits for it and throws the
// CPU's error for the first bad id. Checks are raised in the CPU's order.
class DeviceIdCheck {
 public:
  DeviceIdCheck(const char* op, IdKind kind, const Tensor& ids, int64_t limit)
      : op_(op), kind_(kind), ids_(ids), limit_(limit) {
    const int64_t n = ids.numel();
    if (n == 0) return;
    find_bad_ids_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(flag_.device(), ptr<int32_t>(ids), n,
                                                                         id_end(kind, limit));
    LOOM_CUDA_LAUNCHED();
  }
  void raise() const {
    const int64_t i = flag_.first();
    if (i < 0) return;
    int32_t value = 0;
    read_back(&value, ptr<int32_t>(ids_) + i, sizeof value);
    fail_id(op_, kind_, value, i, ids_.size(1), limit_);
  }

 private:
  const char* op_;
  IdKind kind_;
  const Tensor& ids_;
  int64_t limit_;
  BadIdFlag flag_;
};

// The ids (B, T) i32 copied to the host.
std::vector<int32_t> ids_on_host(const Tensor& ids) {
  std::vector<int32_t> h(static_cast<size_t>(ids.numel()));
  if (!h.empty()) read_back(h.data(), ids.data(), h.size() * sizeof(int32_t));
  return h;
}

// The host copy's check, the first bad id in flat order.
void check_ids(const char* op, IdKind kind, const std::vector<int32_t>& ids, int64_t T, int64_t limit) {
  const int64_t end = id_end(kind, limit);
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= end) fail_id(op, kind, ids[i], static_cast<int64_t>(i), T, limit);
}

// ---- forward ----------------------------------------------------------------------

// One block per (b, t) row: y[b, t] = e + p, rounded once, with e =
// wte[tok - vocab_begin] (zero when tok is outside the table's V_local rows)
// and p = wpe[positions ? positions[b, t] : pos_offset + t] (zero when wpe is
// null). A single term is copied as is; neither gives zeros.
template <typename T>
__global__ void embed_kernel(T* y, const int32_t* tokens, const T* wte, int64_t V_local, int64_t vocab_begin,
                             const T* wpe, int64_t pos_offset, const int32_t* positions, int64_t seq_len, int64_t C) {
  const int64_t bt = blockIdx.x;
  const int64_t row = static_cast<int64_t>(tokens[bt]) - vocab_begin;
  const T* e = row >= 0 && row < V_local ? wte + row * C : nullptr;
  const T* p = nullptr;
  if (wpe) p = wpe + (positions ? static_cast<int64_t>(positions[bt]) : pos_offset + bt % seq_len) * C;
  T* o = y + bt * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    if (e && p) o[c] = from_float<T>(to_float(e[c]) + to_float(p[c]));
    else if (e) o[c] = e[c];
    else if (p) o[c] = p[c];
    else o[c] = from_float<T>(0.f);
  }
}

// The forward of every op once its ids are checked. positions: (B, T) or undefined.
void embed_rows(Tensor y, const Tensor& tokens, const Tensor& wte, int64_t vocab_begin, const Tensor& wpe,
                int64_t pos_offset, const Tensor& positions) {
  const int64_t BT = tokens.numel(), T = tokens.size(1), C = wte.size(1);
  if (BT == 0 || C == 0) return;
  with_float_type(wte.dtype(), [&](auto tag) {
    using E = decltype(tag);
    embed_kernel<<<static_cast<unsigned>(BT), col_threads(C), 0, stream()>>>(
        ptr<E>(y), ptr<int32_t>(tokens), ptr<E>(wte), wte.size(0), vocab_begin, ptr<E>(wpe), pos_offset,
        positions.defined() ? ptr<int32_t>(positions) : nullptr, T, C);
    LOOM_CUDA_LAUNCHED();
  });
}

// ---- backward ---------------------------------------------------------------------

// table[rows[g]] += sum over j in [starts[g], starts[g + 1]) in order of
// dy[members[j]], one block per bucket g and kThreads columns (blockIdx.y).
// dy: (N, C)  table: (rows, C)
template <typename TG, typename TD>
__global__ void scatter_add_kernel(TG* table, const TD* dy, const int64_t* starts, const int64_t* rows,
                                   const int64_t* members, int64_t C) {
  const int64_t g = blockIdx.x;
  const int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float acc = 0.f;
  for (int64_t j = starts[g]; j < starts[g + 1]; ++j) acc += to_float(dy[members[j] * C + c]);
  TG* dst = table + rows[g] * C + c;
  *dst = from_float<TG>(to_float(*dst) + acc);
}

// The rows of dy bucketed by id, for the ids in [id_begin, id_begin +
// n_rows) (the others are skipped), laid out for one upload: starts (G + 1),
// rows (G), members (M). Bucket g is table row rows[g]; its members, the
// indices of dy's rows with that id, are members[starts[g], starts[g + 1])
// in index order, the (b, t) order the CPU sums in.
struct Buckets {
  std::vector<int64_t> buf;
  int64_t G = 0;  // buckets: table rows with at least one member
};

Buckets make_buckets(const std::vector<int32_t>& ids, int64_t id_begin, int64_t n_rows) {
  const int64_t N = static_cast<int64_t>(ids.size());
  Buckets out;
  // Counting sort: start[r] is where row r's members begin.
  std::vector<int64_t> start(static_cast<size_t>(n_rows) + 1, 0);
  for (int64_t i = 0; i < N; ++i) {
    const int64_t r = static_cast<int64_t>(ids[i]) - id_begin;
    if (r >= 0 && r < n_rows) ++start[r + 1];
  }
  for (int64_t r = 0; r < n_rows; ++r) start[r + 1] += start[r];
  const int64_t M = start[n_rows];
  if (M == 0) return out;
  int64_t G = 0;
  for (int64_t r = 0; r < n_rows; ++r) G += start[r + 1] > start[r];
  out.G = G;
  out.buf.resize(static_cast<size_t>(2 * G + 1 + M));
  int64_t* starts = out.buf.data();
  int64_t* rows = starts + G + 1;
  int64_t* members = rows + G;
  for (int64_t r = 0, g = 0; r < n_rows; ++r) {
    if (start[r + 1] == start[r]) continue;
    starts[g] = start[r];
    rows[g] = r;
    ++g;
  }
  starts[G] = M;
  for (int64_t i = 0; i < N; ++i) {  // start[r] becomes row r's next free slot
    const int64_t r = static_cast<int64_t>(ids[i]) - id_begin;
    if (r >= 0 && r < n_rows) members[start[r]++] = i;
  }
  return out;
}

// The buckets on the device (empty when there are none). The copy may still
// read b.buf after returning: the caller keeps it until the stream is
// synchronised.
DeviceTemp upload(const Buckets& b) {
  DeviceTemp dev(b.buf.size() * sizeof(int64_t));
  if (!b.buf.empty())
    LOOM_CUDA_CHECK(cudaMemcpyAsync(dev.as<void>(), b.buf.data(), b.buf.size() * sizeof(int64_t),
                                    cudaMemcpyHostToDevice, stream()));
  return dev;
}

// table[rows[g]] += the sum of bucket g's dy rows, for every bucket.
// dy: (N, C)  table: (n_rows, C)  dev: b uploaded
void scatter_add_rows(Tensor table, const Tensor& dy, const Buckets& b, const DeviceTemp& dev) {
  const int64_t C = table.size(1), G = b.G;
  if (G == 0 || C == 0) return;
  const int64_t* starts = dev.as<int64_t>();
  const int threads = col_threads(C);
  const dim3 grid(static_cast<unsigned>(G), static_cast<unsigned>((C + threads - 1) / threads));
  with_float_type(table.dtype(), [&](auto tg) {
    with_float_type(dy.dtype(), [&](auto td) {
      using TG = decltype(tg);
      using TD = decltype(td);
      scatter_add_kernel<<<grid, threads, 0, stream()>>>(ptr<TG>(table), ptr<TD>(dy), starts, starts + G + 1,
                                                         starts + 2 * G + 1, C);
      LOOM_CUDA_LAUNCHED();
    });
  });
}

// dwpe[pos_offset + t] += sum over b in order of dy[b, t]; one block per t
// and kThreads columns.  dy: (B, T, C)
template <typename TG, typename TD>
__global__ void wpe_backward_kernel(TG* dwpe, const TD* dy, int64_t B, int64_t T, int64_t C, int64_t pos_offset) {
  const int64_t t = blockIdx.x;
  const int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float acc = 0.f;
  for (int64_t b = 0; b < B; ++b) acc += to_float(dy[(b * T + t) * C + c]);
  TG* dst = dwpe + (pos_offset + t) * C + c;
  *dst = from_float<TG>(to_float(*dst) + acc);
}

void wpe_backward(Tensor dwpe, const Tensor& dy, int64_t pos_offset) {
  const int64_t B = dy.size(0), T = dy.size(1), C = dy.size(2);
  if (B * T == 0 || C == 0) return;
  const int threads = col_threads(C);
  const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>((C + threads - 1) / threads));
  with_float_type(dwpe.dtype(), [&](auto tg) {
    with_float_type(dy.dtype(), [&](auto td) {
      using TG = decltype(tg);
      using TD = decltype(td);
      wpe_backward_kernel<<<grid, threads, 0, stream()>>>(ptr<TG>(dwpe), ptr<TD>(dy), B, T, C, pos_offset);
      LOOM_CUDA_LAUNCHED();
    });
  });
}

// Every backward: checks the ids it reads on the host in the CPU's order
// (tokens when check_tokens, then positions when dwpe and positions are
// defined), then dwte (rows from vocab_begin) and dwpe (by positions when
// defined, else by pos_offset + t). Nothing is written before the checks.
void embed_backward(const char* op, Tensor dwte, Tensor dwpe, const Tensor& dy, const Tensor& tokens,
                    IdKind token_kind, bool check_tokens, int64_t vocab_begin, int64_t pos_offset,
                    const Tensor& positions) {
  const int64_t T = tokens.size(1);
  std::vector<int32_t> tok, pos;
  if (check_tokens || dwte.defined()) tok = ids_on_host(tokens);
  if (check_tokens) check_ids(op, token_kind, tok, T, dwte.defined() ? dwte.size(0) : 0);
  const bool by_positions = dwpe.defined() && positions.defined();
  if (by_positions) {
    pos = ids_on_host(positions);
    check_ids(op, IdKind::position, pos, T, dwpe.size(0));
  }
  Buckets tok_buckets, pos_buckets;
  if (dwte.defined()) tok_buckets = make_buckets(tok, vocab_begin, dwte.size(0));
  if (by_positions) pos_buckets = make_buckets(pos, 0, dwpe.size(0));
  const DeviceTemp tok_dev = upload(tok_buckets), pos_dev = upload(pos_buckets);
  // The host buckets may be freed when this returns: let the copies finish
  // (nothing else is queued: reading the ids waited for the stream).
  if (!tok_buckets.buf.empty() || !pos_buckets.buf.empty()) LOOM_CUDA_CHECK(cudaStreamSynchronize(stream()));
  if (dwte.defined()) scatter_add_rows(dwte, dy, tok_buckets, tok_dev);
  if (!dwpe.defined()) return;
  if (by_positions) scatter_add_rows(dwpe, dy, pos_buckets, pos_dev);
  else wpe_backward(dwpe, dy, pos_offset);
}

}  // namespace

// y[b, t] = wte[tokens[b, t]] + wpe[pos_offset + t]
// tokens: (B, T) i32  wte: (V, C)  wpe: (maxT, C) in wte's dtype or undefined  y: (B, T, C) in wte's dtype
void embedding_forward(Tensor y, const Tensor& tokens, const Tensor& wte, const Tensor& wpe, int64_t pos_offset) {
  constexpr const char* op = "embedding_forward";
  DeviceIdCheck(op, IdKind::token, tokens, wte.size(0)).raise();
  embed_rows(y, tokens, wte, 0, wpe, pos_offset, Tensor());
}

// y[b, t] = wte[tokens[b, t]] + wpe[positions[b, t]]; positions: (B, T) i32 in [0, maxT).
void embedding_forward_at(Tensor y, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                          const Tensor& positions) {
  constexpr const char* op = "embedding_forward_at";
  const DeviceIdCheck token_check(op, IdKind::token, tokens, wte.size(0));
  if (wpe.defined()) {
    const DeviceIdCheck position_check(op, IdKind::position, positions, wpe.size(0));
    token_check.raise();
    position_check.raise();
  } else {
    token_check.raise();
  }
  embed_rows(y, tokens, wte, 0, wpe, 0, positions);
}

// dwte += scatter-add of dy by token; dwpe[pos_offset + t] += sum over b of dy[b, t].
void embedding_backward(Tensor dwte, Tensor dwpe, const Tensor& dy, const Tensor& tokens, int64_t pos_offset) {
  embed_backward("embedding_backward", dwte, dwpe, dy, tokens, IdKind::token, dwte.defined(), 0, pos_offset,
                 Tensor());
}

// dwte as embedding_backward; dwpe[positions[b, t]] += dy[b, t], each position's rows summed in (b, t) order.
void embedding_backward_at(Tensor dwte, Tensor dwpe, const Tensor& dy, const Tensor& tokens,
                           const Tensor& positions) {
  embed_backward("embedding_backward_at", dwte, dwpe, dy, tokens, IdKind::token, dwte.defined(), 0, 0, positions);
}

// y[b, t] = (token in the shard's rows ? wte[tok - vocab_begin] : 0) + wpe[pos_offset + t]
void embedding_shard_forward(Tensor y, const Tensor& tokens, const Tensor& wte, int64_t vocab_begin,
                             const Tensor& wpe, int64_t pos_offset) {
  constexpr const char* op = "embedding_shard_forward";
  DeviceIdCheck(op, IdKind::any_token, tokens, 0).raise();
  embed_rows(y, tokens, wte, vocab_begin, wpe, pos_offset, Tensor());
}

// y[b, t] = (token in the shard's rows ? wte[tok - vocab_begin] : 0) + wpe[positions[b, t]]
void embedding_shard_forward_at(Tensor y, const Tensor& tokens, const Tensor& wte, int64_t vocab_begin,
                                const Tensor& wpe, const Tensor& positions) {
  constexpr const char* op = "embedding_shard_forward_at";
  const DeviceIdCheck token_check(op, IdKind::any_token, tokens, 0);
  if (wpe.defined()) {
    const DeviceIdCheck position_check(op, IdKind::position, positions, wpe.size(0));
    token_check.raise();
    position_check.raise();
  } else {
    token_check.raise();
  }
  embed_rows(y, tokens, wte, vocab_begin, wpe, 0, positions);
}

// dwte += scatter-add of dy over the tokens in the shard's rows; dwpe[pos_offset + t] += sum over b of dy[b, t].
void embedding_shard_backward(Tensor dwte, Tensor dwpe, const Tensor& dy, const Tensor& tokens, int64_t vocab_begin,
                              int64_t pos_offset) {
  embed_backward("embedding_shard_backward", dwte, dwpe, dy, tokens, IdKind::any_token, true, vocab_begin,
                 pos_offset, Tensor());
}

// dwte as embedding_shard_backward; dwpe as embedding_backward_at.
void embedding_shard_backward_at(Tensor dwte, Tensor dwpe, const Tensor& dy, const Tensor& tokens,
                                 int64_t vocab_begin, const Tensor& positions) {
  embed_backward("embedding_shard_backward_at", dwte, dwpe, dy, tokens, IdKind::any_token, true, vocab_begin, 0,
                 positions);
}

}  // namespace loom::kernels::cuda
