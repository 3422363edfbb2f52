// `loom bench serve --mode throughput`: vLLM's benchmarks/benchmark_serving.py
// on its "random" dataset, offline (no HTTP): the engine loop runs in this
// thread and the requests are added to it directly.
//
// Workload (seeded, --seed): request i has a prompt of uniform random token
// ids whose length is uniform in [floor(L_in (1 - r)), floor(L_in (1 + r))],
// at least 1, and asks for a length uniform in the same range around
// L_out (r: --range-ratio). Arrivals: all at t = 0, or a Poisson process
// at --request-rate (exponential gaps, request 0 at t = 0; from their own
// stream, so the lengths do not change the arrival times). Requests are
// greedy; with --ignore-eos (the default, as vLLM's benchmark) each gets
// exactly the tokens it asked for.
//
// The loop adds each request once the wall clock has passed its arrival
// time (and, with --concurrency C, once fewer than C are in flight), steps
// the engine while it has work, and sleeps until the next arrival when idle.
// One untimed warm-up request runs first (first touch, oneDNN primitives).
//
// Metrics as vLLM defines them. A request starts at its arrival, or with
// --concurrency at the later of its arrival and the moment a slot freed; a
// token is out when the step that sampled it returns. TTFT = first token -
// start; e2e = last token - start; TPOT = (e2e - TTFT) / (output tokens - 1),
// over requests of 2 tokens or more; ITL = every gap between consecutive
// tokens of a request. Duration: t = 0 to the last token; throughputs are
// per second of it. The KV blocks in use and the running requests are read
// between steps (their peak during a step: blocks, the larger of before and
// after it; running, those after it plus those it finished).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bench/serve_common.h"
#include "core/error.h"
#include "infer/engine.h"
#include "model/lora.h"

