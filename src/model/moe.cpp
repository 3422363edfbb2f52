// The MoE MLP step (moe.h): routing by the kernels' moe_* ops where the
// layer's tensors live (the rows per expert and the balancing statistics
// read back to the host, which plans the experts' GEMMs and reports the
// losses: moe_router.h), rows moved by the kernels' dispatch / combine,
// experts as grouped GEMMs, ep's exchanges through ExpertParallelOps, tp's
// sums as a dense MLP's.
#include "model/moe.h"

#include <algorithm>
#include <array>
#include <numeric>
#include <span>
#include <vector>

#include "core/error.h"
#include "core/memory.h"
#include "kernels/ops.h"
#include "model/family.h"
#include "model/moe_router.h"

namespace loom::model {

using namespace loom::kernels;

namespace {

size_t at(int64_t i) { return static_cast<size_t>(i); }

// A contiguous tensor's values on the host, wherever it lives.
template <typename T>
std::vector<T> to_host(const Tensor& t) {
  std::vector<T> v(at(t.numel()));
  copy_tensor(Tensor(v.data(), t.dtype(), t.shape()), t);
  return v;
}

// Where a layer's rows are, read from MoeActs::plan: per expert sent
// [0, E), per (source rank, local expert) received [E, 2E), then the rows
// this rank's experts computed. The experts compute in
// two chunks, each in the order of the local experts: chunk 0 the rank's own
// rows (which need no exchange: they run while the others travel), chunk 1
// the other ranks' (by source rank within an expert). Without ep chunk 0
// holds every row.
struct RowPlan {
  int64_t E = 0, El = 0, P = 1, me = 0;       // experts, per ep rank, ep ranks, this ep rank
  std::vector<int64_t> send_rows, recv_rows;  // per ep rank
  std::array<std::vector<int64_t>, 2> off;    // per chunk (El + 1): each local expert's first row, experts' order
  int64_t self_send = 0;                      // the rank's own rows' first row in the send buffer
  int64_t computed = 0;
  int64_t begin(int chunk) const { return off[at(chunk)][0]; }
  int64_t rows(int chunk) const { return off[at(chunk)][at(El)] - begin(chunk); }
  // Chunk c's expert offsets counted from its first row.
  std::vector<int64_t> chunk_off(int chunk) const {
    std::vector<int64_t> o(off[at(chunk)]);
    for (int64_t& v : o) v -= begin(chunk);
    return o;
  }
};

// Rows rank r sent this rank for local expert le.
int64_t received(const int64_t* c, const RowPlan& p, int64_t r, int64_t le) {
  return p.P > 1 ? c[p.E + r * p.El + le] : c[le];
}

RowPlan row_plan(const std::vector<int64_t>& plan, int64_t E, int P, int me) {
  const int64_t* c = plan.data();
  RowPlan p;
  p.E = E, p.El = E / P, p.P = P, p.me = me;
  p.send_rows.assign(at(P), 0), p.recv_rows.assign(at(P), 0);
  for (int64_t e = 0; e < E; ++e) p.send_rows[at(e / p.El)] += c[e];
  for (int64_t e = 0; e < me * p.El; ++e) p.self_send += c[e];
  p.off = {std::vector<int64_t>(at(p.El + 1), 0), std::vector<int64_t>(at(p.El + 1), 0)};
  for (int64_t le = 0; le < p.El; ++le) p.off[0][at(le + 1)] = p.off[0][at(le)] + received(c, p, me, le);
  p.off[1][0] = p.off[0][at(p.El)];
  for (int64_t le = 0; le < p.El; ++le) {
    int64_t n = 0;
    for (int64_t r = 0; r < P; ++r) n += r == me ? 0 : received(c, p, r, le);
    p.off[1][at(le + 1)] = p.off[1][at(le)] + n;
  }
  for (int64_t r = 0; r < P; ++r)
    for (int64_t le = 0; le < p.El; ++le) p.recv_rows[at(r)] += received(c, p, r, le);
  p.computed = c[2 * E];
  return p;
}

// Moves rows between the order they arrive in (source rank, then local
// expert) and the experts' order (RowPlan's chunks). to_experts: from
// `by_rank` into `by_expert`, else back; remote_only: the other ranks' rows
// alone (chunk 1).
void reorder(const Tensor& by_rank, const Tensor& by_expert, const std::vector<int64_t>& plan, const RowPlan& p,
             bool to_experts, bool remote_only) {
  const int64_t* c = plan.data();
  std::array<std::vector<int64_t>, 2> cursor = p.off;
  int64_t src = 0;
  for (int64_t r = 0; r < p.P; ++r)
    for (int64_t le = 0; le < p.El; ++le) {
      const int64_t n = received(c, p, r, le);
      if (n == 0) continue;
      const size_t chunk = r == p.me ? 0 : 1;
      if (chunk == 1 || !remote_only) {
        const Tensor a = by_rank.slice(0, src, n), b = by_expert.slice(0, cursor[chunk][at(le)], n);
        if (to_experts) copy(b, a);
        else copy(a, b);
      }
      src += n, cursor[chunk][at(le)] += n;
    }
}

// The rank's experts' weights (or gradients) of one matrix.
std::span<const Tensor> experts(const std::vector<Tensor>& w) { return {w.data(), w.size()}; }

}  // namespace

// ---- forward ----

namespace {

// The balancing losses' per-group statistics into a.count and a.score_sum:
// a group's tokens are the rank's, or under cp spread over the cp group
// (the sums over its ranks).
void routing_stats(const MoeRun& run, MoeActs& a, int64_t N) {
  const int64_t local = run.group_tokens / run.cp_size, groups = N / local;
  const Tensor count = a.count.slice(0, 0, groups), score_sum = a.score_sum.slice(0, 0, groups);
  moe_group_stats(count, score_sum, a.sel.slice(0, 0, N), a.scores.slice(0, 0, N), local,
                  run.cfg->router_score == RouterScore::sigmoid);
  if (run.cp_size == 1) return;
  run.cp->all_reduce_sum(count);
  run.cp->all_reduce_sum(score_sum);
}

// Capacity when a routing group's tokens are spread over the cp ranks:
// every rank's choices gathered (gathered_capacity), the drops decided as
// moe_capacity decides them, the rank's own written to rows as keep flags.
void cp_capacity(const MoeRun& run, const Tensor& rows, const Tensor& sel, const Tensor& scores, int64_t capacity) {
  const int64_t N = sel.size(0), k = sel.size(1), E = scores.size(1), n = N * k, P = run.cp_size;
  const auto T = static_cast<int64_t>(run.positions.size());
  const std::vector<int32_t> s = to_host<int32_t>(sel);
  const std::vector<float> p = to_host<float>(scores);
  static_assert(sizeof(GatheredChoice) == 3 * sizeof(int32_t));
  std::vector<GatheredChoice> mine(at(n)), all(at(n * P));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = i / k;
    mine[at(i)] = {s[at(i)], static_cast<int32_t>((t / T) * run.seq_len + run.positions[at(t % T)]),
                   p[at(t * E + s[at(i)])]};
  }
  // Each choice as three i32 words (the score's bits travel unchanged).
  run.cp->all_gather(Tensor(all.data(), DType::i32, {3 * n * P}), Tensor(mine.data(), DType::i32, {3 * n}));
  const int64_t group_len = run.cfg->routing_group * run.seq_len, groups = N / (T * run.cfg->routing_group);
  const std::vector<char> kept = gathered_capacity(all, E, group_len, groups, capacity);
  std::vector<int32_t> keep(at(n));
  const int64_t base = run.cp->rank() * n;
  for (int64_t i = 0; i < n; ++i) keep[at(i)] = kept[at(base + i)];
  copy_tensor(rows, Tensor(keep.data(), DType::i32, rows.shape()));
}

// Router, top-k, capacity and the dispatch plan: fills a's logits ... rows,
// counts[0, E) and plan[0, E) (sent per expert); returns the rows sent.
// Counts the statistics when training.
int64_t route(MoeRun& run, const Tensor& h, const LayerWeights& w, MoeActs& a, const Dims& d, int64_t layer) {
  const ModelConfig& cfg = *run.cfg;
  const int64_t N = h.size(0), E = cfg.n_expert, k = cfg.top_k;
  const Tensor logits = a.logits.slice(0, 0, N), logits32 = a.logits32.slice(0, 0, N);
  const Tensor scores = a.scores.slice(0, 0, N), sel = a.sel.slice(0, 0, N), rows = a.rows.slice(0, 0, N);
  block_linear(d, logits, h, w.router, Tensor());
  cast(logits32, logits);
  moe_router_scores(scores, a.lse.slice(0, 0, N), logits32, cfg.router_score == RouterScore::sigmoid);
  Tensor bias;  // the balancing bias in f32 (it may be stored in the compute dtype)
  if (w.expert_bias.defined()) {
    bias = a.bias32;
    cast(bias, w.expert_bias);
  }
  moe_top_k(sel, a.weight.slice(0, 0, N), scores, bias, cfg.norm_topk_prob);
  const bool capacity = run.training && cfg.capacity_factor > 0.f;
  const int64_t cap = capacity ? expert_capacity(cfg.capacity_factor, run.group_tokens, k, E) : -1;
  if (capacity && run.cp_size > 1) cp_capacity(run, rows, sel, scores, cap);
  else moe_capacity(rows, sel, scores, capacity ? run.group_tokens : std::max<int64_t>(N, 1), cap);
  // Rows by expert, then token: counts, then each kept choice's place.
  const Tensor sent_per_expert = a.counts.slice(0, 0, E);
  moe_assign_rows(rows, sent_per_expert, sel);
  a.plan.assign(at(2 * E + 1), 0);
  copy_tensor(Tensor(a.plan.data(), DType::i64, {E}), sent_per_expert);
  const int64_t sent = std::accumulate(a.plan.begin(), a.plan.begin() + E, int64_t{0});
  if (!run.training) return sent;
  routing_stats(run, a, N);  // again in a recompute: backward reads them
  if (run.recomputing) return sent;
  MoeStats& st = run.stats;
  const int64_t groups = N / (run.group_tokens / run.cp_size);
  const std::vector<float> count = to_host<float>(a.count.slice(0, 0, groups));
  st.aux_loss += aux_loss(count, to_host<float>(a.score_sum.slice(0, 0, groups)), E, k, run.group_tokens);
  st.z_loss += z_loss(to_host<float>(a.lse.slice(0, 0, N)));
  ++st.layer_forwards, st.choices += N * k, st.dropped += N * k - sent;
  if (st.load.empty()) st.load.assign(at(cfg.n_layer * E), 0);
  // Under cp the counts are the group's over every cp rank: this rank's own choices are its sel's.
  if (run.cp_size > 1) {
    for (const int32_t e : to_host<int32_t>(sel)) ++st.load[at(layer * E + e)];
  } else {
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t e = 0; e < E; ++e) st.load[at(layer * E + e)] += static_cast<int64_t>(count[at(g * E + e)]);
  }
  return sent;
}

