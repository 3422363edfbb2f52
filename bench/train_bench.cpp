// `loom bench train`: the step of train::Trainer (zero_grads, forward,
// backward, global-norm clip, AdamW over every parameter tensor) on random
// tokens, without a data loader or LR schedule, so any preset can be timed
// without data. tests/ref/bench_torch_train.py times the same step in PyTorch.
//
// The --warmup steps are untimed (first touch of the pages, oneDNN primitive
// creation); each of the --steps timed steps is timed on its own, and
// tokens/s and MFU come from the BEST step: on a shared machine the minimum is
// the most reproducible statistic (as in `loom bench kernels`); the median
// step time is printed too.
//
// Under mpirun every rank runs the step through a DataParallel over the
// world (--zero-stage, --bucket-mb, --comm-algo) on its own random tokens;
// a plain process is a group of one (--zero-stage still applies).
// A step is as fast as its slowest rank: each timed step starts at a barrier
// and its time is the maximum over ranks. Global tokens/s = N B T / step;
// the share of gradient communication backward hid is 1 - exposed / alone,
// exposed being what a step waited for its collectives (median over timed
// steps, slowest rank) and alone what they take with no compute beside them
// (DataParallel::measure_gradient_comm_seconds, after the timed steps).
//
// --pp: train_bench_pp.cpp; --cp: cp_bench.cpp; --moe: moe_bench.cpp.
#include "bench/train_bench.h"
#include "bench/train_bench_parts.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm/mpi_backend.h"
#include "comm/self_communicator.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/trace.h"
#include "kernels/op_trace.h"
#include "kernels/ops.h"
#include "model/config.h"
#include "model/config_json.h"
#include "model/model.h"
#include "mesh/mesh.h"
#include "parallel/dp.h"
#include "parallel/pp_schedule.h"
#include "parallel/tp.h"
#include "train/rank_chunks.h"
#include "train/reports.h"
#include "train/trainer.h"

namespace loom::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Data-parallel figures: in an mpirun job, or with --zero-stage > 0.
struct DpFigures {
  int ranks = 1;
  double global_tokens_per_s = 0;
  double comm_exposed = 0;  // seconds a step waited for gradient collectives (median step, slowest rank)
  double comm_alone = 0;    // seconds they take with nothing beside them (slowest rank)
  double comm_hidden = 0;   // 1 - exposed / alone, clamped to [0, 1]
};

// Tensor-parallel figures: with --tp > 1.
struct TpFigures {
  int ranks = 1;
  bool sequence_parallel = false;
  double comm_seconds = 0;  // a step's seconds in the tp collectives (median step, slowest rank)
  double comm_share = 0;    // of the median step
};

struct Result {
  StepTimes step;
  double tokens_per_s = 0, flops_per_token = 0, peak_flops = 0, mfu = 0;
  int64_t num_params = 0;
  MemoryReport memory;
  size_t rss_growth = 0;
  std::optional<DpFigures> dp;
  std::optional<TpFigures> tp;
  std::string ops;  // --ops: the table of the traced steps' kernel ops
};

std::string tp_json(const Result& r) {
  if (!r.tp) return "";
  return concat(",\"tp\":", r.tp->ranks, ",\"sequence_parallel\":", r.tp->sequence_parallel ? "true" : "false",
                ",\"tp_comm_seconds\":", r.tp->comm_seconds, ",\"tp_comm_share\":", r.tp->comm_share);
}

std::string dp_json(const TrainBenchOptions& o, const Result& r) {
  if (!r.dp) return "";
  const DpFigures& d = *r.dp;
  return concat(",\"ranks\":", d.ranks, ",\"zero_stage\":", o.zero_stage, ",\"bucket_mb\":", o.bucket_mb,
                ",\"comm_algo\":\"", o.comm_algo, "\",\"global_tokens_per_s\":", d.global_tokens_per_s,
                ",\"per_rank_tokens_per_s\":", r.tokens_per_s, ",\"comm_exposed_seconds\":", d.comm_exposed,
                ",\"comm_alone_seconds\":", d.comm_alone, ",\"comm_hidden\":", d.comm_hidden);
}

