// The parameter servers (train/ps_server.h, protocol in parallel/ps.h): what
// both modes share, and the synchronous loop.
#include "train/ps_server.h"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>

#include "comm/reduce.h"
#include "core/error.h"
#include "core/log.h"
#include "train/ps_server_core.h"

namespace loom::train {

using parallel::PsKind;
namespace ps = parallel::ps;

PsServerCore::PsServerCore(const RunConfig& c, comm::Communicator& wo, comm::Communicator& se, Pools& p)
    : cfg(c), world(wo), servers(se), pools(p), kind(parallel::ps_kind_from_name(c.parallel.ps_server)),
      S(se.size()), W(static_cast<int>(c.parallel.dp)) {
  LOOM_REQUIRE(world.size() == S + W && world.rank() == servers.rank(), "parameter server: world of ", world.size(),
               " with ", S, " servers and parallel.dp = ", W, " workers");
  receive_layout();
  if (kind == PsKind::optimizer) build_trainer();
  if (servers.rank() == 0)
    log_info("ps: ", S, " ", parallel::ps_kind_name(kind), " server", S == 1 ? "" : "s", " for ", W, " worker",
             W == 1 ? "" : "s", ", ", sizes.size(), " buckets, ",
             c.parallel.staleness > 0 ? concat("asynchronous (staleness ", c.parallel.staleness, ")")
                                      : std::string("synchronous"));
}

void PsServerCore::receive_layout() {
  for (int w = 0; w < W; ++w) {
    int64_t hello[4] = {0, 0, 0, 0};
    world.recv(ps_i64_view(hello, 4), worker_world_rank(w), ps::kTagHello)->wait();
    LOOM_REQUIRE(hello[0] == ps::kProtocol && hello[1] == static_cast<int64_t>(kind) && hello[2] == W,
                 "parameter server ", servers.rank(), ": worker ", w, " (world rank ", worker_world_rank(w),
                 ") speaks protocol ", hello[0], " with ", hello[2], " workers and kind ", hello[1],
                 "; this server: protocol ", ps::kProtocol, ", ", W, " workers, kind ", static_cast<int64_t>(kind));
    std::vector<int64_t> got(static_cast<size_t>(hello[3]));
    if (hello[3] > 0) world.recv(ps_i64_view(got.data(), hello[3]), worker_world_rank(w), ps::kTagLayout)->wait();
    LOOM_REQUIRE(w == 0 || got == sizes, "parameter server: worker ", w, "'s ", got.size(),
                 " buckets differ from worker 0's ", sizes.size(),
                 ": every worker must run the same model and parallel.bucket_mb");
    if (w == 0) sizes = std::move(got);
  }
}

void PsServerCore::build_trainer() {
  server_cfg = ps_server_config(cfg);
  mesh::MeshShape shape;
  shape.dp = S;
  mesh = std::make_unique<mesh::Mesh>(shape, servers);
  ctx = std::make_unique<Context>(Context{*mesh, pools});
  trainer = std::make_unique<Trainer>(server_cfg, *ctx);
  const std::vector<parallel::Bucket>& mine = trainer->dp().buckets();
  bool same = mine.size() == sizes.size();
  for (size_t b = 0; same && b < mine.size(); ++b) same = mine[b].numel() == sizes[b];
  LOOM_REQUIRE(same, "parameter server: the workers' ", sizes.size(), " gradient buckets differ from this server's ",
               mine.size(), " (the same model and parallel.bucket_mb must give the same buckets)");
  // The pieces (segments cut at parameters) of each bucket's segment, in order.
  const std::vector<parallel::ParamPiece>& pieces = trainer->dp().group(0).pieces;
  size_t i = 0;
  for (const parallel::Segment& seg : trainer->dp().segments()) {
    const size_t first = i;
    while (i < pieces.size() && pieces[i].offset < seg.offset + seg.count) ++i;
    bucket_pieces.emplace_back(first, i);
  }
}

// Calls f(views, at) for each ParamPiece of bucket b's segment: its update
// views (parallel/dp.h) and where it starts in the segment.
template <typename F>
void for_each_bucket_piece(const PsServerCore& c, int b, F f) {
  const parallel::DataParallel& dp = c.trainer->dp();
  const parallel::Segment& seg = dp.segments()[static_cast<size_t>(b)];
  const std::vector<parallel::ParamPiece>& pieces = dp.group(0).pieces;
  const auto [first, last] = c.bucket_pieces[static_cast<size_t>(b)];
  for (size_t i = first; i < last; ++i) f(dp.update_piece(0, pieces[i]), pieces[i].offset - seg.offset);
}

void PsServerCore::set_grad_piece(int b, const float* src) {
  for_each_bucket_piece(*this, b, [&](const parallel::UpdatePiece& u, int64_t at) {
    std::memcpy(u.grad.data(), src + at, static_cast<size_t>(u.grad.numel()) * sizeof(float));
  });
}

void PsServerCore::copy_param_piece(int b, float* dst) const {
  for_each_bucket_piece(*this, b, [&](const parallel::UpdatePiece& u, int64_t at) {
    std::memcpy(dst + at, u.master.data(), static_cast<size_t>(u.master.numel()) * sizeof(float));
  });
}

std::pair<double, bool> PsServerCore::update(int64_t step) {
  Trainer& t = *trainer;
  const double norm = t.dp().grad_norm();  // over every server's shard
  const bool skipped = !std::isfinite(norm);
  if (!skipped) {
    const double clip = cfg.train.grad_clip;
    const double clip_factor = clip > 0 && norm > clip ? clip / norm : 1.0;
    t.optimizer().step(t.lr_schedule().at(step), static_cast<float>(clip_factor));
  }
  return {norm, skipped};
}

void PsServerCore::resume(const std::string& path) {
  if (kind != PsKind::optimizer) return;
  CheckpointConfig c = cfg.checkpoint;
  c.resume = path.empty() ? "never" : path;
  checkpoints = std::make_unique<CheckpointRun>(c);
  checkpoints->resume(*trainer);
  if (!path.empty() && servers.rank() == 0)
    log_info("ps: servers resumed from ", path, " at step ", trainer->steps_done());
}

void PsServerCore::save(int64_t step, int64_t position) {
  LOOM_REQUIRE(kind == PsKind::optimizer, "parameter server: summation servers hold no state to save; the workers ",
               "save their checkpoints");
  if (!checkpoints) checkpoints = std::make_unique<CheckpointRun>(cfg.checkpoint);
  trainer->set_steps_done(step);
  trainer->train_data().set_position(position);
  checkpoints->save(*trainer);
}

namespace {

// The synchronous servers: every worker sends every server each command, and
// a step's pushes are summed over all workers before anything is applied.
class Synchronous {
 public:
  explicit Synchronous(PsServerCore& core) : c_(core) {}

