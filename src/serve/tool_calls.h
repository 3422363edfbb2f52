// Tool calls: the `tools` a chat request offers, checked, and the model's
// output read back into calls. A model writes a call in the form its chat
// template taught it, one of three families (as vLLM's tool parsers and
// llama.cpp's chat formats name them):
//
//   hermes   <tool_call>{"name": "f", "arguments": {...}}</tool_call> ...   (Hermes, Qwen 2.5/3, loom's plain template)
//   llama3   <|python_tag|>{"name": "f", "parameters": {...}}; {...}       (Llama 3.1-3.3; the tag is optional)
//   mistral  [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]          (Mistral v3; v11+: [TOOL_CALLS]f[ARGS]{...})
//   deepseek <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f
//            ```json {...} ```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>      (DeepSeek V3, R1; V3.1 drops
//            "function" and the fence: <｜tool▁call▁begin｜>f<｜tool▁sep｜>{...}<｜tool▁call▁end｜>, deepseek_v31)
//   command_r     Action:\n```json\n[{"tool_name": "f", "parameters": {...}}, ...]\n```            (Command R / R+)
//   command_r7b   <|START_ACTION|>[{"tool_call_id": "0", "tool_name": "f", "parameters": {...}}]<|END_ACTION|>
//   functionary_v32   f\n{...}>>>g\n{...}   or   all\ntext>>>f\n{...}   (functionary v3.2: the generation
//            prompt ends with ">>>"; every part starts with its recipient's line, "all" for the user, so
//            the "all\n" header is taken off the content even when no tools are offered)
//   harmony  <|channel|>commentary to=functions.f <|constrain|>json<|message|>{...}<|call|>   (gpt-oss:
//            every answer is messages on channels, read by harmony.h's HarmonyStream, not by ToolCallStream)
//
// The family is chosen from the template's source. Special tokens such as
// <|python_tag|> and [TOOL_CALLS] are control tokens that a tokenizer may
// decode to nothing, so each family also reads its calls without the marker
// when the output starts with the JSON ("{" or "[").
//
// While a response streams, ToolCallStream passes text on as content until
// it may be the start of a call (a marker, or a prefix of one, or JSON at
// the start), then holds the rest: at the end it is either calls or, when
// it does not parse as calls, content after all.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace loom::serve {

enum class ToolFormat { hermes, llama3, mistral, deepseek, deepseek_v31, command_r, command_r7b, functionary_v32,
                        harmony };
const char* tool_format_name(ToolFormat f);

// The family a chat template writes calls in (hermes when it names none).
ToolFormat tool_format_of(std::string_view template_source);
// Whether a template reads its `tools` variable at all (one that does not
// cannot offer tools to its model: requests with tools are refused).
bool template_renders_tools(std::string_view template_source);

struct ToolCall {
  std::string id;  // call_... (mistral: 9 letters and digits, what its templates require)
  std::string name;
  nlohmann::ordered_json arguments = nlohmann::ordered_json::object();
};

// tools as OpenAI and ollama send them: a list of {"type": "function",
// "function": {"name", "description"?, "parameters"? (an object schema)}}.
// Returns the function names in order; ApiError (400) naming the entry that
// is malformed or a name given twice.
std::vector<std::string> check_tools(const nlohmann::ordered_json& tools);

// The calls in a whole output, and the text that is not a call. An output
// that does not parse as calls of the family (or names a function not in
// names) has no calls: all of it is content.
struct ParsedToolOutput {
  std::string content;
  std::vector<ToolCall> calls;
};
ParsedToolOutput parse_tool_calls(ToolFormat f, std::string_view output, const std::vector<std::string>& names);

// A new call id (random; seeded per request so ids differ between calls).
std::string tool_call_id(ToolFormat f, uint64_t seed, int64_t index);

class ToolCallStream {
 public:
  ToolCallStream(ToolFormat f, std::vector<std::string> names, uint64_t seed);
  // Text of the output as it comes; returns the part that is content for
  // certain (may be empty: held back).
  std::string feed(std::string_view text);
  // The end of the output: what was held back, as calls or as content.
  ParsedToolOutput finish();

 private:
  ToolFormat format_;
  std::vector<std::string> names_;
  uint64_t seed_;
  std::string pending_;  // not yet emitted
  bool seen_text_ = false;  // something other than whitespace was emitted
  bool holding_ = false;    // a call has started: everything from here is held
  bool recipient_read_ = false;  // functionary: the output's first recipient line is behind
};

}  // namespace loom::serve
