// Ring and all-gather attention over the cp group (cp.h).
//
// A rank's tensors hold its chunks one after the other along T; here they
// are packed chunk-major, (chunks, B, chunk, heads, HS), so that each chunk
// is a contiguous tensor the kernel takes as it is. K and V travel as one
// buffer: (2·chunks, B, chunk, NKV, HS), keys first.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <utility>

#include "core/error.h"
#include "kernels/ops.h"
#include "parallel/cp.h"

namespace loom::parallel {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kKvTag = 71, kDkvTag = 72;  // the ring's two streams between neighbours

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The bytes of a contiguous tensor as the communicator moves them: f16 as
// bf16 of the same size (sends and gathers only copy; no reduction sees it).
Tensor wire(const Tensor& t) { return comm::copy_view(t).flatten(); }

// Chunk i of a packed tensor: (B, chunk, heads, HS) or (B, heads, chunk), contiguous.
Tensor part(const Tensor& packed, int64_t i) {
  const Shape& s = packed.shape();
  Shape rest;
  if (s.ndim() == 5) rest = Shape{s[1], s[2], s[3], s[4]};
  else rest = Shape{s[1], s[2], s[3]};
  return packed.slice(0, i, 1).reshape(rest);
}

// y (contiguous f32, (B, T, heads, HS)) rows [t0, t0 + n) += x (contiguous
// f32, (B, n, heads, HS)): one add per sequence, whose rows are contiguous.
void add_rows(const Tensor& y, int64_t t0, const Tensor& x) {
  for (int64_t b = 0; b < x.size(0); ++b) {
    const Tensor yb = y.slice(0, b, 1).slice(1, t0, x.size(1));
    kernels::add(yb, yb, x.slice(0, b, 1));
  }
}

}  // namespace

const char* cp_algo_name(CpAlgo a) { return a == CpAlgo::ring ? "ring" : "allgather"; }

CpAlgo cp_algo_from_name(std::string_view name) {
  if (name == "ring") return CpAlgo::ring;
  if (name == "allgather") return CpAlgo::allgather;
  throw Error(concat("cp_algo = '", name, "' is not known: allowed values are ring and allgather"));
}

std::vector<SeqChunk> CpSplit::segments(int rank) const {
  const int64_t c = chunk();
  if (!zigzag) return {{rank * c, c}};
  return {{rank * c, c}, {(2 * cp - 1 - rank) * c, c}};
}

int64_t CpSplit::position(int rank, int64_t t) const {
  const int64_t c = chunk();
  const std::vector<SeqChunk> s = segments(rank);
  return s[static_cast<size_t>(t / c)].start + t % c;
}

CpSplit cp_split(int64_t T, int cp, bool zigzag) {
  LOOM_REQUIRE(cp >= 1, "cp = ", cp, ": the context-parallel group has at least one rank");
  const int64_t parts = zigzag ? 2 * int64_t{cp} : cp;
  LOOM_REQUIRE(T >= parts && T % parts == 0, "seq_len = ", T, " cannot be split over cp = ", cp,
               zigzag ? " in zig-zag order" : "", ": it must be a multiple of ", parts,
               zigzag ? " (2 * cp chunks, two per rank)" : " (one chunk per rank)");
  return {cp, zigzag, T};
}

// What one forward or backward call works on.
struct ContextParallelAttention::Call {
  int64_t B = 0, c = 0, nseg = 0, NH = 0, NKV = 0, HS = 0;
  DType dtype = DType::f32;
  std::vector<std::vector<SeqChunk>> segs;  // every rank's chunks
  int rank = 0;
  OwnedTensor q, kv;                       // packed
  OwnedTensor acc_out, acc_lse, tmp_out, tmp_lse, tmp32;  // forward
  OwnedTensor out, dout, lse, dq;                         // backward

  Shape kv_shape() const { return {2 * nseg, B, c, NKV, HS}; }
  Shape q_shape() const { return {nseg, B, c, NH, HS}; }
};

ContextParallelAttention::ContextParallelAttention(comm::Communicator& cp, CpAlgo algo, bool zigzag, Pools& pools)
    : cp_(cp), algo_(algo), zigzag_(zigzag), pools_(pools) {}

void ContextParallelAttention::wait(const comm::WorkPtr& w) {
  if (!w) return;
  TraceSpan span(trace_, "cp wait");
  const Clock::time_point t0 = Clock::now();
  w->wait();
  stats_.wait_s += seconds_since(t0);
}