void print_json(const TrainBenchOptions& o, const Result& r) {
  std::string by_tag;
  for (int i = 0; i < kNumMemTags; ++i) {
    if (r.memory.tags[i].peak == 0) continue;
    by_tag += concat(by_tag.empty() ? "" : ",", "\"", mem_tag_name(static_cast<MemTag>(i)), "\":",
                     r.memory.tags[i].peak);
  }
  std::printf(
      "{\"model\":\"%s\",\"batch\":%lld,\"seq\":%lld,\"dtype\":\"%s\",\"recompute\":\"%s\",\"threads\":%d,\"steps\":%d,\"warmup\":%d,"
      "\"num_params\":%lld,\"tokens_per_s\":%.1f,\"step_seconds\":%.6g,\"best_step_seconds\":%.6g,"
      "\"flops_per_token\":%.6g,\"peak_gflops\":%.2f,\"mfu\":%.4f,\"peak_bytes\":%zu,\"peak_bytes_by_tag\":{%s},"
      "\"max_rss_growth_bytes\":%zu%s%s,\"impl\":\"loom\"}\n",
      model_label(o).c_str(), static_cast<long long>(o.batch), static_cast<long long>(o.seq), o.dtype.c_str(), o.recompute.c_str(),
      o.threads, o.steps, o.warmup, static_cast<long long>(r.num_params), r.tokens_per_s, r.step.median, r.step.best,
      r.flops_per_token, r.peak_flops / 1e9, r.mfu, r.memory.peak_total, by_tag.c_str(), r.rss_growth,
      dp_json(o, r).c_str(), tp_json(r).c_str());
}

void print_dp_table(const TrainBenchOptions& o, const DpFigures& d, double per_rank_tokens_per_s) {
  std::printf("data parallel   %12d ranks, ZeRO stage %d, buckets of %g MiB, comm %s\n", d.ranks, o.zero_stage,
              o.bucket_mb, o.comm_algo.c_str());
  std::printf("global tokens/s %12.1f  = ranks x B x T / best step (slowest rank)\n", d.global_tokens_per_s);
  std::printf("per-rank tok/s  %12.1f\n", per_rank_tokens_per_s);
  std::printf("grad comm       %11.1f%%  hidden behind backward = 1 - exposed %.4f s / alone %.4f s\n",
              100 * d.comm_hidden, d.comm_exposed, d.comm_alone);
}

void print_table(const TrainBenchOptions& o, const Result& r) {
  std::printf(
      "loom bench train: %s (%lld parameters), B=%lld T=%lld, %s, recompute %s, %d threads; %d warm-up + %d timed "
      "steps\n",
      model_label(o).c_str(), static_cast<long long>(r.num_params), static_cast<long long>(o.batch),
      static_cast<long long>(o.seq), o.dtype.c_str(), o.recompute.c_str(), o.threads, o.warmup, o.steps);
  std::printf("reproduce: %s\n", o.command.c_str());
  std::printf("tokens/s        %12.1f  (best step%s)\n", r.tokens_per_s,
              r.tp ? ", per tp group (one replica)" : r.dp ? ", per rank" : "");
  std::printf("step seconds    %12.4f  median, %.4f best\n", r.step.median, r.step.best);
  if (r.dp) print_dp_table(o, *r.dp, r.tokens_per_s);
  if (r.tp)
    std::printf("tensor parallel %12d ranks%s: %.4f s of the median step in their collectives (%.1f%%)\n",
                r.tp->ranks, r.tp->sequence_parallel ? " (sequence parallel)" : "", r.tp->comm_seconds,
                100 * r.tp->comm_share);
  std::printf("MFU             %11.1f%%  of %.1f GFLOP/s (%s 1024^3 GEMM measured at start-up)\n", 100 * r.mfu,
              r.peak_flops / 1e9, o.dtype.c_str());
  std::printf("FLOPs per token %12.4g  = 6 N + 12 n_layer n_embd T\n", r.flops_per_token);
  std::printf("max RSS growth  %12.1f MiB\n\n%s", static_cast<double>(r.rss_growth) / (1024.0 * 1024.0),
              r.memory.table().c_str());
  if (!r.ops.empty())
    std::printf("\nkernel ops of %d more steps, each op timed on its own (--ops; the figures above are without):\n%s",
                o.steps, r.ops.c_str());
}