  void serve() {
    for (;;) {
      const std::array<int64_t, 4> cmd = next_command();
      switch (cmd[0]) {
        case ps::kStep: step(cmd[1], cmd[2]); break;
        case ps::kResume: c_.resume(receive_path(cmd[3])); break;
        case ps::kSave: save(cmd[1], cmd[2]); break;
        case ps::kStop: return;
        default: fail("parameter server: unknown command ", cmd[0], " from the workers");
      }
    }
  }

 private:
  std::array<int64_t, 4> next_command() {
    std::array<int64_t, 4> first{};
    for (int w = 0; w < c_.W; ++w) {
      std::array<int64_t, 4> cmd{};
      c_.world.recv(ps_i64_view(cmd.data(), 4), c_.worker_world_rank(w), ps::kTagCommand)->wait();
      if (w == 0) first = cmd;
      LOOM_REQUIRE(cmd[0] == first[0] && cmd[1] == first[1], "parameter server: worker ", w, " sent command ", cmd[0],
                   " for step ", cmd[1], " where worker 0 sent ", first[0], " for step ", first[1],
                   ": synchronous workers run in step");
    }
    return first;
  }

  std::string receive_path(int64_t bytes) {
    if (bytes <= 0) return "";
    std::vector<int32_t> chars(static_cast<size_t>(bytes));
    for (int w = 0; w < c_.W; ++w)  // every worker sends it; they agree (the same resume decision)
      c_.world.recv(Tensor(chars.data(), DType::i32, {bytes}), c_.worker_world_rank(w), ps::kTagPath)->wait();
    return std::string(chars.begin(), chars.end());
  }

