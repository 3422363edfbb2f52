// `loom bench serve`: the serving engine (infer::Engine) measured offline,
// without HTTP, in three modes.
//
//   throughput    vLLM's benchmark_serving on its "random" dataset: requests
//                 of random tokens arrive (all at t = 0, or Poisson at
//                 --request-rate), at most --concurrency in flight; reports
//                 request and token throughput, TTFT, TPOT, ITL and e2e
//                 latency (mean, p50, p90, p99) and the KV cache's peak use.
//   decode-bound  --num-requests requests (default one) decoding together,
//                 greedy: decode tokens/s next to the memory bandwidth bound
//                 measured on this machine (bytes one decode step reads per
//                 token / read bandwidth).
//   capacity      PagedAttention's waste argument, without a model: how many
//                 sequences of a realistic length mix a KV budget runs at once,
//                 paged (infer::Scheduler + KvCacheManager) vs contiguous
//                 (a max_model_len cache per sequence).
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "infer/engine.h"
#include "infer/engine_args.h"

namespace loom::bench {

struct ServeBenchOptions {
  std::string mode = "throughput";  // throughput | decode-bound | capacity
  // The model: a preset with random weights, or a model directory (loom or
  // Hugging Face format) when model_dir is set.
  std::string preset = "gpt2-124m";
  std::string model_dir;
  // The engine, as loom generate and loom serve take it (infer/engine_args.h);
  // max_model_len 0: the model's max_seq_len.
  infer::EngineArgs engine;
  uint64_t seed = 0;
  // The workload; 0 takes the mode's default (run_serve_bench's comment).
  int64_t num_requests = 0;
  int64_t input_len = 0;
  int64_t output_len = 0;
  double range_ratio = 0;  // throughput: lengths uniform in [L (1 - r), L (1 + r)]; in [0, 1)
  double request_rate = std::numeric_limits<double>::infinity();  // requests/s, Poisson; inf: all at t = 0
  int64_t concurrency = 0;  // requests in flight at most; 0: no limit
  bool ignore_eos = true;
  // throughput: LoRA adapters served unmerged (random, rank lora_rank on
  // every linear), the requests spread over them in turn; 0: the base alone.
  int64_t lora_adapters = 0;
  int64_t lora_rank = 16;
  bool json = false;  // one JSON Lines object instead of a table
  int threads = 1;    // recorded in the output
  std::string command;  // the command line that reproduces the run
};

// Runs the benchmark and prints its result to stdout; returns the exit code.
// Defaults for 0: throughput 64 requests of 128 + 128 tokens; decode-bound
// one request of 128 + 128 tokens; capacity 1000 requests with lognormal
// lengths of means 161 and 338 (ShareGPT's, serve_capacity.cpp).
// Invalid options are loom::Errors saying what is allowed.
int run_serve_bench(const ServeBenchOptions& opts);

}  // namespace loom::bench
