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
#include "bench/train_bench.h"

#include <mpi.h>
#include <sys/resource.h>

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
#include "core/error.h"
#include "core/memory.h"
#include "kernels/ops.h"
#include "model/config.h"
#include "model/model.h"
#include "mesh/mesh.h"
#include "parallel/dp.h"
#include "parallel/tp.h"
#include "train/trainer.h"

namespace loom::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr double kLr = 3e-4, kGradClip = 1.0;  // values do not change the work done
constexpr uint64_t kSeed = 1;

// Model FLOPs per trained token: 6 N + 12 n_layer n_embd T (attention scores
// and mixing, forward and backward: PaLM appendix B). The formula of
// train::Trainer::flops_per_token, which needs a Trainer (and data) to call.
double flops_per_token(const model::ModelConfig& m, int64_t num_params, int64_t T) {
  return 6.0 * static_cast<double>(num_params) + 12.0 * static_cast<double>(m.n_layer * m.n_embd * T);
}

// Uniform tokens in [0, vocab) from a fixed xorshift stream.
void fill_tokens(Tensor t, int64_t vocab, uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    t.data_as<int32_t>()[i] = static_cast<int32_t>((s >> 11) % static_cast<uint64_t>(vocab));
  }
}

// The process's peak resident set so far (Linux: ru_maxrss in KiB).
size_t max_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<size_t>(u.ru_maxrss) * 1024;
}

struct StepTimes {
  double median = 0, best = 0;
};

// One training step as train::Trainer::step does it, with grad_accum = 1;
// scaler: fp16's dynamic loss scaling, else null.
void train_step(model::Model& m, parallel::DataParallel& dp, const Tensor& tokens, const Tensor& targets,
                train::DynamicLossScaler* scaler) {
  const double loss_scale = scaler ? scaler->scale() : 1.0;
  dp.zero_grads();
  dp.begin_micro_batch(true);
  m.forward(tokens, targets);
  m.backward(static_cast<float>(loss_scale));
  const double norm = dp.grad_norm() / loss_scale;
  if (scaler && !scaler->update(std::isfinite(norm))) return;
  dp.update(kLr, static_cast<float>((norm > kGradClip ? kGradClip / norm : 1.0) / loss_scale));
}

// Under mpirun, main() has initialised MPI before any command runs (it holds
// the job's world while the command runs); a plain process never touches MPI.
bool in_mpi_job() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  return initialized != 0;
}

// Element-wise maximum over the ranks of `comm` (nullptr: a group of one),
// exchanged as f32 (comm has no f64): 7 digits are plenty for seconds.
void max_over_ranks(comm::Communicator* comm, std::vector<double>& values) {
  if (comm == nullptr || values.empty()) return;
  std::vector<float> v(values.begin(), values.end());
  comm->all_reduce(Tensor(v.data(), DType::f32, {static_cast<int64_t>(v.size())}), comm::ReduceOp::max)->wait();
  values.assign(v.begin(), v.end());
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

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
      o.model.c_str(), static_cast<long long>(o.batch), static_cast<long long>(o.seq), o.dtype.c_str(), o.recompute.c_str(),
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
      o.model.c_str(), static_cast<long long>(r.num_params), static_cast<long long>(o.batch),
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
}

void check_options(const TrainBenchOptions& o) {
  LOOM_REQUIRE(o.dtype == "fp32" || o.dtype == "bf16" || o.dtype == "fp16", "bench train: --dtype ", o.dtype,
               " is invalid: allowed are fp32, bf16 and fp16");
  LOOM_REQUIRE(o.zero_stage >= 0 && o.zero_stage <= 3, "bench train: --zero-stage ", o.zero_stage,
               " is invalid: allowed are 0, 1, 2 and 3");
  LOOM_REQUIRE(o.tp >= 1, "bench train: --tp ", o.tp, " is invalid: allowed values are >= 1");
  const std::vector<std::string> presets = model::model_preset_names();
  if (std::find(presets.begin(), presets.end(), o.model) == presets.end()) {
    std::string valid;
    for (const std::string& p : presets) valid += (valid.empty() ? "" : ", ") + p;
    throw Error("bench train: --model '" + o.model + "' is unknown: valid presets are " + valid);
  }
}

// Timed steps: each rank's step times, each step's exposed gradient
// communication seconds and its seconds in tp collectives; all as the
// maximum over the job's ranks (world; nullptr: a plain process).
struct Timings {
  std::vector<double> seconds, exposed, tp_comm;
};

