// `loom bench train --pp N` (train_bench.h), under mpirun: the job's ranks
// form a mesh pp x dp x tp and each runs train::Trainer::pipeline_step's
// work: its chunks of the balanced partition (stage c pp + r for chunk c),
// each with a DataParallel over its dp group, the micro-batches through
// parallel::PipelineRuntime, the tied-embedding gradient sum, the global norm
// and AdamW. Per rank, the median over timed steps of the pipeline's seconds
// (PipelineRuntime::run), of its compute (forwards and backwards) and of its
// waits; the measured bubble is (pipeline - compute) / compute on the rank
// that computed longest (the slowest stage, which sets the pace): its idle
// over busy, the quantity the schedule's theory (p - 1) / m, or (p - 1) /
// (v m) interleaved, predicts for every rank of a balanced pipeline. Each
// rank's wait / compute is printed beside it (waits are the blocked part of
// the non-compute time).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench/train_bench.h"
#include "bench/train_bench_parts.h"
#include "core/error.h"
#include "core/memory.h"
#include "mesh/mesh.h"
#include "model/config.h"
#include "model/config_json.h"
#include "model/model.h"
#include "parallel/pp_partition.h"
#include "parallel/pp_runtime.h"
#include "parallel/pp_schedule.h"
#include "parallel/pp_tied.h"
#include "train/rank_chunks.h"
#include "train/reports.h"
#include "train/trainer.h"

