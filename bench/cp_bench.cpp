// `loom bench train --cp N` under mpirun: the trainer's step with context
// parallelism (parallel/cp.h) over cp ranks of the job, dp = ranks / cp.
// Each rank holds seq / cp tokens of every sequence (zig-zag, or contiguous
// with --cp-contiguous) and its attention passes K and V around the cp ring
// (--cp-algo ring) or all-gathers them (allgather).
//
// Figures, rank 0 printing:
//   tokens/s      the job's (dp x B x seq per step) over the best step, the
//                 step being the slowest rank's (each starts at a barrier);
//   cp comm       per step, what attention waited for its transfers
//                 (exposed: ContextParallelAttention's waits, slowest rank)
//                 and what the bytes it sent take with nothing beside them
//                 (alone: bytes / the ring's bandwidth, measured after the
//                 timed steps by passing one K/V block around the ring); the
//                 share hidden behind attention compute = 1 - exposed / alone;
//   balance       each cp rank's seconds computing attention blocks (median
//                 step): max and min over the mean (zig-zag evens the causal
//                 work; contiguous chunks give rank r (2r + 1) / cp of it);
//   memory        each rank's peak activations (MemTag::activations) and cp
//                 buffers, measured, next to what Model::activation_bytes and
//                 ContextParallelAttention::peak_bytes predict for seq / cp
//                 tokens. --activation-budget-mb refuses a run whose
//                 predicted bytes do not fit, before building anything.
// A Llama's max_seq_len is raised to --seq (RoPE has no position table).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/train_bench_parts.h"
#include "core/error.h"
#include "mesh/mesh.h"
#include "mesh/context.h"
#include "parallel/cp.h"
#include "train/reports.h"

