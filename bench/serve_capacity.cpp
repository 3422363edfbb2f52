// `loom bench serve --mode capacity`: the PagedAttention paper's waste
// argument (Kwon et al., SOSP 2023, §3), measured on loom's own bookkeeping:
// how many sequences a KV budget runs at once.
//
// Contiguous: a cache of max_model_len tokens per sequence (the layout of
// the systems before vLLM, and of loom's retired model::Decoder) runs floor(budget tokens /
// max_model_len) sequences whatever their lengths. Its utilisation is what
// the same length mix would fill of those slots: each sequence's tokens over
// max_model_len, averaged over its decode steps.
//
// Paged: infer::Scheduler + KvCacheManager alone, no model: every request is
// submitted at t = 0, max_num_seqs is unlimited and the step's token budget
// is the cache's capacity (the question is memory, not compute), and each
// step's sampled tokens are fake (token 0). Reported: the peak and the mean
// number of running requests, and the KV utilisation (tokens held / token
// capacity; blocks in use / blocks), means over the saturated steps (some
// request still waits: memory is what limits), or over all steps if none
// was; and the preemptions (by recompute) when running sequences outgrew it.
//
// Length mix (a choice): ShareGPT-like. Prompt and output lengths are
// independent lognormals with sigma = 1 (ShareGPT's conversations spread
// over two orders of magnitude with a long tail) and means --input-len and
// --output-len (default ShareGPT's 161 and 338, serve_common.h); rounded;
// a prompt clipped to [1, max_model_len - 1], then its output to
// [1, max_model_len - prompt]. Seeded (--seed), as are the prompts' tokens.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "bench/serve_common.h"
#include "core/error.h"
#include "infer/kv_cache_manager.h"
#include "infer/scheduler.h"
#include "model/paged_runner.h"

