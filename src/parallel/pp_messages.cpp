#include "parallel/pp_messages.h"

#include <algorithm>

#include "core/error.h"

namespace loom::parallel {
namespace {

bool is_compute(PpOp op) { return op == PpOp::forward || op == PpOp::backward; }
bool is_recv(PpOp op) { return op == PpOp::recv_act || op == PpOp::recv_grad; }

// Each receive's point of posting on `rank`'s list: the last compute before
// it, else its own place (and always for a message the rank sends itself).
std::vector<int> post_points(const std::vector<PpAction>& list, int rank) {
  std::vector<int> post(list.size(), -1);
  int last_compute = -1;
  for (size_t i = 0; i < list.size(); ++i) {
    const PpAction& a = list[i];
    if (is_compute(a.op)) last_compute = static_cast<int>(i);
    else if (is_recv(a.op)) post[i] = a.peer == rank || last_compute < 0 ? static_cast<int>(i) : last_compute;
  }
  return post;
}

// Every rank's progress through its list under given release points, as the
// runtime blocks: at point i a rank first waits for the gradient sends due
// there, which needs their receives posted; then it posts its receives due
// at i; then action i runs, a compute waiting for the send of the message it
// consumes (sends never block). Every rank's ability to pass a point depends
// only on how far others have come, so the furthest progress is one fixed
// point, reached in any order.
class Progress {
 public:
  Progress(const PpSchedule& s, const PpPositions& at, const std::vector<std::vector<int>>& post,
           const std::vector<std::vector<int>>& release)
      : s_(s), at_(at), post_(post), due_(static_cast<size_t>(s.pp)), next_(static_cast<size_t>(s.pp), 0),
        posted_(static_cast<size_t>(s.pp), false) {
    for (int r = 0; r < s.pp; ++r) {
      const std::vector<int>& points = release[static_cast<size_t>(r)];
      due_[static_cast<size_t>(r)].resize(points.size() + 1);
      for (size_t k = 0; k < points.size(); ++k)
        if (points[k] >= 0) due_[static_cast<size_t>(r)][static_cast<size_t>(points[k])].push_back(static_cast<int>(k));
    }
    for (bool moved = true; moved;) {
      moved = false;
      for (int r = 0; r < s.pp; ++r) moved = advance(r) || moved;
    }
  }
  // Where rank r stopped (list size: finished) and whether it had posted
  // that point's receives (then a compute is what it waits on).
  int next(int r) const { return next_[static_cast<size_t>(r)]; }
  bool has_posted(int r) const { return posted_[static_cast<size_t>(r)]; }
  // Whether receive j of rank b is posted.
  bool recv_posted(int b, int j) const {
    const int p = post_[static_cast<size_t>(b)][static_cast<size_t>(j)];
    return next(b) > p || (next(b) == p && has_posted(b));
  }
  // Whether the send at index k of rank r has gone out.
  bool sent(int r, int k) const { return next(r) > k; }
  // Whether the activation send of (micro-batch, chunk) on rank r can complete: its receive is posted.
  bool act_send_done(int r, int mb, int chunk) const {
    const int k = at_.of_rank(r, PpOp::send_act, mb, chunk);
    const PpAction& a = s_.actions[static_cast<size_t>(r)][static_cast<size_t>(k)];
    return a.peer == r || recv_posted(a.peer, at_.receiver(r, a));
  }
  bool all_act_sends_done(int r) const {
    for (const PpAction& a : s_.actions[static_cast<size_t>(r)])
      if (a.op == PpOp::send_act && !act_send_done(r, a.micro_batch, a.chunk)) return false;
    return true;
  }
  // The gradient sends of rank r due at its point i whose receives are not posted.
  std::vector<int> blocking(int r, int i) const {
    std::vector<int> out;
    const std::vector<PpAction>& list = s_.actions[static_cast<size_t>(r)];
    for (int k : due_[static_cast<size_t>(r)][static_cast<size_t>(i)]) {
      const PpAction& a = list[static_cast<size_t>(k)];
      if (!recv_posted(a.peer, at_.receiver(r, a))) out.push_back(k);
    }
    return out;
  }

 private:
  bool advance(int r) {
    const std::vector<PpAction>& list = s_.actions[static_cast<size_t>(r)];
    const int n = static_cast<int>(list.size()), last_stage = s_.pp * s_.virtual_stages - 1;
    int& i = next_[static_cast<size_t>(r)];
    const int from = i;
    const bool from_posted = posted_[static_cast<size_t>(r)];
    for (;;) {
      if (!posted_[static_cast<size_t>(r)]) {
        if (!blocking(r, i).empty()) break;
        if (i == n && !all_act_sends_done(r)) break;  // the end waits for every send
        posted_[static_cast<size_t>(r)] = true;
      }
      if (i == n) break;
      const PpAction& a = list[static_cast<size_t>(i)];
      const int stage = a.chunk * s_.pp + r;
      const bool consumes = (a.op == PpOp::forward && stage > 0) || (a.op == PpOp::backward && stage < last_stage);
      if (consumes) {
        const PpAction recv{a.op == PpOp::forward ? PpOp::recv_act : PpOp::recv_grad, a.micro_batch, a.chunk,
                            a.op == PpOp::forward ? (r + s_.pp - 1) % s_.pp : (r + 1) % s_.pp};
        if (!sent(recv.peer, at_.sender(r, recv))) break;
      }
      // A backward first waits for its forward's activation send (it may rewrite the output).
      if (a.op == PpOp::backward && stage < last_stage && !act_send_done(r, a.micro_batch, a.chunk)) break;
      ++i, posted_[static_cast<size_t>(r)] = false;
    }
    return i != from || posted_[static_cast<size_t>(r)] != from_posted;
  }

