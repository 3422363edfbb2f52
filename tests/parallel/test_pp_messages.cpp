// Where the pipeline runtime posts its receives and takes back its gradient
// sends' buffers (parallel/pp_messages.h), and the buffers that holds: fixed
// by the schedule, checked here as data on every generator over a grid of
// pp, micro-batches and chunks, and on hand-worked lists.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/pp_messages.h"
#include "parallel/pp_schedule.h"

namespace loom::parallel {
namespace {

bool is_compute(PpOp op) { return op == PpOp::forward || op == PpOp::backward; }

std::vector<PpSchedule> grid() {
  std::vector<PpSchedule> out;
  for (int pp : {1, 2, 3, 4, 8})
    for (int m : {1, 2, 3, 4, 8, 16}) {
      out.push_back(make_pp_schedule(PpScheduleKind::afab, pp, m));
      out.push_back(make_pp_schedule(PpScheduleKind::one_f_one_b, pp, m));
      if (m % pp == 0)
        for (int v : {2, 3}) out.push_back(make_pp_schedule(PpScheduleKind::interleaved, pp, m, v));
    }
  return out;
}

std::string name(const PpSchedule& s, int r) {
  return concat(pp_schedule_name(s.kind), " pp=", s.pp, " m=", s.micro_batches, " v=", s.virtual_stages, " rank ", r);
}

TEST(PpMessages, EachReceiveIsPostedAtTheComputeBeforeItOrInItsPlace) {
  for (const PpSchedule& s : grid())
    for (int r = 0; r < s.pp; ++r) {
      SCOPED_TRACE(name(s, r));
      const std::vector<PpAction>& list = s.actions[static_cast<size_t>(r)];
      const PpMessagePoints p = pp_message_points(s, r);
      ASSERT_EQ(p.post.size(), list.size());
      for (size_t j = 0; j < list.size(); ++j) {
        const PpAction& a = list[j];
        if (a.op != PpOp::recv_act && a.op != PpOp::recv_grad) {
          EXPECT_EQ(p.post[j], -1) << to_string(a);
          continue;
        }
        int before = -1;
        for (size_t i = 0; i < j; ++i)
          if (is_compute(list[i].op)) before = static_cast<int>(i);
        EXPECT_EQ(p.post[j], a.peer == r || before < 0 ? static_cast<int>(j) : before) << to_string(a);
      }
    }
}

// A gradient send is taken back at a later send_grad of its rank (where a
// buffer is needed again) or at the end; the buffers that leaves in flight
// never exceed the schedule's sends.
TEST(PpMessages, GradientSendsAreTakenBackAtALaterSendGradOrTheEnd) {
  for (const PpSchedule& s : grid())
    for (int r = 0; r < s.pp; ++r) {
      SCOPED_TRACE(name(s, r));
      const std::vector<PpAction>& list = s.actions[static_cast<size_t>(r)];
      const PpMessagePoints p = pp_message_points(s, r);
      int sends = 0;
      for (size_t k = 0; k < list.size(); ++k) {
        const bool remote_grad = list[k].op == PpOp::send_grad && list[k].peer != r;
        sends += list[k].op == PpOp::send_grad ? 1 : 0;
        if (!remote_grad) {
          EXPECT_EQ(p.release[k], -1) << to_string(list[k]);
          continue;
        }
        const int at = p.release[k];
        ASSERT_GT(at, static_cast<int>(k)) << to_string(list[k]);
        EXPECT_TRUE(at == static_cast<int>(list.size()) || list[static_cast<size_t>(at)].op == PpOp::send_grad)
            << to_string(list[k]) << " taken back at " << at;
      }
      const PpMessageBuffers b = pp_message_buffers(s, r);
      EXPECT_LE(b.gradients, sends + s.micro_batches * s.virtual_stages);
      EXPECT_LE(b.either, b.activations + b.gradients);
      EXPECT_GE(b.either, std::max(b.activations, b.gradients));
    }
}

// 1F1B's steady state on pp = 4, m = 8: every rank but the first sends a
// gradient after each backward, and the receiver has posted it by the
// sender's next send_grad, so each copy is taken back there: one buffer
// serves every send. A middle rank also holds the gradient its next
// backward reads and, posted at that backward, the one after: three.
TEST(PpMessages, OneFOneBTakesEachGradientBackAtTheNextSendGrad) {
  const PpSchedule s = make_pp_schedule(PpScheduleKind::one_f_one_b, 4, 8);
  for (int r = 1; r < 4; ++r) {
    SCOPED_TRACE(r);
    const std::vector<PpAction>& list = s.actions[static_cast<size_t>(r)];
    const PpMessagePoints p = pp_message_points(s, r);
    std::vector<int> sends;
    for (size_t k = 0; k < list.size(); ++k)
      if (list[k].op == PpOp::send_grad) sends.push_back(static_cast<int>(k));
    ASSERT_EQ(sends.size(), 8u);
    for (size_t i = 0; i + 1 < sends.size(); ++i) EXPECT_EQ(p.release[static_cast<size_t>(sends[i])], sends[i + 1]);
    EXPECT_EQ(p.release[static_cast<size_t>(sends.back())], static_cast<int>(list.size()));
    EXPECT_EQ(pp_message_buffers(s, r).gradients, r == 3 ? 1 : 3);  // the last stage receives no gradients
  }
}

// pp = 2, m = 4, 1F1B, worked by hand. Rank 1 (the last stage): recv_act 0,
// F0, B0, send_grad 0, recv_act 1, F1, B1, send_grad 1, ... — recv_act k + 1
// is posted at B k while send_grad k's copy is out, so an f32 run holds two
// buffers and a bf16 run one of each kind. Rank 0: F0, send_act 0, F1,
// send_act 1, recv_grad 0, B0, F2, ..., B2, recv_grad 3, B3 — recv_grad 3 is
// posted at B2, before B2 frees recv_grad 2's buffer: two.
TEST(PpMessages, OneFOneBOnTwoRanksHoldsWhatTheListSays) {
  const PpSchedule s = make_pp_schedule(PpScheduleKind::one_f_one_b, 2, 4);
  const PpMessageBuffers last = pp_message_buffers(s, 1), first = pp_message_buffers(s, 0);
  EXPECT_EQ(last.activations, 1);
  EXPECT_EQ(last.gradients, 1);
  EXPECT_EQ(last.either, 2);
  EXPECT_EQ(first.activations, 0);
  EXPECT_EQ(first.gradients, 2);
  EXPECT_EQ(first.either, 2);
}

// GPipe (afab) on pp = 2, m = 4: rank 1 posts recv_act k + 1 at F k, before
// F k frees act k: two activation buffers. Its backwards run B3 .. B0, each
// gradient send taken back at the next.
TEST(PpMessages, AfabHoldsTwoActivationsOnTheLastStage) {
  const PpSchedule s = make_pp_schedule(PpScheduleKind::afab, 2, 4);
  const PpMessageBuffers last = pp_message_buffers(s, 1);
  EXPECT_EQ(last.activations, 2);
  EXPECT_EQ(last.gradients, 1);
}

TEST(PpMessages, ARankOutsideTheScheduleIsAClearError) {
  const PpSchedule s = make_pp_schedule(PpScheduleKind::one_f_one_b, 2, 4);
  EXPECT_THROW(pp_message_points(s, 2), Error);
  EXPECT_THROW(pp_message_points(s, -1), Error);
}

}  // namespace
}  // namespace loom::parallel