// ep > 1: counts[E, 2E) from every rank, then the rows to the experts'
// ranks (xr; in flight on return) while the rank's own rows are copied to
// the start of xe (chunk 0). Returns the plan.
RowPlan start_dispatch(MoeRun& run, MoeActs& a, int64_t E) {
  const int P = run.ep.ep.size;
  const Tensor received = a.counts.slice(0, E, E);
  run.ep.ops->exchange_counts(received, a.counts.slice(0, 0, E));
  copy_tensor(Tensor(a.plan.data() + E, DType::i64, {E}), received);
  RowPlan p = row_plan(a.plan, E, P, run.ep.ep.rank);
  p.computed = std::accumulate(p.recv_rows.begin(), p.recv_rows.end(), int64_t{0});
  a.plan[at(2 * E)] = p.computed;
  run.ep.ops->start_rows(a.xr, p.recv_rows, a.xs, p.send_rows);
  if (p.rows(0) > 0) copy(a.xe.slice(0, 0, p.rows(0)), a.xs.slice(0, p.self_send, p.rows(0)));
  return p;
}

// One matrix of the experts over their rows (offsets as grouped_linear_forward's):
// weights served in their blocks (quant_weights.h) one expert at a time
// through block_linear, float ones as one grouped call.
void experts_linear(const Dims& d, Tensor y, const Tensor& x, const std::vector<Tensor>& w,
                    const std::vector<int64_t>& off) {
  if (w.empty() || w.front().dtype() != DType::u8)
    return grouped_linear_forward(y, x, experts(w), off, d.batch_invariant);
  for (size_t g = 0; g < w.size(); ++g) {
    const int64_t n = off[g + 1] - off[g];
    if (n > 0) block_linear(d, y.slice(0, off[g], n), x.slice(0, off[g], n), w[g], Tensor());
  }
}

