#include "parallel/pp_schedule.h"

#include <algorithm>
#include <deque>
#include <map>
#include <set>
#include <tuple>

#include "core/error.h"

namespace loom::parallel {
namespace {

constexpr PpScheduleKind kKinds[] = {PpScheduleKind::afab, PpScheduleKind::one_f_one_b, PpScheduleKind::interleaved};

// One forward or backward of the rank's compute order, before the transfers
// are placed around it.
struct Compute {
  bool forward = true;
  int micro_batch = 0;
  int chunk = 0;
};

// Every generator is the same loop: `warmup` forwards, then one forward and
// one backward at a time, then the remaining backwards (afab: warmup = all).
// forward_at(k) / backward_at(k) give the k-th forward / backward of the rank.
template <typename ForwardAt, typename BackwardAt>
std::vector<Compute> one_f_one_b_loop(int total, int warmup, ForwardAt forward_at, BackwardAt backward_at) {
  std::vector<Compute> order;
  order.reserve(static_cast<size_t>(2 * total));
  for (int k = 0; k < warmup; ++k) order.push_back(forward_at(k));
  for (int k = 0; k + warmup < total; ++k) {
    order.push_back(forward_at(k + warmup));
    order.push_back(backward_at(k));
  }
  for (int k = total - warmup; k < total; ++k) order.push_back(backward_at(k));
  return order;
}

// Megatron's virtual pipeline: the k-th forward of a rank is micro-batch
// group (k / (pp v)) * pp + k % pp on chunk (k / pp) % v, i.e. chunk 0 for a
// group of pp micro-batches, then chunk 1 for the same group, ...; the k-th
// backward walks the same order with the chunks reversed (Narayanan et al.
// 2021 §2.2). Warm-up: (pp - r - 1) * 2 + (v - 1) * pp forwards, Megatron's
// count. With zero-time transfers (pp - r - 1) + (v - 1) * pp would already
// give the same bubble; the extra pp - r - 1 forwards leave the rank work
// while a gradient is in transit, at the cost of more activations held.
std::vector<Compute> interleaved_order(int pp, int r, int m, int v) {
  const int total = m * v;
  const int warmup = std::min((pp - r - 1) * 2 + (v - 1) * pp, total);
  auto at = [pp, v](int k, bool forward) {
    const int in_group = k % (pp * v);
    const int chunk = in_group / pp;
    return Compute{forward, (k / (pp * v)) * pp + k % pp, forward ? chunk : v - 1 - chunk};
  };
  return one_f_one_b_loop(
      total, warmup, [&](int k) { return at(k, true); }, [&](int k) { return at(k, false); });
}

std::vector<Compute> compute_order(PpScheduleKind kind, int pp, int r, int m, int v) {
  auto forward_at = [](int k) { return Compute{true, k, 0}; };
  auto backward_at = [](int k) { return Compute{false, k, 0}; };
  switch (kind) {
    case PpScheduleKind::afab: return one_f_one_b_loop(m, m, forward_at, backward_at);
    case PpScheduleKind::one_f_one_b: return one_f_one_b_loop(m, std::min(pp - r - 1, m), forward_at, backward_at);
    case PpScheduleKind::interleaved: return interleaved_order(pp, r, m, v);
  }
  LOOM_CHECK(false, "unknown PpScheduleKind ", static_cast<int>(kind));
}

// Wraps each compute in its transfers: the recv of its input right before it
// (pp_runtime posts it one compute earlier, non-blocking), the send of its output
// right after. Stage s = c pp + r; its neighbours s - 1 and s + 1 live on
// ranks r - 1 and r + 1 (mod pp).
std::vector<PpAction> with_transfers(const std::vector<Compute>& order, int pp, int r, int v) {
  const int last_stage = pp * v - 1, prev = (r + pp - 1) % pp, next = (r + 1) % pp;
  std::vector<PpAction> actions;
  actions.reserve(order.size() * 3);
  for (const Compute& c : order) {
    const int stage = c.chunk * pp + r;
    const int mb = c.micro_batch;
    if (c.forward) {
      if (stage > 0) actions.push_back({PpOp::recv_act, mb, c.chunk, prev});
      actions.push_back({PpOp::forward, mb, c.chunk, -1});
      if (stage < last_stage) actions.push_back({PpOp::send_act, mb, c.chunk, next});
    } else {
      if (stage < last_stage) actions.push_back({PpOp::recv_grad, mb, c.chunk, next});
      actions.push_back({PpOp::backward, mb, c.chunk, -1});
      if (stage > 0) actions.push_back({PpOp::send_grad, mb, c.chunk, prev});
    }
  }
  return actions;
}

bool is_send(PpOp op) { return op == PpOp::send_act || op == PpOp::send_grad; }
bool is_act(PpOp op) { return op == PpOp::send_act || op == PpOp::recv_act; }

// The stage on the other side of a transfer: where a send's data goes (an
// activation to s + 1, a gradient to s - 1), where a recv's comes from.
int other_stage(const PpAction& a, int pp, int rank) {
  const int stage = a.chunk * pp + rank;
  switch (a.op) {
    case PpOp::send_act: case PpOp::recv_grad: return stage + 1;
    case PpOp::recv_act: case PpOp::send_grad: return stage - 1;
    default: return stage;
  }
}

// A message is identified by its kind, micro-batch, receiving stage and the
// two ranks: a send and a recv match when these agree.
using MessageKey = std::tuple<bool, int, int, int, int>;  // act?, micro-batch, stage, from, to
MessageKey message_key(const PpAction& a, int pp, int rank) {
  if (is_send(a.op)) return {is_act(a.op), a.micro_batch, other_stage(a, pp, rank), rank, a.peer};
  return {is_act(a.op), a.micro_batch, a.chunk * pp + rank, a.peer, rank};
}

std::string on_rank(int rank, const PpAction& a) { return concat("rank ", rank, ": ", to_string(a)); }

}  // namespace

std::string_view pp_schedule_name(PpScheduleKind k) {
  switch (k) {
    case PpScheduleKind::afab: return "afab";
    case PpScheduleKind::one_f_one_b: return "1f1b";
    case PpScheduleKind::interleaved: return "interleaved";
  }
  LOOM_CHECK(false, "unknown PpScheduleKind ", static_cast<int>(k));
}

PpScheduleKind pp_schedule_from_name(std::string_view name) {
  std::string allowed;
  for (PpScheduleKind k : kKinds) {
    if (pp_schedule_name(k) == name) return k;
    allowed += concat(allowed.empty() ? "" : ", ", pp_schedule_name(k));
  }
  fail("unknown pp_schedule '", name, "': allowed values are ", allowed);
}

std::string_view pp_op_name(PpOp op) {
  switch (op) {
    case PpOp::forward: return "forward";
    case PpOp::backward: return "backward";
    case PpOp::send_act: return "send_act";
    case PpOp::recv_act: return "recv_act";
    case PpOp::send_grad: return "send_grad";
    case PpOp::recv_grad: return "recv_grad";
  }
  LOOM_CHECK(false, "unknown PpOp ", static_cast<int>(op));
}

std::string to_string(const PpAction& a) {
  const std::string what = concat(" m", a.micro_batch, " c", a.chunk);
  if (a.op == PpOp::forward) return "F" + what;
  if (a.op == PpOp::backward) return "B" + what;
  return concat(pp_op_name(a.op), what, is_send(a.op) ? " -> " : " <- ", a.peer);
}

PpSchedule make_pp_schedule(PpScheduleKind kind, int pp, int micro_batches, int virtual_stages) {
  const std::string_view name = pp_schedule_name(kind);
  LOOM_REQUIRE(pp >= 1, "pipeline schedule: pp = ", pp, " is invalid: pp must be >= 1");
  LOOM_REQUIRE(micro_batches >= 1, "pipeline schedule: micro-batches = ", micro_batches,
               " is invalid: the pipeline needs at least 1 micro-batch (train.grad_accum >= 1)");
  if (kind == PpScheduleKind::interleaved) {
    LOOM_REQUIRE(virtual_stages >= 2, "pipeline schedule interleaved: virtual_stages = ", virtual_stages,
                 " is invalid: interleaved needs virtual_stages >= 2 (for one chunk per rank use 1f1b)");
    LOOM_REQUIRE(micro_batches % pp == 0, "pipeline schedule interleaved: micro-batches = ", micro_batches,
                 " is not a multiple of pp = ", pp, ": interleaved runs micro-batches in groups of pp (e.g. ",
                 (micro_batches / pp + 1) * pp, "), or use 1f1b");
  } else {
    LOOM_REQUIRE(virtual_stages == 1, "pipeline schedule ", name, ": virtual_stages = ", virtual_stages,
                 " is invalid: ", name, " has one chunk per rank (virtual_stages = 1); use interleaved for more");
  }
  PpSchedule s{kind, pp, micro_batches, virtual_stages, {}};
  s.actions.reserve(static_cast<size_t>(pp));
  for (int r = 0; r < pp; ++r) {
    const std::vector<Compute> order = compute_order(kind, pp, r, micro_batches, virtual_stages);
    s.actions.push_back(with_transfers(order, pp, r, virtual_stages));
  }
  return s;
}

namespace {

// The simulated executor's state: each rank's position, clock and in-flight
// set, and the messages sent but not yet received.
struct SimRank {
  size_t next = 0;
  double clock = 0, busy = 0;
  std::set<std::pair<int, int>> in_flight;  // (micro-batch, chunk)
  int peak = 0;
};
struct Posted {
  double time;
  int rank;
  PpAction action;
};
using Mailbox = std::map<MessageKey, std::deque<Posted>>;

// Runs rank r until it blocks on a recv or ends; returns the peers its sends
// may have unblocked.
std::vector<int> run_rank(const PpSchedule& s, int r, SimRank& rank, Mailbox& posted, double t_forward,
                          double t_backward) {
  std::vector<int> woken;
  const std::vector<PpAction>& list = s.actions[static_cast<size_t>(r)];
  for (; rank.next < list.size(); ++rank.next) {
    const PpAction& a = list[rank.next];
    if (a.op == PpOp::forward || a.op == PpOp::backward) {
      const double t = a.op == PpOp::forward ? t_forward : t_backward;
      rank.clock += t, rank.busy += t;
      if (a.op == PpOp::forward) rank.in_flight.insert({a.micro_batch, a.chunk});
      else rank.in_flight.erase({a.micro_batch, a.chunk});
      rank.peak = std::max(rank.peak, static_cast<int>(rank.in_flight.size()));
    } else if (is_send(a.op)) {
      posted[message_key(a, s.pp, r)].push_back({rank.clock, r, a});
      woken.push_back(a.peer);
    } else {
      auto it = posted.find(message_key(a, s.pp, r));
      if (it == posted.end() || it->second.empty()) break;
      rank.clock = std::max(rank.clock, it->second.front().time);
      it->second.pop_front();
    }
  }
  return woken;
}

// Timings, and the problem: the ranks that wait forever, or else the sends
// nobody received.
PpSimulation sim_report(const PpSchedule& s, const std::vector<SimRank>& ranks, const Mailbox& posted) {
  PpSimulation sim;
  for (int r = 0; r < s.pp; ++r) {
    const SimRank& rank = ranks[static_cast<size_t>(r)];
    const std::vector<PpAction>& list = s.actions[static_cast<size_t>(r)];
    if (rank.next < list.size())
      sim.problem += concat(sim.problem.empty() ? "deadlock: " : "; ", on_rank(r, list[rank.next]),
                            " waits forever (no matching send is ever posted)");
    sim.makespan = std::max(sim.makespan, rank.clock);
    sim.busy = std::max(sim.busy, rank.busy);
    sim.peak_in_flight.push_back(rank.peak);
  }
  if (sim.problem.empty()) {
    for (const auto& [key, queue] : posted)
      for (const Posted& p : queue)
        sim.problem += concat(sim.problem.empty() ? "" : "; ", on_rank(p.rank, p.action), " has no matching recv");
  }
  sim.deadlock = !sim.problem.empty();
  sim.bubble_fraction = sim.busy > 0 ? (sim.makespan - sim.busy) / sim.busy : 0;
  return sim;
}

}  // namespace

// Event-driven over ranks: a rank runs until it reaches a recv whose message
// has not been posted; a send wakes its peer. Sends never block and a
// compute only waits for its own rank, so every time is fixed by the data
// flow alone (recv done = max(own clock, send time)) and the order in which
// ranks are woken changes nothing: the result is deterministic.
PpSimulation simulate_pp_schedule(const PpSchedule& s, double t_forward, double t_backward) {
  const int pp = s.pp;
  LOOM_REQUIRE(pp >= 1 && static_cast<int>(s.actions.size()) == pp, "simulate_pp_schedule: ", s.actions.size(),
               " action lists for pp = ", pp);
  std::vector<SimRank> ranks(static_cast<size_t>(pp));
  Mailbox posted;
  std::deque<int> ready;
  std::vector<bool> queued(static_cast<size_t>(pp), true);
  for (int r = 0; r < pp; ++r) ready.push_back(r);
  while (!ready.empty()) {
    const int r = ready.front();
    ready.pop_front();
    queued[static_cast<size_t>(r)] = false;
    for (int peer : run_rank(s, r, ranks[static_cast<size_t>(r)], posted, t_forward, t_backward)) {
      if (peer < 0 || peer >= pp || queued[static_cast<size_t>(peer)]) continue;
      queued[static_cast<size_t>(peer)] = true;
      ready.push_back(peer);
    }
  }
  return sim_report(s, ranks, posted);
}

namespace {

// "rank 2: F m3 c1": the action of a stage, named as on its rank's list.
std::string describe(PpOp op, int mb, int stage, int pp, int peer = -1) {
  return on_rank(stage % pp, PpAction{op, mb, stage / pp, peer});
}

// Each action's fields are in range, a transfer names the rank of the stage
// on its other side, and no action appears twice; records every position.
std::string check_actions(const PpSchedule& s, PpPositions& pos) {
  const int pp = s.pp, m = s.micro_batches, v = s.virtual_stages, stages = pp * v;
  for (int r = 0; r < pp; ++r) {
    const std::vector<PpAction>& list = s.actions[static_cast<size_t>(r)];
    for (size_t i = 0; i < list.size(); ++i) {
      const PpAction& a = list[i];
      if (a.micro_batch < 0 || a.micro_batch >= m || a.chunk < 0 || a.chunk >= v)
        return concat(on_rank(r, a), ": micro-batch or chunk out of range (m = ", m, ", v = ", v, ")");
      if (a.op == PpOp::forward || a.op == PpOp::backward) {
        if (a.peer != -1) return concat(on_rank(r, a), ": a forward or backward has peer ", a.peer, ", not -1");
      } else {
        const int other = other_stage(a, pp, r);
        if (other < 0 || other >= stages)
          return concat(on_rank(r, a), ": stage ", a.chunk * pp + r, " has no stage ", other, " to exchange with");
        if (a.peer != other % pp)
          return concat(on_rank(r, a), ": the other side, stage ", other, ", is on rank ", other % pp, ", not ",
                        a.peer);
      }
      int& at = pos.at(a.op, a.micro_batch, a.chunk * pp + r);
      if (at >= 0) return concat(on_rank(r, a), ": appears twice (positions ", at, " and ", i, ")");
      at = static_cast<int>(i);
    }
  }
  return "";
}

// Every send has its recv on the peer and vice versa: the activation of
// stage s - 1 is received by s, the gradient of s + 1 too.
std::string check_pairs(const PpSchedule& s, PpPositions& pos) {
  const int pp = s.pp, last = pp * s.virtual_stages - 1;
  for (int mb = 0; mb < s.micro_batches; ++mb) {
    for (int stage = 0; stage <= last; ++stage) {
      for (const bool act : {true, false}) {
        const int from = act ? stage - 1 : stage + 1;
        if (from < 0 || from > last) continue;
        const PpOp send = act ? PpOp::send_act : PpOp::send_grad, recv = act ? PpOp::recv_act : PpOp::recv_grad;
        const bool sent = pos.at(send, mb, from) >= 0, received = pos.at(recv, mb, stage) >= 0;
        if (sent && !received)
          return concat(describe(send, mb, from, pp, stage % pp), " has no matching ", pp_op_name(recv));
        if (received && !sent)
          return concat(describe(recv, mb, stage, pp, from % pp), " has no matching ", pp_op_name(send));
      }
    }
  }
  return "";
}

// Stage (mb, stage)'s forward and backward exist, the forward first, each
// with its recv before and its send after, and the rank's chunks in model
// order (forward of chunk c before chunk c + 1's, backward the reverse).
std::string check_stage(PpPositions& pos, int mb, int stage, int pp, int last) {
  const int f = pos.at(PpOp::forward, mb, stage), b = pos.at(PpOp::backward, mb, stage);
  if (f < 0) return concat(describe(PpOp::forward, mb, stage, pp), " is missing");
  if (b < 0) return concat(describe(PpOp::backward, mb, stage, pp), " is missing");
  if (b < f) return concat(describe(PpOp::backward, mb, stage, pp), " runs before its forward");
  struct Need {
    bool needed;
    PpOp op;
    int compute;
    PpOp compute_op;
    bool before;
  };
  const Need needs[] = {{stage > 0, PpOp::recv_act, f, PpOp::forward, true},
                        {stage < last, PpOp::send_act, f, PpOp::forward, false},
                        {stage < last, PpOp::recv_grad, b, PpOp::backward, true},
                        {stage > 0, PpOp::send_grad, b, PpOp::backward, false}};
  for (const Need& n : needs) {
    if (!n.needed) continue;
    const int at = pos.at(n.op, mb, stage);
    if (at < 0) return concat(describe(n.compute_op, mb, stage, pp), " has no ", pp_op_name(n.op));
    if ((at < n.compute) != n.before)
      return concat(describe(n.compute_op, mb, stage, pp), ": its ", pp_op_name(n.op), " must come ",
                    n.before ? "before" : "after", " it");
  }
  if (stage + pp <= last) {
    if (pos.at(PpOp::forward, mb, stage + pp) < f)
      return concat(describe(PpOp::forward, mb, stage + pp, pp), " runs before the forward of chunk ", stage / pp);
    if (pos.at(PpOp::backward, mb, stage + pp) > b)
      return concat(describe(PpOp::backward, mb, stage + pp, pp), " runs after the backward of chunk ", stage / pp);
  }
  return "";
}

}  // namespace

PpPositions::PpPositions(int pp, int micro_batches, int virtual_stages)
    : pp_(pp), m_(micro_batches), stages_(pp * virtual_stages),
      at_(static_cast<size_t>(6 * micro_batches * pp * virtual_stages), -1) {}

PpPositions::PpPositions(const PpSchedule& s) : PpPositions(s.pp, s.micro_batches, s.virtual_stages) {
  for (int r = 0; r < s.pp; ++r) {
    const std::vector<PpAction>& list = s.actions[static_cast<size_t>(r)];
    for (size_t i = 0; i < list.size(); ++i)
      at(list[i].op, list[i].micro_batch, list[i].chunk * s.pp + r) = static_cast<int>(i);
  }
}

int PpPositions::sender(int rank, const PpAction& a) const {
  const bool act = a.op == PpOp::recv_act;
  const int stage = a.chunk * pp_ + rank + (act ? -1 : 1);
  return at(act ? PpOp::send_act : PpOp::send_grad, a.micro_batch, stage);
}

int PpPositions::receiver(int rank, const PpAction& a) const {
  const bool act = a.op == PpOp::send_act;
  const int stage = a.chunk * pp_ + rank + (act ? 1 : -1);
  return at(act ? PpOp::recv_act : PpOp::recv_grad, a.micro_batch, stage);
}

std::string validate_pp_schedule(const PpSchedule& s) {
  const int pp = s.pp, v = s.virtual_stages, m = s.micro_batches;
  if (pp < 1 || v < 1 || m < 1)
    return concat("pp = ", pp, ", virtual_stages = ", v, ", micro-batches = ", m, ": each must be >= 1");
  if (static_cast<int>(s.actions.size()) != pp) return concat(s.actions.size(), " action lists for pp = ", pp);
  PpPositions pos(pp, m, v);
  if (std::string problem = check_actions(s, pos); !problem.empty()) return problem;
  if (std::string problem = check_pairs(s, pos); !problem.empty()) return problem;
  for (int mb = 0; mb < m; ++mb)
    for (int stage = 0; stage < pp * v; ++stage)
      if (std::string problem = check_stage(pos, mb, stage, pp, pp * v - 1); !problem.empty()) return problem;
  return "";
}

}  // namespace loom::parallel
