#include "comm/engine.h"

#include <chrono>

#include "comm/deadline.h"
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
  {
    std::lock_guard lock(m_);
    if (done_) return true;
  }
  if (guarded_ && Clock::now() > deadline_after(issued_at_, info_->options.timeout_s)) watchdog_abort();
  return false;
}

void OpWork::cancel() {
  if (guarded_) return;
  cancel_requested_.store(true);
  if (wake_engine_) wake_engine_();
  std::unique_lock lock(m_);
  cv_.wait(lock, [&] { return done_; });
}

std::string OpWork::label() const { return concat(what_, " #", seq_, " on communicator '", info_->name, "'"); }

void OpWork::wait() {
  std::unique_lock lock(m_);
  if (!guarded_) {  // no deadline: the caller watches the peer itself
    cv_.wait(lock, [&] { return done_; });
    if (error_) std::rethrow_exception(error_);
    return;
  }
  const auto deadline = deadline_after(Clock::now(), info_->options.timeout_s);
  if (!cv_.wait_until(lock, deadline, [&] { return done_; })) {
    lock.unlock();
    watchdog_abort();
  }
  if (error_) std::rethrow_exception(error_);
}

// Asks every other member which collective it has issued last (its engine
// answers from its own thread, even while its caller sleeps or computes):
// those below this op's sequence number never arrived.
void OpWork::watchdog_abort(const std::string& context, const std::function<void()>& serve_queries) {
  const CommInfo& info = *info_;
  std::string head = concat("[rank ", info.world_ranks.at(info.rank), "] comm watchdog: ", context, label(),
                            " did not complete within ", info.options.timeout_s, " s; ");
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
    if (serve_queries) serve_queries();
    if (!all_done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::string missing, silent;
  for (int r = 0; r < info.size; ++r) {
    if (r == info.rank) continue;
    if (replies[r] < 0) silent += concat(silent.empty() ? "" : ", ", describe_rank(info, r));
    else if (replies[r] < seq_)
      missing += concat(missing.empty() ? "" : ", ", describe_rank(info, r), " (last issued #", replies[r], ")");
  }
  // Blame goes to the ranks that answered with a lower count (alive, not
  // there yet) and to the silent ones: a live rank's engine answers within
  // milliseconds even while its caller computes or waits, so silence means
  // the rank left this communicator (exited, or failed without ending the
  // job) or its process is stuck. Ranks that have issued the op are never named.
  std::string who = missing.empty() ? "" : "ranks that did not arrive: " + missing;
  if (!silent.empty())
    who += concat(who.empty() ? "" : "; ", "ranks that did not answer (exited, failed or stuck): ", silent);
  if (who.empty()) who = "every rank has issued it (mismatched collectives? run with --check-collectives)";
  mpi_abort_job(concat(head, who, ". Aborting the job."));
}

Engine::Engine(MPI_Comm comm, std::shared_ptr<const CommInfo> info) : comm_(comm), info_(std::move(info)) {
  MPI_Irecv(&query_buf_, 1, MPI_INT64_T, MPI_ANY_SOURCE, kQueryTag, info_->ctl, &query_req_);
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() { stop(); }

void Engine::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(m_);
    const auto deadline = deadline_after(Clock::now(), info_->options.timeout_s);
    drain_deadline_ns_.store(std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch()).count());
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
  if (!work->guarded()) work->wake_engine_ = [this] { cv_.notify_all(); };
  {
    std::lock_guard lock(m_);
    incoming_.push_back(Pending{std::move(work), {}, post});
  }
  cv_.notify_all();
}

namespace {

// The loom::Error of a point-to-point op that MPI failed (a receive smaller
// than the matching send: MPI_ERR_TRUNCATE).
std::exception_ptr p2p_error(const OpWork& work, const CommInfo& info, int code) {
  const char* hint = work.what().rfind("recv", 0) == 0
                         ? " (is the receive buffer smaller than the message the peer sent?)"
                         : "";
  return std::make_exception_ptr(Error(concat(work.label(), " failed with peer ", describe_rank(info, work.peer()),
                                              ": ", mpi_error_text(code), hint)));
}

}  // namespace