Timings time_steps(const TrainBenchOptions& o, model::Model& m, parallel::DataParallel& dp,
                   parallel::TensorParallel* tp, comm::Communicator* world, const Tensor& tokens,
                   const Tensor& targets, train::DynamicLossScaler* scaler) {
  for (int i = 0; i < o.warmup; ++i) train_step(m, dp, tokens, targets, scaler);
  Timings t;
  for (int i = 0; i < o.steps; ++i) {
    if (world != nullptr) world->barrier()->wait();  // every rank starts the step together
    dp.reset_comm_stats();
    if (tp) tp->reset_stats();
    const auto t0 = Clock::now();
    train_step(m, dp, tokens, targets, scaler);
    t.seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    t.exposed.push_back(dp.comm_stats().exposed_seconds);
    t.tp_comm.push_back(tp ? tp->seconds() : 0.0);
  }
  max_over_ranks(world, t.seconds);
  max_over_ranks(world, t.exposed);
  max_over_ranks(world, t.tp_comm);
  return t;
}

DpFigures dp_figures(parallel::DataParallel& dp, comm::Communicator* world, const Timings& t, double best_step,
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
  const model::ModelConfig cfg = model::model_preset(o.model);
  // An mpirun job trains data parallel over its world; a plain process is a group of one.
  std::unique_ptr<comm::Communicator> world;
  if (in_mpi_job()) {
    comm::Options copts;
    copts.algo = comm::algo_from_name(o.comm_algo);
    world = comm::mpi_world(copts);
  }
  const int rank = world ? world->rank() : 0;
  const int world_size = world ? world->size() : 1;
  LOOM_REQUIRE(world_size % o.tp == 0, "bench train: --tp ", o.tp, " does not divide the job's ", world_size,
               " ranks: run mpirun -np (a multiple of tp)");
  // Groups: tp neighbouring ranks hold a replica, the rest is data parallel.
  std::unique_ptr<mesh::Mesh> mesh;
  std::unique_ptr<parallel::TensorParallel> tp;
  comm::Communicator* dp_group = world.get();
  if (o.tp > 1) {
    mesh = std::make_unique<mesh::Mesh>(mesh::MeshShape{1, world_size / o.tp, 1, o.tp, 1}, *world);
    tp = std::make_unique<parallel::TensorParallel>(mesh->tp(), o.sequence_parallel);
    dp_group = &mesh->dp();
  }
  Result r;
  // Before any model memory: the GEMM's buffers then do not count as growth.
  const DType compute = o.dtype == "bf16" ? DType::bf16 : o.dtype == "fp16" ? DType::f16 : DType::f32;
  r.peak_flops = train::measure_peak_flops(compute);
  const size_t rss_before = max_rss_bytes();

  Pools pools;
  model::Model m(cfg, o.batch, o.seq, pools, compute, model::recompute_from_name(o.recompute),
                 parallel::DataParallel::model_storage(o.zero_stage), tp ? tp->options() : model::TpOptions{});
  parallel::DpOptions dpo;
  dpo.zero_stage = o.zero_stage, dpo.bucket_mb = o.bucket_mb;
  parallel::DataParallel dp(m, dp_group, dpo, {}, pools);
  if (tp) dp.set_tp_group(&tp->group());
  dp.init_params(kSeed);
  OwnedTensor tokens = pools[MemTag::activations].empty(DType::i32, {o.batch, o.seq});
  OwnedTensor targets = pools[MemTag::activations].empty(DType::i32, {o.batch, o.seq});
  // Every dp rank its own tokens (rank 0's are a plain process's); a tp
  // group shares them.
  const uint64_t dp_rank = static_cast<uint64_t>(dp.rank());
  fill_tokens(tokens, cfg.vocab_size, kSeed + 2 * dp_rank);
  fill_tokens(targets, cfg.vocab_size, kSeed + 2 * dp_rank + 1);

  std::optional<train::DynamicLossScaler> scaler;
  if (compute == DType::f16) scaler.emplace(train::TrainConfig{}.loss_scale, train::TrainConfig{}.loss_scale_window);
  const Timings t = time_steps(o, m, dp, tp.get(), world.get(), tokens, targets, scaler ? &*scaler : nullptr);
  r.step = {median_of(t.seconds), *std::min_element(t.seconds.begin(), t.seconds.end())};
  r.num_params = model::param_count(model::param_specs(cfg));  // the whole model, every tp rank's slice
  r.tokens_per_s = static_cast<double>(o.batch * o.seq) / r.step.best;
  r.flops_per_token = flops_per_token(cfg, r.num_params, o.seq);
  // A tp group's ranks share its tokens and its FLOPs.
  r.mfu = r.flops_per_token * r.tokens_per_s / (r.peak_flops * o.tp);
  if (tp) r.tp = TpFigures{o.tp, o.sequence_parallel, median_of(t.tp_comm), median_of(t.tp_comm) / r.step.median};
  r.memory = pools.report();  // the steps' memory, before the communication-only measurement below
  // The data-parallel figures: in a job, or for a ZeRO stage run as a group of one.
  if (world || o.zero_stage != 0) r.dp = dp_figures(dp, world.get(), t, r.step.best, o.batch * o.seq);
  r.rss_growth = max_rss_bytes() - std::min(rss_before, max_rss_bytes());
  if (rank == 0) {
    if (o.json) print_json(o, r);
    else print_table(o, r);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace loom::bench
