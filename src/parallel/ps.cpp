// The parameter-server worker (parallel/ps.h).
#include "parallel/ps.h"

#include <bit>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <utility>

#include "comm/reduce.h"
#include "core/error.h"
#include "core/log.h"

namespace loom::parallel {
namespace {

Tensor i64_view(int64_t* p, int64_t n) { return Tensor(p, DType::i64, {n}); }

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Several operations seen as one; `finish` runs once, after all of them
// completed, on the thread that waits or tests.
class GroupWork final : public comm::Work {
 public:
  GroupWork(std::vector<comm::WorkPtr> parts, std::function<void()> finish)
      : parts_(std::move(parts)), finish_(std::move(finish)) {}
  void wait() override {
    for (const comm::WorkPtr& w : parts_) w->wait();
    done();
  }
  bool test() override {
    for (const comm::WorkPtr& w : parts_)
      if (!w->test()) return false;
    done();
    return true;
  }

 private:
  void done() {
    if (!finish_) return;
    std::function<void()> f = std::move(finish_);
    finish_ = nullptr;
    f();
  }
  std::vector<comm::WorkPtr> parts_;
  std::function<void()> finish_;
};

}  // namespace

PsKind ps_kind_from_name(const std::string& name) {
  if (name == "sum") return PsKind::sum;
  if (name == "optimizer") return PsKind::optimizer;
  fail("parameter-server kind '", name, "' is unknown: allowed sum, optimizer");
}

const char* ps_kind_name(PsKind kind) { return kind == PsKind::sum ? "sum" : "optimizer"; }

PsWorker::PsWorker(comm::Communicator& world, int servers, int workers, int worker, PsKind kind, int64_t staleness,
                   std::vector<Bucket> buckets, Pools& pools)
    : world_(world), servers_(servers), workers_(workers), worker_(worker), kind_(kind),
      buckets_(std::move(buckets)), pools_(pools), staleness_(staleness) {
  LOOM_REQUIRE(staleness == 0 || kind == PsKind::optimizer, "parameter server: asynchronous training (staleness ",
               staleness, ") needs optimizer servers");
  read_instrumentation();
  LOOM_REQUIRE(world.size() == servers + workers && world.rank() == ps::worker_rank(servers, worker),
               "parameter server: world rank ", world.rank(), " of ", world.size(), " is not worker ", worker,
               " of ", workers, " after ", servers, " servers");
  const auto nb = static_cast<int64_t>(buckets_.size());
  LOOM_REQUIRE(nb <= ps::kMaxBuckets, "parameter server: ", nb, " buckets; at most ", ps::kMaxBuckets,
               " (raise parallel.bucket_mb)");
  int64_t hello[4] = {ps::kProtocol, static_cast<int64_t>(kind), workers, nb};
  std::vector<int64_t> sizes;
  for (const Bucket& b : buckets_) sizes.push_back(b.numel());
  send_to_servers(i64_view(hello, 4), servers, ps::kTagHello);
  if (nb > 0) send_to_servers(i64_view(sizes.data(), nb), servers, ps::kTagLayout);
}

void PsWorker::send_to_servers(Tensor buf, int servers, int tag) {
  std::vector<comm::WorkPtr> sent;
  for (int s = 0; s < servers; ++s) sent.push_back(world_.send(buf, ps::server_rank(s), tag));
  for (const comm::WorkPtr& w : sent) w->wait();
}

PsWorker::~PsWorker() = default;

void PsWorker::read_instrumentation() {
  if (const char* d = std::getenv("LOOM_PS_EVENTS")) events_path_ = concat(d, "/worker_", worker_, ".jsonl");
}

void PsWorker::command(int64_t cmd, int64_t a, int64_t b, int64_t c) {
  int64_t msg[4] = {cmd, a, b, c};
  send_to_servers(i64_view(msg, 4), command_servers(), ps::kTagCommand);
}

void PsWorker::begin_step(int64_t step, int64_t position) {
  LOOM_CHECK(pushed_.empty(), "begin_step with the last step's pushes pending");
  begun_ = wall_seconds();
  step_ = step;
  command(ps::kStep, step, position, 0);
}

void PsWorker::record(int64_t step, const PsStepResult& r) {
  if (events_path_.empty()) return;
  std::ofstream out(events_path_, std::ios::app);
  out << concat("{\"worker\": ", worker_, ", \"step\": ", step, ", \"begin\": ", std::to_string(begun_),
                ", \"pushed\": ", std::to_string(pushed_at_), ", \"replied\": ", std::to_string(wall_seconds()),
                ", \"slowest\": ", r.slowest, ", \"lost\": ", r.lost, "}\n");
  LOOM_REQUIRE(out.good(), "LOOM_PS_EVENTS: cannot append to '", events_path_, "'");
}

comm::WorkPtr PsWorker::exchange(int bucket, Tensor grads) {
  const int64_t n = grads.numel();
  LOOM_CHECK(bucket >= 0 && bucket < static_cast<int>(buckets_.size()) && n == buckets_[bucket].numel() &&
                 grads.dtype() == DType::f32,
             "PsWorker::exchange of bucket ", bucket, " with ", n, " elements");
  std::vector<comm::WorkPtr> parts;
  const int tag = ps::kTagBucket + bucket;
  for (int s = 0; s < servers_; ++s) {
    const comm::Range r = comm::shard_range(n, servers_, s);
    if (r.count > 0) parts.push_back(world_.send(grads.slice(0, r.offset, r.count), ps::server_rank(s), tag));
  }
  sent_ += n * 4;
  if (kind_ == PsKind::optimizer) {
    pushed_.push_back(bucket);
    return std::make_shared<GroupWork>(std::move(parts), nullptr);
  }
  // The sums come back into a buffer of their own (the gradients are the
  // send's buffer until it completes), then are averaged into place.
  auto sums = std::make_shared<OwnedTensor>(pools_[MemTag::comm].empty(DType::f32, {n}));
  for (int s = 0; s < servers_; ++s) {
    const comm::Range r = comm::shard_range(n, servers_, s);
    if (r.count > 0) parts.push_back(world_.recv(Tensor(*sums).slice(0, r.offset, r.count), ps::server_rank(s), tag));
  }
  received_ += n * 4;
  const int divisor = workers_;
  return std::make_shared<GroupWork>(std::move(parts), [grads, sums, n, divisor]() mutable {
    comm::divide_by(sums->data(), n, DType::f32, divisor);
    std::memcpy(grads.data(), sums->data(), static_cast<size_t>(n) * sizeof(float));
    sums.reset();
  });
}

PsStepResult PsWorker::pull(Tensor params) {
  LOOM_CHECK(kind_ == PsKind::optimizer, "PsWorker::pull with summation servers");
  LOOM_CHECK(pushed_.size() == buckets_.size(), "pull after ", pushed_.size(), " of ", buckets_.size(),
             " buckets pushed");
  pushed_at_ = wall_seconds();
  if (asynchronous()) {  // every piece is out (the caller waited for the sends): server 0 may apply the push
    int64_t done[2] = {step_, 0};
    world_.send(i64_view(done, 2), ps::server_rank(0), ps::kTagDone)->wait();
  }
  int64_t info[4] = {0, 0, 0, 0};
  world_.recv(i64_view(info, 4), ps::server_rank(0), ps::kTagInfo)->wait();
  arriving_.assign(buckets_.size(), {});
  for (int b = 0; b < static_cast<int>(buckets_.size()); ++b) {
    const Bucket& bk = buckets_[static_cast<size_t>(b)];
    for (int s = 0; s < servers_; ++s) {
      const comm::Range r = comm::shard_range(bk.numel(), servers_, s);
      if (r.count > 0)
        arriving_[static_cast<size_t>(b)].push_back(world_.recv(params.slice(0, bk.begin + r.offset, r.count),
                                                                ps::server_rank(s), ps::kTagBucket + b));
    }
    received_ += bk.numel() * 4;
  }
  pushed_.clear();
  const PsStepResult r{std::bit_cast<double>(info[0]), info[1] != 0, info[2], info[3]};
  if (r.lost > 0) comm::note_lost_peer();
  record(step_, r);
  return r;
}

void PsWorker::params_needed(int bucket) {
  if (static_cast<size_t>(bucket) >= arriving_.size()) return;
  std::vector<comm::WorkPtr>& pending = arriving_[static_cast<size_t>(bucket)];
  for (const comm::WorkPtr& w : pending) w->wait();
  pending.clear();
}

void PsWorker::wait_params() {
  for (int b = 0; b < static_cast<int>(arriving_.size()); ++b) params_needed(b);
}

void PsWorker::resume(const std::string& path) {
  command(ps::kResume, 0, 0, static_cast<int64_t>(path.size()));
  if (path.empty()) return;
  std::vector<int32_t> bytes(path.begin(), path.end());
  send_to_servers(Tensor(bytes.data(), DType::i32, {static_cast<int64_t>(bytes.size())}), command_servers(),
                  ps::kTagPath);
}

void PsWorker::save(int64_t step, int64_t position) {
  command(ps::kSave, step, position, 0);
  int64_t ok = 0;
  world_.recv(i64_view(&ok, 1), ps::server_rank(0), ps::kTagReply)->wait();
  LOOM_REQUIRE(ok == 1, "parameter server: the servers could not write the checkpoint (see server 0's log)");
}

void PsWorker::stop() {
  wait_params();
  command(ps::kStop, 0, 0, 0);
}

}  // namespace loom::parallel
