// `loom bench train --moe E [--top-k K] [--capacity-factor F] [--ep N]`: the
// trainer's step of a Llama preset whose MLPs are E-expert MoE layers
// (model/moe.h), data parallel over the job's ranks with experts split over
// ep of them (parallel/ep.h), timed beside the dense model of the same
// active parameters (the preset with d_ff x K, no experts) on the same
// ranks and tokens. Under ep the MoE model is timed twice: with every
// exchange blocking (parallel.ep_overlap = false), then overlapped with the
// layer's compute (the default; model/expert_parallel.h).
//
// Figures, rank 0 printing:
//   tokens/s       the job's (ranks x B x seq per step) over the best step
//                  (the slowest rank's, each step starting at a barrier),
//                  and its ratio to the dense model's (and, under ep, to the
//                  blocking run's);
//   all-to-all     per step, the seconds a rank waited for the count,
//                  dispatch and combine exchanges (forward and backward; the
//                  slowest rank's median) and their share of the step. In
//                  the blocking run that is the exchanges' whole time; the
//                  hidden share is 1 - (overlapped wait / blocking time);
//   dropped        the fraction of the step's token choices over capacity,
//                  summed over every rank and layer;
//   balance        the most and least loaded expert over the mean, per
//                  layer, summed over the ranks.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/train_bench_parts.h"
#include "core/error.h"
#include "mesh/context.h"
#include "mesh/mesh.h"
#include "train/moe_step.h"
#include "train/reports.h"

namespace loom::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct MoeTimings {
  std::vector<double> seconds, a2a;
  int64_t choices = 0, dropped = 0;
  std::vector<int64_t> load;  // summed over the timed steps
  double bytes_per_step = 0;
};

// The steps of one model on the job's mesh: warm-up, then timed steps.
MoeTimings time_moe_steps(const TrainBenchOptions& o, const model::ModelConfig& cfg, DType compute,
                          comm::Communicator& world, int ep, bool overlap) {
  mesh::Mesh mesh(mesh::MeshShape{1, world.size(), 1, 1, ep}, world);
  Pools pools;
  Context ctx{mesh, pools};
  train::ChunkOptions co = chunk_options(o, cfg, compute);
  co.ep_overlap = overlap;
  train::RankChunks chunks = train::build_rank_chunks(co, ctx);
  model::Model& m = *chunks.models[0];
  OwnedTensor tokens = pools[MemTag::activations].empty(DType::i32, {o.batch, o.seq});
  OwnedTensor targets = pools[MemTag::activations].empty(DType::i32, {o.batch, o.seq});
  const uint64_t rank = static_cast<uint64_t>(world.rank());
  fill_tokens(tokens, cfg.vocab_size, kSeed + 2 * rank), fill_tokens(targets, cfg.vocab_size, kSeed + 2 * rank + 1);
  for (int i = 0; i < o.warmup; ++i) train_step(m, *chunks.dps[0], *chunks.optimizers[0], tokens, targets, nullptr);
  MoeTimings t;
  m.reset_moe_stats();
  for (int i = 0; i < o.steps; ++i) {
    world.barrier()->wait();
    if (chunks.ep) chunks.ep->reset_stats();
    const Clock::time_point t0 = Clock::now();
    train_step(m, *chunks.dps[0], *chunks.optimizers[0], tokens, targets, nullptr);
    t.seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    t.a2a.push_back(chunks.ep ? chunks.ep->seconds() : 0.0);
    t.bytes_per_step = chunks.ep ? static_cast<double>(chunks.ep->bytes_sent()) : 0.0;
  }
  max_over_ranks(world, t.seconds);
  const model::MoeStats& st = m.moe_stats();
  t.choices = st.choices, t.dropped = st.dropped, t.load = st.load;
  std::vector<int64_t> sums = t.load;
  sums.push_back(t.choices), sums.push_back(t.dropped);
  if (!sums.empty() && world.size() > 1)
    world.all_reduce(Tensor(sums.data(), DType::i64, {static_cast<int64_t>(sums.size())}), comm::ReduceOp::sum)->wait();
  t.dropped = sums.back(), sums.pop_back(), t.choices = sums.back(), sums.pop_back();
  t.load = sums;
  std::vector<double> a2a{median_of(t.a2a)};
  max_over_ranks(world, a2a);
  t.a2a = a2a;
  return t;
}

}  // namespace