void check_options(const TrainBenchOptions& o) {
  LOOM_REQUIRE(!o.ops || (!o.json && o.moe == 0 && o.pp == 1 && !o.cp_bench), "bench train: --ops prints a table "
               "after the dense, dp and tp figures: it does not go with --json, --moe, --pp or --cp");
  precision_dtype(o.dtype, "bench train: --dtype");  // a loom::Error for a name other than fp32, bf16, fp16
  if (o.dtype == "bf16") train::require_cpu_bf16_gemm("bench train: --dtype bf16", "--dtype fp32");  // as loom train
  LOOM_REQUIRE(o.zero_stage >= 0 && o.zero_stage <= 3, "bench train: --zero-stage ", o.zero_stage,
               " is invalid: allowed are 0, 1, 2 and 3");
  LOOM_REQUIRE(o.tp >= 1 && o.pp >= 1, "bench train: --tp ", o.tp, " / --pp ", o.pp, " is invalid: allowed >= 1");
  LOOM_REQUIRE(o.ep == 1 || o.moe > 0, "bench train: --ep ", o.ep, " needs --moe (the experts to split)");
  LOOM_REQUIRE(o.virtual_stages >= 1 && o.micro_batches >= 1, "bench train: --virtual-stages ", o.virtual_stages,
               " / --micro-batches ", o.micro_batches, " is invalid: allowed values are >= 1");
  parallel::pp_schedule_from_name(o.schedule);  // a loom::Error listing the names
  const std::vector<std::string> presets = model::model_preset_names();
  if (std::find(presets.begin(), presets.end(), o.model) == presets.end()) {
    std::string valid;
    for (const std::string& p : presets) valid += (valid.empty() ? "" : ", ") + p;
    throw Error("bench train: --model '" + o.model + "' is unknown: valid presets are " + valid);
  }
}

// Timed steps: each rank's step times, each step's exposed gradient
// communication seconds and its seconds in tp collectives; all as the
// maximum over the job's ranks (world).
struct Timings {
  std::vector<double> seconds, exposed, tp_comm;
};

Timings time_steps(const TrainBenchOptions& o, model::Model& m, parallel::DataParallel& dp, train::AdamW& adamw,
                   parallel::TensorParallel* tp, comm::Communicator& world, const Tensor& tokens,
                   const Tensor& targets, train::DynamicLossScaler* scaler) {
  for (int i = 0; i < o.warmup; ++i) train_step(m, dp, adamw, tokens, targets, scaler);
  Timings t;
  for (int i = 0; i < o.steps; ++i) {
    world.barrier()->wait();  // every rank starts the step together
    dp.reset_comm_stats();
    if (tp) tp->reset_stats();
    const auto t0 = Clock::now();
    train_step(m, dp, adamw, tokens, targets, scaler);
    t.seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    t.exposed.push_back(dp.comm_stats().exposed_seconds);
    t.tp_comm.push_back(tp ? tp->seconds() : 0.0);
  }
  max_over_ranks(world, t.seconds);
  max_over_ranks(world, t.exposed);
  max_over_ranks(world, t.tp_comm);
  return t;
}

// --ops: o.steps more steps with each kernel op timed on its own, and the
// table of their ops (this rank's).
std::string ops_table(const TrainBenchOptions& o, model::Model& m, parallel::DataParallel& dp, train::AdamW& adamw,
                      const Tensor& tokens, const Tensor& targets, train::DynamicLossScaler* scaler) {
  TraceRecorder rec(dp.rank(), "bench train");
  kernels::OpTracer tracer(rec);
  for (int i = 0; i < o.steps; ++i) train_step(m, dp, adamw, tokens, targets, scaler);
  return tracer.table();
}

DpFigures dp_figures(parallel::DataParallel& dp, comm::Communicator& world, const Timings& t, double best_step,
                     int64_t tokens_per_rank) {
  DpFigures d;
  d.ranks = dp.size();
  d.global_tokens_per_s = static_cast<double>(d.ranks * tokens_per_rank) / best_step;
  d.comm_exposed = median_of(t.exposed);
  std::vector<double> alone{dp.measure_gradient_comm_seconds()};
  max_over_ranks(world, alone);
  d.comm_alone = alone[0];
  d.comm_hidden = d.comm_alone > 0 ? std::clamp(1.0 - d.comm_exposed / d.comm_alone, 0.0, 1.0) : 0.0;
  return d;
}

}  // namespace

