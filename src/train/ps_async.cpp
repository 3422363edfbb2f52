// The asynchronous parameter servers (parallel/ps.h: SSP with staleness s):
// server 0 watches the workers and orders the servers' work as events; every
// server applies each push alone, as it arrives, and answers a worker's pull
// once the staleness bound allows it.
#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>
#include <tuple>

#include "core/error.h"
#include "core/log.h"
#include "train/ps_server_core.h"

namespace loom::train {
namespace {

using Clock = std::chrono::steady_clock;
namespace ps = parallel::ps;

// What server 0 tells every server to do next: i64[4] {event, worker, step, position}.
enum Event : int64_t { kIdle = 0, kApply = 1, kDrop = 2, kSave = 3, kStopped = 4, kEnd = 5 };
using EventMsg = std::array<int64_t, 4>;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// One worker as the servers see it.
struct Peer {
  bool alive = true, stopped = false;
  int64_t completed = 0;  // its pushes applied
  // This server's pieces of its next push, received ahead (unguarded: it may die).
  std::vector<OwnedTensor> pieces;
  std::vector<comm::WorkPtr> recvs;
  // Server 0: its next command, and the end of the push it announced.
  std::array<int64_t, 4> cmd{};
  comm::WorkPtr cmd_recv;
  std::array<int64_t, 2> done{};
  comm::WorkPtr done_recv;
  bool pushing = false;
  int64_t step = 0, position = 0;
  // Its pull: waiting for the bound since its push of wait_step was applied.
  bool waiting = false;
  int64_t wait_step = 0;
  double norm = 0;
  bool skipped = false;
  Clock::time_point heard = Clock::now();  // its last message, or our last reply to it
  std::vector<std::pair<OwnedTensor, comm::WorkPtr>> replies;  // in flight
};

class Asynchronous {
 public:
  explicit Asynchronous(PsServerCore& core)
      : c_(core), peers_(static_cast<size_t>(core.W)), staleness_(core.cfg.parallel.staleness),
        drop_after_s_(core.cfg.parallel.timeout_s / 2) {}

  void serve() {
    start();
    for (;;) {
      const EventMsg ev = share(lead() ? decide() : EventMsg{});
      last_event_ = Clock::now();
      if (!execute(ev)) break;
    }
    for (Peer& p : peers_)
      for (auto& [buf, work] : p.replies) work->wait();  // the live workers' last replies
  }

 private:
  bool lead() const { return c_.servers.rank() == 0; }
  Peer& peer(int64_t w) { return peers_[static_cast<size_t>(w)]; }

  // Every worker's resume command (to server 0), the step dir shared with the
  // other servers, then every worker's first push awaited.
  void start() {
    std::string path;
    if (lead()) {
      for (int w = 0; w < c_.W; ++w) {
        std::array<int64_t, 4> cmd{};
        c_.world.recv(ps_i64_view(cmd.data(), 4), c_.worker_world_rank(w), ps::kTagCommand)->wait();
        LOOM_REQUIRE(cmd[0] == ps::kResume, "parameter server: worker ", w, " began with command ", cmd[0],
                     " where a resume was due");
        std::vector<int32_t> chars(static_cast<size_t>(cmd[3]));
        if (cmd[3] > 0)
          c_.world.recv(Tensor(chars.data(), DType::i32, {cmd[3]}), c_.worker_world_rank(w), ps::kTagPath)->wait();
        if (w == 0) path.assign(chars.begin(), chars.end());
      }
      warn_without_recovery();
    }
    path = share_path(path);
    c_.resume(path);
    for (int w = 0; w < c_.W; ++w) {
      post_push(w);
      if (lead()) post_command(w);
    }
  }

  void warn_without_recovery() const {
    const char* recovery = std::getenv("OMPI_MCA_orte_enable_recovery");
    if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr && (recovery == nullptr || std::string(recovery) != "1"))
      log_warn("ps: asynchronous training goes on without a worker that dies only when the launcher keeps the job ",
               "alive: start it with mpirun --enable-recovery (OpenMPI); without it mpirun ends the job");
  }

  std::string share_path(const std::string& path) {
    if (c_.S == 1) return path;
    int64_t n = static_cast<int64_t>(path.size());
    c_.servers.broadcast(ps_i64_view(&n, 1), 0)->wait();
    std::vector<int32_t> chars(path.begin(), path.end());
    chars.resize(static_cast<size_t>(n));
    if (n > 0) c_.servers.broadcast(Tensor(chars.data(), DType::i32, {n}), 0)->wait();
    return std::string(chars.begin(), chars.end());
  }