int run_moe_bench(const TrainBenchOptions& o, comm::Communicator& world) {
  model::ModelConfig cfg = model::model_preset(o.model);
  LOOM_REQUIRE(cfg.family == model::Family::llama, "bench train: --moe needs a Llama preset (Mixtral's layers): ",
               o.model, " is a GPT-2");
  LOOM_REQUIRE(o.tp == 1 && o.pp == 1 && !o.cp_bench, "bench train: --moe runs with dp and ep alone (no --tp, --pp, --cp)");
  LOOM_REQUIRE(world.size() % o.ep == 0, "bench train: --ep ", o.ep, " does not divide the job's ", world.size(),
               " ranks: run mpirun -np (a multiple of ep)");
  cfg.n_expert = o.moe, cfg.top_k = o.top_k, cfg.capacity_factor = static_cast<float>(o.capacity_factor);
  LOOM_REQUIRE(o.moe % o.ep == 0, "bench train: --ep ", o.ep, " does not divide --moe ", o.moe, " experts");
  cfg.validate();
  model::ModelConfig dense = cfg;
  dense.n_expert = 0, dense.d_ff = cfg.d_ff * cfg.top_k;  // the same active parameters a token
  const DType compute = precision_dtype(o.dtype, "bench train: --dtype");
  LOOM_REQUIRE(compute != DType::f16, "bench train: --moe runs fp32 and bf16 (fp16's loss scaling is not timed here)");
  const MoeTimings moe = time_moe_steps(o, cfg, compute, world, o.ep, true);
  const MoeTimings blocking = o.ep > 1 ? time_moe_steps(o, cfg, compute, world, o.ep, false) : moe;
  const MoeTimings base = time_moe_steps(o, dense, compute, world, 1, true);
  const auto best_of = [](const MoeTimings& t) { return *std::min_element(t.seconds.begin(), t.seconds.end()); };
  const double best = best_of(moe), best_blocking = best_of(blocking), best_dense = best_of(base);
  const double tokens = static_cast<double>(world.size() * o.batch * o.seq);
  const double dropped = static_cast<double>(moe.dropped) / static_cast<double>(std::max<int64_t>(1, moe.choices));
  const double hidden = blocking.a2a[0] > 0 ? std::max(0.0, 1.0 - moe.a2a[0] / blocking.a2a[0]) : 0.0;
  const auto [least, most] = train::load_spread(moe.load, cfg.n_expert);
  if (world.rank() != 0) return 0;
  if (o.json) {
    std::printf("{\"model\":\"%s\",\"batch\":%lld,\"seq\":%lld,\"dtype\":\"%s\",\"dp\":%d,\"ep\":%d,\"experts\":%d,"
                "\"top_k\":%lld,\"capacity_factor\":%g,\"params\":%lld,\"active_params\":%lld,\"step_s\":%.6g,"
                "\"tokens_per_s\":%.6g,\"dense_tokens_per_s\":%.6g,\"vs_dense\":%.4f,\"blocking_tokens_per_s\":%.6g,"
                "\"a2a_s\":%.6g,\"a2a_share\":%.4f,\"a2a_blocking_s\":%.6g,\"a2a_hidden\":%.4f,\"a2a_bytes\":%.0f,"
                "\"dropped\":%.4f,\"load_max_over_mean\":%.4f,\"load_min_over_mean\":%.4f,\"impl\":\"loom\"}\n",
                o.model.c_str(), static_cast<long long>(o.batch), static_cast<long long>(o.seq), o.dtype.c_str(),
                world.size(), o.ep, o.moe, static_cast<long long>(o.top_k), o.capacity_factor,
                static_cast<long long>(model::param_count(cfg)), static_cast<long long>(model::active_param_count(cfg)),
                best, tokens / best, tokens / best_dense, best_dense / best, tokens / best_blocking, moe.a2a[0],
                moe.a2a[0] / best, blocking.a2a[0], hidden, moe.bytes_per_step, dropped, most, least);
    return 0;
  }
  std::printf("loom bench train: %s with %d experts top-%lld (capacity %g), B=%lld T=%lld, %s; dp=%d ep=%d\n",
              o.model.c_str(), o.moe, static_cast<long long>(o.top_k), o.capacity_factor,
              static_cast<long long>(o.batch), static_cast<long long>(o.seq), o.dtype.c_str(), world.size(), o.ep);
  std::printf("  %lld parameters, %lld active a token\n", static_cast<long long>(model::param_count(cfg)),
              static_cast<long long>(model::active_param_count(cfg)));
  std::printf("  step %.3f s (best of %d), %.0f tokens/s; dense model of the same active parameters (d_ff %lld): "
              "%.0f tokens/s (MoE %.2fx)\n", best, o.steps, tokens / best, static_cast<long long>(dense.d_ff),
              tokens / best_dense, best_dense / best);
  if (o.ep > 1)
    std::printf("  all-to-all per step: blocking %.4f s (%.1f%% of its %.3f s step, %.0f tokens/s); overlapped with "
                "expert compute %.4f s waited (%.1f%% of a step): %.0f%% hidden, %.2fx the blocking tokens/s; "
                "%.2f MiB sent a rank\n",
                blocking.a2a[0], 100 * blocking.a2a[0] / best_blocking, best_blocking, tokens / best_blocking,
                moe.a2a[0], 100 * moe.a2a[0] / best, 100 * hidden, best_blocking / best,
                moe.bytes_per_step / (1024.0 * 1024.0));
  std::printf("  dropped %.2f%% of token choices; expert load max %.2f x mean, min %.2f x mean\n", 100 * dropped, most,
              least);
  if (!o.command.empty()) std::printf("  reproduce: %s\n", o.command.c_str());
  return 0;
}

}  // namespace loom::bench