namespace loom::bench::serve {
namespace {

constexpr double kLengthSigma = 1.0;

struct Lengths {
  std::vector<int64_t> input, output;
  double mean_input = 0, mean_output = 0;
};

Lengths sharegpt_like_lengths(const ServeBenchOptions& o) {
  std::mt19937_64 rng(o.seed);
  auto lognormal = [](double mean) {
    return std::lognormal_distribution<double>(std::log(mean) - kLengthSigma * kLengthSigma / 2, kLengthSigma);
  };
  std::lognormal_distribution<double> in = lognormal(static_cast<double>(o.input_len));
  std::lognormal_distribution<double> out = lognormal(static_cast<double>(o.output_len));
  const int64_t M = o.engine.max_model_len;
  Lengths l;
  for (int64_t i = 0; i < o.num_requests; ++i) {
    const int64_t p = std::clamp<int64_t>(std::llround(in(rng)), 1, M - 1);
    const int64_t q = std::clamp<int64_t>(std::llround(out(rng)), 1, M - p);
    l.input.push_back(p), l.output.push_back(q);
    l.mean_input += static_cast<double>(p) / static_cast<double>(o.num_requests);
    l.mean_output += static_cast<double>(q) / static_cast<double>(o.num_requests);
  }
  return l;
}

struct Budget {
  int64_t bytes = 0, num_blocks = 0;  // blocks with the null block, as the engine counts them
  int64_t token_capacity = 0;         // allocatable: (num_blocks - 1) * block_size
  int64_t contiguous = 0;             // sequences of max_model_len
};

Budget kv_budget(const ServeBenchOptions& o, const model::ModelConfig& cfg) {
  const int64_t B = o.engine.block_size, M = o.engine.max_model_len, per_seq = (M + B - 1) / B;
  const int64_t block_bytes = model::kv_block_bytes(cfg, B, kv_dtype(o));
  Budget b;
  // The engine's default (infer::EngineConfig): max_num_seqs sequences of
  // max_model_len, with the null block.
  b.bytes = engine_config(o).kv_cache_bytes;
  if (b.bytes == 0) b.bytes = (1 + o.engine.max_num_seqs * per_seq) * block_bytes;
  b.num_blocks = b.bytes / block_bytes;
  LOOM_REQUIRE(b.num_blocks >= 1 + per_seq, "bench serve: a KV budget of ", b.bytes / 1048576.0, " MiB holds ",
               b.num_blocks, " blocks of ", B, " tokens (", block_bytes, " bytes each, null block included); one "
               "sequence of max_model_len = ", M, " tokens needs ", 1 + per_seq,
               ": raise --kv-cache-mb or lower --max-model-len");
  b.token_capacity = (b.num_blocks - 1) * B;
  b.contiguous = b.bytes / (M * model::kv_block_bytes(cfg, 1, kv_dtype(o)));
  return b;
}

// The contiguous cache's utilisation with this mix (the file's comment).
double contiguous_utilisation(const Lengths& l, int64_t max_model_len) {
  double held = 0, slots = 0;
  for (size_t i = 0; i < l.input.size(); ++i) {
    const double p = static_cast<double>(l.input[i]), q = static_cast<double>(l.output[i]);
    held += q * p + q * (q + 1) / 2;  // sum over decode steps k = 1..q of p + k
    slots += q * static_cast<double>(max_model_len);
  }
  return held / slots;
}

struct Occupancy {
  int64_t steps = 0, saturated_steps = 0, peak_running = 0, preemptions = 0;
  double mean_running = 0, token_utilisation = 0, block_utilisation = 0;  // over the steps averaged
};

Occupancy simulate_paged(const ServeBenchOptions& o, const Budget& b, const Lengths& l, int64_t vocab) {
  infer::KvCacheManager kv({.num_blocks = b.num_blocks, .block_size = o.engine.block_size});
  infer::Scheduler sched({.max_num_batched_tokens = b.token_capacity, .max_num_seqs = o.num_requests,
                          .max_model_len = o.engine.max_model_len},
                         kv);
  std::mt19937_64 rng(o.seed + 1);
  for (size_t i = 0; i < l.input.size(); ++i)
    sched.add_request(static_cast<infer::RequestId>(i + 1), random_tokens(rng, l.input[i], vocab),
                      {.max_tokens = l.output[i], .ignore_eos = true});
  Occupancy all, saturated;  // sums, then means
  std::vector<infer::SampledToken> sampled;
  while (sched.has_unfinished()) {
    const infer::SchedulerOutput out = sched.schedule();
    const infer::SchedulerStats st = sched.stats();
    int64_t held = 0;
    sampled.clear();
    for (const infer::ScheduledRequest& s : out.scheduled) {
      held += kv.num_tokens(s.id);
      if (s.samples) sampled.push_back({s.id, 0});
    }
    for (Occupancy* occ : {&all, &saturated}) {
      if (occ == &saturated && st.num_waiting == 0) continue;
      ++occ->steps;
      occ->mean_running += static_cast<double>(st.num_running);
      occ->token_utilisation += static_cast<double>(held) / static_cast<double>(b.token_capacity);
      occ->block_utilisation += static_cast<double>(kv.pool().num_used()) / static_cast<double>(b.num_blocks - 1);
    }
    all.peak_running = std::max(all.peak_running, st.num_running);
    sched.update(sampled);
  }
  Occupancy r = saturated.steps > 0 ? saturated : all;
  const double n = static_cast<double>(std::max<int64_t>(1, r.steps));
  r.mean_running /= n, r.token_utilisation /= n, r.block_utilisation /= n;
  r.saturated_steps = saturated.steps, r.steps = all.steps;
  r.peak_running = all.peak_running, r.preemptions = sched.stats().num_preemptions;
  return r;
}

void print_json(const ServeBenchOptions& o, const Budget& b, const Lengths& l, double contiguous_util,
                const Occupancy& p) {
  std::printf("{%s,\"length_mix\":\"lognormal\",\"length_sigma\":%s,\"mean_input_tokens\":%s,"
              "\"mean_output_tokens\":%s,\"kv_cache_bytes\":%lld,\"kv_blocks_total\":%lld,\"kv_token_capacity\":%lld,"
              "\"contiguous_seqs\":%lld,\"contiguous_kv_utilization\":%s,\"paged_peak_running\":%lld,"
              "\"paged_mean_running\":%s,\"paged_kv_utilization\":%s,\"paged_kv_block_utilization\":%s,"
              "\"paged_over_contiguous\":%s,\"preemptions\":%lld,\"steps\":%lld,\"saturated_steps\":%lld}\n",
              run_json(o).c_str(), json_number(kLengthSigma).c_str(), json_number(l.mean_input).c_str(),
              json_number(l.mean_output).c_str(), static_cast<long long>(b.bytes),
              static_cast<long long>(b.num_blocks - 1), static_cast<long long>(b.token_capacity),
              static_cast<long long>(b.contiguous), json_number(contiguous_util).c_str(),
              static_cast<long long>(p.peak_running), json_number(p.mean_running).c_str(),
              json_number(p.token_utilisation).c_str(), json_number(p.block_utilisation).c_str(),
              json_number(p.mean_running / static_cast<double>(b.contiguous)).c_str(),
              static_cast<long long>(p.preemptions), static_cast<long long>(p.steps),
              static_cast<long long>(p.saturated_steps));
}

void print_table(const ServeBenchOptions& o, const Budget& b, const Lengths& l, double contiguous_util,
                 const Occupancy& p) {
  const auto M = static_cast<long long>(o.engine.max_model_len);
  std::printf("KV budget        %.1f MiB: %lld blocks of %lld tokens + the null block = %lld tokens; max_model_len "
              "%lld\n", b.bytes / 1048576.0, static_cast<long long>(b.num_blocks - 1),
              static_cast<long long>(o.engine.block_size), static_cast<long long>(b.token_capacity), M);
  std::printf("length mix       %lld requests, lognormal (sigma %g) lengths of means %lld + %lld asked, %.1f + %.1f "
              "after clipping\n\n", static_cast<long long>(o.num_requests), kLengthSigma,
              static_cast<long long>(o.input_len), static_cast<long long>(o.output_len), l.mean_input, l.mean_output);
  std::printf("contiguous       %6lld sequences (budget tokens / %lld), KV utilisation %.1f%%\n",
              static_cast<long long>(b.contiguous), M, 100 * contiguous_util);
  std::printf("paged            %6lld peak, %.1f mean running (%.2fx contiguous), KV utilisation %.1f%% of tokens, "
              "%.1f%% of blocks\n", static_cast<long long>(p.peak_running), p.mean_running,
              p.mean_running / static_cast<double>(b.contiguous), 100 * p.token_utilisation,
              100 * p.block_utilisation);
  std::printf("                 means over %lld saturated steps of %lld%s; %lld preemptions\n",
              static_cast<long long>(p.saturated_steps), static_cast<long long>(p.steps),
              p.saturated_steps == 0 ? " (never saturated: means over all steps; raise --num-requests)" : "",
              static_cast<long long>(p.preemptions));
}

}  // namespace

int run_capacity(const ServeBenchOptions& o) {
  const model::ModelConfig cfg = model_config(o);
  const Budget b = kv_budget(o, cfg);
  const Lengths l = sharegpt_like_lengths(o);
  const double contiguous_util = contiguous_utilisation(l, o.engine.max_model_len);
  const Occupancy p = simulate_paged(o, b, l, cfg.vocab_size);
  if (o.json) {
    print_json(o, b, l, contiguous_util, p);
  } else {
    print_table_header(o, cfg);
    print_table(o, b, l, contiguous_util, p);
  }
  return 0;
}

}  // namespace loom::bench::serve