// The rank's experts on one chunk of their rows: fc, up, act, ye.
void run_experts(const Dims& d, const LayerWeights& w, MoeActs& a, const RowPlan& p, int chunk) {
  const int64_t b = p.begin(chunk), n = p.rows(chunk);
  if (n == 0) return;
  const std::vector<int64_t> off = p.chunk_off(chunk);
  const Tensor xe = a.xe.slice(0, b, n), fc = a.fc.slice(0, b, n), up = a.up.slice(0, b, n);
  const Tensor act = a.act.slice(0, b, n);
  experts_linear(d, fc, xe, w.w1, off);
  experts_linear(d, up, xe, w.w3, off);
  swiglu_forward(act, fc, up);
  experts_linear(d, a.ye.slice(0, b, n), act, w.w2, off);
}

// The shared experts' output (partial under tp) into sh_out.
void shared_forward(const Dims& d, const Tensor& h, const LayerWeights& w, MoeActs& a) {
  if (!w.sh_gate.defined()) return;
  const int64_t N = h.size(0);
  const Tensor fc = a.sh_fc.slice(0, 0, N), up = a.sh_up.slice(0, 0, N), act = a.sh_act.slice(0, 0, N);
  block_linear(d, fc, h, w.sh_gate, Tensor());
  block_linear(d, up, h, w.sh_up, Tensor());
  swiglu_forward(act, fc, up);
  block_linear(d, a.sh_out.slice(0, 0, N), act, w.sh_down, Tensor());
}

