// `loom bench serve --mode decode-bound`: how close decoding comes to the
// machine's memory bandwidth, the bound of small-batch decoding (each step
// reads every weight once for the tokens of all its sequences).
//
// Decode tokens/s: S = --num-requests requests (default 1) decoding together,
// greedy, EOS ignored, each a random prompt of --input-len tokens and
// --output-len new tokens. Timed: the steps that decode all S sequences at
// once (one token each, none a first token, so no prefill in them), sampling
// included; tokens/s = S x those steps / their time. With S = 1 that is the
// (output - 1) steps after the first token. An untimed 4-token warm-up of S
// requests on other prompts runs first (first touch of the cache and the
// buffers).
//
// Read bandwidth: the sum of a 1 GiB buffer (far bigger than any last-level
// cache), read by the same OpenMP threads as the model, each its static share
// (first touched by that thread: local memory on a NUMA machine); the best of
// 5 passes before the model is loaded and 5 after the decode (a shared
// machine's bandwidth drifts between runs by a third: the best of both is
// the bound, so the ratio is never flattered by a slow moment). GB = 1e9
// bytes.
//
// Bytes per decode token: a step reads every weight byte the forward reads
// in the compute dtype once for its S tokens — the token embedding as one row
// per token for the lookup (tied: plus the whole table once as the LM head),
// GPT-2's wpe as one row per token — plus each sequence's K/V bytes of the
// mean context, input_len + output_len / 2 tokens (decode step k attends over
// input_len + k positions, k = 1 .. output_len - 1); per token, that over S.
// Activations, logits and the block tables are left out (small next to the
// weights at these batches).
// Bound tokens/s = bandwidth / bytes per token. It ignores the S-fold FLOPs
// of a step, so as S grows compute, not bandwidth, bounds it and the ratio
// falls.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <unordered_set>
#include <vector>

#include "bench/serve_common.h"
#include "core/bandwidth.h"
#include "core/error.h"
#include "infer/engine.h"
#include "model/family.h"
#include "model/params.h"

