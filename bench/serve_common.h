// What the modes of `loom bench serve` share: the resolved options, the
// model (config and weights), the engine's config, latency summaries and the
// JSON / table pieces every mode prints. serve_bench.cpp defines them; each
// mode lives in its own file (serve_throughput.cpp, serve_decode.cpp,
// serve_capacity.cpp).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "bench/serve_bench.h"
#include "core/memory.h"
#include "infer/engine.h"
#include "model/config.h"
#include "model/quant_weights.h"

namespace loom::bench::serve {

// Mean prompt and output tokens of ShareGPT conversations (the PagedAttention
// paper, Kwon et al. SOSP 2023, Fig. 11: 161.31 and 337.99): the capacity
// mode's default length mix (serve_capacity.cpp).
inline constexpr int64_t kShareGptInputMean = 161, kShareGptOutputMean = 338;

// The options with every 0 ("the mode's default") replaced and checked;
// loom::Error naming the option and what is allowed.
ServeBenchOptions resolve_options(const ServeBenchOptions& o);

// The preset's config, or the model directory's (its weights are not read).
model::ModelConfig model_config(const ServeBenchOptions& o);
// The preset name or the directory, as the output names the model.
std::string model_name(const ServeBenchOptions& o);
DType compute_dtype(const ServeBenchOptions& o);
DType kv_dtype(const ServeBenchOptions& o);
// (P) packed per param_specs(cfg) in compute_dtype(o): random (init_params
// with o.seed) for a preset, else read from the model directory or GGUF file
// (its quantized linears in their blocks unless o.engine.dequantize).
model::ServingWeights load_weights(const ServeBenchOptions& o, const model::ModelConfig& cfg, Pools& pools);
// o.engine with the KV cache's dtype and bytes (--kv-cache-mb) filled in.
infer::EngineConfig engine_config(const ServeBenchOptions& o);

// Uniform token ids in [0, vocab).
std::vector<int32_t> random_tokens(std::mt19937_64& rng, int64_t n, int64_t vocab);

// mean, p50, p90, p99 (linear interpolation between order statistics, as
// numpy.percentile and vLLM's benchmark); all 0 for no values.
struct Summary {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0;
};
Summary summarize(std::vector<double> values);

// A JSON number; null when not finite (JSON has no inf or NaN).
std::string json_number(double v);
// ,"<name>_mean":..,"<name>_p50":..,"<name>_p90":..,"<name>_p99":..
std::string summary_json(const std::string& name, const Summary& s);
// "mode":..,"model":..,"dtype":..,... : the parameters that identify a run
// (no braces), with the command line last.
std::string run_json(const ServeBenchOptions& o);
// The table's first lines: what ran, and "reproduce: <command>".
void print_table_header(const ServeBenchOptions& o, const model::ModelConfig& cfg);

int run_throughput(const ServeBenchOptions& o);
int run_decode_bound(const ServeBenchOptions& o);
int run_capacity(const ServeBenchOptions& o);

}  // namespace loom::bench::serve
