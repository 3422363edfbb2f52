#include "comm/engine.h"

#include <chrono>

#include "comm/mpi_runtime.h"
#include "core/error.h"

namespace loom::comm {
namespace {

using Clock = std::chrono::steady_clock;

// Yield while requests are moving (a piece of a large message completes every
// few hundred microseconds), sleep once nothing has completed for 5 ms: the
// peer is computing, and spinning would steal its core.
class Backoff {
 public:
  void reset() { idle_since_ = Clock::now(); sleep_us_ = 20; }
  void pause() {
    if (Clock::now() - idle_since_ < std::chrono::milliseconds(5)) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
    sleep_us_ = std::min(sleep_us_ * 2, 1000);
  }

 private:
  Clock::time_point idle_since_ = Clock::now();
  int sleep_us_ = 20;
};

std::string describe_rank(const CommInfo& info, int r) {
  return concat(r, " (world rank ", info.world_ranks.at(r), ")");
}

}  // namespace

void OpWork::finish(std::exception_ptr error) {
  std::lock_guard lock(m_);
  done_ = true;
  error_ = std::move(error);
  cv_.notify_all();
}

bool OpWork::test() {
  std::lock_guard lock(m_);
  return done_;
}

void OpWork::wait() {
  std::unique_lock lock(m_);
  const auto deadline = Clock::now() + std::chrono::duration<double>(info_->options.timeout_s);
  if (!cv_.wait_until(lock, deadline, [&] { return done_; })) {
    lock.unlock();
    watchdog_abort();
  }
  if (error_) std::rethrow_exception(error_);
}

// Asks every other member which collective it has issued last (its engine
// answers from its own thread, even while its caller sleeps or computes):
// those below this op's sequence number never arrived.
void OpWork::watchdog_abort() {
  const CommInfo& info = *info_;
  std::string head = concat("[rank ", info.world_ranks.at(info.rank), "] comm watchdog: ", what_, " #", seq_,
                            " on communicator '", info.name, "' did not complete within ", info.options.timeout_s,
                            " s; ");
  if (peer_ >= 0)
    mpi_abort_job(concat(head, "the rank that did not arrive: peer ", describe_rank(info, peer_), ". Aborting the job."));

  std::vector<int64_t> replies(info.size, -1);
  std::vector<MPI_Request> reqs;
  int64_t query = seq_;
  for (int r = 0; r < info.size; ++r) {
    if (r == info.rank) continue;
    reqs.emplace_back();
    MPI_Irecv(&replies[r], 1, MPI_INT64_T, r, kReplyTag, info.ctl, &reqs.back());
    reqs.emplace_back();
    MPI_Isend(&query, 1, MPI_INT64_T, r, kQueryTag, info.ctl, &reqs.back());
  }
  const auto give_up = Clock::now() + std::chrono::seconds(1);
  int all_done = 0;
  while (!all_done && Clock::now() < give_up) {
    MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &all_done, MPI_STATUSES_IGNORE);
    if (!all_done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::string missing, silent;
  for (int r = 0; r < info.size; ++r) {
    if (r == info.rank) continue;
    if (replies[r] < 0) silent += concat(silent.empty() ? "" : ", ", describe_rank(info, r));
    else if (replies[r] < seq_)
      missing += concat(missing.empty() ? "" : ", ", describe_rank(info, r), " (last issued #", replies[r], ")");
  }
  std::string who = missing.empty() ? "every rank that answered has issued it" : "ranks that did not arrive: " + missing;
  if (!silent.empty()) who += "; ranks that did not answer: " + silent;
  if (missing.empty() && silent.empty()) who += " (mismatched collectives? run with --check-collectives)";
  mpi_abort_job(concat(head, who, ". Aborting the job."));
}

Engine::Engine(MPI_Comm comm, std::shared_ptr<const CommInfo> info) : comm_(comm), info_(std::move(info)) {
  MPI_Irecv(&query_buf_, 1, MPI_INT64_T, MPI_ANY_SOURCE, kQueryTag, info_->ctl, &query_req_);
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard lock(m_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  MPI_Cancel(&query_req_);
  MPI_Wait(&query_req_, MPI_STATUS_IGNORE);
  for (auto& [value, req] : replies_) MPI_Wait(&req, MPI_STATUS_IGNORE);
}

void Engine::submit_collective(std::shared_ptr<OpWork> work, std::function<void()> body) {
  issued_.store(work->seq());
  {
    std::lock_guard lock(m_);
    incoming_.push_back(Pending{std::move(work), std::move(body), {}});
  }
  cv_.notify_all();
}

void Engine::submit_p2p(std::shared_ptr<OpWork> work, P2pPost post) {
  {
    std::lock_guard lock(m_);
    incoming_.push_back(Pending{std::move(work), {}, post});
  }
  cv_.notify_all();
}

void Engine::post_p2p(Pending& p) {
  MPI_Request req;
  const P2pPost& q = p.post;
  if (q.is_send) MPI_Isend(q.buf, q.count, q.type, q.peer, q.tag, comm_, &req);
  else MPI_Irecv(q.buf, q.count, q.type, q.peer, q.tag, comm_, &req);
  active_p2p_.emplace_back(std::move(p.work), req);
}

void Engine::serve_queries(bool& progressed) {
  int flag = 0;
  MPI_Status status;
  MPI_Test(&query_req_, &flag, &status);
  if (flag) {
    replies_.emplace_back(issued_.load(), MPI_REQUEST_NULL);
    MPI_Isend(&replies_.back().first, 1, MPI_INT64_T, status.MPI_SOURCE, kReplyTag, info_->ctl,
              &replies_.back().second);
    MPI_Irecv(&query_buf_, 1, MPI_INT64_T, MPI_ANY_SOURCE, kQueryTag, info_->ctl, &query_req_);
    progressed = true;
  }
  while (!replies_.empty()) {
    MPI_Test(&replies_.front().second, &flag, MPI_STATUS_IGNORE);
    if (!flag) break;
    replies_.pop_front();
  }
}

bool Engine::poll() {
  bool progressed = false;
  std::deque<Pending> fresh;
  {
    std::lock_guard lock(m_);
    fresh.swap(incoming_);
  }
  for (Pending& p : fresh) {
    if (p.body) collectives_.push_back(std::move(p));
    else post_p2p(p);
    progressed = true;
  }
  for (size_t i = 0; i < active_p2p_.size();) {
    int flag = 0;
    MPI_Test(&active_p2p_[i].second, &flag, MPI_STATUS_IGNORE);
    if (flag) {
      active_p2p_[i].first->finish(nullptr);
      active_p2p_.erase(active_p2p_.begin() + static_cast<std::ptrdiff_t>(i));
      progressed = true;
    } else {
      ++i;
    }
  }
  serve_queries(progressed);
  return progressed;
}

void Engine::wait(MPI_Request* req) {
  Backoff backoff;
  for (;;) {
    int flag = 0;
    MPI_Test(req, &flag, MPI_STATUS_IGNORE);
    if (flag) return;
    if (poll()) backoff.reset();
    else backoff.pause();
  }
}

void Engine::loop() {
  Backoff backoff;
  for (;;) {
    const bool progressed = poll();
    if (!collectives_.empty()) {
      Pending c = std::move(collectives_.front());
      collectives_.pop_front();
      std::exception_ptr error;
      try {
        c.body();
      } catch (...) {
        error = std::current_exception();
      }
      c.work->finish(error);
      backoff.reset();
      continue;
    }
    if (!active_p2p_.empty()) {
      if (progressed) backoff.reset();
      else backoff.pause();
      continue;
    }
    // Idle: sleep until new work, waking now and then to answer queries.
    std::unique_lock lock(m_);
    if (incoming_.empty() && stop_) return;
    cv_.wait_for(lock, std::chrono::milliseconds(50), [&] { return !incoming_.empty() || stop_; });
  }
}

}  // namespace loom::comm