  // Bucket b's piece on this server, summed over the workers in worker order (f32).
  OwnedTensor sum_bucket(int b, comm::Range r) {
    std::vector<OwnedTensor> bufs;
    std::vector<comm::WorkPtr> recvs;
    for (int w = 0; w < c_.W; ++w) {
      bufs.push_back(c_.pools[MemTag::comm].empty(DType::f32, {r.count}));
      recvs.push_back(c_.world.recv(bufs.back(), c_.worker_world_rank(w), ps::kTagBucket + b));
    }
    for (int w = 0; w < c_.W; ++w) {
      recvs[static_cast<size_t>(w)]->wait();
      if (w > 0)
        comm::reduce_into(bufs[0].data(), bufs[static_cast<size_t>(w)].data(), r.count, DType::f32,
                          comm::ReduceOp::sum);
    }
    return std::move(bufs[0]);
  }

  void step(int64_t step, int64_t position) {
    std::vector<OwnedTensor> held;  // buffers of the sends in flight
    std::vector<comm::WorkPtr> sends;
    for (int b = 0; b < c_.num_buckets(); ++b) {
      const comm::Range r = c_.piece(b);
      if (r.count == 0) continue;
      OwnedTensor sum = sum_bucket(b, r);
      if (c_.kind == PsKind::sum) {
        for (int w = 0; w < c_.W; ++w) sends.push_back(c_.world.send(sum, c_.worker_world_rank(w), ps::kTagBucket + b));
        held.push_back(std::move(sum));
        continue;
      }
      comm::divide_by(sum.data(), r.count, DType::f32, c_.W);
      c_.set_grad_piece(b, sum.data_as<float>());
    }
    if (c_.kind == PsKind::optimizer) reply(step, position, sends, held);
    for (const comm::WorkPtr& w : sends) w->wait();
  }

  // The optimizer servers' update of step `step` and the sends of its result
  // (server 0) and of every bucket's updated piece (each server).
  void reply(int64_t step, int64_t position, std::vector<comm::WorkPtr>& sends, std::vector<OwnedTensor>& held) {
    const auto [norm, skipped] = c_.update(step);
    c_.trainer->set_steps_done(step + 1);
    c_.trainer->train_data().set_position(position + c_.W * c_.cfg.train.micro_batch * c_.cfg.train.grad_accum);
    info_ = {std::bit_cast<int64_t>(norm), skipped ? 1 : 0, 0, step + 1};
    if (c_.servers.rank() == 0)
      for (int w = 0; w < c_.W; ++w)
        sends.push_back(c_.world.send(ps_i64_view(info_.data(), 4), c_.worker_world_rank(w), ps::kTagInfo));
    for (int b = 0; b < c_.num_buckets(); ++b) {
      const comm::Range r = c_.piece(b);
      if (r.count == 0) continue;
      held.push_back(c_.pools[MemTag::comm].empty(DType::f32, {r.count}));
      c_.copy_param_piece(b, held.back().data_as<float>());
      for (int w = 0; w < c_.W; ++w)
        sends.push_back(c_.world.send(held.back(), c_.worker_world_rank(w), ps::kTagBucket + b));
    }
  }

  void save(int64_t step, int64_t position) {
    c_.save(step, position);
    if (c_.servers.rank() != 0) return;
    int64_t ok = 1;
    std::vector<comm::WorkPtr> sent;
    for (int w = 0; w < c_.W; ++w)
      sent.push_back(c_.world.send(ps_i64_view(&ok, 1), c_.worker_world_rank(w), ps::kTagReply));
    for (const comm::WorkPtr& s : sent) s->wait();
  }

  PsServerCore& c_;
  std::array<int64_t, 4> info_{};
};

}  // namespace

void serve_synchronous(PsServerCore& core) { Synchronous(core).serve(); }

RunConfig ps_server_config(const RunConfig& cfg) {
  RunConfig c = cfg;
  c.parallel.mode = "collective";
  c.parallel.dp = cfg.parallel.ps_servers;
  c.parallel.zero_stage = 3;  // the server keeps its shards only
  c.parallel.staleness = 0;
  c.train.eval_every = 0;
  // The global batch is the workers': the servers never run forward, so
  // global_batch is cleared rather than re-derived for their count.
  c.train.global_batch = 0;
  return c;
}

void run_ps_server(const RunConfig& cfg, comm::Communicator& world, comm::Communicator& servers, Pools& pools) {
  PsServerCore core(cfg, world, servers, pools);
  if (cfg.parallel.staleness > 0) serve_asynchronous(core);
  else serve_synchronous(core);
}

}  // namespace loom::train
