// The parameter servers' loop (train/ps_server.h, protocol in parallel/ps.h).
#include "train/ps_server.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/reduce.h"
#include "core/error.h"
#include "core/log.h"
#include "mesh/context.h"
#include "mesh/mesh.h"
#include "parallel/ps.h"
#include "train/checkpoint_dir.h"
#include "train/trainer.h"

namespace loom::train {
namespace {

using parallel::PsKind;
namespace ps = parallel::ps;

Tensor i64_view(int64_t* p, int64_t n) { return Tensor(p, DType::i64, {n}); }

class Server {
 public:
  Server(const RunConfig& cfg, comm::Communicator& world, comm::Communicator& servers, Pools& pools)
      : cfg_(cfg), world_(world), servers_(servers), pools_(pools),
        kind_(parallel::ps_kind_from_name(cfg.parallel.ps_server)), S_(servers.size()),
        W_(static_cast<int>(cfg.parallel.dp)) {
    LOOM_REQUIRE(world.size() == S_ + W_ && world.rank() == servers.rank(), "parameter server: world of ",
                 world.size(), " with ", S_, " servers and parallel.dp = ", W_, " workers");
    receive_layout();
    if (kind_ == PsKind::optimizer) build_trainer();
    if (servers_.rank() == 0)
      log_info("ps: ", S_, " ", parallel::ps_kind_name(kind_), " server", S_ == 1 ? "" : "s", " for ", W_,
               " worker", W_ == 1 ? "" : "s", ", ", sizes_.size(), " buckets");
  }

  // Serves commands until every worker said stop.
  void serve() {
    for (;;) {
      const std::array<int64_t, 4> c = next_command();
      switch (c[0]) {
        case ps::kStep: step(c[1], c[2]); break;
        case ps::kResume: resume(c[3]); break;
        case ps::kSave: save(); break;
        case ps::kStop: return;
        default: fail("parameter server: unknown command ", c[0], " from the workers");
      }
    }
  }

 private:
  int worker_world_rank(int w) const { return ps::worker_rank(S_, w); }

  // Every worker's hello and bucket sizes, which must agree with the run and each other.
  void receive_layout() {
    for (int w = 0; w < W_; ++w) {
      int64_t hello[4] = {0, 0, 0, 0};
      world_.recv(i64_view(hello, 4), worker_world_rank(w), ps::kTagHello)->wait();
      LOOM_REQUIRE(hello[0] == ps::kProtocol && hello[1] == static_cast<int64_t>(kind_) && hello[2] == W_,
                   "parameter server ", servers_.rank(), ": worker ", w, " (world rank ", worker_world_rank(w),
                   ") speaks protocol ", hello[0], " with ", hello[2], " workers and kind ", hello[1],
                   "; this server: protocol ", ps::kProtocol, ", ", W_, " workers, kind ",
                   static_cast<int64_t>(kind_));
      std::vector<int64_t> sizes(static_cast<size_t>(hello[3]));
      if (hello[3] > 0)
        world_.recv(i64_view(sizes.data(), hello[3]), worker_world_rank(w), ps::kTagLayout)->wait();
      LOOM_REQUIRE(w == 0 || sizes == sizes_, "parameter server: worker ", w, "'s ", sizes.size(),
                   " buckets differ from worker 0's ", sizes_.size(), ": every worker must run the same model and "
                   "parallel.bucket_mb");
      if (w == 0) sizes_ = std::move(sizes);
    }
  }

  // The optimizer servers' state: a Trainer of the run as a ZeRO-1 group of S ranks.
  void build_trainer() {
    server_cfg_ = ps_server_config(cfg_);
    mesh::MeshShape shape;
    shape.dp = S_;
    mesh_ = std::make_unique<mesh::Mesh>(shape, servers_);
    ctx_ = std::make_unique<Context>(Context{*mesh_, pools_});
    trainer_ = std::make_unique<Trainer>(server_cfg_, *ctx_);
    const std::vector<parallel::Bucket>& mine = trainer_->dp().buckets();
    bool same = mine.size() == sizes_.size();
    for (size_t b = 0; same && b < mine.size(); ++b) same = mine[b].numel() == sizes_[b];
    LOOM_REQUIRE(same, "parameter server: the workers' ", sizes_.size(), " gradient buckets differ from this ",
                 "server's ", mine.size(), " (the same model and parallel.bucket_mb must give the same buckets)");
  }

  std::array<int64_t, 4> next_command() {
    std::array<int64_t, 4> first{};
    for (int w = 0; w < W_; ++w) {
      std::array<int64_t, 4> c{};
      world_.recv(i64_view(c.data(), 4), worker_world_rank(w), ps::kTagCommand)->wait();
      if (w == 0) first = c;
      LOOM_REQUIRE(c[0] == first[0] && c[1] == first[1], "parameter server: worker ", w, " sent command ", c[0],
                   " for step ", c[1], " where worker 0 sent ", first[0], " for step ", first[1],
                   ": synchronous workers run in step");
    }
    return first;
  }

  // Bucket b's piece on this server, summed over the workers in worker order (f32).
  OwnedTensor sum_bucket(int b, comm::Range r) {
    std::vector<OwnedTensor> bufs;
    std::vector<comm::WorkPtr> recvs;
    for (int w = 0; w < W_; ++w) {
      bufs.push_back(pools_[MemTag::comm].empty(DType::f32, {r.count}));
      recvs.push_back(world_.recv(bufs.back(), worker_world_rank(w), ps::kTagBucket + b));
    }
    for (int w = 0; w < W_; ++w) {
      recvs[static_cast<size_t>(w)]->wait();
      if (w > 0) comm::reduce_into(bufs[0].data(), bufs[static_cast<size_t>(w)].data(), r.count, DType::f32,
                                   comm::ReduceOp::sum);
    }
    return std::move(bufs[0]);
  }

