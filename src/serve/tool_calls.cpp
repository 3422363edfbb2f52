#include "serve/tool_calls.h"

#include <algorithm>
#include <random>
#include <set>

#include "serve/harmony.h"
#include "serve/openai/openai_request.h"

namespace loom::serve {
namespace {

using ojson = nlohmann::ordered_json;

constexpr std::string_view kHermesOpen = "<tool_call>", kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>", kMistralCalls = "[TOOL_CALLS]", kMistralArgs = "[ARGS]";
constexpr std::string_view kDsCalls = "<｜tool▁calls▁begin｜>", kDsCallsEnd = "<｜tool▁calls▁end｜>",
                           kDsCall = "<｜tool▁call▁begin｜>", kDsCallEnd = "<｜tool▁call▁end｜>",
                           kDsSep = "<｜tool▁sep｜>";
constexpr std::string_view kCohereAction = "Action:", kCohereStart = "<|START_ACTION|>", kCohereEnd = "<|END_ACTION|>";
constexpr std::string_view kRecipient = ">>>", kToAll = "all";
constexpr size_t kMaxRecipient = 128;  // a first line longer than this is text, not a recipient

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

bool is_deepseek(ToolFormat f) { return f == ToolFormat::deepseek || f == ToolFormat::deepseek_v31; }

std::string_view marker_of(ToolFormat f) {
  switch (f) {
    case ToolFormat::hermes: return kHermesOpen;
    case ToolFormat::llama3: return kPythonTag;
    case ToolFormat::deepseek:
    case ToolFormat::deepseek_v31: return kDsCalls;
    case ToolFormat::command_r: return kCohereAction;
    case ToolFormat::command_r7b: return kCohereStart;
    case ToolFormat::functionary_v32: return kRecipient;
    case ToolFormat::harmony:  // read by HarmonyStream, which has its own markers
    case ToolFormat::mistral: break;
  }
  return kMistralCalls;
}

// The length of the JSON object or array at the start of s (brackets
// balanced, strings and their escapes skipped), or 0 when s does not start
// with one that ends.
size_t json_extent(std::string_view s) {
  if (s.empty() || (s[0] != '{' && s[0] != '[')) return 0;
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if ((c == '}' || c == ']') && --depth == 0) {
      return i + 1;
    }
  }
  return 0;
}

// The JSON value at the start of s, consumed from s; discarded when none.
ojson take_json(std::string_view& s) {
  s = trim(s);
  const size_t n = json_extent(s);
  if (n == 0) return ojson(ojson::value_t::discarded);
  ojson v = ojson::parse(s.substr(0, n), nullptr, false);
  s.remove_prefix(n);
  return v;
}

// {"name": ..., "arguments" | "parameters": {...} or a string holding it}
// as a call; false when it is not one of names'.
bool to_call(const ojson& v, const std::vector<std::string>& names, ToolCall& call) {
  if (!v.is_object() || !v.contains("name") || !v["name"].is_string()) return false;
  call.name = v["name"].get<std::string>();
  if (std::find(names.begin(), names.end(), call.name) == names.end()) return false;
  ojson args = v.contains("arguments") ? v["arguments"] : v.contains("parameters") ? v["parameters"] : ojson::object();
  if (args.is_string()) args = ojson::parse(args.get<std::string>(), nullptr, false);
  if (args.is_null()) args = ojson::object();
  if (!args.is_object()) return false;
  call.arguments = std::move(args);
  return true;
}

bool parse_hermes(std::string_view s, const std::vector<std::string>& names, ParsedToolOutput& out) {
  size_t at = s.find(kHermesOpen);
  if (at == std::string_view::npos) return false;
  out.content = std::string(s.substr(0, at));
  while (at != std::string_view::npos) {
    std::string_view rest = s.substr(at + kHermesOpen.size());
    ToolCall call;
    if (!to_call(take_json(rest), names, call)) return false;
    rest = trim(rest);
    if (rest.starts_with(kHermesClose)) rest.remove_prefix(kHermesClose.size());
    else if (!rest.empty()) return false;  // only an output cut at its end may lack the closing tag
    out.calls.push_back(std::move(call));
    const size_t next = rest.find(kHermesOpen);
    out.content += std::string(trim(rest.substr(0, next)));
    at = next == std::string_view::npos ? next : static_cast<size_t>(rest.data() - s.data()) + next;
  }
  return true;
}

bool parse_llama3(std::string_view s, const std::vector<std::string>& names, ParsedToolOutput& out) {
  const size_t tag = s.find(kPythonTag);
  if (tag != std::string_view::npos) {
    out.content = std::string(s.substr(0, tag));
    s.remove_prefix(tag + kPythonTag.size());
  } else if (!trim(s).starts_with('{')) {
    return false;
  }
  while (!trim(s).empty()) {
    ToolCall call;
    if (!to_call(take_json(s), names, call)) return false;
    out.calls.push_back(std::move(call));
    s = trim(s);
    if (s.starts_with(';')) s.remove_prefix(1);
    else if (!s.empty()) return false;
  }
  return !out.calls.empty();
}

bool parse_mistral(std::string_view s, const std::vector<std::string>& names, ParsedToolOutput& out) {
  const size_t tag = s.find(kMistralCalls);
  if (tag != std::string_view::npos) {
    out.content = std::string(s.substr(0, tag));
    s.remove_prefix(tag + kMistralCalls.size());
  } else if (!trim(s).starts_with('[')) {
    return false;
  }
  if (trim(s).starts_with('[')) {  // v3: a JSON list of calls
    const ojson list = take_json(s);
    if (!list.is_array() || list.empty() || !trim(s).empty()) return false;
    for (const ojson& v : list) {
      ToolCall call;
      if (!to_call(v, names, call)) return false;
      out.calls.push_back(std::move(call));
    }
    return true;
  }
  while (!trim(s).empty()) {  // v11: name[ARGS]{...}, each after [TOOL_CALLS]
    const size_t args = s.find(kMistralArgs);
    if (args == std::string_view::npos) return false;
    const ojson name(std::string(trim(s.substr(0, args))));
    s.remove_prefix(args + kMistralArgs.size());
    ToolCall call;
    if (!to_call(ojson{{"name", name}, {"arguments", take_json(s)}}, names, call)) return false;
    out.calls.push_back(std::move(call));
    s = trim(s);
    if (s.starts_with(kMistralCalls)) s.remove_prefix(kMistralCalls.size());
    else if (!s.empty()) return false;
  }
  return !out.calls.empty();
}

// One DeepSeek call after <｜tool▁call▁begin｜>: "function<｜tool▁sep｜>f\n```json\n{...}\n```" (V3, R1) or
// "f<｜tool▁sep｜>{...}" (V3.1), then <｜tool▁call▁end｜> (absent only where the output was cut).
bool take_deepseek_call(std::string_view& s, const std::vector<std::string>& names, ToolCall& call) {
  const size_t sep = s.find(kDsSep);
  if (sep == std::string_view::npos) return false;
  std::string_view head = trim(s.substr(0, sep)), rest = s.substr(sep + kDsSep.size());
  std::string name(head);
  bool fenced = false;
  if (head == "function") {  // V3 / R1: the name on the line after the separator, the arguments fenced
    const size_t eol = rest.find('\n');
    name = std::string(trim(rest.substr(0, eol)));
    rest = eol == std::string_view::npos ? std::string_view() : rest.substr(eol + 1);
    rest = trim(rest);
    if (!rest.starts_with("```json")) return false;
    rest.remove_prefix(7);
    fenced = true;
  }
  const ojson args = take_json(rest);
  rest = trim(rest);
  if (fenced) {
    if (!rest.starts_with("```")) return false;
    rest.remove_prefix(3);
    rest = trim(rest);
  }
  if (rest.starts_with(kDsCallEnd)) rest.remove_prefix(kDsCallEnd.size());
  else if (!rest.empty()) return false;
  s = rest;
  return to_call(ojson{{"name", name}, {"arguments", args}}, names, call);
}

bool parse_deepseek(std::string_view s, const std::vector<std::string>& names, ParsedToolOutput& out) {
  const size_t at = s.find(kDsCalls);
  if (at == std::string_view::npos) return false;
  out.content = std::string(s.substr(0, at));
  s.remove_prefix(at + kDsCalls.size());
  while (true) {
    s = trim(s);
    if (s.empty() || s.starts_with(kDsCallsEnd)) break;
    if (!s.starts_with(kDsCall)) return false;
    s.remove_prefix(kDsCall.size());
    ToolCall call;
    if (!take_deepseek_call(s, names, call)) return false;
    out.calls.push_back(std::move(call));
  }
  if (s.starts_with(kDsCallsEnd)) s.remove_prefix(kDsCallsEnd.size());
  return !out.calls.empty() && trim(s).empty();
}

// Command R's list of {"tool_name", "parameters"} after its marker: R+
// fences it as JSON after "Action:", R7B closes it with <|END_ACTION|>.
bool parse_command_r(ToolFormat f, std::string_view s, const std::vector<std::string>& names,
                     ParsedToolOutput& out) {
  const std::string_view marker = f == ToolFormat::command_r ? kCohereAction : kCohereStart;
  const size_t at = s.find(marker);
  if (at == std::string_view::npos) return false;
  out.content = std::string(trim(s.substr(0, at)));
  s = trim(s.substr(at + marker.size()));
  const bool fenced = s.starts_with("```json");
  if (fenced) s.remove_prefix(7);
  const ojson list = take_json(s);
  if (!list.is_array() || list.empty()) return false;
  for (const ojson& v : list) {
    if (!v.is_object()) return false;
    ToolCall call;
    const ojson named = {{"name", v.value("tool_name", ojson())}, {"arguments", v.value("parameters", ojson())}};
    if (!to_call(named, names, call)) return false;
    out.calls.push_back(std::move(call));
  }
  s = trim(s);
  if (fenced && s.starts_with("```")) s.remove_prefix(3);
  if (!fenced && s.starts_with(kCohereEnd)) s.remove_prefix(kCohereEnd.size());
  return trim(s).empty();
}

// functionary v3.2: parts "recipient\nbody" separated by ">>>" (the first
// one's written by the prompt); "all" parts are content, the others calls
// whose body is the arguments' JSON object (python's may be bare code).
bool parse_functionary(std::string_view s, const std::vector<std::string>& names, ParsedToolOutput& out) {
  if (s.starts_with(kRecipient)) s.remove_prefix(kRecipient.size());
  while (true) {
    const size_t next = s.find(kRecipient);
    std::string_view part = s.substr(0, next);
    const size_t nl = part.find('\n');
    const std::string_view recipient = trim(part.substr(0, nl));
    const std::string_view body = nl == std::string_view::npos ? std::string_view() : part.substr(nl + 1);
    if (recipient == kToAll) {
      out.content += body;
    } else {
      ToolCall call;
      call.name = recipient;
      std::string_view rest = body;
      const ojson args = take_json(rest);
      if (args.is_object() && trim(rest).empty()) call.arguments = args;
      else if (recipient == "python" && !trim(body).empty()) call.arguments = {{"code", std::string(trim(body))}};
      else return false;
      if (std::find(names.begin(), names.end(), call.name) == names.end()) return false;
      out.calls.push_back(std::move(call));
    }
    if (next == std::string_view::npos) return true;
    s.remove_prefix(next + kRecipient.size());
  }
}

// What a functionary output is when it is not calls: its text, less the
// "all" recipient line it starts with.
std::string functionary_text(std::string_view s) {
  const std::string_view head = s.substr(0, s.find('\n'));
  return std::string(trim(head) == kToAll ? s.substr(std::min(s.size(), head.size() + 1)) : s);
}

}  // namespace