namespace loom::bench {
namespace {

using Clock = std::chrono::steady_clock;

// One rank's figures (medians over the timed steps), exchanged as doubles.
struct PpRankFigures {
  double pp_rank = 0, dp_rank = 0, tp_rank = 0, slots = 0, layers = 0;
  double pipeline = 0, compute = 0, wait = 0;  // seconds of PipelineRuntime::run, its forwards and backwards, its waits
  double peak_activations = 0;                 // bytes: pools.report()[MemTag::activations].peak
  static constexpr int kFields = 9;
};

struct PpResult {
  int dp = 1;
  StepTimes step;
  double tokens_per_s = 0, flops_per_token = 0, peak_flops = 0, mfu = 0;
  double theory = 0, simulated = 0;  // bubble fraction of the schedule in unit time
  int bottleneck = 0;                // world rank with the most compute seconds (the slowest stage)
  double bubble = 0;                 // its (pipeline - compute) / compute
  std::vector<PpRankFigures> ranks;  // by world rank
};

// Every rank's figures on every rank (MPI_COMM_WORLD's order is the world
// communicator's: comm::mpi_world duplicates it).
std::vector<PpRankFigures> gather_ranks(const PpRankFigures& mine, int world_size) {
  const double send[PpRankFigures::kFields] = {mine.pp_rank,  mine.dp_rank, mine.tp_rank,
                                                mine.slots,    mine.layers,  mine.pipeline,
                                                mine.compute, mine.wait,    mine.peak_activations};
  std::vector<double> all(static_cast<size_t>(world_size * PpRankFigures::kFields));
  MPI_Allgather(send, PpRankFigures::kFields, MPI_DOUBLE, all.data(), PpRankFigures::kFields, MPI_DOUBLE,
                MPI_COMM_WORLD);
  std::vector<PpRankFigures> out(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    const double* v = all.data() + static_cast<size_t>(r * PpRankFigures::kFields);
    out[static_cast<size_t>(r)] = {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8]};
  }
  return out;
}

std::string pp_theory_formula(const TrainBenchOptions& o) {
  return o.virtual_stages > 1 ? "(p-1)/(v m)" : "(p-1)/m";
}

void print_pp_json(const TrainBenchOptions& o, const PpResult& r) {
  std::string ranks;
  for (size_t i = 0; i < r.ranks.size(); ++i) {
    const PpRankFigures& f = r.ranks[i];
    ranks += concat(i == 0 ? "" : ",", "{\"rank\":", i, ",\"pp_rank\":", static_cast<int>(f.pp_rank),
                    ",\"dp_rank\":", static_cast<int>(f.dp_rank), ",\"tp_rank\":", static_cast<int>(f.tp_rank),
                    ",\"slots\":", static_cast<int>(f.slots), ",\"layers\":", static_cast<int>(f.layers),
                    ",\"pipeline_seconds\":", f.pipeline,
                    ",\"compute_seconds\":", f.compute, ",\"wait_seconds\":", f.wait,
                    ",\"wait_over_compute\":", f.compute > 0 ? f.wait / f.compute : 0.0,
                    ",\"peak_activation_bytes\":", static_cast<int64_t>(f.peak_activations), "}");
  }
  std::printf(
      "{\"model\":\"%s\",\"batch\":%lld,\"seq\":%lld,\"dtype\":\"%s\",\"recompute\":\"%s\",\"threads\":%d,\"steps\":%d,"
      "\"warmup\":%d,\"pp\":%d,\"dp\":%d,\"tp\":%d,\"schedule\":\"%s\",\"virtual_stages\":%d,\"micro_batches\":%d,"
      "\"tokens_per_s\":%.1f,\"flops_per_token\":%.6g,\"peak_gflops\":%.2f,\"mfu\":%.4f,\"step_seconds\":%.6g,"
      "\"best_step_seconds\":%.6g,\"bubble_measured\":%.4f,\"bubble_rank\":%d,\"bubble_theory\":%.4f,"
      "\"bubble_simulated\":%.4f,\"ranks\":[%s],\"impl\":\"loom\"}\n",
      model_label(o).c_str(), static_cast<long long>(o.batch), static_cast<long long>(o.seq), o.dtype.c_str(),
      o.recompute.c_str(), o.threads, o.steps, o.warmup, o.pp, r.dp, o.tp, o.schedule.c_str(), o.virtual_stages,
      o.micro_batches, r.tokens_per_s, r.flops_per_token, r.peak_flops / 1e9, r.mfu, r.step.median, r.step.best,
      r.bubble, r.bottleneck, r.theory, r.simulated, ranks.c_str());
}

void print_pp_table(const TrainBenchOptions& o, const PpResult& r) {
  std::printf(
      "loom bench train: %s, B=%lld T=%lld, %s, recompute %s, %d threads; pp=%d dp=%d tp=%d, %s schedule, v=%d, "
      "m=%d micro-batches per step; %d warm-up + %d timed steps\n",
      model_label(o).c_str(), static_cast<long long>(o.batch), static_cast<long long>(o.seq), o.dtype.c_str(),
      o.recompute.c_str(), o.threads, o.pp, r.dp, o.tp, o.schedule.c_str(), o.virtual_stages, o.micro_batches,
      o.warmup, o.steps);
  std::printf("reproduce: %s\n", o.command.c_str());
  std::printf("tokens/s        %12.1f  = dp x m x B x T / best step (slowest rank)\n", r.tokens_per_s);
  std::printf("MFU             %11.1f%%  of %d ranks x %.1f GFLOP/s (%s 1024^3 GEMM measured at start-up by every "
              "rank at once; rank 0's)\n",
              100 * r.mfu, o.pp * r.dp * o.tp, r.peak_flops / 1e9, o.dtype.c_str());
  std::printf("step seconds    %12.4f  median, %.4f best\n", r.step.median, r.step.best);
  std::printf("bubble          %11.1f%%  measured: (pipeline - compute) / compute on rank %d (most compute: the "
              "slowest stage)\n",
              100 * r.bubble, r.bottleneck);
  std::printf("                %11.1f%%  theory %s (simulated schedule: %.1f%%)\n", 100 * r.theory,
              pp_theory_formula(o).c_str(), 100 * r.simulated);
  std::printf("\nrank  pp  dp  tp  layers  slots  pipeline s  compute s   wait s  wait/compute  peak activations\n");
  for (size_t i = 0; i < r.ranks.size(); ++i) {
    const PpRankFigures& f = r.ranks[i];
    std::printf("%4zu %3d %3d %3d %7d %6d %11.4f %10.4f %8.4f %12.1f%% %13.1f MiB\n", i,
                static_cast<int>(f.pp_rank), static_cast<int>(f.dp_rank), static_cast<int>(f.tp_rank),
                static_cast<int>(f.layers), static_cast<int>(f.slots), f.pipeline,
                f.compute, f.wait, f.compute > 0 ? 100 * f.wait / f.compute : 0.0,
                f.peak_activations / (1024.0 * 1024.0));
  }
  std::printf("(medians over the timed steps; peak activations: pools.report()[activations].peak, which includes "
              "the step's m micro-batches of token ids)\n");
}

// The chunks a rank of this bench trains: the trainer's (train/rank_chunks.h)
// with the bench's flags, default AdamW and its fixed seed.

}  // namespace