  EventMsg share(EventMsg ev) {
    if (c_.S > 1) c_.servers.broadcast(ps_i64_view(ev.data(), 4), 0)->wait();
    return ev;
  }

  void post_push(int w) {
    Peer& p = peer(w);
    p.pieces.clear(), p.recvs.clear();
    for (int b = 0; b < c_.num_buckets(); ++b) {
      const comm::Range r = c_.piece(b);
      if (r.count == 0) continue;
      p.pieces.push_back(c_.pools[MemTag::comm].empty(DType::f32, {r.count}));
      p.recvs.push_back(c_.world.recv_unguarded(p.pieces.back(), c_.worker_world_rank(w), ps::kTagBucket + b));
    }
  }

  void post_command(int w) {
    Peer& p = peer(w);
    p.cmd_recv = c_.world.recv_unguarded(ps_i64_view(p.cmd.data(), 4), c_.worker_world_rank(w), ps::kTagCommand);
  }

  bool push_complete(Peer& p) {
    if (!p.pushing || !p.done_recv->test()) return false;
    return std::all_of(p.recvs.begin(), p.recvs.end(), [](const comm::WorkPtr& r) { return r->test(); });
  }

  // Server 0: a worker's command, if one arrived (an event, or kIdle).
  EventMsg take_command(int w) {
    Peer& p = peer(w);
    if (!p.cmd_recv || !p.cmd_recv->test()) return {kIdle, 0, 0, 0};
    p.heard = Clock::now();
    p.cmd_recv = nullptr;
    const std::array<int64_t, 4> cmd = p.cmd;
    switch (cmd[0]) {
      case ps::kStep:
        p.pushing = true, p.step = cmd[1], p.position = cmd[2];
        p.done_recv = c_.world.recv_unguarded(ps_i64_view(p.done.data(), 2), c_.worker_world_rank(w), ps::kTagDone);
        post_command(w);
        return {kIdle, 0, 0, 0};
      case ps::kSave: post_command(w); return {kSave, w, cmd[1], cmd[2]};
      case ps::kStop: return {kStopped, w, 0, 0};
      default: fail("parameter server: worker ", w, " sent command ", cmd[0], " to an asynchronous run");
    }
  }

  // Server 0: waits for what happens next.
  EventMsg decide() {
    int sleep_us = 50;
    for (;;) {
      bool any_running = false;
      for (int w = 0; w < c_.W; ++w) {
        Peer& p = peer(w);
        if (!p.alive || p.stopped) continue;
        any_running = true;
        const EventMsg ev = take_command(w);
        if (ev[0] != kIdle) return ev;
        if (push_complete(p)) {
          p.heard = Clock::now();
          return {kApply, w, p.step, p.position};
        }
      }
      if (!any_running) return {kEnd, 0, 0, 0};
      const Clock::time_point now = Clock::now();
      for (int w = 0; w < c_.W; ++w) {
        const Peer& p = peer(w);
        if (p.alive && !p.stopped && !p.waiting && seconds(now - p.heard) > drop_after_s_) return {kDrop, w, 0, 0};
      }
      if (seconds(now - last_event_) > c_.cfg.parallel.timeout_s / 4) return {kIdle, 0, 0, 0};  // keeps the others' waits alive
      reap_replies();
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
      sleep_us = std::min(sleep_us * 2, 1000);
    }
  }

  bool execute(const EventMsg& ev) {
    reap_replies();
    switch (ev[0]) {
      case kIdle: return true;
      case kApply: apply(static_cast<int>(ev[1]), ev[2]); return true;
      case kDrop: drop(static_cast<int>(ev[1])); return true;
      case kSave: save(static_cast<int>(ev[1]), ev[2], ev[3]); return true;
      case kStopped: stop(static_cast<int>(ev[1])); return true;
      case kEnd: return false;
      default: fail("parameter server ", c_.servers.rank(), ": unknown event ", ev[0], " from server 0");
    }
  }

  // Worker w's push of `step`, alone: its gradient (the mean over its own
  // batch) clipped by its own norm, at the learning rate of its step.
  void apply(int w, int64_t step) {
    Peer& p = peer(w);
    int i = 0;
    for (int b = 0; b < c_.num_buckets(); ++b) {
      if (c_.piece(b).count == 0) continue;
      p.recvs[static_cast<size_t>(i)]->wait();  // complete on server 0; sent before the worker's done on the others
      c_.set_grad_piece(b, p.pieces[static_cast<size_t>(i)].data_as<float>());
      ++i;
    }
    std::tie(p.norm, p.skipped) = c_.update(step);
    p.completed = step + 1;
    p.pushing = false;
    p.waiting = true, p.wait_step = step;
    post_push(w);
    answer_waiting();
  }