// The routed experts' outputs, by ep: chunk 0 computed while the other
// ranks' rows travel, chunk 1 once they are here, the outputs sent back
// (in flight on return: finish_rows before reading ys).
void experts_forward(MoeRun& run, const Dims& d, const LayerWeights& w, MoeActs& a) {
  const int64_t E = run.cfg->n_expert;
  ExpertParallelOps& ops = *run.ep.ops;
  const RowPlan p = start_dispatch(run, a, E);
  run_experts(d, w, a, p, 0);
  ops.finish_rows();
  reorder(a.xr, a.xe, a.plan, p, true, true);
  run_experts(d, w, a, p, 1);
  reorder(a.xr, a.ye, a.plan, p, false, false);  // the outputs, back in arrival order
  ops.start_rows(a.ys, p.send_rows, a.xr, p.recv_rows);
}

// An evaluation keeps every routing choice, but the experts' rows are sized for training's capacity: its
// tokens go through in passes whose every choice fits (a rank's experts receive at most min(k, E / ep) of a
// token's choices from each of ep ranks). Training routes its N tokens in one pass.
int64_t pass_tokens(const MoeRun& run, const MoeActs& a, int64_t N) {
  if (run.training) return std::max<int64_t>(N, 1);
  const int64_t ep = run.ep.ep.size, E = run.cfg->n_expert;
  const int64_t per_token = ep * std::min(run.cfg->top_k, E / ep);
  return std::clamp<int64_t>(a.fc.size(0) / per_token, 1, std::max<int64_t>(N, 1));
}

}  // namespace

void MoeMlp::forward(Tensor out, const Tensor& h_rows, const LayerWeights& w, LayerActs& la,
                     const BlockContext& c) const {
  const Dims& d = c.d;
  const TpContext& tp = d.par.tp;
  MoeActs& a = la.moe;
  const int64_t C = d.C, E = run_.cfg->n_expert;
  const Tensor h = rows_of(tp_enter(d, h_rows), C);  // (N, C): every token of the tp group
  const int64_t N = h.size(0), pass = pass_tokens(run_, a, N);
  // The combine (and shared experts) give partial sums under tp: summed as g.
  const Tensor y = tp.sp ? tp.partial : rows_of(out, C);
  for (int64_t first = 0; first < N; first += pass) {  // every ep rank makes the same passes
    const int64_t n = std::min(pass, N - first);
    const Tensor hs = h.slice(0, first, n);
    const int64_t sent = route(run_, hs, w, a, d, c.layer);
    const Tensor rows = a.rows.slice(0, 0, n);
    moe_dispatch(a.xs, hs, rows);
    if (run_.ep.active()) {
      experts_forward(run_, d, w, a);
    } else {
      a.plan[at(2 * E)] = sent;
      run_experts(d, w, a, row_plan(a.plan, E, 1, 0), 0);
    }
    if (first + n >= N) shared_forward(d, h, w, a);  // under ep while the outputs travel back
    if (run_.ep.active()) run_.ep.ops->finish_rows();
    moe_combine(y.slice(0, first, n), a.ys, rows, a.weight.slice(0, 0, n));
  }
  if (w.sh_gate.defined()) add(y, y, a.sh_out.slice(0, 0, N));
  if (tp.ops) tp.ops->reduce(tp.sp ? rows_of(out, C) : out, tp.sp ? tp.partial : out);
}