  const PpSchedule& s_;
  const PpPositions& at_;
  const std::vector<std::vector<int>>& post_;
  std::vector<std::vector<std::vector<int>>> due_;  // per rank and point: the gradient sends taken back there
  std::vector<int> next_;
  std::vector<bool> posted_;
};

// The next send_grad of `list` after point i, else the end.
int next_send_grad(const std::vector<PpAction>& list, int i) {
  for (int k = i + 1; k < static_cast<int>(list.size()); ++k)
    if (list[static_cast<size_t>(k)].op == PpOp::send_grad) return k;
  return static_cast<int>(list.size());
}

// Every rank's release points: each gradient send is taken back at its
// rank's next send_grad, where the rank needs a buffer again; a wait there
// that would block for good (its receiver cannot post the receive before
// this rank moves on) is put off to the next send_grad, and so on, until the
// progress simulation finishes every rank. The end of the run is always
// safe: every receive is posted by then.
std::vector<std::vector<int>> release_points(const PpSchedule& s, const PpPositions& at,
                                             const std::vector<std::vector<int>>& post) {
  std::vector<std::vector<int>> release(static_cast<size_t>(s.pp));
  for (int r = 0; r < s.pp; ++r) {
    const std::vector<PpAction>& list = s.actions[static_cast<size_t>(r)];
    release[static_cast<size_t>(r)].assign(list.size(), -1);
    for (int k = 0; k < static_cast<int>(list.size()); ++k)
      if (list[static_cast<size_t>(k)].op == PpOp::send_grad && list[static_cast<size_t>(k)].peer != r)
        release[static_cast<size_t>(r)][static_cast<size_t>(k)] = next_send_grad(list, k);
  }
  for (;;) {
    const Progress run(s, at, post, release);
    bool finished = true, put_off = false;
    for (int r = 0; r < s.pp; ++r) {
      const std::vector<PpAction>& list = s.actions[static_cast<size_t>(r)];
      const int i = run.next(r);
      finished = finished && i == static_cast<int>(list.size()) && run.has_posted(r);
      if (run.has_posted(r) || i == static_cast<int>(list.size())) continue;  // not held by a release it could put off
      for (int k : run.blocking(r, i)) release[static_cast<size_t>(r)][static_cast<size_t>(k)] = next_send_grad(list, i);
      put_off = true;
    }
    if (finished) return release;
    LOOM_CHECK(put_off, "pp_message_points: the ", pp_schedule_name(s.kind),
               " schedule deadlocks even with every gradient send waited for at the end (validate_pp_schedule)");
  }
}

}  // namespace

PpMessagePoints pp_message_points(const PpSchedule& s, int rank) {
  LOOM_REQUIRE(rank >= 0 && rank < s.pp && static_cast<int>(s.actions.size()) == s.pp, "pp_message_points: rank ",
               rank, " of a schedule of ", s.actions.size(), " action lists for pp = ", s.pp);
  std::vector<std::vector<int>> post;
  for (int r = 0; r < s.pp; ++r) post.push_back(post_points(s.actions[static_cast<size_t>(r)], r));
  const PpPositions at(s);
  std::vector<std::vector<int>> release = release_points(s, at, post);
  return {.post = std::move(post[static_cast<size_t>(rank)]), .release = std::move(release[static_cast<size_t>(rank)])};
}

// Replays run()'s takes and gives in list order (pp_runtime.cpp): at each
// point the sends due are taken back, then the receives due are posted,
// then the action runs (a compute gives back the buffer of the message it
// waited for; send_grad takes one; a rank's send to itself takes one).
PpMessageBuffers pp_message_buffers(const PpSchedule& s, int rank) {
  const PpMessagePoints p = pp_message_points(s, rank);
  const std::vector<PpAction>& list = s.actions[static_cast<size_t>(rank)];
  const size_t n = list.size();
  const int last_stage = s.pp * s.virtual_stages - 1;
  std::vector<std::vector<size_t>> posts_at(n), releases_at(n + 1);
  for (size_t j = 0; j < n; ++j) {
    if (p.post[j] >= 0) posts_at[static_cast<size_t>(p.post[j])].push_back(j);
    if (p.release[j] >= 0) releases_at[static_cast<size_t>(p.release[j])].push_back(j);
  }
  int act = 0, grad = 0;
  PpMessageBuffers most;
  const auto take = [&](bool is_grad) {
    ++(is_grad ? grad : act);
    most.activations = std::max(most.activations, act);
    most.gradients = std::max(most.gradients, grad);
    most.either = std::max(most.either, act + grad);
  };
  for (size_t i = 0; i < n; ++i) {
    grad -= static_cast<int>(releases_at[i].size());
    for (size_t j : posts_at[i])
      if (list[j].peer != rank) take(list[j].op == PpOp::recv_grad);  // a local message moves its sender's buffer
    const PpAction& a = list[i];
    const int stage = a.chunk * s.pp + rank;
    if (a.op == PpOp::forward && stage > 0) --act;
    if (a.op == PpOp::backward && stage < last_stage) --grad;
    if (a.op == PpOp::send_act && a.peer == rank) take(false);
    if (a.op == PpOp::send_grad) take(true);
  }
  return most;
}

}  // namespace loom::parallel