  int64_t slowest() const {
    int64_t m = std::numeric_limits<int64_t>::max();
    for (const Peer& p : peers_)
      if (p.alive && !p.stopped) m = std::min(m, p.completed);
    return m;
  }

  // Every waiting worker the bound now lets go: its push of step k applied,
  // every live worker has pushed at least k + 1 - staleness steps.
  void answer_waiting() {
    for (int w = 0; w < c_.W; ++w) {
      Peer& p = peer(w);
      if (!p.alive || !p.waiting || slowest() < p.wait_step + 1 - staleness_) continue;
      reply(w);
      p.waiting = false;
      p.heard = Clock::now();
    }
  }

  // The result (server 0) and this server's piece of every bucket's weights,
  // copied: the next push's update must not change them under the send.
  void reply(int w) {
    Peer& p = peer(w);
    const int to = c_.worker_world_rank(w);
    if (lead()) {
      OwnedTensor info = c_.pools[MemTag::comm].empty(DType::i64, {4});
      int64_t* v = info.data_as<int64_t>();
      v[0] = std::bit_cast<int64_t>(p.norm), v[1] = p.skipped ? 1 : 0, v[2] = lost_, v[3] = slowest();
      comm::WorkPtr work = c_.world.send_unguarded(info, to, ps::kTagInfo);
      p.replies.emplace_back(std::move(info), std::move(work));
    }
    for (int b = 0; b < c_.num_buckets(); ++b) {
      const comm::Range r = c_.piece(b);
      if (r.count == 0) continue;
      OwnedTensor copy = c_.pools[MemTag::comm].empty(DType::f32, {r.count});
      c_.copy_param_piece(b, copy.data_as<float>());
      comm::WorkPtr work = c_.world.send_unguarded(copy, to, ps::kTagBucket + b);
      p.replies.emplace_back(std::move(copy), std::move(work));
    }
  }

  void reap_replies() {
    for (Peer& p : peers_)
      std::erase_if(p.replies, [](const std::pair<OwnedTensor, comm::WorkPtr>& r) { return r.second->test(); });
  }

  // Withdraws everything posted to or from worker w.
  void cancel_posted(Peer& p) {
    for (const comm::WorkPtr& r : p.recvs) r->cancel();
    // A piece's receive may have matched a push the worker died sending: MPI
    // may still hold its buffer (the command and done buffers are eager-sized,
    // completed on match, and live in peers_ to the end anyway).
    for (OwnedTensor& piece : p.pieces) graveyard_.push_back(std::move(piece));
    p.recvs.clear(), p.pieces.clear();
    if (p.cmd_recv) p.cmd_recv->cancel();
    if (p.done_recv && p.pushing) p.done_recv->cancel();
    p.cmd_recv = nullptr, p.done_recv = nullptr;
  }

  void drop(int w) {
    Peer& p = peer(w);
    cancel_posted(p);
    for (auto& [buf, work] : p.replies) {
      work->cancel();  // abandoned: MPI may still read the buffer, which is kept to the end
      graveyard_.push_back(std::move(buf));
    }
    p.replies.clear();
    p.alive = false;
    ++lost_;
    comm::note_lost_peer();
    if (lead()) {
      int live = 0;
      for (const Peer& q : peers_) live += q.alive && !q.stopped;
      log_warn("ps: worker ", w, " (world rank ", c_.worker_world_rank(w), ") lost: nothing from it for ",
               drop_after_s_, " s (parallel.timeout_s / 2) after ", p.completed, " pushes; dropped, training goes on ",
               "with ", live, " worker", live == 1 ? "" : "s");
    }
    answer_waiting();
  }

  void stop(int w) {
    Peer& p = peer(w);
    cancel_posted(p);
    p.stopped = true;
    answer_waiting();
  }

  void save(int w, int64_t step, int64_t position) {
    c_.save(step, position);
    if (!lead()) return;
    int64_t ok = 1;
    c_.world.send(ps_i64_view(&ok, 1), c_.worker_world_rank(w), ps::kTagReply)->wait();
  }

  PsServerCore& c_;
  std::vector<Peer> peers_;
  int64_t staleness_;
  double drop_after_s_;
  int64_t lost_ = 0;
  Clock::time_point last_event_ = Clock::now();
  std::vector<OwnedTensor> graveyard_;  // buffers of withdrawn sends and receives, kept to the end
};

}  // namespace

void serve_asynchronous(PsServerCore& core) { Asynchronous(core).serve(); }

}  // namespace loom::train