  void step(int64_t step, int64_t position) {
    std::vector<OwnedTensor> held;  // buffers of the sends in flight
    std::vector<comm::WorkPtr> sends;
    for (int b = 0; b < static_cast<int>(sizes_.size()); ++b) {
      const comm::Range r = comm::shard_range(sizes_[static_cast<size_t>(b)], S_, servers_.rank());
      if (r.count == 0) continue;
      OwnedTensor sum = sum_bucket(b, r);
      if (kind_ == PsKind::sum) {
        for (int w = 0; w < W_; ++w) sends.push_back(world_.send(sum, worker_world_rank(w), ps::kTagBucket + b));
        held.push_back(std::move(sum));
        continue;
      }
      comm::divide_by(sum.data(), r.count, DType::f32, W_);
      const int64_t at = trainer_->dp().buckets()[static_cast<size_t>(b)].begin + r.offset;
      std::memcpy(trainer_->model().grads().slice(0, at, r.count).data(), sum.data(),
                  static_cast<size_t>(r.count) * sizeof(float));
    }
    if (kind_ == PsKind::optimizer) update(step, position, sends);
    for (const comm::WorkPtr& w : sends) w->wait();
  }

  // The optimizer servers' update of step `step` and the sends of its result
  // (server 0) and of every bucket's updated piece (each server).
  void update(int64_t step, int64_t position, std::vector<comm::WorkPtr>& sends) {
    Trainer& t = *trainer_;
    const double norm = t.dp().grad_norm();  // over every server's shard
    const bool skipped = !std::isfinite(norm);
    if (!skipped) {
      const double clip = cfg_.train.grad_clip;
      const double clip_factor = clip > 0 && norm > clip ? clip / norm : 1.0;
      t.optimizer().step(t.lr_schedule().at(step), static_cast<float>(clip_factor));
    }
    t.set_steps_done(step + 1);
    t.train_data().set_position(position + W_ * cfg_.train.micro_batch * cfg_.train.grad_accum);
    info_[0] = std::bit_cast<int64_t>(norm), info_[1] = skipped ? 1 : 0;
    if (servers_.rank() == 0)
      for (int w = 0; w < W_; ++w) sends.push_back(world_.send(i64_view(info_, 2), worker_world_rank(w), ps::kTagInfo));
    const Tensor params = t.model().params();
    for (int b = 0; b < static_cast<int>(sizes_.size()); ++b) {
      const comm::Range r = comm::shard_range(sizes_[static_cast<size_t>(b)], S_, servers_.rank());
      if (r.count == 0) continue;
      const Tensor piece = params.slice(0, t.dp().buckets()[static_cast<size_t>(b)].begin + r.offset, r.count);
      for (int w = 0; w < W_; ++w) sends.push_back(world_.send(piece, worker_world_rank(w), ps::kTagBucket + b));
    }
  }

  void resume(int64_t path_bytes) {
    std::string path;
    if (path_bytes > 0) {
      std::vector<int32_t> bytes(static_cast<size_t>(path_bytes));
      for (int w = 0; w < W_; ++w)  // every worker sends it; worker 0's is the one
        world_.recv(Tensor(bytes.data(), DType::i32, {path_bytes}), worker_world_rank(w), ps::kTagPath)->wait();
      path.assign(bytes.begin(), bytes.end());
    }
    if (kind_ != PsKind::optimizer) return;
    CheckpointConfig c = cfg_.checkpoint;
    c.resume = path.empty() ? "never" : path;
    checkpoints_ = std::make_unique<CheckpointRun>(c);
    checkpoints_->resume(*trainer_);
    if (!path.empty() && servers_.rank() == 0)
      log_info("ps: servers resumed from ", path, " at step ", trainer_->steps_done());
  }

  void save() {
    LOOM_REQUIRE(kind_ == PsKind::optimizer, "parameter server: summation servers hold no state to save; the ",
                 "workers save their checkpoints");
    if (!checkpoints_) checkpoints_ = std::make_unique<CheckpointRun>(cfg_.checkpoint);
    checkpoints_->save(*trainer_);
    if (servers_.rank() != 0) return;
    int64_t ok = 1;
    std::vector<comm::WorkPtr> sent;
    for (int w = 0; w < W_; ++w) sent.push_back(world_.send(i64_view(&ok, 1), worker_world_rank(w), ps::kTagReply));
    for (const comm::WorkPtr& s : sent) s->wait();
  }

  const RunConfig& cfg_;
  comm::Communicator& world_;
  comm::Communicator& servers_;
  Pools& pools_;
  PsKind kind_;
  int S_, W_;
  std::vector<int64_t> sizes_;  // the workers' buckets' elements
  RunConfig server_cfg_;
  std::unique_ptr<mesh::Mesh> mesh_;
  std::unique_ptr<Context> ctx_;
  std::unique_ptr<Trainer> trainer_;
  std::unique_ptr<CheckpointRun> checkpoints_;
  int64_t info_[2] = {0, 0};
};

}  // namespace

RunConfig ps_server_config(const RunConfig& cfg) {
  RunConfig c = cfg;
  c.parallel.mode = "collective";
  c.parallel.dp = cfg.parallel.ps_servers;
  c.parallel.zero_stage = 1;
  c.parallel.staleness = 0;
  c.train.eval_every = 0;
  // The global batch is the workers': the servers' own grad_accum is unused
  // (they never run forward), so global_batch is cleared rather than re-derived.
  c.train.global_batch = 0;
  return c;
}

void run_ps_server(const RunConfig& cfg, comm::Communicator& world, comm::Communicator& servers, Pools& pools) {
  Server server(cfg, world, servers, pools);
  server.serve();
}

}  // namespace loom::train