const char* tool_format_name(ToolFormat f) {
  switch (f) {
    case ToolFormat::hermes: return "hermes";
    case ToolFormat::llama3: return "llama3";
    case ToolFormat::mistral: return "mistral";
    case ToolFormat::deepseek: return "deepseek";
    case ToolFormat::deepseek_v31: return "deepseek_v31";
    case ToolFormat::command_r: return "command_r";
    case ToolFormat::command_r7b: return "command_r7b";
    case ToolFormat::functionary_v32: return "functionary_v32";
    case ToolFormat::harmony: return "harmony";
  }
  return "hermes";
}

ToolFormat tool_format_of(std::string_view source) {
  if (is_harmony_template(source)) return ToolFormat::harmony;
  if (source.find(">>>all") != std::string_view::npos) return ToolFormat::functionary_v32;
  if (source.find(kHermesOpen) != std::string_view::npos) return ToolFormat::hermes;
  if (source.find(kCohereStart) != std::string_view::npos) return ToolFormat::command_r7b;
  if (source.find("Action:\\n```json") != std::string_view::npos) return ToolFormat::command_r;
  if (source.find(kDsCalls) != std::string_view::npos)
    return source.find("```json") != std::string_view::npos ? ToolFormat::deepseek : ToolFormat::deepseek_v31;
  if (source.find(kMistralCalls) != std::string_view::npos) return ToolFormat::mistral;
  if (source.find(kPythonTag) != std::string_view::npos || source.find("<|start_header_id|>") != std::string_view::npos)
    return ToolFormat::llama3;
  return ToolFormat::hermes;
}