namespace loom::bench {
namespace {

using Clock = std::chrono::steady_clock;

double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

// Seconds one hop of a `bytes` buffer takes around the group's ring (each
// rank sends to the next, receives from the previous), the best of `hops`.
double ring_hop_seconds(comm::Communicator& ring, int64_t bytes, int hops) {
  std::vector<float> out(static_cast<size_t>(bytes / 4 + 1), 1.f), in(out.size());
  const int n = ring.size(), next = (ring.rank() + 1) % n, prev = (ring.rank() + n - 1) % n;
  const Tensor a(out.data(), DType::f32, {static_cast<int64_t>(out.size())});
  const Tensor b(in.data(), DType::f32, {static_cast<int64_t>(in.size())});
  double best = 1e30;
  for (int h = 0; h < hops; ++h) {
    ring.barrier()->wait();
    const Clock::time_point t0 = Clock::now();
    comm::WorkPtr s = ring.send(a, next, 90), r = ring.recv(b, prev, 90);
    r->wait(), s->wait();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::vector<double> v{best};
  max_over_ranks(ring, v);
  return v[0];
}

// What a rank is predicted to hold for its seq / cp tokens: the model's
// activations and the cp buffers' peak.
struct Predicted {
  int64_t activations = 0, cp_buffers = 0;
};
Predicted predict(const TrainBenchOptions& o, const model::ModelConfig& cfg, DType compute) {
  model::ModelOptions mo{.compute = compute, .recompute = model::recompute_from_name(o.recompute)};
  mo.cp.size = o.cp;
  const int64_t T = o.seq / o.cp;
  const parallel::CpAlgo algo = parallel::cp_algo_from_name(o.cp_algo);
  return {model::Model::activation_bytes(cfg, o.batch, T, mo),
          o.cp == 1 ? 0
                    : parallel::ContextParallelAttention::peak_bytes(o.batch, T, cfg.n_head, cfg.n_kv_head,
                                                                     cfg.n_embd / cfg.n_head, compute, o.cp, algo,
                                                                     !o.cp_contiguous)};
}

// Steps timed; per step the slowest rank's seconds, and this rank's cp
// figures.
struct CpTimings {
  std::vector<double> seconds, exposed, compute;
  double bytes_per_step = 0;
};

CpTimings time_cp_steps(const TrainBenchOptions& o, train::RankChunks& chunks, comm::Communicator& world,
                        const Tensor& tokens, const Tensor& targets) {
  model::Model& m = *chunks.models[0];
  parallel::DataParallel& dp = *chunks.dps[0];
  parallel::ContextParallelAttention* cp = chunks.cp.get();  // null at cp = 1: local attention
  for (int i = 0; i < o.warmup; ++i) train_step(m, dp, *chunks.optimizers[0], tokens, targets, nullptr);
  CpTimings t;
  for (int i = 0; i < o.steps; ++i) {
    world.barrier()->wait();
    if (cp) cp->reset_stats();
    const Clock::time_point t0 = Clock::now();
    train_step(m, dp, *chunks.optimizers[0], tokens, targets, nullptr);
    t.seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    t.exposed.push_back(cp ? cp->stats().wait_s : 0.0), t.compute.push_back(cp ? cp->stats().compute_s : 0.0);
    t.bytes_per_step = cp ? static_cast<double>(cp->stats().bytes_sent) : 0.0;
  }
  max_over_ranks(world, t.seconds);
  return t;
}

// What rank 0 prints: the step (the slowest rank's best), the cp
// communication, the balance and the memory, as a table or one JSON line.
struct CpFigures {
  int dp = 1;
  double best = 0, flops_per_token = 0, peak_flops = 0;  // peak_flops: the job's
  double exposed = 0, alone = 0, bytes = 0;
  double most = 0, least = 0;               // attention compute, max and min over the cp ranks' mean
  double activations = 0, cp_buffers = 0;   // peak bytes, the largest rank's
};

void print_cp(const TrainBenchOptions& o, const CpFigures& f, const Predicted& pred) {
  const double best = f.best, alone = f.alone, exposed = f.exposed;
  const double tokens_per_s = static_cast<double>(f.dp * o.batch * o.seq) / best;
  const double mfu = f.flops_per_token * tokens_per_s / f.peak_flops;
  const double hidden = alone > 0 ? std::clamp(1.0 - exposed / alone, 0.0, 1.0) : 0.0;
  if (o.json) {
    std::printf("{\"model\":\"%s\",\"batch\":%lld,\"seq\":%lld,\"dtype\":\"%s\",\"recompute\":\"%s\",\"dp\":%d,\"cp\":%d,"
                "\"cp_algo\":\"%s\",\"zigzag\":%s,\"step_s\":%.6g,\"tokens_per_s\":%.6g,\"mfu\":%.4f,"
                "\"cp_exposed_s\":%.6g,\"cp_alone_s\":%.6g,\"cp_hidden\":%.4f,\"cp_share\":%.4f,"
                "\"attn_compute_max_over_mean\":%.4f,\"attn_compute_min_over_mean\":%.4f,"
                "\"activations_peak_bytes\":%.0f,\"activations_predicted_bytes\":%lld,\"cp_buffers_peak_bytes\":%.0f,"
                "\"cp_buffers_predicted_bytes\":%lld,\"impl\":\"loom\"}\n",
                o.model.c_str(), static_cast<long long>(o.batch), static_cast<long long>(o.seq), o.dtype.c_str(),
                o.recompute.c_str(), f.dp, o.cp, o.cp_algo.c_str(), o.cp_contiguous ? "false" : "true", best,
                tokens_per_s, mfu, exposed, alone, hidden, exposed / best, f.most, f.least, f.activations,
                static_cast<long long>(pred.activations), f.cp_buffers, static_cast<long long>(pred.cp_buffers));
    return;
  }
  std::printf("loom bench train: %s, B=%lld T=%lld, %s, recompute %s; dp=%d cp=%d (%s, %s)\n", o.model.c_str(),
              static_cast<long long>(o.batch), static_cast<long long>(o.seq), o.dtype.c_str(), o.recompute.c_str(),
              f.dp, o.cp, o.cp_algo.c_str(), o.cp_contiguous ? "contiguous chunks" : "zig-zag");
  std::printf("  step %.3f s (best of %d), %.0f tokens/s, MFU %.1f%%\n", best, o.steps, tokens_per_s, 100 * mfu);
  std::printf("  cp comm per step: exposed %.4f s, alone %.4f s (%.1f MiB sent a rank): %.0f%% hidden; %.1f%% of a "
              "step\n", exposed, alone, mib(f.bytes), 100 * hidden, 100 * exposed / best);
  std::printf("  attention compute per cp rank: max %.3f x mean, min %.3f x mean\n", f.most, f.least);
  std::printf("  per rank: activations peak %.1f MiB (predicted %.1f), cp buffers peak %.1f MiB (predicted %.1f)\n",
              mib(f.activations), mib(static_cast<double>(pred.activations)), mib(f.cp_buffers),
              mib(static_cast<double>(pred.cp_buffers)));
  if (!o.command.empty()) std::printf("  reproduce: %s\n", o.command.c_str());
}

// The rank's tokens and targets (B, seq / cp) of its dp rank's random
// sequences (seed), which its cp ranks share.
void rank_tokens(const TrainBenchOptions& o, const train::RankChunks& chunks, int64_t vocab, uint64_t seed,
                 std::vector<int32_t>& tok, std::vector<int32_t>& tgt) {
  const int64_t T = o.seq / o.cp;
  std::vector<int32_t> seq(static_cast<size_t>(o.batch * o.seq));
  fill_tokens(Tensor(seq.data(), DType::i32, {o.batch * o.seq}), vocab, seed);
  tok.resize(static_cast<size_t>(o.batch * T)), tgt.resize(tok.size());
  for (int64_t b = 0; b < o.batch; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t pos = chunks.cp ? chunks.cp_positions[static_cast<size_t>(t)] : t;
      const size_t at = static_cast<size_t>(b * o.seq + pos);
      tok[static_cast<size_t>(b * T + t)] = seq[at], tgt[static_cast<size_t>(b * T + t)] = seq[(at + 1) % seq.size()];
    }
}

}  // namespace

int run_cp_bench(const TrainBenchOptions& o, comm::Communicator& world) {
  model::ModelConfig cfg = model::model_preset(o.model);
  if (cfg.family == model::Family::llama) cfg.max_seq_len = std::max(cfg.max_seq_len, o.seq);
  LOOM_REQUIRE(o.tp == 1 && o.pp == 1, "bench train: --cp runs with --tp 1 and --pp 1 (got --tp ", o.tp, ", --pp ",
               o.pp, ")");
  LOOM_REQUIRE(world.size() % o.cp == 0, "bench train: --cp ", o.cp, " does not divide the job's ", world.size(),
               " ranks: run mpirun -np (a multiple of cp)");
  (void)parallel::cp_split(o.seq, o.cp, !o.cp_contiguous);  // a loom::Error saying what --seq must divide by
  const DType compute = precision_dtype(o.dtype, "bench train: --dtype");
  LOOM_REQUIRE(compute != DType::f16, "bench train: --cp runs fp32 and bf16 (fp16's loss scaling is not timed here)");
  const Predicted pred = predict(o, cfg, compute);
  const double need = mib(static_cast<double>(pred.activations + pred.cp_buffers));
  LOOM_REQUIRE(o.activation_budget_mb <= 0 || need <= o.activation_budget_mb, "bench train: --cp ", o.cp, ": a rank's ",
               o.seq / o.cp, " tokens of each sequence need ", need, " MiB of activations and cp buffers, over ",
               "--activation-budget-mb ", o.activation_budget_mb, ": use a larger --cp");
  const int dp_size = world.size() / o.cp;
  mesh::Mesh mesh(mesh::MeshShape{1, dp_size, o.cp, 1, 1}, world);
  const double peak_flops = train::measure_peak_flops(compute);
  Pools pools, cp_pools;  // the cp attention's buffers apart, to measure them
  Context ctx{mesh, pools};
  train::ChunkOptions co = chunk_options(o, cfg, compute);
  co.cp_pools = &cp_pools;
  train::RankChunks chunks = train::build_rank_chunks(co, ctx);
  const int64_t T = o.seq / o.cp;
  std::vector<int32_t> tok, tgt;
  rank_tokens(o, chunks, cfg.vocab_size, kSeed + static_cast<uint64_t>(mesh.dp().rank()), tok, tgt);
  pools.reset_peaks();
  const CpTimings t = time_cp_steps(o, chunks, world, Tensor(tok.data(), DType::i32, {o.batch, T}),
                                    Tensor(tgt.data(), DType::i32, {o.batch, T}));
  const MemoryReport mem = pools.report();
  const double best = *std::min_element(t.seconds.begin(), t.seconds.end());
  // The ring's bandwidth for a K/V block of this size, and the balance over the cp group.
  const int64_t kv_bytes = 2 * o.batch * T * cfg.n_kv_head * (cfg.n_embd / cfg.n_head) *
                           static_cast<int64_t>(dtype_size(compute));
  const double hop = o.cp > 1 ? ring_hop_seconds(mesh.cp(), kv_bytes, 5) : 1.0;
  std::vector<double> exposed{median_of(t.exposed)};
  max_over_ranks(world, exposed);
  const double alone = t.bytes_per_step / (static_cast<double>(kv_bytes) / hop);
  std::vector<float> mine{static_cast<float>(median_of(t.compute))}, all(static_cast<size_t>(o.cp));
  mesh.cp().all_gather(Tensor(all.data(), DType::f32, {o.cp}), Tensor(mine.data(), DType::f32, {1}))->wait();
  double mean = 0;
  for (float c : all) mean += c / o.cp;
  if (mean == 0) mean = 1;  // cp = 1: no cp attention to balance
  const double most = *std::max_element(all.begin(), all.end()), least = *std::min_element(all.begin(), all.end());
  std::vector<double> peaks{static_cast<double>(mem[MemTag::activations].peak),
                            static_cast<double>(cp_pools.report().peak_total)};
  max_over_ranks(world, peaks);
  if (world.rank() == 0) {
    print_cp(o, {dp_size, best, train::model_flops_per_token(cfg, o.seq), peak_flops * world.size(), exposed[0], alone,
                 t.bytes_per_step, most / mean, least / mean, peaks[0], peaks[1]},
             pred);
  }
  return 0;
}

}  // namespace loom::bench