namespace loom::bench::serve {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kBandwidthBytes = int64_t{1} << 30;
constexpr int kBandwidthPasses = 5;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Bytes per decode token: weights (a step's over S) + one sequence's K/V.
struct DecodeBytes {
  int64_t weights = 0, kv = 0;
  double mean_context = 0;
  int64_t total() const { return weights + kv; }
};

// Quantized linears (quant, may be null) count their blocks' bytes.
DecodeBytes decode_bytes(const model::ModelConfig& cfg, DType compute, const model::QuantWeights* quant, DType kv,
                         int64_t input_len, int64_t output_len, int64_t S) {
  DecodeBytes b;
  b.weights = model::decode_weight_bytes(cfg, compute, quant, S) / S;
  b.mean_context = static_cast<double>(input_len) + static_cast<double>(output_len) / 2;
  b.kv = static_cast<int64_t>(b.mean_context * static_cast<double>(model::kv_block_bytes(cfg, 1, kv)));
  return b;
}

struct DecodeTiming {
  int64_t sequences = 1;
  int64_t steps = 0;  // steps that decoded all sequences at once
  double seconds = 0;  // their time
  double tokens_per_s() const { return static_cast<double>(sequences * steps) / seconds; }
};

DecodeTiming time_engine(const ServeBenchOptions& o, const model::ModelConfig& cfg,
                         const model::ServingWeights& weights, Pools& pools,
                         const std::vector<std::vector<int32_t>>& prompts,
                         const std::vector<std::vector<int32_t>>& warm) {
  const auto S = static_cast<int64_t>(prompts.size());
  // max_num_seqs = S (resolve_options)
  infer::Engine engine(cfg, weights.params, pools, engine_config(o), weights.quant_or_null());
  infer::GenerationParams p{.sampler = {.temperature = 0.f}, .stop = {.max_tokens = 4, .ignore_eos = true}};
  engine.generate(warm, p);
  p.stop.max_tokens = o.output_len;
  for (const std::vector<int32_t>& prompt : prompts) engine.add_request(prompt, p);
  DecodeTiming t{.sequences = S};
  std::unordered_set<infer::RequestId> started;  // requests that have their first token
  while (engine.has_unfinished()) {
    const Clock::time_point t0 = Clock::now();
    const std::vector<infer::TokenEvent> events = engine.step();
    const double seconds = seconds_since(t0);
    int64_t first_tokens = 0;
    for (const infer::TokenEvent& e : events) first_tokens += started.insert(e.request).second ? 1 : 0;
    if (static_cast<int64_t>(events.size()) == S && first_tokens == 0) {
      ++t.steps;
      t.seconds += seconds;
    }
  }
  LOOM_REQUIRE(t.steps > 0, "bench serve: no step decoded all ", S, " requests at once (their prompts were "
               "prefilled in chunks over more steps than --output-len ", o.output_len, " gives): raise "
               "--max-num-batched-tokens to --num-requests x --input-len = ", S * o.input_len);
  return t;
}

void print_result(const ServeBenchOptions& o, const model::ModelConfig& cfg, const DecodeTiming& t,
                  double bandwidth, const DecodeBytes& b) {
  const double bound = bandwidth / static_cast<double>(b.total()), ratio = t.tokens_per_s() / bound;
  if (o.json) {
    std::printf("{%s,\"decode_tokens_per_s\":%s,\"decode_steps\":%lld,\"decode_seconds\":%s,"
                "\"bandwidth_gb_per_s\":%s,\"bytes_per_token\":%lld,\"weight_bytes_per_token\":%lld,"
                "\"kv_bytes_per_token\":%lld,\"mean_context_tokens\":%s,\"bound_tokens_per_s\":%s,"
                "\"bound_ratio\":%s}\n",
                run_json(o).c_str(), json_number(t.tokens_per_s()).c_str(), static_cast<long long>(t.steps),
                json_number(t.seconds).c_str(), json_number(bandwidth / 1e9).c_str(),
                static_cast<long long>(b.total()), static_cast<long long>(b.weights), static_cast<long long>(b.kv),
                json_number(b.mean_context).c_str(), json_number(bound).c_str(), json_number(ratio).c_str());
    return;
  }
  print_table_header(o, cfg);
  std::printf("%lld requests decoding together through the engine: %lld prompt tokens, %lld new each (greedy, "
              "EOS ignored)\n\n",
              static_cast<long long>(t.sequences), static_cast<long long>(o.input_len),
              static_cast<long long>(o.output_len));
  std::printf("decode tokens/s   %10.2f  (%lld steps of %lld tokens in %.3f s, no first token in them)\n",
              t.tokens_per_s(), static_cast<long long>(t.steps), static_cast<long long>(t.sequences), t.seconds);
  std::printf("read bandwidth    %10.2f  GB/s (sum over 1 GiB, %d threads, best of %d passes before and after)\n",
              bandwidth / 1e9, o.threads, kBandwidthPasses);
  std::printf("bytes per token   %10.2f  MB = weights %.2f MB (%s, a step's over %lld) + K/V %.2f MB (mean context "
              "%.1f tokens, %s)\n",
              b.total() / 1e6, b.weights / 1e6, o.engine.dtype.c_str(), static_cast<long long>(t.sequences), b.kv / 1e6,
              b.mean_context, o.engine.kv_dtype.c_str());
  std::printf("bound tokens/s    %10.2f  = bandwidth / bytes per token\nof the bound      %9.1f%%\n", bound,
              100 * ratio);
}

}  // namespace

int run_decode_bound(const ServeBenchOptions& o) {
  const model::ModelConfig cfg = model_config(o);
  // Before the model (its buffer is freed again) and after the decode.
  const double before = measure_read_bandwidth(kBandwidthBytes, kBandwidthPasses);
  std::mt19937_64 rng(o.seed);
  std::vector<std::vector<int32_t>> prompts, warm;
  for (int64_t i = 0; i < o.num_requests; ++i) prompts.push_back(random_tokens(rng, o.input_len, cfg.vocab_size));
  for (int64_t i = 0; i < o.num_requests; ++i) warm.push_back(random_tokens(rng, o.input_len, cfg.vocab_size));
  DecodeTiming t;
  DecodeBytes bytes;
  {
    Pools pools;
    const model::ServingWeights weights = load_weights(o, cfg, pools);
    t = time_engine(o, cfg, weights, pools, prompts, warm);
    bytes = decode_bytes(cfg, compute_dtype(o), weights.quant_or_null(), kv_dtype(o), o.input_len, o.output_len,
                         t.sequences);
  }
  const double bandwidth = std::max(before, measure_read_bandwidth(kBandwidthBytes, kBandwidthPasses));
  print_result(o, cfg, t, bandwidth, bytes);
  return 0;
}

}  // namespace loom::bench::serve