void MoeMlp::recompute(LayerActs& la) const {
  MoeActs& a = la.moe;
  const int64_t n = a.plan[at(2 * run_.cfg->n_expert)];
  if (n > 0) swiglu_forward(a.act.slice(0, 0, n), a.fc.slice(0, 0, n), a.up.slice(0, 0, n));
  if (a.sh_fc.defined()) swiglu_forward(a.sh_act, a.sh_fc, a.sh_up);
}

// ---- backward ----

namespace {

// The experts' backward on one chunk of their rows: dye in (scratch: scaled
// here), dxe (zeroed here) out; weight gradients += into g. Under ep a
// rank's experts see the rows of every rank of its ep group, so their
// weight gradients sum ep ranks' losses, where a dense weight's hold its own
// rank's: they are scaled by 1 / ep, so that the average over the expert-dp
// group (dp / ep ranks) is the same mean over every dp rank's loss the dense
// weights get.
void experts_backward(const LayerWeights& w, const LayerWeights& g, const MoeActs& a, MoeScratch& m,
                      const Tensor& dye_all, const RowPlan& p, int chunk) {
  const int64_t b = p.begin(chunk), n = p.rows(chunk);
  if (n == 0) return;
  const std::vector<int64_t> off = p.chunk_off(chunk);
  const Tensor dact = m.dact.slice(0, b, n), dfc = m.dfc.slice(0, b, n), dup = m.dup.slice(0, b, n);
  const Tensor dxe = m.dxe.slice(0, b, n), xe = a.xe.slice(0, b, n), dye = dye_all.slice(0, b, n);
  const Tensor act = a.act.slice(0, b, n);
  fill(dact, 0.f), fill(dfc, 0.f), fill(dup, 0.f), fill(dxe, 0.f);
  const std::span<const Tensor> none;
  grouped_linear_backward(dact, none, dye, act, experts(w.w2), off);
  swiglu_backward(dfc, dup, dact, a.fc.slice(0, b, n), a.up.slice(0, b, n));
  grouped_linear_backward(dxe, none, dfc, xe, experts(w.w1), off);
  grouped_linear_backward(dxe, none, dup, xe, experts(w.w3), off);
  if (p.P > 1)
    for (const Tensor& t : {dye, dfc, dup}) scale(t, 1.f / static_cast<float>(p.P));
  grouped_linear_backward(Tensor(), experts(g.w2), dye, act, experts(w.w2), off);
  grouped_linear_backward(Tensor(), experts(g.w1), dfc, xe, experts(w.w1), off);
  grouped_linear_backward(Tensor(), experts(g.w3), dup, xe, experts(w.w3), off);
}

// Under ep: the combine's gradient rows (dys) to the experts' ranks, the
// rank's own rows' backward while the others travel, then theirs, and the
// input gradient rows sent back into dxs (in flight on return: finish_rows
// before reading dxs).
void experts_backward_ep(const MoeRun& run, const LayerWeights& w, const LayerWeights& g, const MoeActs& a,
                         MoeScratch& m, const RowPlan& p) {
  ExpertParallelOps& ops = *run.ep.ops;
  ops.start_rows(m.dyr, p.recv_rows, m.dys, p.send_rows);
  if (p.rows(0) > 0) copy(m.dye.slice(0, 0, p.rows(0)), m.dys.slice(0, p.self_send, p.rows(0)));
  experts_backward(w, g, a, m, m.dye, p, 0);
  ops.finish_rows();
  reorder(m.dyr, m.dye, a.plan, p, true, true);
  experts_backward(w, g, a, m, m.dye, p, 1);
  reorder(m.dyr, m.dxe, a.plan, p, false, false);
  ops.start_rows(m.dxs, p.send_rows, m.dyr, p.recv_rows);
}

void shared_backward(Tensor dx, const Tensor& dy, const Tensor& h, const LayerWeights& w, const LayerWeights& g,
                     const MoeActs& a, MoeScratch& m) {
  if (!w.sh_gate.defined()) return;
  fill(m.sh_dact, 0.f), fill(m.sh_dfc, 0.f), fill(m.sh_dup, 0.f);
  linear_backward(m.sh_dact, g.sh_down, Tensor(), dy, a.sh_act, w.sh_down);
  swiglu_backward(m.sh_dfc, m.sh_dup, m.sh_dact, a.sh_fc, a.sh_up);
  linear_backward(dx, g.sh_gate, Tensor(), m.sh_dfc, h, w.sh_gate);
  linear_backward(dx, g.sh_up, Tensor(), m.sh_dup, h, w.sh_up);
}

// The router's gradient from the combine weights' (m.dweight) and the
// balancing losses' (the forward's statistics), into the router weight and
// (once over tp) dx.
void router_backward_into(const MoeRun& run, Tensor dx, const Tensor& h, const LayerWeights& w,
                          const LayerWeights& g, const MoeActs& a, MoeScratch& m, const TpContext& tp) {
  const ModelConfig& cfg = *run.cfg;
  const int64_t N = h.size(0), local = run.group_tokens / run.cp_size;
  MoeRouterGrad args{a.logits32.slice(0, 0, N), a.scores.slice(0, 0, N), a.lse.slice(0, 0, N),
                     a.sel.slice(0, 0, N),      a.weight.slice(0, 0, N), m.dweight.slice(0, 0, N),
                     a.count.slice(0, 0, N / local)};
  args.group_tokens = run.group_tokens, args.local_tokens = local;
  // Under cp each rank's router sees its own tokens' share of a group's aux
  // loss, and the dp x cp average divides the ranks' gradients by cp.
  args.aux_scale = static_cast<double>(cfg.aux_loss_coef) * run.dloss * run.cp_size;
  args.z_scale = static_cast<double>(cfg.z_loss_coef) * run.dloss;
  args.sigmoid = cfg.router_score == RouterScore::sigmoid, args.normalise = cfg.norm_topk_prob;
  const Tensor dlogits = m.dlogits.slice(0, 0, N);
  moe_router_backward(dlogits, args);
  // The router is replicated over tp, its input gradient summed with the experts' partials: rank 0 adds it.
  linear_backward(tp.rank == 0 ? dx : Tensor(), g.router, Tensor(), dlogits, h, w.router);
}

}  // namespace

