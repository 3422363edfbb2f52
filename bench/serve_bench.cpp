// `loom bench serve`: options, the model, and what every mode prints
// (serve_common.h); the modes are in serve_throughput.cpp,
// serve_decode.cpp and serve_capacity.cpp.
#include "bench/serve_bench.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "bench/serve_common.h"
#include "core/error.h"
#include "core/trace.h"
#include "kernels/ops.h"
#include "model/config_json.h"
#include "model/params.h"

namespace loom::bench {
namespace serve {
namespace {

void require_one_of(const std::string& value, std::initializer_list<const char*> allowed, const char* option) {
  std::string list;
  for (const char* a : allowed) {
    if (value == a) return;
    list += concat(list.empty() ? "" : ", ", a);
  }
  fail("bench serve: ", option, " '", value, "' is invalid: allowed are ", list);
}

// An option the mode does not use must not be given, so a run never
// silently measures something else than what its command line says.
void require_unused(bool given, const ServeBenchOptions& o, const char* option) {
  LOOM_REQUIRE(!given, "bench serve: ", option, " does not apply to --mode ", o.mode,
               ": leave it out (throughput takes the workload options; decode-bound --num-requests requests of "
               "--input-len + --output-len decoding together; capacity --num-requests, --input-len and --output-len "
               "as mean lengths)");
}

void check_mode_options(const ServeBenchOptions& o) {
  const bool decode = o.mode == "decode-bound", capacity = o.mode == "capacity";
  if (decode || capacity) {
    require_unused(o.range_ratio != 0, o, "--range-ratio");
    require_unused(std::isfinite(o.request_rate), o, "--request-rate");
    require_unused(o.concurrency != 0, o, "--concurrency");
  }
  if (decode) LOOM_REQUIRE(o.num_requests <= o.engine.max_num_batched_tokens, "bench serve: --num-requests ",
                           o.num_requests, " is invalid in decode-bound mode: allowed values are <= "
                           "--max-num-batched-tokens = ", o.engine.max_num_batched_tokens,
                           " (a decode step computes one token of each)");
  if (decode) LOOM_REQUIRE(o.output_len >= 2, "bench serve: --output-len ", o.output_len,
                           " is invalid in decode-bound mode: allowed values are >= 2 (the first token is the "
                           "prefill's; decode steps follow)");
}

void check_model(const ServeBenchOptions& o) {
  if (!o.model_dir.empty()) return;  // load_model_dir says what is wrong with a directory
  const std::vector<std::string> presets = model::model_preset_names();
  if (std::find(presets.begin(), presets.end(), o.preset) != presets.end()) return;
  std::string valid;
  for (const std::string& p : presets) valid += (valid.empty() ? "" : ", ") + p;
  fail("bench serve: --preset '", o.preset, "' is unknown: valid presets are ", valid,
       " (or give a model directory with --model)");
}

void check_options(const ServeBenchOptions& o) {
  check_model(o);
  require_one_of(o.mode, {"throughput", "decode-bound", "capacity"}, "--mode");
  auto at_least = [](int64_t v, int64_t min, const char* option) {
    LOOM_REQUIRE(v >= min, "bench serve: ", option, " ", v, " is invalid: allowed values are >= ", min);
  };
  at_least(o.num_requests, 1, "--num-requests");
  at_least(o.input_len, 1, "--input-len");
  at_least(o.output_len, 1, "--output-len");
  at_least(o.concurrency, 0, "--concurrency");
  LOOM_REQUIRE(o.range_ratio >= 0 && o.range_ratio < 1, "bench serve: --range-ratio ", o.range_ratio,
               " is invalid: allowed 0 <= r < 1");
  LOOM_REQUIRE(o.request_rate > 0, "bench serve: --request-rate ", o.request_rate,
               " is invalid: allowed values are > 0 (requests/s; inf: all at once)");
  try {
    o.engine.validate();
  } catch (const Error& e) {
    fail("bench serve: ", e.what());
  }
  check_mode_options(o);
}

// The prompt and output lengths of the mode's workload fit max_model_len.
void check_lengths(const ServeBenchOptions& o, const model::ModelConfig& cfg) {
  const int64_t M = o.engine.max_model_len;
  LOOM_REQUIRE(M >= 2 && M <= cfg.max_seq_len, "bench serve: --max-model-len ", M,
               " is invalid: allowed 2 to model.max_seq_len = ", cfg.max_seq_len, " (0: max_seq_len)");
  if (o.mode == "capacity") return;  // lengths are clipped to max_model_len (serve_capacity.cpp)
  const auto hi = [&](int64_t L) { return static_cast<int64_t>(std::floor(L * (1 + o.range_ratio))); };
  LOOM_REQUIRE(hi(o.input_len) + hi(o.output_len) <= M, "bench serve: --input-len ", o.input_len,
               " and --output-len ", o.output_len, " (--range-ratio ", o.range_ratio, ") reach ", hi(o.input_len),
               " + ", hi(o.output_len), " tokens, over max_model_len = ", M,
               ": shorten them, or raise --max-model-len (at most model.max_seq_len = ", cfg.max_seq_len, ")");
}

}  // namespace

ServeBenchOptions resolve_options(const ServeBenchOptions& in) {
  ServeBenchOptions o = in;
  const bool capacity = o.mode == "capacity";
  if (o.num_requests == 0) o.num_requests = o.mode == "decode-bound" ? 1 : capacity ? 1000 : 64;
  if (o.input_len == 0) o.input_len = capacity ? kShareGptInputMean : 128;
  if (o.output_len == 0) o.output_len = capacity ? kShareGptOutputMean : 128;
  check_options(o);
  const model::ModelConfig cfg = model_config(o);
  if (o.engine.max_model_len == 0) o.engine.max_model_len = cfg.max_seq_len;
  if (o.mode == "decode-bound") o.engine.max_num_seqs = o.num_requests;  // all of them decode together
  check_lengths(o, cfg);
  return o;
}

model::ModelConfig model_config(const ServeBenchOptions& o) {
  if (o.model_dir.empty()) return model::model_preset(o.preset);
  return model::load_model_dir(o.model_dir).config;
}

std::string model_name(const ServeBenchOptions& o) { return o.model_dir.empty() ? o.preset : o.model_dir; }
DType compute_dtype(const ServeBenchOptions& o) { return o.engine.compute_dtype(); }
DType kv_dtype(const ServeBenchOptions& o) { return o.engine.cache_dtype(); }

model::ServingWeights load_weights(const ServeBenchOptions& o, const model::ModelConfig& cfg, Pools& pools) {
  if (!o.model_dir.empty())
    return model::load_serving_weights(model::load_model_dir(o.model_dir), compute_dtype(o), o.engine.dequantize,
                                       "--dtype", pools[MemTag::params]);
  const std::vector<model::ParamSpec> specs = model::param_specs(cfg);
  OwnedTensor f32 = pools[MemTag::params].empty(DType::f32, {model::param_count(specs)});
  model::init_params(f32, specs, o.seed);
  model::ServingWeights w;
  w.params = model::params_in_dtype(std::move(f32), compute_dtype(o), pools[MemTag::params]);
  return w;
}

infer::EngineConfig engine_config(const ServeBenchOptions& o) { return o.engine.config(model_config(o)); }

std::vector<int32_t> random_tokens(std::mt19937_64& rng, int64_t n, int64_t vocab) {
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = token(rng);
  return t;
}

Summary summarize(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  auto at = [&](double p) {
    const double pos = p / 100 * static_cast<double>(v.size() - 1);
    const size_t lo = static_cast<size_t>(pos);
    const size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
  };
  return {sum / static_cast<double>(v.size()), at(50), at(90), at(99)};
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string summary_json(const std::string& name, const Summary& s) {
  return concat(",\"", name, "_mean\":", json_number(s.mean), ",\"", name, "_p50\":", json_number(s.p50), ",\"",
                name, "_p90\":", json_number(s.p90), ",\"", name, "_p99\":", json_number(s.p99));
}

std::string run_json(const ServeBenchOptions& o) {
  const infer::EngineArgs& e = o.engine;
  std::string s = concat("\"mode\":\"", o.mode, "\",\"model\":\"", json_escape(model_name(o)), "\",\"dtype\":\"",
                         o.engine.dtype, "\",\"kv_dtype\":\"", o.engine.kv_dtype, "\",\"block_size\":", e.block_size,
                         ",\"max_num_seqs\":", e.max_num_seqs, ",\"max_num_batched_tokens\":",
                         e.max_num_batched_tokens, ",\"max_model_len\":", e.max_model_len, ",\"batch_invariant\":",
                         e.batch_invariant ? "true" : "false", ",\"threads\":", o.threads,
                         ",\"seed\":", o.seed, ",\"num_requests\":", o.num_requests, ",\"input_len\":", o.input_len,
                         ",\"output_len\":", o.output_len);
  if (o.mode == "throughput")
    s += concat(",\"range_ratio\":", json_number(o.range_ratio), ",\"request_rate\":",
                std::isfinite(o.request_rate) ? json_number(o.request_rate) : "\"inf\"", ",\"concurrency\":",
                o.concurrency > 0 ? std::to_string(o.concurrency) : "null", ",\"ignore_eos\":",
                o.ignore_eos ? "true" : "false", ",\"lora_adapters\":", o.lora_adapters, ",\"lora_rank\":",
                o.lora_rank);
  return s + concat(",\"command\":\"", json_escape(o.command), "\"");
}

void print_table_header(const ServeBenchOptions& o, const model::ModelConfig& cfg) {
  std::printf("loom bench serve --mode %s: %s (%s, %lld layers, C=%lld, V=%lld), %s weights, %s KV cache in "
              "blocks of %lld, %s linears, %d threads\nreproduce: %s\n",
              o.mode.c_str(), model_name(o).c_str(), std::string(model::family_name(cfg.family)).c_str(),
              static_cast<long long>(cfg.n_layer), static_cast<long long>(cfg.n_embd),
              static_cast<long long>(cfg.vocab_size), o.engine.dtype.c_str(), o.engine.kv_dtype.c_str(),
              static_cast<long long>(o.engine.block_size), o.engine.batch_invariant ? "batch-invariant" : "oneDNN",
              o.threads, o.command.c_str());
}

}  // namespace serve

int run_serve_bench(const ServeBenchOptions& opts) {
  const ServeBenchOptions o = serve::resolve_options(opts);
  if (o.mode == "decode-bound") return serve::run_decode_bound(o);
  if (o.mode == "capacity") return serve::run_capacity(o);
  return serve::run_throughput(o);
}

}  // namespace loom::bench