bool template_renders_tools(std::string_view source) { return source.find("tools") != std::string_view::npos; }

std::vector<std::string> check_tools(const ojson& tools) {
  if (!tools.is_array()) throw bad_request("tools", "tools must be a list of {\"type\": \"function\", \"function\": {...}}");
  std::vector<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string at = "tools[" + std::to_string(i) + "]";
    const ojson& t = tools[i];
    if (!t.is_object() || t.value("type", ojson("function")) != "function")
      throw bad_request(at, at + " must be {\"type\": \"function\", \"function\": {...}}: only function tools exist");
    const auto f = t.find("function");
    if (f == t.end() || !f->is_object()) throw bad_request(at + ".function", at + ".function must be an object");
    const auto name = f->find("name");
    if (name == f->end() || !name->is_string() || name->get<std::string>().empty())
      throw bad_request(at + ".function.name", at + ".function.name must be a non-empty string");
    if (const auto p = f->find("parameters"); p != f->end() && !p->is_null() && !p->is_object())
      throw bad_request(at + ".function.parameters", at + ".function.parameters must be a JSON schema object");
    if (std::find(names.begin(), names.end(), name->get<std::string>()) != names.end())
      throw bad_request(at + ".function.name", "tools name the function " + name->dump() + " twice");
    names.push_back(name->get<std::string>());
  }
  return names;
}

