#include "train/reports.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "kernels/ops.h"
#include "model/params.h"

namespace loom::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double mib(size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

}  // namespace

double model_flops_per_token(const model::ModelConfig& m, int64_t seq_len) {
  return 6.0 * static_cast<double>(model::active_param_count(m)) +
         12.0 * static_cast<double>(m.n_layer * m.n_embd * seq_len);
}

double lora_flops_per_token(const model::ModelConfig& m, int64_t seq_len, int64_t adapters) {
  return 4.0 * static_cast<double>(model::active_param_count(m)) + 8.0 * static_cast<double>(adapters) +
         12.0 * static_cast<double>(m.n_layer * m.n_embd * seq_len);
}

double measure_peak_flops(DType dtype, Device device) {
  const int64_t n = device.is_cpu() ? 1024 : 8192;
  MemoryTracker tracker;
  Pool pool(MemTag::workspace, device, tracker);
  OwnedTensor a = pool.empty(dtype, {n, n}), b = pool.empty(dtype, {n, n}), c = pool.empty(dtype, {n, n});
  kernels::fill(a, 0.5f);
  kernels::fill(b, 0.25f);
  kernels::matmul(c, a, b);  // warm-up: oneDNN builds its kernel
  if (!device.is_cpu()) {
    // Ops on a device return once enqueued; sum_squares returns a value, so
    // it waits for every GEMM before it (its own pass is ~1% of one GEMM's).
    kernels::sum_squares(c);
    const auto start = Clock::now();
    constexpr int reps = 8;
    for (int i = 0; i < reps; ++i) kernels::matmul(c, a, b);
    kernels::sum_squares(c);
    return 2.0 * n * n * n * reps / seconds_since(start);
  }
  double best = 1e30;
  for (int i = 0; i < 8; ++i) {
    const auto start = Clock::now();
    kernels::matmul(c, a, b);
    best = std::min(best, seconds_since(start));
  }
  return 2.0 * n * n * n / best;
}

std::string recompute_report(const model::Model& m, const MemoryReport& report) {
  const model::ModelConfig& cfg = m.config();
  auto layout = [&](model::Recompute r) {
    return model::Model::activation_bytes(cfg, m.batch_size(), m.seq_len(),
                                          {.compute = m.compute_dtype(), .recompute = r, .tp = m.tensor_parallel()});
  };
  const int64_t none = layout(model::Recompute::none), chosen = layout(m.recompute());
  const size_t peak = report[MemTag::activations].peak;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "recompute = %s: activations peak %.1f MiB measured; model layout %.1f MiB "
                "(none %.1f, selective %.1f, full %.1f MiB): %.1f%% less than none",
                std::string(model::recompute_name(m.recompute())).c_str(), mib(peak), mib(chosen), mib(none),
                mib(layout(model::Recompute::selective)), mib(layout(model::Recompute::full)),
                100.0 * (1.0 - static_cast<double>(chosen) / static_cast<double>(none)));
  return buf;
}

double predicted_layer_activation_bytes(const model::ModelConfig& cfg, int64_t B, int64_t T, DType compute, int tp,
                                        bool sequence_parallel) {
  const double sbh = static_cast<double>(T) * static_cast<double>(B) * static_cast<double>(cfg.n_embd);
  const double t = tp;
  // Per sbh at 2 bytes: 34 unsplit (11 attention + 19 MLP + 4 norms); TP
  // splits 24 of them (q, k, v, scores input, MLP hidden) and SP the other 10.
  const double per_sbh = tp == 1 ? 34.0 : sequence_parallel ? 34.0 / t : 10.0 + 24.0 / t;
  return sbh * per_sbh * static_cast<double>(dtype_size(compute)) / 2.0;
}

std::string cp_buffers_report(const model::Model& m, const parallel::ContextParallelAttention& cp) {
  const model::ModelConfig& c = m.config();
  const int tp = m.tensor_parallel().tp.size;  // a tp rank holds its heads
  const int64_t bytes = parallel::ContextParallelAttention::peak_bytes(
      m.batch_size(), m.seq_len(), c.n_head / tp, c.n_kv_head / tp, c.n_embd / c.n_head, m.compute_dtype(),
      m.options().cp.size, cp.algo(), cp.split(m.seq_len()).zigzag);
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "context parallel (cp = %d, %s): an attention call holds at most %.2f MiB beside the activations "
                "(K/V blocks in flight, the running result, dK/dV travelling)",
                m.options().cp.size, parallel::cp_algo_name(cp.algo()), mib(static_cast<size_t>(bytes)));
  return buf;
}

std::string activation_prediction_report(const model::Model& m) {
  model::ModelConfig one_less = m.config();
  model::ModelConfig cfg = m.config();
  if (cfg.n_layer == 1) cfg.n_layer = 2;  // the difference of two layouts needs a second layer
  one_less.n_layer = cfg.n_layer - 1;
  const model::TpOptions& tp = m.tensor_parallel();
  auto layout = [&](const model::ModelConfig& c) {
    return model::Model::activation_bytes(c, m.batch_size(), m.seq_len(),
                                          {.compute = m.compute_dtype(), .recompute = model::Recompute::none, .tp = tp,
                                           .cp = {m.options().cp.size, {}, nullptr}});
  };
  const int64_t per_layer = layout(cfg) - layout(one_less);
  const int cp = m.options().cp.size;
  const double predicted =
      predicted_layer_activation_bytes(cfg, m.batch_size(), m.seq_len(), m.compute_dtype(), tp.tp.size, tp.sp());
  char buf[640];
  const std::string cp_note =
      cp == 1 ? "" : concat(", cp = ", cp, ": this rank's ", m.seq_len(), " of each sequence's ", m.seq_len() * cp,
                            " tokens");
  std::snprintf(buf, sizeof buf,
                "activations per layer (recompute none, tp = %d%s%s): %.2f MiB in this rank's layout; Korthikanti et "
                "al. predict %.2f MiB (s b h (%s), no 5 a s / h term: flash attention keeps no s x s scores%s): "
                "ratio %.3f",
                tp.tp.size, tp.sp() ? ", sequence parallel" : "", cp_note.c_str(), mib(static_cast<size_t>(per_layer)),
                predicted / (1024.0 * 1024.0),
                tp.tp.size == 1 ? "34" : tp.sp() ? "34 / t" : "10 + 24 / t",
                cfg.d_ff == 4 * cfg.n_embd ? "" : "; the formula assumes d_ff = 4 h",
                static_cast<double>(per_layer) / predicted);
  return buf;
}

std::string memory_json_lines(const MemoryRankCoords& at, const MemoryReport& report) {
  std::string out;
  for (int i = 0; i < kNumMemTags; ++i) {
    const TagUsage& u = report.tags[static_cast<size_t>(i)];
    out += concat("{\"world_rank\":", at.world_rank, ",\"pp_rank\":", at.pp_rank, ",\"dp_rank\":", at.dp_rank,
                  ",\"cp_rank\":", at.cp_rank, ",\"tp_rank\":", at.tp_rank, ",\"ep_rank\":", at.ep_rank,
                  ",\"tag\":\"", mem_tag_name(static_cast<MemTag>(i)), "\",\"current_bytes\":", u.current,
                  ",\"peak_bytes\":", u.peak, "}\n");
  }
  return out;
}

}  // namespace loom::train