Tensor MoeMlp::backward(const Tensor& dy, const Tensor& h_rows, const LayerWeights& w, const LayerWeights& g,
                        const LayerActs& la, Scratch& s, const BlockContext& c) const {
  const Dims& d = c.d;
  const TpContext& tp = d.par.tp;
  const MoeActs& a = la.moe;
  MoeScratch& m = s.moe;
  const int64_t C = d.C, E = run_.cfg->n_expert;
  const Tensor dyf = rows_of(tp_exit_backward(d, dy), C);  // (N, C) f32
  Tensor h = rows_of(h_rows, C);
  if (tp.sp) {
    tp.ops->gather(tp.gathered, h);
    h = tp.gathered;
  }
  const int64_t N = h.size(0);
  const Tensor rows = a.rows.slice(0, 0, N), dweight = m.dweight.slice(0, 0, N);
  const RowPlan p = row_plan(a.plan, E, run_.ep.ep.size, run_.ep.ep.rank);
  moe_combine_backward(m.dys, dweight, dyf, a.ys, rows, a.weight.slice(0, 0, N));
  if (tp.ops) tp.ops->all_reduce_sum(dweight);  // ys were partial sums over tp
  if (run_.ep.active()) experts_backward_ep(run_, w, g, a, m, p);
  else experts_backward(w, g, a, m, m.dys, p, 0);
  const Tensor dx = rows_of(s.dnorm, C);
  fill(dx, 0.f);
  shared_backward(dx, dyf, h, w, g, a, m);  // under ep while the input gradients travel back
  router_backward_into(run_, dx, h, w, g, a, m, tp);
  if (run_.ep.active()) run_.ep.ops->finish_rows();
  moe_dispatch_backward(dx, run_.ep.active() ? m.dxs : m.dxe, rows);
  if (!tp.ops) return s.dnorm;
  const Tensor summed = tp.sp ? tp.dlocal : s.dnorm;
  tp.ops->reduce(summed, tp.sp ? dx : s.dnorm);
  return summed;
}

