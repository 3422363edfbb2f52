#include "comm/self_communicator.h"

#include <utility>

#include "core/memory.h"

namespace loom::comm {

namespace {

// Complete from the start, or (a recv posted before its send) when matched.
class SelfWork final : public Work {
 public:
  explicit SelfWork(bool done) : done_(done) {}
  void wait() override {
    LOOM_CHECK(done_, "a recv on a one-rank communicator waits for a send to itself that was never posted");
  }
  bool test() override { return done_; }
  void complete() { done_ = true; }

 private:
  bool done_;
};

WorkPtr done() { return std::make_shared<SelfWork>(true); }

// Copies the first `bytes` of src to the start of dst (a recv buffer may be
// larger than its message) unless they are the same memory (in place), on
// the host or on the device both live on (a one-GPU run's "collectives").
void copy_bytes(const Tensor& dst, const Tensor& src, size_t bytes) {
  const auto n = static_cast<int64_t>(bytes);
  copy_tensor(Tensor(dst.data(), DType::u8, {n}, dst.device()), Tensor(src.data(), DType::u8, {n}, src.device()));
}
void copy_bytes(const Tensor& dst, const Tensor& src) { copy_bytes(dst, src, src.nbytes()); }

}  // namespace

struct SelfCommunicator::Pending {
  Tensor buf;
  int tag = 0;
  std::shared_ptr<SelfWork> work;
};

SelfCommunicator::SelfCommunicator(std::string name, Options options)
    : name_(std::move(name)), options_(options) {}

// One rank's collectives are copies or nothing, which core does on the host
// or on any registered device: the call's device is its tensor's (the
// validation still requires every tensor of one call on that device).
CallSite SelfCommunicator::at(const char* op, const Tensor& t) const { return {op, name_, 1, t.device()}; }

WorkPtr SelfCommunicator::all_reduce(Tensor buf, ReduceOp op) {
  validate_buffer(at("all_reduce", buf), "buf", buf);
  validate_reduce_op(at("all_reduce", buf), buf.dtype(), op);
  return done();
}

WorkPtr SelfCommunicator::reduce_scatter(Tensor out, Tensor in, ReduceOp op) {
  validate_reduce_scatter(at("reduce_scatter", in), 0, out, in, op);
  copy_bytes(out, in);
  return done();
}

WorkPtr SelfCommunicator::all_gather(Tensor out, Tensor in) {
  validate_all_gather(at("all_gather", in), 0, out, in);
  copy_bytes(out, in);
  return done();
}

WorkPtr SelfCommunicator::broadcast(Tensor buf, int root) {
  validate_buffer(at("broadcast", buf), "buf", buf);
  validate_peer(at("broadcast", buf), "root", root);
  return done();
}

// A message to itself: the oldest pending recv with the same tag takes it,
// else it waits (as a copy of the sender's tensor view) for one.
WorkPtr SelfCommunicator::send(Tensor buf, int peer, int tag) {
  validate_buffer(at("send", buf), "buf", buf);
  validate_peer(at("send", buf), "peer", peer);
  for (auto it = recvs_.begin(); it != recvs_.end(); ++it) {
    if ((*it)->tag != tag) continue;
    LOOM_REQUIRE((*it)->buf.nbytes() >= buf.nbytes(), "send on ", name_, ": a message of ", describe(buf),
                 " is larger than its recv buffer (", describe((*it)->buf), ")");
    copy_bytes((*it)->buf, buf);
    (*it)->work->complete();
    recvs_.erase(it);
    return done();
  }
  // The sender must leave buf untouched until its Work completes; a send to
  // oneself completes at its recv.
  auto pending = std::make_shared<Pending>(Pending{buf, tag, std::make_shared<SelfWork>(false)});
  sends_.push_back(pending);
  return pending->work;
}

WorkPtr SelfCommunicator::recv(Tensor buf, int peer, int tag) {
  validate_buffer(at("recv", buf), "buf", buf);
  validate_peer(at("recv", buf), "peer", peer);
  for (auto it = sends_.begin(); it != sends_.end(); ++it) {
    if ((*it)->tag != tag) continue;
    LOOM_REQUIRE(buf.nbytes() >= (*it)->buf.nbytes(), "recv on ", name_, ": a message of ", describe((*it)->buf),
                 " is larger than the recv buffer (", describe(buf), ")");
    copy_bytes(buf, (*it)->buf);
    (*it)->work->complete();
    sends_.erase(it);
    return done();
  }
  auto pending = std::make_shared<Pending>(Pending{buf, tag, std::make_shared<SelfWork>(false)});
  recvs_.push_back(pending);
  return pending->work;
}

WorkPtr SelfCommunicator::all_to_all(Tensor out, Tensor in) {
  validate_all_to_all(at("all_to_all", in), out, in);
  copy_bytes(out, in);
  return done();
}

WorkPtr SelfCommunicator::all_to_all_v(Tensor out, std::span<const int64_t> out_counts, Tensor in,
                                       std::span<const int64_t> in_counts) {
  validate_all_to_all_v(at("all_to_all_v", in), out, out_counts, in, in_counts);
  LOOM_REQUIRE(out_counts[0] == in_counts[0], "all_to_all_v on ", name_, ": rank 0 sends itself ", in_counts[0],
               " elements but expects ", out_counts[0]);
  copy_bytes(out, in, static_cast<size_t>(in_counts[0]) * dtype_size(in.dtype()));
  return done();
}

WorkPtr SelfCommunicator::barrier() { return done(); }

std::unique_ptr<Communicator> SelfCommunicator::split(int, int, const std::string& name) {
  return std::make_unique<SelfCommunicator>(name, options_);
}

}  // namespace loom::comm
