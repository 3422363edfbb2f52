// Point-to-point messages of the emulated device's communicator
// (emulated_device.h) queued the way the NCCL backend queues them
// (comm/nccl/nccl_backend.h), so a schedule that would hang or mispair its
// messages on GPUs does so here, on CPUs:
//   - each stream of p2p_link (comm/p2p_links.h) is a queue served by a
//     thread of its own: an op starts once the op before it on its stream
//     has finished;
//   - a send finishes only once its receive has taken the message (the
//     receiver acknowledges it), a receive once the message is here;
//   - NCCL has no tags: every message travels under one MPI tag, after a
//     header with the tag its sender gave, which the receive checks, so
//     messages that pair by tag instead of issue order fail by name;
//   - the communicator's first send or recv waits until both neighbours in
//     rank order have issued theirs (NCCL's connection set-up).
// MPI (the host communicator) carries the bytes.
#pragma once

#include <array>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/p2p_links.h"
#include "core/error.h"

namespace loom::test {

class EmulatedP2p {
 public:
  // `host` carries the messages; every call into it (here and by the
  // caller) holds `issue`: it is not made to be issued on by two threads.
  EmulatedP2p(comm::Communicator& host, std::mutex& issue) : host_(host), issue_m_(issue) {}
  // Finishes every queued op (their peers must issue the matching ones).
  ~EmulatedP2p() {
    {
      std::lock_guard lock(m_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_)
      if (t.joinable()) t.join();
  }
  EmulatedP2p(const EmulatedP2p&) = delete;
  EmulatedP2p& operator=(const EmulatedP2p&) = delete;

  // buf: the host view of the device tensor.
  comm::WorkPtr submit(bool is_send, Tensor buf, int peer, int tag) {
    if (!connected_) connect();
    auto op = std::make_shared<Op>(is_send, buf, peer, tag);
    const int link = static_cast<int>(comm::p2p_link(host_.rank(), host_.size(), peer, is_send));
    {
      std::lock_guard lock(m_);
      queues_[static_cast<size_t>(link)].push_back(op);
      if (!started_[static_cast<size_t>(link)]) {
        started_[static_cast<size_t>(link)] = true;
        threads_.emplace_back([this, link] { serve(link); });
      }
    }
    cv_.notify_all();
    return op;
  }

 private:
  static constexpr int kMessage = 0, kAck = 1, kConnect = 2;

  // A queued op is its own Work: finished by its stream's thread.
  struct Op final : comm::Work {
    Op(bool send, Tensor b, int to_or_from, int t) : is_send(send), buf(b), peer(to_or_from), tag(t) {}
    void wait() override {
      std::unique_lock lock(m);
      cv.wait(lock, [&] { return done; });
      if (error) std::rethrow_exception(error);
    }
    bool test() override {
      std::lock_guard lock(m);
      return done;
    }
    void finish(std::exception_ptr e) {
      {
        std::lock_guard lock(m);
        done = true, error = std::move(e);
      }
      cv.notify_all();
    }
    const bool is_send;
    const Tensor buf;
    const int peer, tag;
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    std::exception_ptr error;
  };

  comm::WorkPtr issue(bool is_send, Tensor buf, int peer, int tag) {
    std::lock_guard lock(issue_m_);
    return is_send ? host_.send(buf, peer, tag) : host_.recv(buf, peer, tag);
  }

  void connect() {
    const int n = host_.size(), r = host_.rank();
    connected_ = true;
    if (n == 1) return;
    std::vector<int> neighbours = {(r + 1) % n};
    if (n > 2) neighbours.push_back((r + n - 1) % n);
    std::vector<int32_t> tokens(2 * neighbours.size(), r);
    std::vector<comm::WorkPtr> works;
    for (size_t i = 0; i < neighbours.size(); ++i) {
      works.push_back(issue(true, Tensor(&tokens[i], DType::i32, {1}), neighbours[i], kConnect));
      works.push_back(issue(false, Tensor(&tokens[neighbours.size() + i], DType::i32, {1}), neighbours[i], kConnect));
    }
    for (const comm::WorkPtr& w : works) w->wait();
  }

  void serve(int link) {
    std::deque<std::shared_ptr<Op>>& queue = queues_[static_cast<size_t>(link)];
    for (;;) {
      std::shared_ptr<Op> op;
      {
        std::unique_lock lock(m_);
        cv_.wait(lock, [&] { return stopping_ || !queue.empty(); });
        if (queue.empty()) return;
        op = queue.front();
      }
      std::exception_ptr error;
      try {
        run(*op);
      } catch (...) {
        error = std::current_exception();
      }
      {
        std::lock_guard lock(m_);
        queue.pop_front();
      }
      op->finish(error);
    }
  }

  void run(const Op& op) {
    int32_t header = op.is_send ? op.tag : -1, ack = 0;
    const Tensor header_t(&header, DType::i32, {1}), ack_t(&ack, DType::i32, {1});
    comm::WorkPtr head = issue(op.is_send, header_t, op.peer, kMessage);
    comm::WorkPtr body = issue(op.is_send, op.buf, op.peer, kMessage);
    head->wait(), body->wait();
    if (op.is_send) {
      issue(false, ack_t, op.peer, kAck)->wait();
      return;
    }
    issue(true, ack_t, op.peer, kAck)->wait();
    LOOM_REQUIRE(header == op.tag, "communicator ", host_.name(), " (emulated cuda): recv from ", op.peer,
                 " with tag ", op.tag, " is matched, in NCCL's issue order, with the message sent with tag ", header,
                 ": the two ranks post their messages in different orders");
  }

  comm::Communicator& host_;
  std::mutex& issue_m_;
  bool connected_ = false;  // the caller's thread only
  std::mutex m_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::array<std::deque<std::shared_ptr<Op>>, comm::kP2pLinks> queues_;
  std::array<bool, comm::kP2pLinks> started_{};
  std::vector<std::thread> threads_;
};

}  // namespace loom::test
