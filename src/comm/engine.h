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
  OpWork(std::shared_ptr<const CommInfo> info, std::string what, int64_t seq, int peer)
      : info_(std::move(info)), what_(std::move(what)), seq_(seq), peer_(peer) {}
  void wait() override;
  bool test() override;
  void finish(std::exception_ptr error);

  const std::string& what() const { return what_; }
  int64_t seq() const { return seq_; }
  int peer() const { return peer_; }  // -1 for collectives

 private:
  [[noreturn]] void watchdog_abort();

  std::shared_ptr<const CommInfo> info_;
  std::string what_;  // "all_reduce(f32, 1000 elements, sum)"
  int64_t seq_;
  int peer_;
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
  ~Engine();  // finishes every queued operation, then stops the thread
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Caller thread. A collective's body runs on the engine thread after every
  // earlier collective; an exception it throws goes to the Work.
  void submit_collective(std::shared_ptr<OpWork> work, std::function<void()> body);
  void submit_p2p(std::shared_ptr<OpWork> work, P2pPost post);
  // The highest collective sequence number this rank has issued.
  int64_t issued_collectives() const { return issued_.load(); }

  // Engine thread, inside a collective body: completes req while driving
  // everything else.
  void wait(MPI_Request* req);

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

  MPI_Comm comm_;
  std::shared_ptr<const CommInfo> info_;
  std::atomic<int64_t> issued_{0};

  std::mutex m_;
  std::condition_variable cv_;
  std::deque<Pending> incoming_;  // guarded by m_
  bool stop_ = false;             // guarded by m_

  // Engine thread only.
  std::deque<Pending> collectives_;
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