int run_pp_bench(const TrainBenchOptions& o, comm::Communicator& world) {
  const model::ModelConfig cfg = model::model_config_from_sets(o.model, o.sets, "bench train");
  const int world_size = world.size();
  LOOM_REQUIRE(world_size % (o.pp * o.tp) == 0, "bench train: --pp ", o.pp, " x --tp ", o.tp,
               " does not divide the job's ", world_size, " ranks: run mpirun -np (a multiple of pp x tp)");
  mesh::Mesh mesh(mesh::MeshShape{o.pp, world_size / (o.pp * o.tp), 1, o.tp, 1}, world);
  comm::Communicator& pp = mesh.pp();
  const int r = pp.rank(), m = o.micro_batches, v = o.virtual_stages;
  const DType compute = precision_dtype(o.dtype);
  // Before any model memory, as the data-parallel bench does; rank 0's
  // figure is reported (every rank runs it at the same time).
  const double peak_flops = train::measure_peak_flops(compute);
  Pools pools;
  Context ctx{mesh, pools};
  train::RankChunks rank;
  try {
    rank = train::build_rank_chunks(chunk_options(o, cfg, compute), ctx);
  } catch (const Error& e) {
    throw Error(concat("bench train --pp ", o.pp, " --virtual-stages ", v, o.pp_layers.empty() ? "" : " --pp-layers",
                       ": ", e.what()));
  }
  const parallel::PpSchedule& schedule = *rank.schedule;
  parallel::PipelineRuntime& rt = *rank.pipe;
  const std::vector<model::Model*> chunks = rank.model_ptrs();
  const std::vector<parallel::DataParallel*> chunk_dps = rank.dp_ptrs();
  std::vector<std::unique_ptr<parallel::DataParallel>>& dps = rank.dps;
  int slots = 0, layers = 0;
  for (const model::Model* c : chunks) slots += c->slots(), layers += static_cast<int>(c->num_layers());
  // m micro-batches of random tokens; a dp rank its own, shared by its pp and tp group.
  std::vector<OwnedTensor> owned_tokens, owned_targets;
  std::vector<Tensor> tokens, targets;
  const uint64_t dp_rank = static_cast<uint64_t>(mesh.dp().rank());
  for (int k = 0; k < m; ++k) {
    owned_tokens.push_back(pools[MemTag::activations].empty(DType::i32, {o.batch, o.seq}));
    owned_targets.push_back(pools[MemTag::activations].empty(DType::i32, {o.batch, o.seq}));
    const uint64_t seed = kSeed + 2 * (dp_rank * static_cast<uint64_t>(m) + static_cast<uint64_t>(k));
    fill_tokens(owned_tokens.back(), cfg.vocab_size, seed);
    fill_tokens(owned_targets.back(), cfg.vocab_size, seed + 1);
    tokens.push_back(owned_tokens.back()), targets.push_back(owned_targets.back());
  }

  std::optional<train::DynamicLossScaler> scaler;
  if (compute == DType::f16) scaler.emplace(train::TrainConfig{}.loss_scale, train::TrainConfig{}.loss_scale_window);
  // One step of train::Trainer::pipeline_step; returns PipelineRuntime::run's seconds.
  auto step = [&] {
    const double loss_scale = scaler ? scaler->scale() : 1.0;
    for (auto& dp : dps) dp->zero_grads();
    const auto t0 = Clock::now();
    rt.run(tokens, targets, static_cast<float>(loss_scale / m));
    const double pipeline = std::chrono::duration<double>(Clock::now() - t0).count();
    double sum_squares = 0;
    for (auto& dp : dps) dp->wait_gradients();
    rank.tied->sum_grads(chunks, chunk_dps);
    for (auto& dp : dps) sum_squares += dp->grad_sum_squares();
    sum_squares = parallel::exact_group_sum(pp, sum_squares);
    const double norm = std::sqrt(sum_squares) / loss_scale;
    if (scaler && !scaler->update(std::isfinite(norm))) return pipeline;
    for (auto& opt : rank.optimizers)
      opt->step(kLr, static_cast<float>((norm > kGradClip ? kGradClip / norm : 1.0) / loss_scale));
    return pipeline;
  };
  for (int i = 0; i < o.warmup; ++i) step();
  std::vector<double> seconds, pipeline, computing, waiting;
  for (int i = 0; i < o.steps; ++i) {
    world.barrier()->wait();  // every rank starts the step together
    const auto t0 = Clock::now();
    pipeline.push_back(step());
    seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    computing.push_back(rt.compute_seconds()), waiting.push_back(rt.wait_seconds());
  }
  max_over_ranks(world, seconds);

  PpResult res;
  res.dp = mesh.dp().size();
  res.step = {median_of(seconds), *std::min_element(seconds.begin(), seconds.end())};
  res.tokens_per_s = static_cast<double>(res.dp * m * o.batch * o.seq) / res.step.best;
  // Every rank of the pp x dp x tp job shares the model FLOPs of its tokens.
  res.flops_per_token = train::model_flops_per_token(cfg, o.seq);
  res.peak_flops = peak_flops;
  res.mfu = res.flops_per_token * res.tokens_per_s / (peak_flops * world_size);
  res.theory = static_cast<double>(o.pp - 1) / static_cast<double>(v * m);
  res.simulated = parallel::simulate_pp_schedule(schedule).bubble_fraction;
  PpRankFigures mine;
  mine.pp_rank = r, mine.dp_rank = mesh.dp().rank(), mine.tp_rank = mesh.tp().rank(), mine.slots = slots;
  mine.layers = layers;
  mine.pipeline = median_of(pipeline), mine.compute = median_of(computing), mine.wait = median_of(waiting);
  mine.peak_activations = static_cast<double>(pools.report()[MemTag::activations].peak);
  res.ranks = gather_ranks(mine, world_size);
  for (size_t i = 0; i < res.ranks.size(); ++i)
    if (res.ranks[i].compute > res.ranks[static_cast<size_t>(res.bottleneck)].compute)
      res.bottleneck = static_cast<int>(i);
  const PpRankFigures& slow = res.ranks[static_cast<size_t>(res.bottleneck)];
  res.bubble = slow.compute > 0 ? (slow.pipeline - slow.compute) / slow.compute : 0.0;
  if (world.rank() == 0) {
    if (o.json) print_pp_json(o, res);
    else print_pp_table(o, res);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace loom::bench