ContextParallelAttention::CallBytes ContextParallelAttention::call_bytes(int64_t B, int64_t local_tokens, int64_t NH,
                                                                         int64_t NKV, int64_t HS, DType compute, int cp,
                                                                         CpAlgo algo, bool zigzag) {
  const int64_t e = static_cast<int64_t>(dtype_size(compute)), f = 4;  // bytes of an element, of an f32
  const int64_t QN = B * local_tokens * NH * HS, KV = 2 * B * local_tokens * NKV * HS, LN = B * NH * local_tokens;
  const int64_t chunks = zigzag ? 2 : 1;
  const bool ring = algo == CpAlgo::ring, alone = cp == 1;
  CallBytes b;
  // forward: workspace q, the f32 running out and lse, one block's out and
  // lse (and its f32 copy); comm kv and the block in flight, or every rank's
  b.forward_workspace = QN * e + QN * f + LN * f + QN / chunks * e + LN / chunks * f;
  if (compute != DType::f32) b.forward_workspace += QN / chunks * f;
  b.forward_comm = KV * e + (ring ? (alone ? 0 : KV * e) : cp * KV * e);
  // backward: workspace q, out, dout (f32), lse, dq, this rank's dkv; comm
  // kv and in flight: kv, dkv in, two out (or every rank's kv and dkv)
  b.backward_workspace = QN * e + QN * e + QN * f + LN * f + QN * f + KV * f;
  b.backward_comm = KV * e + (ring ? (alone ? 0 : KV * e + 3 * KV * f) : cp * KV * (e + f));
  return b;
}

int64_t ContextParallelAttention::peak_bytes(int64_t B, int64_t local_tokens, int64_t NH, int64_t NKV, int64_t HS,
                                             DType compute, int cp, CpAlgo algo, bool zigzag) {
  const CallBytes b = call_bytes(B, local_tokens, NH, NKV, HS, compute, cp, algo, zigzag);
  return std::max(b.forward_workspace + b.forward_comm, b.backward_workspace + b.backward_comm);
}

// The call's geometry, and the rank's q, k and v packed.
void ContextParallelAttention::begin(Call& c, const model::AttentionArgs& a) {
  LOOM_CHECK(a.q.ndim() == 4 && a.k.ndim() == 4 && a.k.size(1) == a.q.size(1), "cp attention: q ", a.q.str(),
             " and k ", a.k.str(), " must hold the same tokens");
  const CpSplit sp = split(a.q.size(1));
  c.B = a.q.size(0), c.NH = a.q.size(2), c.HS = a.q.size(3), c.NKV = a.k.size(2);
  c.c = sp.chunk(), c.nseg = zigzag_ ? 2 : 1, c.dtype = a.q.dtype(), c.rank = cp_.rank();
  for (int r = 0; r < cp_.size(); ++r) c.segs.push_back(sp.segments(r));
  c.q = pools_[MemTag::workspace].empty(c.dtype, c.q_shape());
  c.kv = pools_[MemTag::comm].empty(c.dtype, c.kv_shape());
  for (int64_t i = 0; i < c.nseg; ++i) {
    kernels::copy(part(c.q, i), a.q.slice(1, i * c.c, c.c));
    kernels::copy(part(c.kv, i), a.k.slice(1, i * c.c, c.c));
    kernels::copy(part(c.kv, c.nseg + i), a.v.slice(1, i * c.c, c.c));
  }
}

void ContextParallelAttention::forward(const model::AttentionArgs& a) {
  Call c;
  begin(c, a);
  Pool& work = pools_[MemTag::workspace];
  c.acc_out = work.zeros(DType::f32, c.q_shape());
  c.acc_lse = work.empty(DType::f32, {c.nseg, c.B, c.NH, c.c});
  kernels::fill(c.acc_lse, -std::numeric_limits<float>::infinity());
  c.tmp_out = work.empty(c.dtype, {c.B, c.c, c.NH, c.HS});
  c.tmp_lse = work.empty(DType::f32, {c.B, c.NH, c.c});
  if (c.dtype != DType::f32) c.tmp32 = work.empty(DType::f32, {c.B, c.c, c.NH, c.HS});
  if (algo_ == CpAlgo::ring) {
    ring_forward(c);
  } else {
    const int64_t N = c.kv.numel();
    OwnedTensor all = pools_[MemTag::comm].empty(c.dtype, {cp_.size() * N});
    stats_.bytes_sent += static_cast<int64_t>(c.kv.nbytes()) * (cp_.size() - 1);
    wait(cp_.all_gather(wire(all), wire(c.kv)));
    for (int s = 0; s < cp_.size(); ++s) {
      const int src = (c.rank - s + cp_.size()) % cp_.size();
      forward_blocks(c, all.slice(0, src * N, N).reshape(c.kv_shape()), src);
    }
  }
  for (int64_t i = 0; i < c.nseg; ++i) {
    if (c.dtype == DType::f32) {
      kernels::copy(a.out.slice(1, i * c.c, c.c), part(c.acc_out, i));
    } else {
      kernels::cast(c.tmp_out, part(c.acc_out, i));
      kernels::copy(a.out.slice(1, i * c.c, c.c), c.tmp_out);
    }
    if (a.lse.defined()) kernels::copy(a.lse.slice(2, i * c.c, c.c), part(c.acc_lse, i));
  }
}