void Engine::post_p2p(Pending& p) {
  if (p.work->cancel_requested()) {  // withdrawn before it was posted
    p.work->finish(nullptr);
    return;
  }
  MPI_Request req = MPI_REQUEST_NULL;
  const P2pPost& q = p.post;
  const int rc = q.is_send ? MPI_Isend(q.buf, q.count, q.type, q.peer, q.tag, comm_, &req)
                           : MPI_Irecv(q.buf, q.count, q.type, q.peer, q.tag, comm_, &req);
  if (rc != MPI_SUCCESS) {
    p.work->finish(p2p_error(*p.work, *info_, rc));
    return;
  }
  active_p2p_.emplace_back(std::move(p.work), req);
}

void Engine::check_drain_deadline() {
  const int64_t deadline = drain_deadline_ns_.load();
  if (deadline == INT64_MAX) return;
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  if (now < deadline) return;
  std::shared_ptr<OpWork> oldest = running_;
  std::string pending;
  auto add = [&](const std::shared_ptr<OpWork>& w) {
    if (!oldest) oldest = w;
    pending += concat(pending.empty() ? "" : ", ", w->what(), " #", w->seq());
  };
  if (running_) add(running_);
  for (const Pending& c : collectives_) add(c.work);
  for (const auto& a : active_p2p_) add(a.first);
  {
    std::lock_guard lock(m_);
    for (const Pending& c : incoming_) add(c.work);
  }
  // The last pending op may finish just as the deadline passes: then the
  // drain is over, and the loop exits on its next idle turn.
  if (!oldest) return;
  oldest->watchdog_abort(concat("communicator '", info_->name, "' was destroyed with unfinished operations (",
                                pending, "); "),
                         [this] {
                           bool progressed = false;
                           serve_queries(progressed);
                         });
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
    OpWork& op = *active_p2p_[i].first;
    if (op.cancel_requested()) {  // an unguarded op withdrawn (OpWork::cancel)
      // Never waited for: a receive that already matched a message from a
      // peer that then died (a single-copy read of its memory failed) never
      // completes, cancelled or not, and waiting would stall this thread and
      // every operation behind it. Freed, the request's buffer may still be
      // read or written by MPI: the caller keeps it (Work::cancel).
      MPI_Request& req = active_p2p_[i].second;
      if (op.what().rfind("recv", 0) == 0) MPI_Cancel(&req);
      MPI_Request_free(&req);
      op.finish(nullptr);
      active_p2p_.erase(active_p2p_.begin() + static_cast<std::ptrdiff_t>(i));
      progressed = true;
      continue;
    }
    int flag = 0;
    const int rc = MPI_Test(&active_p2p_[i].second, &flag, MPI_STATUS_IGNORE);
    if (flag || rc != MPI_SUCCESS) {
      OpWork& work = *active_p2p_[i].first;
      work.finish(rc == MPI_SUCCESS ? nullptr : p2p_error(work, *info_, rc));
      active_p2p_.erase(active_p2p_.begin() + static_cast<std::ptrdiff_t>(i));
      progressed = true;
    } else {
      ++i;
    }
  }
  serve_queries(progressed);
  check_drain_deadline();
  return progressed;
}

void Engine::wait(MPI_Request* req) {
  Backoff backoff;
  for (;;) {
    int flag = 0;
    const int rc = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      throw Error(concat(running_label(), " failed: ", mpi_error_text(rc)));
    }
    if (flag) return;
    if (poll()) backoff.reset();
    else backoff.pause();
  }
}

std::string Engine::running_label() const {
  return running_ ? running_->label() : concat("an operation on communicator '", info_->name, "'");
}

void Engine::loop() {
  Backoff backoff;
  for (;;) {
    const bool progressed = poll();
    if (!collectives_.empty()) {
      Pending c = std::move(collectives_.front());
      collectives_.pop_front();
      std::exception_ptr error;
      running_ = c.work;
      try {
        c.body();
      } catch (...) {
        error = std::current_exception();
      }
      running_.reset();
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