int run_train_bench(const TrainBenchOptions& o) {
  check_options(o);
  const model::ModelConfig cfg = model::model_config_from_sets(o.model, o.sets, "bench train");
  // An mpirun job trains data parallel over its world; a plain process is a
  // world of one (no MPI).
  comm::Options copts;
  copts.algo = comm::algo_from_name(o.comm_algo);
  const bool in_job = in_mpi_job();
  const std::unique_ptr<comm::Communicator> world =
      in_job ? comm::mpi_world(copts) : std::make_unique<comm::SelfCommunicator>("world", copts);
  LOOM_REQUIRE(o.pp == 1 || o.cp == 1, "bench train: --pp ", o.pp, " and --cp ", o.cp, ": run one of them");
  if (o.moe > 0) return run_moe_bench(o, *world);
  if (o.pp > 1 || o.cp_bench) {
    LOOM_REQUIRE(in_job, "bench train: ", o.pp > 1 ? "--pp" : "--cp", " needs an mpirun job (pp x dp x cp x tp ranks)");
    return o.pp > 1 ? run_pp_bench(o, *world) : run_cp_bench(o, *world);
  }
  const int rank = world->rank();
  const int world_size = world->size();
  LOOM_REQUIRE(world_size % o.tp == 0, "bench train: --tp ", o.tp, " does not divide the job's ", world_size,
               " ranks: run mpirun -np (a multiple of tp)");
  // Groups: tp neighbouring ranks hold a replica, the rest is data parallel.
  mesh::Mesh mesh(mesh::MeshShape{1, world_size / o.tp, 1, o.tp, 1}, *world);
  Result r;
  // Before any model memory: the GEMM's buffers then do not count as growth.
  const DType compute = precision_dtype(o.dtype);
  r.peak_flops = train::measure_peak_flops(compute);
  const size_t rss_before = max_rss_bytes();
  Pools pools;
  Context ctx{mesh, pools};
  train::RankChunks chunks = train::build_rank_chunks(chunk_options(o, cfg, compute), ctx);
  model::Model& m = *chunks.models[0];
  parallel::DataParallel& dp = *chunks.dps[0];
  parallel::TensorParallel* tp = chunks.tp.get();
  OwnedTensor tokens = pools[MemTag::activations].empty(DType::i32, {o.batch, o.seq});
  OwnedTensor targets = pools[MemTag::activations].empty(DType::i32, {o.batch, o.seq});
  // Every dp rank its own tokens (rank 0's are a plain process's); a tp
  // group shares them.
  const uint64_t dp_rank = static_cast<uint64_t>(dp.rank());
  fill_tokens(tokens, cfg.vocab_size, kSeed + 2 * dp_rank);
  fill_tokens(targets, cfg.vocab_size, kSeed + 2 * dp_rank + 1);
  std::optional<train::DynamicLossScaler> scaler;
  if (compute == DType::f16) scaler.emplace(train::TrainConfig{}.loss_scale, train::TrainConfig{}.loss_scale_window);
  const Timings t =
      time_steps(o, m, dp, *chunks.optimizers[0], tp, *world, tokens, targets, scaler ? &*scaler : nullptr);
  r.step = {median_of(t.seconds), *std::min_element(t.seconds.begin(), t.seconds.end())};
  r.num_params = model::param_count(model::param_specs(cfg));  // the whole model, every tp rank's slice
  r.tokens_per_s = static_cast<double>(o.batch * o.seq) / r.step.best;
  r.flops_per_token = train::model_flops_per_token(cfg, o.seq);
  // A tp group's ranks share its tokens and its FLOPs.
  r.mfu = r.flops_per_token * r.tokens_per_s / (r.peak_flops * o.tp);
  if (tp) r.tp = TpFigures{o.tp, o.sequence_parallel, median_of(t.tp_comm), median_of(t.tp_comm) / r.step.median};
  r.memory = pools.report();  // the steps' memory, before the communication-only measurement below
  if (o.ops) r.ops = ops_table(o, m, dp, *chunks.optimizers[0], tokens, targets, scaler ? &*scaler : nullptr);
  // The data-parallel figures: in a job, or for a ZeRO stage run as a group of one.
  if (in_job || o.zero_stage != 0) r.dp = dp_figures(dp, *world, t, r.step.best, o.batch * o.seq);
  r.rss_growth = max_rss_bytes() - std::min(rss_before, max_rss_bytes());
  if (rank == 0) {
    if (o.json) print_json(o, r);
    else print_table(o, r);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace loom::bench