namespace {

// fn(i, j, q_pos) for every (query chunk i of this rank, key chunk j of
// rank src) that is not wholly in the queries' future; q_pos: where the
// query chunk starts, counted from the key chunk's start. Chunks never
// straddle: a key chunk starts at or before a query chunk, or after its end.
template <typename Fn>
void each_block(const std::vector<SeqChunk>& mine, const std::vector<SeqChunk>& theirs, Fn&& fn) {
  for (size_t i = 0; i < mine.size(); ++i)
    for (size_t j = 0; j < theirs.size(); ++j)
      if (theirs[j].start <= mine[i].start)
        fn(static_cast<int64_t>(i), static_cast<int64_t>(j), mine[i].start - theirs[j].start);
}

}  // namespace

// Block src's attention, merged into the running result.
void ContextParallelAttention::forward_blocks(Call& c, const Tensor& kv, int src) {
  TraceSpan span(trace_, "cp forward block");
  const Clock::time_point t0 = Clock::now();
  each_block(c.segs[static_cast<size_t>(c.rank)], c.segs[static_cast<size_t>(src)],
             [&](int64_t i, int64_t j, int64_t q_pos) {
               kernels::attention_forward(c.tmp_out, c.tmp_lse, part(c.q, i), part(kv, j), part(kv, c.nseg + j),
                                          q_pos);
               if (c.dtype != DType::f32) kernels::cast(c.tmp32, c.tmp_out);
               kernels::attention_merge(part(c.acc_out, i), part(c.acc_lse, i),
                                        c.dtype == DType::f32 ? Tensor(c.tmp_out) : Tensor(c.tmp32), c.tmp_lse);
               ++stats_.blocks;
             });
  stats_.compute_s += seconds_since(t0);
}

// K and V around the ring: block s comes from rank r - s; the transfer of
// the next is in flight while this one is computed.
void ContextParallelAttention::ring_forward(Call& c) {
  const int n = cp_.size(), next = (c.rank + 1) % n, prev = (c.rank + n - 1) % n;
  OwnedTensor spare = n > 1 ? pools_[MemTag::comm].empty(c.dtype, c.kv_shape()) : OwnedTensor();
  Tensor cur = c.kv, nxt = spare;
  for (int s = 0; s < n; ++s) {
    comm::WorkPtr send, recv;
    if (s + 1 < n) {
      TraceSpan span(trace_, "cp post kv");
      send = cp_.send(wire(cur), next, kKvTag);
      recv = cp_.recv(wire(nxt), prev, kKvTag);
      stats_.bytes_sent += static_cast<int64_t>(cur.nbytes());
    }
    forward_blocks(c, cur, (c.rank - s + n) % n);
    if (send) {
      wait(recv);
      wait(send);
      std::swap(cur, nxt);
    }
  }
}

