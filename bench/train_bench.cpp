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
#include "bench/train_bench.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/memory.h"
#include "kernels/ops.h"
#include "model/config.h"
#include "model/model.h"
#include "parallel/dp.h"
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

struct Result {
  StepTimes step;
  double tokens_per_s = 0, flops_per_token = 0, peak_flops = 0, mfu = 0;
  int64_t num_params = 0;
  MemoryReport memory;
  size_t rss_growth = 0;
};

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
      "\"max_rss_growth_bytes\":%zu,\"impl\":\"loom\"}\n",
      o.model.c_str(), static_cast<long long>(o.batch), static_cast<long long>(o.seq), o.dtype.c_str(), o.recompute.c_str(),
      o.threads, o.steps, o.warmup, static_cast<long long>(r.num_params), r.tokens_per_s, r.step.median, r.step.best,
      r.flops_per_token, r.peak_flops / 1e9, r.mfu, r.memory.peak_total, by_tag.c_str(), r.rss_growth);
}

void print_table(const TrainBenchOptions& o, const Result& r) {
  std::printf(
      "loom bench train: %s (%lld parameters), B=%lld T=%lld, %s, recompute %s, %d threads; %d warm-up + %d timed "
      "steps\n",
      o.model.c_str(), static_cast<long long>(r.num_params), static_cast<long long>(o.batch),
      static_cast<long long>(o.seq), o.dtype.c_str(), o.recompute.c_str(), o.threads, o.warmup, o.steps);
  std::printf("reproduce: %s\n", o.command.c_str());
  std::printf("tokens/s        %12.1f  (best step)\n", r.tokens_per_s);
  std::printf("step seconds    %12.4f  median, %.4f best\n", r.step.median, r.step.best);
  std::printf("MFU             %11.1f%%  of %.1f GFLOP/s (%s 1024^3 GEMM measured at start-up)\n", 100 * r.mfu,
              r.peak_flops / 1e9, o.dtype.c_str());
  std::printf("FLOPs per token %12.4g  = 6 N + 12 n_layer n_embd T\n", r.flops_per_token);
  std::printf("max RSS growth  %12.1f MiB\n\n%s", static_cast<double>(r.rss_growth) / (1024.0 * 1024.0),
              r.memory.table().c_str());
}

}  // namespace

int run_train_bench(const TrainBenchOptions& o) {
  LOOM_REQUIRE(o.dtype == "fp32" || o.dtype == "bf16" || o.dtype == "fp16", "bench train: --dtype ", o.dtype,
               " is invalid: allowed are fp32, bf16 and fp16");
  const std::vector<std::string> presets = model::model_preset_names();
  if (std::find(presets.begin(), presets.end(), o.model) == presets.end()) {
    std::string valid;
    for (const std::string& p : presets) valid += (valid.empty() ? "" : ", ") + p;
    throw Error("bench train: --model '" + o.model + "' is unknown: valid presets are " + valid);
  }
  const model::ModelConfig cfg = model::model_preset(o.model);
  Result r;
  // Before any model memory: the GEMM's buffers then do not count as growth.
  const DType compute = o.dtype == "bf16" ? DType::bf16 : o.dtype == "fp16" ? DType::f16 : DType::f32;
  r.peak_flops = train::measure_peak_flops(compute);
  const size_t rss_before = max_rss_bytes();

  Pools pools;
  model::Model m(cfg, o.batch, o.seq, pools, compute, model::recompute_from_name(o.recompute),
                 parallel::DataParallel::model_storage(0));
  parallel::DataParallel opt(m, nullptr, {}, {}, pools);
  opt.init_params(kSeed);
  OwnedTensor tokens = pools[MemTag::activations].empty(DType::i32, {o.batch, o.seq});
  OwnedTensor targets = pools[MemTag::activations].empty(DType::i32, {o.batch, o.seq});
  fill_tokens(tokens, cfg.vocab_size, kSeed);
  fill_tokens(targets, cfg.vocab_size, kSeed + 1);

  std::optional<train::DynamicLossScaler> scaler;
  if (compute == DType::f16) scaler.emplace(train::TrainConfig{}.loss_scale, train::TrainConfig{}.loss_scale_window);
  train::DynamicLossScaler* s = scaler ? &*scaler : nullptr;
  for (int i = 0; i < o.warmup; ++i) train_step(m, opt, tokens, targets, s);
  std::vector<double> times;
  for (int i = 0; i < o.steps; ++i) {
    const auto t0 = Clock::now();
    train_step(m, opt, tokens, targets, s);
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  r.step = {times[times.size() / 2], times.front()};
  r.num_params = m.num_params();
  r.tokens_per_s = static_cast<double>(o.batch * o.seq) / r.step.best;
  r.flops_per_token = flops_per_token(cfg, r.num_params, o.seq);
  r.mfu = r.flops_per_token * r.tokens_per_s / r.peak_flops;
  r.memory = pools.report();
  r.rss_growth = max_rss_bytes() - std::min(rss_before, max_rss_bytes());
  if (o.json) print_json(o, r);
  else print_table(o, r);
  std::fflush(stdout);
  return 0;
}

}  // namespace loom::bench
