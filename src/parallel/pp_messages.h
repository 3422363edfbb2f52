// When the pipeline runtime (pp_runtime.h) posts each receive and takes back
// each gradient send's buffer, decided from the schedule alone: run() does
// its message bookkeeping at the same points of its list every step, however
// fast the messages travel, so the buffers it holds (pools[comm], cached
// between steps) are known before it runs — loom plan predicts them
// (plan/memory_plan.h), and no timing makes a run hold more.
//
// A point is an action index of the rank's list: point i is "before action i
// runs", point list.size() the end of the run.
//
// Receives: posted before the compute that precedes them on the list (their
// message arrives while that compute runs), into a buffer of their own; one
// with no compute before it, or a message the rank sends itself (pp = 1), at
// its own place.
//
// Gradient sends: run() sends a copy of stage_grad() (the next backward
// overwrites it) and takes the copy back, waiting for the send, at the
// rank's next send_grad — where it needs a buffer again, and by when the
// transfer has normally long finished. A wait there is safe only if the
// receiver can post the matching receive without this rank going further:
// a progress simulation of every rank (each blocking where run() blocks:
// on a message not yet sent, on its own sends' receives not yet posted)
// finds the waits that would block for good and puts each off to the rank's
// following send_grad, until every rank finishes; a send with no safe point
// left is waited for at the end of the run, when every receive is posted.
//
#pragma once

#include <vector>

#include "parallel/pp_schedule.h"

namespace loom::parallel {

struct PpMessagePoints {
  std::vector<int> post;     // per action: a receive's point of posting; -1 for other actions
  std::vector<int> release;  // per action: a send_grad to another rank: where its buffer is taken back; else -1
};
// Pure. rank: 0 .. s.pp - 1 (anything else is a loom::Error); s well formed
// (validate_pp_schedule).
PpMessagePoints pp_message_points(const PpSchedule& s, int rank);

// The most message buffers run() holds at once on `rank`, by kind: received
// activations (the compute dtype), gradients (f32: received, or a copy being
// sent), and both kinds together — what it holds when the two are of one
// dtype and shape (an f32 run), since its cache then lends either kind's
// free buffer to the other. The cache keeps them between steps: after the
// first step, a step allocates none.
struct PpMessageBuffers {
  int activations = 0, gradients = 0, either = 0;
};
PpMessageBuffers pp_message_buffers(const PpSchedule& s, int rank);

}  // namespace loom::parallel
