// Pipeline schedules as data (parallel/pp_schedule.h): every generator over
// a grid of pp, micro-batches and chunks is well formed and runs in the
// simulated executor without deadlock; peak in-flight micro-batches and the
// unit-time bubble match the papers' formulas; the validator and the
// simulator catch planted mistakes; impossible requests are clear errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "parallel/pp_schedule.h"

namespace loom::parallel {
namespace {

struct Case {
  PpScheduleKind kind;
  int pp, m, v;
};

std::string str(const Case& c) {
  return concat(pp_schedule_name(c.kind), " pp=", c.pp, " m=", c.m, " v=", c.v);
}

// The grid of the issue: pp in {1, 2, 3, 4, 8}, m in {1, 2, 3, 4, 8, 16};
// interleaved only where m is a multiple of pp, with v in {2, 3}.
std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (int pp : {1, 2, 3, 4, 8}) {
    for (int m : {1, 2, 3, 4, 8, 16}) {
      cases.push_back({PpScheduleKind::afab, pp, m, 1});
      cases.push_back({PpScheduleKind::one_f_one_b, pp, m, 1});
      if (m % pp == 0)
        for (int v : {2, 3}) cases.push_back({PpScheduleKind::interleaved, pp, m, v});
    }
  }
  return cases;
}

PpSchedule make(const Case& c) { return make_pp_schedule(c.kind, c.pp, c.m, c.v); }

bool is_compute(PpOp op) { return op == PpOp::forward || op == PpOp::backward; }

// The forwards and backwards of a rank, without the transfers.
std::vector<PpAction> computes(const std::vector<PpAction>& list) {
  std::vector<PpAction> out;
  for (const PpAction& a : list)
    if (is_compute(a.op)) out.push_back(a);
  return out;
}

std::string expect_error(auto&& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no loom::Error";
  return "";
}

TEST(PpSchedule, NamesRoundTripAndActionsPrintReadably) {
  for (PpScheduleKind k : {PpScheduleKind::afab, PpScheduleKind::one_f_one_b, PpScheduleKind::interleaved})
    EXPECT_EQ(pp_schedule_from_name(pp_schedule_name(k)), k);
  EXPECT_EQ(pp_schedule_name(PpScheduleKind::one_f_one_b), "1f1b");
  EXPECT_EQ(to_string(PpAction{PpOp::forward, 3, 1, -1}), "F m3 c1");
  EXPECT_EQ(to_string(PpAction{PpOp::backward, 0, 2, -1}), "B m0 c2");
  EXPECT_EQ(to_string(PpAction{PpOp::send_act, 3, 1, 2}), "send_act m3 c1 -> 2");
  EXPECT_EQ(to_string(PpAction{PpOp::recv_grad, 5, 0, 1}), "recv_grad m5 c0 <- 1");
}

// Checked here from the lists alone, independently of validate_pp_schedule:
// every send has exactly one recv on its peer for the same micro-batch and
// the stage its data goes to, and vice versa.
void expect_sends_match_recvs(const PpSchedule& s, const std::string& what) {
  // (activation?, micro-batch, receiving stage, from rank, to rank) -> sends - recvs
  std::map<std::tuple<bool, int, int, int, int>, int> balance;
  int transfers = 0;
  for (int r = 0; r < s.pp; ++r) {
    for (const PpAction& a : s.actions[static_cast<size_t>(r)]) {
      const int stage = a.chunk * s.pp + r;
      switch (a.op) {
        case PpOp::send_act: ++balance[{true, a.micro_batch, stage + 1, r, a.peer}], ++transfers; break;
        case PpOp::recv_act: --balance[{true, a.micro_batch, stage, a.peer, r}]; break;
        case PpOp::send_grad: ++balance[{false, a.micro_batch, stage - 1, r, a.peer}], ++transfers; break;
        case PpOp::recv_grad: --balance[{false, a.micro_batch, stage, a.peer, r}]; break;
        default: break;
      }
    }
  }
  for (const auto& [key, n] : balance) EXPECT_EQ(n, 0) << what << ": unmatched transfer of stage " << std::get<2>(key);
  // Each micro-batch crosses the pp v - 1 stage boundaries forward and back.
  EXPECT_EQ(transfers, 2 * s.micro_batches * (s.pp * s.virtual_stages - 1)) << what;
}

// On every stage's rank, each micro-batch's forward comes before its
// backward, and the rank runs each exactly once.
void expect_forward_before_backward(const PpSchedule& s, const std::string& what) {
  for (int r = 0; r < s.pp; ++r) {
    std::map<std::pair<int, int>, std::pair<int, int>> seen;  // (mb, chunk) -> (forward at, backward at)
    const std::vector<PpAction> list = computes(s.actions[static_cast<size_t>(r)]);
    for (size_t i = 0; i < list.size(); ++i) {
      auto [it, fresh] = seen.try_emplace({list[i].micro_batch, list[i].chunk}, -1, -1);
      int& at = list[i].op == PpOp::forward ? it->second.first : it->second.second;
      EXPECT_EQ(at, -1) << what << " rank " << r << ": " << to_string(list[i]) << " twice";
      at = static_cast<int>(i);
    }
    EXPECT_EQ(seen.size(), static_cast<size_t>(s.micro_batches * s.virtual_stages)) << what << " rank " << r;
    for (const auto& [mc, fb] : seen)
      EXPECT_TRUE(fb.first >= 0 && fb.first < fb.second)
          << what << " rank " << r << " m" << mc.first << " c" << mc.second << ": forward at " << fb.first
          << ", backward at " << fb.second;
  }
}

// The generators place a recv right before the compute it feeds and a send
// right after the compute that produced its data.
void expect_transfers_next_to_their_compute(const PpSchedule& s, const std::string& what) {
  for (int r = 0; r < s.pp; ++r) {
    const std::vector<PpAction>& list = s.actions[static_cast<size_t>(r)];
    for (size_t i = 0; i < list.size(); ++i) {
      const PpAction& a = list[i];
      if (is_compute(a.op)) continue;
      const bool recv = a.op == PpOp::recv_act || a.op == PpOp::recv_grad;
      const bool forward_side = a.op == PpOp::recv_act || a.op == PpOp::send_act;
      const size_t j = recv ? i + 1 : i - 1;
      ASSERT_LT(j, list.size()) << what << " rank " << r << ": " << to_string(a);
      const PpAction want{forward_side ? PpOp::forward : PpOp::backward, a.micro_batch, a.chunk, -1};
      EXPECT_EQ(list[j], want) << what << " rank " << r << ": " << to_string(a) << " next to " << to_string(list[j]);
    }
  }
}

TEST(PpSchedule, EveryScheduleIsWellFormedAndRunsWithoutDeadlock) {
  for (const Case& c : all_cases()) {
    const PpSchedule s = make(c);
    const std::string what = str(c);
    ASSERT_EQ(s.actions.size(), static_cast<size_t>(c.pp)) << what;
    EXPECT_EQ(validate_pp_schedule(s), "") << what;
    const PpSimulation sim = simulate_pp_schedule(s);
    EXPECT_FALSE(sim.deadlock) << what << ": " << sim.problem;
    EXPECT_EQ(sim.problem, "") << what;
    expect_sends_match_recvs(s, what);
    expect_forward_before_backward(s, what);
    expect_transfers_next_to_their_compute(s, what);
  }
}

TEST(PpSchedule, OneFOneBFollowsPipeDreamFlushOrder) {
  // pp = 4, m = 8, rank 1: pp - r - 1 = 2 warm-up forwards, then F/B pairs, then 2 cool-down backwards.
  const PpSchedule s = make_pp_schedule(PpScheduleKind::one_f_one_b, 4, 8);
  std::vector<PpAction> want;
  auto F = [&](int mb) { want.push_back({PpOp::forward, mb, 0, -1}); };
  auto B = [&](int mb) { want.push_back({PpOp::backward, mb, 0, -1}); };
  F(0), F(1);
  for (int k = 0; k < 6; ++k) F(k + 2), B(k);
  B(6), B(7);
  EXPECT_EQ(computes(s.actions[1]), want);
  // The last rank has no warm-up: F0 B0 F1 B1 ...; rank 0 warms up with 3.
  EXPECT_EQ(computes(s.actions[3])[1], (PpAction{PpOp::backward, 0, 0, -1}));
  EXPECT_EQ(computes(s.actions[0])[3], (PpAction{PpOp::forward, 3, 0, -1}));
  EXPECT_EQ(computes(s.actions[0])[4], (PpAction{PpOp::backward, 0, 0, -1}));
}

TEST(PpSchedule, InterleavedFollowsMegatronOrder) {
  // pp = 2, v = 2, m = 4, rank 0 (stages 0 and 2). Forward order: chunk 0 for
  // micro-batches 0, 1, chunk 1 for 0, 1, then the same for 2, 3; backward
  // the same walk with the chunks reversed. Warm-up (2 - 0 - 1) 2 + (2 - 1) 2 = 4.
  const PpSchedule s = make_pp_schedule(PpScheduleKind::interleaved, 2, 4, 2);
  auto F = [](int mb, int c) { return PpAction{PpOp::forward, mb, c, -1}; };
  auto B = [](int mb, int c) { return PpAction{PpOp::backward, mb, c, -1}; };
  const std::vector<PpAction> rank0 = {F(0, 0), F(1, 0), F(0, 1), F(1, 1),  // warm-up
                                       F(2, 0), B(0, 1), F(3, 0), B(1, 1), F(2, 1), B(0, 0), F(3, 1), B(1, 0),
                                       B(2, 1), B(3, 1), B(2, 0), B(3, 0)};  // cool-down
  EXPECT_EQ(computes(s.actions[0]), rank0);
  // Rank 1 (stages 1 and 3): warm-up (v - 1) pp = 2, so its 1F1B starts with F(0, 1) then B(0, 1).
  const std::vector<PpAction> rank1 = computes(s.actions[1]);
  ASSERT_EQ(rank1.size(), 16u);
  EXPECT_EQ(std::vector<PpAction>(rank1.begin(), rank1.begin() + 4),
            (std::vector<PpAction>{F(0, 0), F(1, 0), F(0, 1), B(0, 1)}));
  // Stage 0's first micro-batch goes to rank 1 chunk 0; stage 1's to rank 0 chunk 1.
  EXPECT_EQ(s.actions[0][1], (PpAction{PpOp::send_act, 0, 0, 1}));
  EXPECT_EQ(s.actions[1][0], (PpAction{PpOp::recv_act, 0, 0, 0}));
  EXPECT_EQ(s.actions[1][2], (PpAction{PpOp::send_act, 0, 0, 0}));
}

TEST(PpSchedule, PeakInFlightIsMForAfabAndMinMPpMinusRankFor1f1b) {
  for (const Case& c : all_cases()) {
    if (c.kind == PpScheduleKind::interleaved) continue;
    const PpSimulation sim = simulate_pp_schedule(make(c));
    ASSERT_EQ(sim.peak_in_flight.size(), static_cast<size_t>(c.pp));
    for (int r = 0; r < c.pp; ++r) {
      // AFAB: every rank holds all m micro-batches before its first backward.
      // 1F1B: pp - r - 1 warm-up forwards plus the steady state's one.
      const int want = c.kind == PpScheduleKind::afab ? c.m : std::min(c.m, c.pp - r);
      EXPECT_EQ(sim.peak_in_flight[static_cast<size_t>(r)], want) << str(c) << " rank " << r;
      if (c.kind == PpScheduleKind::one_f_one_b) {
        EXPECT_LE(sim.peak_in_flight[static_cast<size_t>(r)], c.pp);
      }
    }
  }
}

TEST(PpSchedule, InterleavedPeakInFlightIsMegatronWarmupPlusOne) {
  // Rank r runs W = (pp - r - 1) 2 + (v - 1) pp warm-up forwards (capped at
  // m v), then each 1F1B step adds one (micro-batch, chunk) and removes one:
  // peak = min(W + 1, m v) chunk-activations. A chunk holds 1/v of the
  // rank's layers, so in whole micro-batches of activation memory the peak is
  // (W + 1) / v <= ((v + 1) pp - 1) / v < pp (1 + 1/v): rank 0 keeps at most
  // pp / v micro-batches more than under 1F1B, Megatron's known cost.
  for (const Case& c : all_cases()) {
    if (c.kind != PpScheduleKind::interleaved) continue;
    const PpSimulation sim = simulate_pp_schedule(make(c));
    for (int r = 0; r < c.pp; ++r) {
      const int warmup = (c.pp - r - 1) * 2 + (c.v - 1) * c.pp;
      const int peak = sim.peak_in_flight[static_cast<size_t>(r)];
      EXPECT_EQ(peak, std::min(warmup + 1, c.m * c.v)) << str(c) << " rank " << r;
      EXPECT_LT(static_cast<double>(peak) / c.v, c.pp * (1.0 + 1.0 / c.v)) << str(c) << " rank " << r;
    }
  }
}

TEST(PpSchedule, UnitTimeBubbleIsPpMinusOneOverMAndOverVmInterleaved) {
  for (const Case& c : all_cases()) {
    // A chunk is 1/v of a rank's layers: its forward and backward take 1/v.
    const double t = 1.0 / c.v;
    const PpSimulation sim = simulate_pp_schedule(make(c), t, t);
    const double want = (c.pp - 1.0) / (c.v * c.m);
    EXPECT_NEAR(sim.busy, 2.0 * c.m, 1e-12) << str(c);
    EXPECT_NEAR(sim.bubble_fraction, want, 1e-12) << str(c);
    EXPECT_NEAR(sim.makespan, sim.busy * (1 + want), 1e-12) << str(c);
  }
}

TEST(PpSchedule, BubbleIsPpMinusOneOverMWithBackwardTwiceForward) {
  for (const Case& c : all_cases()) {
    if (c.kind == PpScheduleKind::interleaved) continue;
    const PpSimulation sim = simulate_pp_schedule(make(c), 1.0, 2.0);
    EXPECT_FALSE(sim.deadlock) << str(c);
    EXPECT_NEAR(sim.busy, 3.0 * c.m, 1e-12) << str(c);
    EXPECT_NEAR(sim.bubble_fraction, (c.pp - 1.0) / c.m, 1e-12) << str(c);
  }
}

// The index of the first action equal to a on rank r.
size_t find(const PpSchedule& s, int r, const PpAction& a) {
  const std::vector<PpAction>& list = s.actions[static_cast<size_t>(r)];
  const auto it = std::find(list.begin(), list.end(), a);
  EXPECT_NE(it, list.end()) << to_string(a);
  return static_cast<size_t>(it - list.begin());
}

TEST(PpSchedule, ValidateCatchesADroppedRecv) {
  PpSchedule s = make_pp_schedule(PpScheduleKind::one_f_one_b, 4, 8);
  auto& rank2 = s.actions[2];
  rank2.erase(rank2.begin() + static_cast<long>(find(s, 2, {PpOp::recv_act, 3, 0, 1})));
  const std::string problem = validate_pp_schedule(s);
  EXPECT_NE(problem.find("send_act m3 c0 -> 2 has no matching recv_act"), std::string::npos) << problem;
  // Run as is, stage 1's activation is never received.
  const PpSimulation sim = simulate_pp_schedule(s);
  EXPECT_TRUE(sim.deadlock);
  EXPECT_NE(sim.problem.find("rank 1: send_act m3 c0 -> 2 has no matching recv"), std::string::npos) << sim.problem;
}

TEST(PpSchedule, ValidateCatchesAForwardMovedAfterItsBackward) {
  PpSchedule s = make_pp_schedule(PpScheduleKind::one_f_one_b, 2, 2);
  // Rank 1 holds the last stage: F m0 right before B m0; swap them.
  const size_t f = find(s, 1, {PpOp::forward, 0, 0, -1}), b = find(s, 1, {PpOp::backward, 0, 0, -1});
  ASSERT_EQ(b, f + 1);
  std::swap(s.actions[1][f], s.actions[1][b]);
  const std::string problem = validate_pp_schedule(s);
  EXPECT_EQ(problem, "rank 1: B m0 c0 runs before its forward");
}

TEST(PpSchedule, ValidateCatchesASendToTheWrongPeer) {
  PpSchedule s = make_pp_schedule(PpScheduleKind::interleaved, 4, 4, 2);
  s.actions[1][find(s, 1, {PpOp::send_act, 2, 0, 2})].peer = 3;
  const std::string problem = validate_pp_schedule(s);
  EXPECT_EQ(problem, "rank 1: send_act m2 c0 -> 3: the other side, stage 2, is on rank 2, not 3");
  // The simulator sees rank 2 wait forever for that activation.
  const PpSimulation sim = simulate_pp_schedule(s);
  EXPECT_TRUE(sim.deadlock);
  EXPECT_NE(sim.problem.find("rank 2: recv_act m2 c0 <- 1 waits forever"), std::string::npos) << sim.problem;
}

TEST(PpSchedule, ValidateCatchesChunksOutOfModelOrder) {
  // pp = 1, v = 2: rank 0 holds stages 0 and 1 and sends itself the
  // activation. Move stage 1's recv + forward of m0 ahead of stage 0's
  // forward + send: each transfer still sits next to its compute.
  PpSchedule s = make_pp_schedule(PpScheduleKind::interleaved, 1, 2, 2);
  auto& list = s.actions[0];
  ASSERT_EQ(std::vector<PpAction>(list.begin(), list.begin() + 4),
            (std::vector<PpAction>{{PpOp::forward, 0, 0, -1}, {PpOp::send_act, 0, 0, 0},
                                   {PpOp::recv_act, 0, 1, 0}, {PpOp::forward, 0, 1, -1}}));
  std::rotate(list.begin(), list.begin() + 2, list.begin() + 4);
  EXPECT_EQ(validate_pp_schedule(s), "rank 0: F m0 c1 runs before the forward of chunk 0");
  // Run as is, the rank waits on its own activation before producing it.
  EXPECT_TRUE(simulate_pp_schedule(s).deadlock);
}

TEST(PpSchedule, SimulateReportsACyclicWaitAsDeadlock) {
  // Two ranks, one micro-batch: rank 0 waits for the gradient before it
  // sends the activation, rank 1 waits for the activation before it sends
  // the gradient. Each list is well formed on its own.
  PpSchedule s{PpScheduleKind::one_f_one_b, 2, 1, 1, {}};
  s.actions = {{{PpOp::recv_grad, 0, 0, 1}, {PpOp::forward, 0, 0, -1}, {PpOp::send_act, 0, 0, 1},
                {PpOp::backward, 0, 0, -1}},
               {{PpOp::recv_act, 0, 0, 0}, {PpOp::forward, 0, 0, -1}, {PpOp::backward, 0, 0, -1},
                {PpOp::send_grad, 0, 0, 0}}};
  const PpSimulation sim = simulate_pp_schedule(s);
  EXPECT_TRUE(sim.deadlock);
  EXPECT_EQ(sim.problem,
            "deadlock: rank 0: recv_grad m0 c0 <- 1 waits forever (no matching send is ever posted); "
            "rank 1: recv_act m0 c0 <- 0 waits forever (no matching send is ever posted)");
  // Moving rank 0's recv to just before its backward breaks the cycle.
  std::rotate(s.actions[0].begin(), s.actions[0].begin() + 1, s.actions[0].begin() + 3);
  EXPECT_EQ(validate_pp_schedule(s), "");
  const PpSimulation fixed = simulate_pp_schedule(s);
  EXPECT_FALSE(fixed.deadlock) << fixed.problem;
  EXPECT_DOUBLE_EQ(fixed.makespan, 4.0);  // F0, F1, B1, B0 one after another
}

TEST(PpSchedule, ImpossibleRequestsAreErrorsSayingWhatIsAllowed) {
  std::string e = expect_error([] { make_pp_schedule(PpScheduleKind::interleaved, 4, 6, 2); });
  EXPECT_NE(e.find("micro-batches = 6"), std::string::npos) << e;
  EXPECT_NE(e.find("multiple of pp = 4"), std::string::npos) << e;
  e = expect_error([] { make_pp_schedule(PpScheduleKind::interleaved, 2, 4, 1); });
  EXPECT_NE(e.find("virtual_stages >= 2"), std::string::npos) << e;
  EXPECT_NE(e.find("1f1b"), std::string::npos) << e;
  for (PpScheduleKind k : {PpScheduleKind::afab, PpScheduleKind::one_f_one_b}) {
    e = expect_error([k] { make_pp_schedule(k, 2, 4, 2); });
    EXPECT_NE(e.find("virtual_stages = 2 is invalid"), std::string::npos) << e;
    EXPECT_NE(e.find("interleaved"), std::string::npos) << e;
  }
  e = expect_error([] { make_pp_schedule(PpScheduleKind::one_f_one_b, 0, 4); });
  EXPECT_NE(e.find("pp = 0 is invalid: pp must be >= 1"), std::string::npos) << e;
  e = expect_error([] { make_pp_schedule(PpScheduleKind::afab, 2, 0); });
  EXPECT_NE(e.find("micro-batches = 0 is invalid"), std::string::npos) << e;
  e = expect_error([] { pp_schedule_from_name("gpipe"); });
  EXPECT_EQ(e, "unknown pp_schedule 'gpipe': allowed values are afab, 1f1b, interleaved");
}

}  // namespace
}  // namespace loom::parallel