// ---- layout ----

MoeSizes moe_sizes(const ModelConfig& cfg, int64_t N, int64_t groups, int64_t group_tokens, int tp, int ep) {
  MoeSizes z;
  z.N = N, z.k = cfg.top_k, z.E = cfg.n_expert, z.C = cfg.n_embd;
  z.groups = group_tokens > 0 ? groups : 0;
  z.F = cfg.d_ff / tp, z.Fs = cfg.n_shared_expert * cfg.d_ff / tp;
  z.ep = ep > 1;
  z.R = static_cast<int64_t>(ep) * N * z.k;  // dropless: every rank's every choice may come here
  if (group_tokens > 0 && cfg.capacity_factor > 0.f) {
    const int64_t cap = expert_capacity(cfg.capacity_factor, group_tokens, z.k, z.E);
    z.R = std::min(z.R, static_cast<int64_t>(ep) * groups * (z.E / ep) * cap);
  }
  z.R = std::max<int64_t>(z.R, 1);
  return z;
}

void moe_kept_acts(MoeActs& a, const MoeSizes& z, const MoeAlloc& alloc, DType compute) {
  const DType f32 = DType::f32, i32 = DType::i32;
  const int64_t N = z.N, E = z.E, k = z.k, C = z.C, R = z.R;
  a.logits = alloc({N, E}, compute), a.logits32 = alloc({N, E}, f32), a.scores = alloc({N, E}, f32);
  a.lse = alloc({N}, f32);
  a.sel = alloc({N, k}, i32), a.weight = alloc({N, k}, f32), a.rows = alloc({N, k}, i32);
  a.counts = alloc({2 * E}, DType::i64);
  a.bias32 = alloc({E}, f32);
  if (z.groups > 0) a.count = alloc({z.groups, E}, f32), a.score_sum = alloc({z.groups, E}, f32);
  a.xs = alloc({N * k, C}, compute);
  if (z.ep) {
    a.xr = alloc({R, C}, compute), a.xe = alloc({R, C}, compute);
    a.ye = alloc({R, C}, compute), a.ys = alloc({N * k, C}, compute);
  } else {
    a.xe = a.xs, a.ye = alloc({N * k, C}, compute), a.ys = a.ye;
  }
  a.fc = alloc({R, z.F}, compute), a.up = alloc({R, z.F}, compute);
  if (z.Fs > 0) a.sh_fc = alloc({N, z.Fs}, compute), a.sh_up = alloc({N, z.Fs}, compute);
  if (z.Fs > 0) a.sh_out = alloc({N, C}, compute);
}

void moe_dropped_acts(MoeActs& a, const MoeSizes& z, const MoeAlloc& alloc, DType compute) {
  a.act = alloc({z.R, z.F}, compute);
  if (z.Fs > 0) a.sh_act = alloc({z.N, z.Fs}, compute);
}

MoeScratch moe_scratch(const MoeSizes& z, const MoeAlloc& alloc) {
  const DType f32 = DType::f32;
  const int64_t N = z.N, E = z.E, k = z.k, C = z.C, R = z.R;
  MoeScratch m;
  m.dys = alloc({N * k, C}, f32);
  if (z.ep) m.dyr = alloc({R, C}, f32), m.dye = alloc({R, C}, f32), m.dxs = alloc({N * k, C}, f32);
  m.dxe = alloc({z.ep ? R : N * k, C}, f32);
  m.dfc = alloc({R, z.F}, f32), m.dup = alloc({R, z.F}, f32), m.dact = alloc({R, z.F}, f32);
  if (z.Fs > 0) m.sh_dfc = alloc({N, z.Fs}, f32), m.sh_dup = alloc({N, z.Fs}, f32), m.sh_dact = alloc({N, z.Fs}, f32);
  m.dlogits = alloc({N, E}, f32), m.dweight = alloc({N, k}, f32);
  return m;
}

}  // namespace loom::model
