// The progress engine of one MPI communicator: a thread that posts and
// drives every operation, so work proceeds while the caller computes (MPI
// progresses nonblocking requests only inside MPI calls).
//
// Point-to-point operations are posted the moment the thread sees them, in
// issue order, and never wait for each other. Collectives run one at a time
// in issue order as blocking code on the thread; their waits (Engine::wait)
// keep posting and testing point-to-point operations and answer watchdog
// queries, so nothing queued behind a collective starves.
//
// Polling backs off: yield while requests are moving, then sleep (up to
// 1 ms) once nothing has completed for a while, and block on a condition
// variable when idle, so 8 ranks on 2 cores do not spin each other out.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"

namespace loom::comm {

// Who the communicator is, for watchdog and check messages.
struct CommInfo {
  std::string name;
  int rank = 0;
  int size = 1;
  std::vector<int> world_ranks;  // world rank of each member
  Options options;
  MPI_Comm ctl = MPI_COMM_NULL;  // watchdog queries and replies
};

// The Work of one operation; completed by the engine thread.
class OpWork : public Work {
 public:
  // guarded = false: a point-to-point op without deadline, which cancel()
  // withdraws (Communicator::send_unguarded / recv_unguarded).
  OpWork(std::shared_ptr<const CommInfo> info, std::string what, int64_t seq, int peer, bool guarded = true)
      : info_(std::move(info)), what_(std::move(what)), seq_(seq), peer_(peer), guarded_(guarded),
        issued_at_(std::chrono::steady_clock::now()) {}
  void wait() override;
  // Past issue + timeout_s an incomplete op trips the watchdog here too, so a
  // caller that polls instead of waiting is not left spinning forever.
  bool test() override;
  // Unguarded ops: asks the engine to withdraw the op and waits until it has.
  void cancel() override;
  bool cancel_requested() const { return cancel_requested_.load(); }
  bool guarded() const { return guarded_; }
  void finish(std::exception_ptr error);
  // The watchdog's message and job abort; `context` (may be empty) opens the
  // message's reason, e.g. that the communicator is being destroyed. On the
  // engine thread (a drain's deadline) `serve_queries` answers the other
  // ranks' watchdogs while this one waits for their answers: two ranks whose
  // deadlines pass together must not take each other for silent.
  [[noreturn]] void watchdog_abort(const std::string& context = "",
                                   const std::function<void()>& serve_queries = {});
  // "send(f32[8], to 1, tag 0) #3 on communicator 'world'"
  std::string label() const;

  const std::string& what() const { return what_; }
  int64_t seq() const { return seq_; }
  int peer() const { return peer_; }  // -1 for collectives

 private:
  std::shared_ptr<const CommInfo> info_;
  std::string what_;  // "all_reduce(f32, 1000 elements, sum)"
  int64_t seq_;
  int peer_;
  bool guarded_ = true;
  std::atomic<bool> cancel_requested_{false};
  std::function<void()> wake_engine_;  // set by Engine::submit_p2p: cancel() wakes the engine's thread
  friend class Engine;
  std::chrono::steady_clock::time_point issued_at_;
  std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

struct P2pPost {
  bool is_send = false;
  void* buf = nullptr;
  int count = 0;
  MPI_Datatype type = MPI_BYTE;
  int peer = 0;
  int tag = 0;
};

class Engine {
 public:
  // comm carries user point-to-point messages and MPI's collectives.
  Engine(MPI_Comm comm, std::shared_ptr<const CommInfo> info);
  // Finishes every queued operation, then stops the thread. Operations still
  // pending timeout_s after destruction began trip the watchdog (job abort
  // naming them): a destructor must not hang forever on a missing peer.
  // stop() at destruction, if not called before.
  ~Engine();
  // The drain and stop described above; the owner calls it while everything
  // the queued bodies use is still alive. Idempotent.
  void stop();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Caller thread. A collective's body runs on the engine thread after every
  // earlier collective; an exception it throws goes to the Work.
  void submit_collective(std::shared_ptr<OpWork> work, std::function<void()> body);
  void submit_p2p(std::shared_ptr<OpWork> work, P2pPost post);
  // The highest collective sequence number this rank has issued.
  int64_t issued_collectives() const { return issued_.load(); }

  // Engine thread, inside a collective body: completes req while driving
  // everything else; an MPI error becomes a loom::Error naming the running
  // collective (MPI_ERRORS_RETURN is set on every loom communicator).
  void wait(MPI_Request* req);
  // Engine thread: "all_reduce(...) #4 on communicator 'world'" of the
  // collective whose body runs now, for error messages.
  std::string running_label() const;

 private:
  struct Pending {
    std::shared_ptr<OpWork> work;
    std::function<void()> body;  // collective
    P2pPost post;                // point-to-point, when body is empty
  };
  void loop();
  bool poll();  // posts new p2p ops, tests active ones, answers queries; true if anything happened
  void post_p2p(Pending& p);
  void serve_queries(bool& progressed);
  // Aborts the job once a destructor's drain has run past its deadline.
  void check_drain_deadline();

  MPI_Comm comm_;
  std::shared_ptr<const CommInfo> info_;
  std::atomic<int64_t> issued_{0};

  std::mutex m_;
  std::condition_variable cv_;
  std::deque<Pending> incoming_;  // guarded by m_
  bool stop_ = false;             // guarded by m_
  // steady_clock nanoseconds by which a destructor's drain must finish; set
  // once by ~Engine, read by the engine thread.
  std::atomic<int64_t> drain_deadline_ns_{INT64_MAX};

  // Engine thread only.
  std::deque<Pending> collectives_;
  std::shared_ptr<OpWork> running_;  // the collective whose body runs now
  std::vector<std::pair<std::shared_ptr<OpWork>, MPI_Request>> active_p2p_;
  MPI_Request query_req_ = MPI_REQUEST_NULL;
  int64_t query_buf_ = 0;
  std::deque<std::pair<int64_t, MPI_Request>> replies_;

  std::thread thread_;
};

// Tags on CommInfo::ctl.
inline constexpr int kQueryTag = 1;
inline constexpr int kReplyTag = 2;

}  // namespace loom::comm
