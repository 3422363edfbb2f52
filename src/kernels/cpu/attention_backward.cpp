// Causal flash attention backward on the CPU (ops.h): FlashAttention-2 (Dao
// 2023), Algorithm 2. P is recomputed per tile from the saved lse, so no
// (T, T) matrix exists:
//   D = rowsum(dO * O)   P = exp(S - lse)   dV += P^T dO   dP = dO V^T
//   dS = P * (dP - D)    dQ += dS K * scale   dK += dS^T Q * scale
// Each task owns one (b, kv head) and every query head that reads it (GQA),
// so all of dk, dv and dq it touches are its own: no atomics, and the result
// does not depend on the thread count. Gradients are summed in f32 scratch
// and added (+=) to dq, dk, dv once at the end of the task.
#include <omp.h>

#include <algorithm>
#include <utility>

#include "kernels/cpu/attention_tiles.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/cpu_ops.h"

namespace loom::kernels::cpu::LOOM_ISA {
namespace {

using namespace attention;

struct BackwardArgs {
  Tensor dq, dk, dv;
  Rows dout, q, k, v, out;
  const float* lse;  // (B, NH, Tq)
  Geometry g;
};

// One thread's f32 scratch for its backward tasks, laid out in a slice of
// ThreadSlices. Every size is a multiple of kBlockQ or kBlockK floats (64),
// so every array starts 64-byte aligned.
struct BackwardTiles {
  // Whole sequences of one head, (Tq_pad or Tk_pad, HSp): q is pre-scaled,
  // dq / dk / dv accumulate over the task. D: (Tq_pad).
  float *q, *dout, *dq, *dk, *dv, *D;
  float *k, *kt, *vt, *p, *ds;  // tiles of one key block / (query, key) pair
  int64_t nq, nk;  // floats in q, dout, dq and in dk, dv
  int64_t floats = 0;  // the total
  // Lays the arrays out from base, or only counts them (floats) when base is null.
  BackwardTiles(const Geometry& g, int64_t Tq_pad, int64_t Tk_pad, float* base)
      : nq(Tq_pad * g.HSp), nk(Tk_pad * g.HSp) {
    const std::pair<float**, int64_t> parts[] = {
        {&q, nq}, {&dout, nq}, {&dq, nq}, {&dk, nk}, {&dv, nk}, {&D, Tq_pad}, {&k, kBlockK * g.HSp},
        {&kt, g.HSp * kBlockK}, {&vt, g.HSp * kBlockK}, {&p, kBlockQ * kBlockK}, {&ds, kBlockQ * kBlockK}};
    for (const auto& [ptr, n] : parts) {
      *ptr = base ? base + floats : nullptr;
      floats += n;
    }
  }
};

// p[r, c] = exp(p[r, c] - lse[r]) where key j0 + c is visible to query row r
// (position off + q0 + r), else 0; padded rows r >= rows are all 0.
void probabilities(float* p, const float* lse, const Geometry& g, int64_t q0, int64_t rows, int64_t mr, int64_t j0,
                   int64_t cols, int64_t nc) {
  for (int64_t r = 0; r < mr; ++r) {
    float* s = p + r * kBlockK;
    const int64_t limit = r < rows ? std::clamp<int64_t>(g.off + q0 + r - j0 + 1, 0, cols) : 0;
    const float m = r < rows ? lse[r] : 0.f;
    for (int64_t c = 0; c < limit; ++c) s[c] = exp_f32(s[c] - m);
    std::fill(s + limit, s + nc, 0.f);
  }
}

// All query blocks of head h against key block [j0, j0 + cols); w.k, w.kt,
// w.vt hold that block.
void backward_key_block(const BackwardArgs& a, BackwardTiles& w, const float* lse, int64_t j0, int64_t cols) {
  const Geometry& g = a.g;
  const int64_t HSp = g.HSp, nc = round_up(cols, kTileLanes), mc = round_up(cols, kRowBlock);
  // Queries before position j0 see none of these keys.
  for (int64_t q0 = std::max<int64_t>(0, j0 - g.off) / kBlockQ * kBlockQ; q0 < g.Tq; q0 += kBlockQ) {
    const int64_t rows = std::min(kBlockQ, g.Tq - q0), mr = round_up(rows, kRowBlock);
    const float* qi = w.q + q0 * HSp;
    const float* doi = w.dout + q0 * HSp;
    float* p = w.p;
    float* ds = w.ds;
    gemm_tile(p, kBlockK, {qi, HSp}, {w.kt, kBlockK}, mr, nc, g.HS, Store::write);  // S = Q K^T (q scaled)
    probabilities(p, lse + q0, g, q0, rows, mr, j0, cols, nc);
    if (a.dv.defined())  // dV += P^T dO
      gemm_tile(w.dv + j0 * HSp, HSp, {p, 1, kBlockK}, {doi, HSp}, mc, HSp, rows, Store::add);
    gemm_tile(ds, kBlockK, {doi, HSp}, {w.vt, kBlockK}, mr, nc, g.HS, Store::write);  // dP = dO V^T
    for (int64_t r = 0; r < mr; ++r) {
      const float D = w.D[q0 + r];
      for (int64_t c = 0; c < nc; ++c) ds[r * kBlockK + c] = p[r * kBlockK + c] * (ds[r * kBlockK + c] - D);
    }
    if (a.dk.defined())  // dK += dS^T (Q * scale)
      gemm_tile(w.dk + j0 * HSp, HSp, {ds, 1, kBlockK}, {qi, HSp}, mc, HSp, rows, Store::add);
    if (a.dq.defined())  // dQ += dS K   (times scale when added to dq)
      gemm_tile(w.dq + q0 * HSp, HSp, {ds, kBlockK}, {w.k, HSp}, mr, HSp, cols, Store::add);
  }
}

// Query head h of batch b: loads q, dout and D, runs every key block.
void backward_head(const BackwardArgs& a, BackwardTiles& w, int64_t b, int64_t h, int64_t Tq_pad) {
  const Geometry& g = a.g;
  const int64_t HSp = g.HSp, kvh = h / g.group();
  load_tile(w.q, HSp, a.q, b, 0, g.Tq, Tq_pad, h, HSp, g.scale);
  load_tile(w.dout, HSp, a.dout, b, 0, g.Tq, Tq_pad, h, HSp);
  load_tile(w.dq, HSp, a.out, b, 0, g.Tq, Tq_pad, h, HSp);  // out, borrowing dq's scratch
  for (int64_t t = 0; t < Tq_pad; ++t) {
    float D = 0.f;
    for (int64_t d = 0; d < HSp; ++d) D += w.dout[t * HSp + d] * w.dq[t * HSp + d];
    w.D[t] = D;
  }
  std::fill_n(w.dq, w.nq, 0.f);
  const float* lse = a.lse + (b * g.NH + h) * g.Tq;
  for (int64_t j0 = 0; j0 < g.Tk; j0 += kBlockK) {
    const int64_t cols = std::min(kBlockK, g.Tk - j0);
    load_tile(w.k, HSp, a.k, b, j0, cols, round_up(cols, kRowBlock), kvh, HSp);
    load_tile_t(w.kt, kBlockK, a.k, b, j0, cols, round_up(cols, kTileLanes), kvh);
    load_tile_t(w.vt, kBlockK, a.v, b, j0, cols, round_up(cols, kTileLanes), kvh);
    backward_key_block(a, w, lse, j0, cols);
  }
  if (a.dq.defined()) add_tile(a.dq, w.dq, HSp, b, 0, g.Tq, h, g.scale);
}

}  // namespace

// dq: like q  dk, dv: like k  (f32 or the input's dtype, contiguous, or undefined)
// dout, out: (B, Tq, NH, HS) contiguous   lse: (B, NH, Tq) f32 from attention_forward
void attention_backward(Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse, int64_t q_pos) {
  if (!dq.defined() && !dk.defined() && !dv.defined()) return;
  const Geometry g = geometry(q, k, v, q_pos);
  const BackwardArgs args{dq, dk, dv, Rows(dout), Rows(q), Rows(k), Rows(v), Rows(out), lse.data_as<float>(), g};
  const int64_t Tq_pad = round_up(g.Tq, kBlockQ), Tk_pad = round_up(g.Tk, kBlockK), n_tasks = g.B * g.NKV;
  // One slice per thread, and no more threads than tasks: each slice holds
  // whole sequences, so an idle thread's would be large.
  const ThreadSlices<float> slices(ScratchSlot::a,
                                   static_cast<size_t>(BackwardTiles(g, Tq_pad, Tk_pad, nullptr).floats),
                                   static_cast<int>(std::min<int64_t>(omp_get_max_threads(), n_tasks)));
#pragma omp parallel num_threads(slices.threads())
  {
    BackwardTiles w(g, Tq_pad, Tk_pad, slices.mine());
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n_tasks; ++i) {
      const int64_t b = i / g.NKV, kvh = i % g.NKV;
      std::fill_n(w.dk, w.nk, 0.f);
      std::fill_n(w.dv, w.nk, 0.f);
      for (int64_t h = kvh * g.group(); h < (kvh + 1) * g.group(); ++h) backward_head(args, w, b, h, Tq_pad);
      if (dk.defined()) add_tile(dk, w.dk, g.HSp, b, 0, g.Tk, kvh, 1.f);
      if (dv.defined()) add_tile(dv, w.dv, g.HSp, b, 0, g.Tk, kvh, 1.f);
    }
  }
}

}  // namespace loom::kernels::cpu::LOOM_ISA