namespace loom::bench::serve {
namespace {

using Clock = std::chrono::steady_clock;

struct Workload {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int64_t> output_lens;
  std::vector<double> arrivals;  // seconds from t = 0, non-decreasing
};

Workload random_workload(const ServeBenchOptions& o, int64_t vocab) {
  std::mt19937_64 rng(o.seed);
  auto length = [&](int64_t L) {
    const auto lo = std::max<int64_t>(1, static_cast<int64_t>(std::floor(L * (1 - o.range_ratio))));
    const auto hi = std::max<int64_t>(lo, static_cast<int64_t>(std::floor(L * (1 + o.range_ratio))));
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  const auto N = static_cast<size_t>(o.num_requests);
  Workload w;
  std::vector<int64_t> input_lens(N);
  for (int64_t& n : input_lens) n = length(o.input_len);
  for (size_t i = 0; i < N; ++i) w.output_lens.push_back(length(o.output_len));
  for (size_t i = 0; i < N; ++i) w.prompts.push_back(random_tokens(rng, input_lens[i], vocab));
  std::mt19937_64 arrival_rng(o.seed ^ 0xA5A5A5A5A5A5A5A5ull);
  double t = 0;
  for (size_t i = 0; i < N; ++i) {
    w.arrivals.push_back(t);
    if (std::isfinite(o.request_rate)) t += std::exponential_distribution<double>(o.request_rate)(arrival_rng);
  }
  return w;
}

struct Trace {
  double start = 0;            // seconds from t = 0
  std::vector<double> tokens;  // when each output token was out
};

struct LoopResult {
  std::vector<Trace> traces;
  double duration = 0;
  int64_t peak_blocks = 0, peak_running = 0, steps = 0;
};

// The engine loop's state while the workload runs.
struct Loop {
  Loop(infer::Engine& e, const Workload& wl, const infer::GenerationParams& p, int64_t c)
      : engine(e), w(wl), params(p), concurrency(c), free_slots(static_cast<size_t>(c), 0.0) {
    r.traces.resize(w.prompts.size());
  }

  infer::Engine& engine;
  const Workload& w;
  infer::GenerationParams params;  // stop.max_tokens set per request
  int64_t concurrency = 0;
  Clock::time_point t0 = Clock::now();
  // --concurrency: when each free slot freed, in order; those before free_head are taken.
  std::vector<double> free_slots;
  size_t free_head = 0;
  std::unordered_map<infer::RequestId, size_t> which;
  size_t next = 0, done = 0;
  LoopResult r;

  double now() const { return std::chrono::duration<double>(Clock::now() - t0).count(); }

  void admit() {
    const double t = now();
    while (next < w.prompts.size() && w.arrivals[next] <= t && (concurrency == 0 || free_head < free_slots.size())) {
      double start = w.arrivals[next];
      if (concurrency > 0) {
        start = std::max(start, free_slots[free_head++]);
      }
      r.traces[next].start = start;
      infer::GenerationParams p = params;
      p.stop.max_tokens = w.output_lens[next];
      if (engine.num_adapters() > 0) p.adapter = static_cast<int32_t>(next % engine.num_adapters()) + 1;
      which[engine.add_request(w.prompts[next], p)] = next;
      ++next;
    }
  }

  void step() {
    const int64_t used_before = engine.kv().pool().num_used();
    const std::vector<infer::TokenEvent> events = engine.step();
    const double t = now();
    int64_t finished = 0;
    for (const infer::TokenEvent& e : events) {
      r.traces[which.at(e.request)].tokens.push_back(t);
      if (e.finish == infer::FinishReason::none) continue;
      ++finished, ++done;
      if (concurrency > 0) free_slots.push_back(t);
    }
    r.peak_blocks = std::max({r.peak_blocks, used_before, engine.kv().pool().num_used()});
    r.peak_running = std::max(r.peak_running, engine.scheduler().stats().num_running + finished);
    ++r.steps;
  }
};

LoopResult run_workload(infer::Engine& engine, const Workload& w, const infer::GenerationParams& params,
                        int64_t concurrency) {
  Loop loop(engine, w, params, concurrency);
  loop.t0 = Clock::now();
  while (loop.done < w.prompts.size()) {
    loop.admit();
    if (engine.has_unfinished()) {
      loop.step();
    } else {  // idle: nothing in flight, so the next request waits for its arrival only
      const std::chrono::duration<double> at(w.arrivals[loop.next]);
      std::this_thread::sleep_until(loop.t0 + std::chrono::duration_cast<Clock::duration>(at));
    }
  }
  loop.r.duration = loop.now();
  return loop.r;
}

struct Metrics {
  int64_t completed = 0, input_tokens = 0, output_tokens = 0, asked_output_tokens = 0;
  double duration = 0;
  Summary ttft, tpot, itl, e2e;  // ms
};

Metrics compute_metrics(const Workload& w, const LoopResult& r) {
  Metrics m;
  m.duration = r.duration;
  std::vector<double> ttft, tpot, itl, e2e;
  for (size_t i = 0; i < r.traces.size(); ++i) {
    const Trace& t = r.traces[i];
    m.input_tokens += static_cast<int64_t>(w.prompts[i].size());
    m.asked_output_tokens += w.output_lens[i];
    if (t.tokens.empty()) continue;
    ++m.completed;
    const auto n = static_cast<int64_t>(t.tokens.size());
    m.output_tokens += n;
    ttft.push_back(1e3 * (t.tokens.front() - t.start));
    e2e.push_back(1e3 * (t.tokens.back() - t.start));
    if (n > 1) tpot.push_back((e2e.back() - ttft.back()) / static_cast<double>(n - 1));
    for (size_t k = 1; k < t.tokens.size(); ++k) itl.push_back(1e3 * (t.tokens[k] - t.tokens[k - 1]));
  }
  m.ttft = summarize(ttft), m.tpot = summarize(tpot), m.itl = summarize(itl), m.e2e = summarize(e2e);
  return m;
}

// The engine's counters over the timed run: differences from the warm-up's.
struct EngineFigures {
  int64_t kv_blocks = 0, kv_bytes = 0, preemptions = 0, prefix_queried = 0, prefix_hits = 0;
  double prefix_hit_rate() const { return prefix_queried > 0 ? double(prefix_hits) / double(prefix_queried) : 0; }
};

EngineFigures engine_counters(const infer::Engine& e) {
  const infer::KvCacheStats kv = e.kv().stats();
  return {kv.num_blocks, e.runner().kv_cache_bytes(), e.scheduler().stats().num_preemptions,
          kv.prefix_queried_tokens, kv.prefix_hit_tokens};
}

void print_json(const ServeBenchOptions& o, const Metrics& m, const LoopResult& r, const EngineFigures& f) {
  const double d = m.duration;
  std::printf("{%s,\"duration_s\":%s,\"completed\":%lld,\"total_input_tokens\":%lld,\"total_output_tokens\":%lld,"
              "\"asked_output_tokens\":%lld,\"request_throughput_req_per_s\":%s,\"output_tokens_per_s\":%s,"
              "\"total_tokens_per_s\":%s%s%s%s%s,\"kv_cache_bytes\":%lld,\"kv_blocks_total\":%lld,"
              "\"peak_kv_blocks_used\":%lld,\"peak_running\":%lld,\"preemptions\":%lld,"
              "\"prefix_cache_hit_rate\":%s,\"steps\":%lld}\n",
              run_json(o).c_str(), json_number(d).c_str(), static_cast<long long>(m.completed),
              static_cast<long long>(m.input_tokens), static_cast<long long>(m.output_tokens),
              static_cast<long long>(m.asked_output_tokens), json_number(m.completed / d).c_str(),
              json_number(m.output_tokens / d).c_str(), json_number((m.input_tokens + m.output_tokens) / d).c_str(),
              summary_json("ttft_ms", m.ttft).c_str(), summary_json("tpot_ms", m.tpot).c_str(),
              summary_json("itl_ms", m.itl).c_str(), summary_json("e2e_ms", m.e2e).c_str(),
              static_cast<long long>(f.kv_bytes), static_cast<long long>(f.kv_blocks),
              static_cast<long long>(r.peak_blocks), static_cast<long long>(r.peak_running),
              static_cast<long long>(f.preemptions), json_number(f.prefix_hit_rate()).c_str(),
              static_cast<long long>(r.steps));
}

void print_table(const ServeBenchOptions& o, const Metrics& m, const LoopResult& r, const EngineFigures& f) {
  const double d = m.duration;
  std::printf("workload: %lld requests, input %lld and output %lld tokens (range ratio %g), request rate %s/s, "
              "concurrency %s; max_num_seqs %lld, max_num_batched_tokens %lld, max_model_len %lld\n\n",
              static_cast<long long>(o.num_requests), static_cast<long long>(o.input_len),
              static_cast<long long>(o.output_len), o.range_ratio,
              std::isfinite(o.request_rate) ? json_number(o.request_rate).c_str() : "inf",
              o.concurrency > 0 ? std::to_string(o.concurrency).c_str() : "unlimited",
              static_cast<long long>(o.engine.max_num_seqs), static_cast<long long>(o.engine.max_num_batched_tokens),
              static_cast<long long>(o.engine.max_model_len));
  if (o.lora_adapters > 0)
    std::printf("LoRA: %lld adapters of rank %lld on every linear, served unmerged, requests over them in turn\n\n",
                static_cast<long long>(o.lora_adapters), static_cast<long long>(o.lora_rank));
  std::printf("completed requests  %10lld  in %.3f s (%lld engine steps)\n", static_cast<long long>(m.completed), d,
              static_cast<long long>(r.steps));
  std::printf("tokens              %10lld  input, %lld output (%lld asked)\n", static_cast<long long>(m.input_tokens),
              static_cast<long long>(m.output_tokens), static_cast<long long>(m.asked_output_tokens));
  std::printf("request throughput  %10.2f  req/s\n", m.completed / d);
  std::printf("output tokens/s     %10.1f\ntotal tokens/s      %10.1f\n\n", m.output_tokens / d,
              (m.input_tokens + m.output_tokens) / d);
  std::printf("%-8s %10s %10s %10s %10s\n", "ms", "mean", "p50", "p90", "p99");
  const std::pair<const char*, const Summary*> rows[] = {{"TTFT", &m.ttft}, {"TPOT", &m.tpot}, {"ITL", &m.itl},
                                                         {"E2E", &m.e2e}};
  for (const auto& [name, s] : rows)
    std::printf("%-8s %10.2f %10.2f %10.2f %10.2f\n", name, s->mean, s->p50, s->p90, s->p99);
  std::printf("\nKV blocks peak      %10lld  of %lld (%.1f%%; %.1f MiB cache)\n", static_cast<long long>(r.peak_blocks),
              static_cast<long long>(f.kv_blocks), 100.0 * r.peak_blocks / f.kv_blocks, f.kv_bytes / 1048576.0);
  std::printf("running peak        %10lld  requests\npreemptions         %10lld\nprefix cache hits   %9.1f%%\n",
              static_cast<long long>(r.peak_running), static_cast<long long>(f.preemptions),
              100 * f.prefix_hit_rate());
}

// o.lora_adapters adapters of rank o.lora_rank on every linear (alpha 2r):
// A within LoRA's init bound, B small (a trained adapter's values matter
// little to the time; only their shapes do).
void add_random_adapters(infer::Engine& engine, const model::ModelConfig& cfg, const ServeBenchOptions& o) {
  model::LoraConfig lora;
  lora.rank = o.lora_rank, lora.alpha = 2.0 * static_cast<double>(o.lora_rank);
  std::mt19937_64 rng(o.seed + 2);
  std::vector<float> w(static_cast<size_t>(o.lora_adapters > 0 ? model::lora_param_count(cfg, lora) : 0));
  for (int64_t k = 0; k < o.lora_adapters; ++k) {
    std::uniform_real_distribution<float> u(-0.02f, 0.02f);
    for (float& v : w) v = u(rng);
    engine.add_adapter(lora, Tensor(w.data(), DType::f32, {static_cast<int64_t>(w.size())}));
  }
}

}  // namespace

int run_throughput(const ServeBenchOptions& o) {
  const model::ModelConfig cfg = model_config(o);
  const Workload w = random_workload(o, cfg.vocab_size);
  Pools pools;
  const model::ServingWeights weights = load_weights(o, cfg, pools);
  infer::Engine engine(cfg, weights.params, pools, engine_config(o), weights.quant_or_null());
  add_random_adapters(engine, cfg, o);
  // EOS is the last vocabulary id (GPT-2's <|endoftext|>, 50256); it only
  // matters without --ignore-eos.
  infer::GenerationParams gen{.sampler = {.temperature = 0.f},
                              .stop = {.eos_token_ids = {static_cast<int32_t>(cfg.vocab_size - 1)},
                                       .ignore_eos = o.ignore_eos}};
  std::mt19937_64 warm_rng(o.seed + 1);
  infer::GenerationParams warm = gen;
  warm.stop.max_tokens = 4;
  engine.generate({random_tokens(warm_rng, o.input_len, cfg.vocab_size)}, warm);
  const EngineFigures before = engine_counters(engine);
  const LoopResult r = run_workload(engine, w, gen, o.concurrency);
  EngineFigures f = engine_counters(engine);
  f.preemptions -= before.preemptions;
  f.prefix_queried -= before.prefix_queried;
  f.prefix_hits -= before.prefix_hits;
  const Metrics m = compute_metrics(w, r);
  if (o.json) {
    print_json(o, m, r, f);
  } else {
    print_table_header(o, cfg);
    print_table(o, m, r, f);
  }
  return 0;
}

}  // namespace loom::bench::serve