ParsedToolOutput parse_tool_calls(ToolFormat f, std::string_view output, const std::vector<std::string>& names) {
  if (f == ToolFormat::harmony) {  // its reasoning is not content: left out
    OutputPiece p = HarmonyStream(names, 0).feed(output, true);
    for (ToolCall& c : p.calls) c.id.clear();
    return {std::move(p.content), std::move(p.calls)};
  }
  ParsedToolOutput out;
  const bool ok = f == ToolFormat::hermes   ? parse_hermes(output, names, out)
                  : f == ToolFormat::llama3 ? parse_llama3(output, names, out)
                  : is_deepseek(f)          ? parse_deepseek(output, names, out)
                  : f == ToolFormat::command_r || f == ToolFormat::command_r7b
                      ? parse_command_r(f, output, names, out)
                  : f == ToolFormat::functionary_v32 ? parse_functionary(output, names, out)
                                                     : parse_mistral(output, names, out);
  if (!ok) return {f == ToolFormat::functionary_v32 ? functionary_text(output) : std::string(output), {}};
  return out;
}

std::string tool_call_id(ToolFormat f, uint64_t seed, int64_t index) {
  static constexpr char kAlnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(index) + 1);
  std::string id = f == ToolFormat::mistral ? "" : "call_";
  for (int i = 0, n = f == ToolFormat::mistral ? 9 : 24; i < n; ++i) id += kAlnum[rng() % (sizeof kAlnum - 1)];
  return id;
}

ToolCallStream::ToolCallStream(ToolFormat f, std::vector<std::string> names, uint64_t seed)
    : format_(f), names_(std::move(names)), seed_(seed) {}

std::string ToolCallStream::feed(std::string_view text) {
  pending_ += text;
  if (holding_) return {};
  if (format_ == ToolFormat::functionary_v32 && !recipient_read_) {  // the first part's recipient decides
    const size_t nl = pending_.find('\n');
    if (nl == std::string::npos && pending_.size() <= kMaxRecipient) return {};
    recipient_read_ = true;
    if (nl != std::string::npos && trim(std::string_view(pending_).substr(0, nl)) == kToAll) pending_.erase(0, nl + 1);
    else if (nl != std::string::npos) return holding_ = true, std::string();  // a call: held whole
  }
  if (!seen_text_) {
    const std::string_view head = trim(pending_);
    if (head.empty()) return {};  // only whitespace yet: it may lead into a call
    const char json_start = format_ == ToolFormat::llama3 ? '{' : format_ == ToolFormat::mistral ? '[' : '\0';
    if (head.front() == json_start) {
      holding_ = true;
      return {};
    }
  }
  const std::string_view marker = marker_of(format_);
  if (const size_t at = pending_.find(marker); at != std::string::npos) {
    std::string out = pending_.substr(0, at);
    pending_.erase(0, at);
    holding_ = true;
    if (!seen_text_ && trim(out).empty()) out.clear();  // the call is the whole answer: no blank content before it
    seen_text_ = seen_text_ || !out.empty();
    return out;
  }
  // Hold back the longest end of the text that begins the marker.
  size_t keep = std::min(pending_.size(), marker.size() - 1);
  while (keep > 0 && !marker.starts_with(std::string_view(pending_).substr(pending_.size() - keep))) --keep;
  if (!seen_text_ && trim(std::string_view(pending_).substr(0, pending_.size() - keep)).empty())
    return {};  // only blanks before what may be a call: held with it
  std::string out = pending_.substr(0, pending_.size() - keep);
  pending_.erase(0, pending_.size() - keep);
  seen_text_ = true;
  return out;
}

ParsedToolOutput ToolCallStream::finish() {
  const bool unframed = format_ == ToolFormat::functionary_v32 && !recipient_read_;  // a short output: its "all\n" still on
  ParsedToolOutput out = holding_    ? parse_tool_calls(format_, pending_, names_)
                         : unframed ? ParsedToolOutput{functionary_text(pending_), {}}
                                    : ParsedToolOutput{pending_, {}};
  pending_.clear();
  for (size_t i = 0; i < out.calls.size(); ++i)
    out.calls[i].id = tool_call_id(format_, seed_, static_cast<int64_t>(i));
  return out;
}

}  // namespace loom::serve