void ContextParallelAttention::backward(const model::AttentionArgs& a, const model::AttentionGrads& g) {
  LOOM_CHECK(a.lse.defined() && g.dq.is_contiguous() && g.dk.is_contiguous() && g.dv.is_contiguous() &&
                 g.dq.dtype() == DType::f32 && g.dk.dtype() == DType::f32 && g.dv.dtype() == DType::f32,
             "cp attention backward: needs the forward's lse and contiguous f32 gradients");
  Call c;
  begin(c, a);
  Pool& work = pools_[MemTag::workspace];
  c.out = work.empty(a.out.dtype(), c.q_shape());
  c.dout = work.empty(g.dout.dtype(), c.q_shape());
  c.lse = work.empty(DType::f32, {c.nseg, c.B, c.NH, c.c});
  c.dq = work.zeros(DType::f32, c.q_shape());
  for (int64_t i = 0; i < c.nseg; ++i) {
    kernels::copy(part(c.out, i), a.out.slice(1, i * c.c, c.c));
    kernels::copy(part(c.dout, i), g.dout.slice(1, i * c.c, c.c));
    kernels::copy(part(c.lse, i), a.lse.slice(2, i * c.c, c.c));
  }
  OwnedTensor dkv = work.zeros(DType::f32, c.kv_shape());  // the gradients of this rank's own K and V
  if (algo_ == CpAlgo::ring) {
    ring_backward(c, dkv);
  } else {
    const int n = cp_.size();
    const int64_t N = c.kv.numel();
    OwnedTensor all = pools_[MemTag::comm].empty(c.dtype, {n * N});
    OwnedTensor dall = pools_[MemTag::comm].zeros(DType::f32, {n * N});
    stats_.bytes_sent += (static_cast<int64_t>(c.kv.nbytes()) + N * 4) * (n - 1);
    wait(cp_.all_gather(wire(all), wire(c.kv)));
    for (int s = 0; s < n; ++s) {
      const int src = (c.rank - s + n) % n;
      backward_blocks(c, all.slice(0, src * N, N).reshape(c.kv_shape()),
                      dall.slice(0, src * N, N).reshape(c.kv_shape()), src);
    }
    wait(cp_.reduce_scatter(dkv.flatten(), dall, comm::ReduceOp::sum));
  }
  for (int64_t i = 0; i < c.nseg; ++i) {
    add_rows(g.dq, i * c.c, part(c.dq, i));
    add_rows(g.dk, i * c.c, part(dkv, i));
    add_rows(g.dv, i * c.c, part(dkv, c.nseg + i));
  }
}

// Block src's share of the gradients: dq (local) and dkv (the block's) +=.
void ContextParallelAttention::backward_blocks(Call& c, const Tensor& kv, const Tensor& dkv, int src) {
  TraceSpan span(trace_, "cp backward block");
  const Clock::time_point t0 = Clock::now();
  each_block(c.segs[static_cast<size_t>(c.rank)], c.segs[static_cast<size_t>(src)],
             [&](int64_t i, int64_t j, int64_t q_pos) {
               kernels::attention_backward(part(c.dq, i), part(dkv, j), part(dkv, c.nseg + j), part(c.dout, i),
                                           part(c.q, i), part(kv, j), part(kv, c.nseg + j), part(c.out, i),
                                           part(c.lse, i), q_pos);
               ++stats_.blocks;
             });
  stats_.compute_s += seconds_since(t0);
}

// K and V around the ring again; each block's dK and dV travel with it, the
// rank holding the block adding its share before passing them on, and
// reach the block's owner one hop after its last use.
void ContextParallelAttention::ring_backward(Call& c, const Tensor& dkv_own) {
  const int n = cp_.size(), next = (c.rank + 1) % n, prev = (c.rank + n - 1) % n;
  if (n == 1) return backward_blocks(c, c.kv, dkv_own, c.rank);
  Pool& comm = pools_[MemTag::comm];
  OwnedTensor spare = comm.empty(c.dtype, c.kv_shape()), in = comm.empty(DType::f32, c.kv_shape());
  OwnedTensor acc[2] = {comm.empty(DType::f32, c.kv_shape()), comm.empty(DType::f32, c.kv_shape())};
  Tensor cur = c.kv, nxt = spare;
  comm::WorkPtr sending;
  // Each rank sends its neighbour K, V of step s, then (after the step's
  // blocks) their dK, dV so far; the receives are posted in that same order
  // (dK, dV of step s - 1 before K, V of step s), since NCCL matches the
  // messages between two ranks in the order they are issued, not by tag.
  for (int s = 0; s < n; ++s) {
    comm::WorkPtr kv_send, kv_recv, incoming;
    if (s > 0) incoming = cp_.recv(in.flatten(), prev, kDkvTag);  // block src's dK, dV so far
    if (s + 1 < n) {
      kv_send = cp_.send(wire(cur), next, kKvTag);
      kv_recv = cp_.recv(wire(nxt), prev, kKvTag);
      stats_.bytes_sent += static_cast<int64_t>(cur.nbytes());
    }
    const Tensor mine = acc[s % 2];  // its send (two steps ago) was waited for last step
    kernels::fill(mine, 0.f);
    backward_blocks(c, cur, mine, (c.rank - s + n) % n);
    if (incoming) {
      wait(incoming);
      kernels::add(mine, mine, in);
    }
    wait(sending);
    sending = cp_.send(mine.flatten(), next, kDkvTag);
    stats_.bytes_sent += static_cast<int64_t>(mine.nbytes());
    if (kv_send) {
      wait(kv_recv);
      wait(kv_send);
      std::swap(cur, nxt);
    }
  }
  wait(cp_.recv(dkv_own.flatten(), prev, kDkvTag));  // this rank's block, every rank's share in it
  wait(sending);
}

}  // namespace loom::parallel
