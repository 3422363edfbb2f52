// POST /v1/chat/completions' request (parse_chat) and the checks of both
// generation routes that need no model (precheck): openai_request.h. The
// fields they share with /v1/completions are request_fields.h's.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "infer/grammar.h"
#include "serve/openai/openai_request.h"
#include "serve/openai/request_fields.h"
#include "serve/reasoning.h"
#include "serve/store/chat_template.h"
#include "serve/structured_output.h"

namespace loom::serve {

using namespace fields;

namespace {

// A message's content as text: a string, null (an assistant turn that only
// called tools), or a list of {"type": "text", "text": ...} parts, joined.
std::string message_content(const json& msg, size_t i) {
  const std::string param = cat("messages[", i, "].content");
  const auto it = msg.find("content");
  if (it == msg.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) throw bad_request(param, cat(param, " must be a string or a list of content parts"));
  std::string text;
  for (const json& part : *it) {
    if (!part.is_object() || part.value("type", json()) != "text")
      throw bad_request(param, cat(param, " holds a part that is not {\"type\": \"text\", ...}: only text is "
                                          "supported"));
    const auto t = part.find("text");
    if (t == part.end() || !t->is_string()) throw bad_request(param, cat(param, ": a text part needs \"text\""));
    text += t->get<std::string>();
  }
  return text;
}

// An assistant message's tool_calls for the template: each
// {"id"?, "type": "function", "function": {"name", "arguments"}} with the
// arguments an object (OpenAI sends a JSON string, ollama an object).
json tool_calls_of(const json& calls, const std::string& param) {
  if (!calls.is_array()) throw bad_request(param, cat(param, " must be a list of tool calls"));
  json out = json::array();
  for (size_t k = 0; k < calls.size(); ++k) {
    const std::string at = cat(param, "[", k, "]");
    const json& c = calls[k];
    const auto f = c.is_object() ? c.find("function") : c.end();
    if (f == c.end() || !f->is_object() || !f->contains("name") || !(*f)["name"].is_string())
      throw bad_request(at, cat(at, " must be {\"type\": \"function\", \"function\": {\"name\", \"arguments\"}}"));
    json args = f->value("arguments", json::object());
    if (args.is_string()) args = json::parse(args.get<std::string>(), nullptr, false);
    if (args.is_null()) args = json::object();
    if (!args.is_object())
      throw bad_request(at + ".function.arguments", cat(at, ".function.arguments must be a JSON object (or a string "
                                                            "holding one)"));
    json call = json::object();
    if (const auto id = c.find("id"); id != c.end() && id->is_string()) call["id"] = *id;
    call["type"] = "function";
    call["function"] = {{"name", (*f)["name"]}, {"arguments", std::move(args)}};
    out.push_back(std::move(call));
  }
  return out;
}

// messages, checked and normalized for the template: role and content
// strings, with name, tool_calls, tool_call_id (and ollama's tool_name)
// where given. An assistant's reasoning, under any name a client sends it
// (vLLM's reasoning_content or reasoning, ollama's thinking), reaches the
// template under both names templates read: reasoning_content (Qwen3) and
// thinking (gpt-oss; not beside a call's content, which its template
// refuses).
json chat_messages(const json& body) {
  const json* f = field(body, "messages");
  if (f == nullptr) throw bad_request("messages", "messages is required");
  if (!f->is_array() || f->empty()) throw bad_request("messages", "messages must be a non-empty list of messages");
  json out = json::array();
  for (size_t i = 0; i < f->size(); ++i) {
    const json& msg = (*f)[i];
    if (!msg.is_object()) throw bad_request("messages", cat("messages[", i, "] must be an object"));
    const auto role = msg.find("role");
    static const char* roles[] = {"system", "developer", "user", "assistant", "tool"};
    if (role == msg.end() || !role->is_string() ||
        std::find(std::begin(roles), std::end(roles), role->get<std::string>()) == std::end(roles))
      throw bad_request(cat("messages[", i, "].role"), cat("messages[", i, "].role must be one of system, developer, "
                                                           "user, assistant, tool"));
    json m = {{"role", *role}, {"content", message_content(msg, i)}};
    for (const char* key : {"name", "tool_call_id", "tool_name"})
      if (const auto v = msg.find(key); v != msg.end() && v->is_string()) m[key] = *v;
    if (const auto calls = msg.find("tool_calls"); calls != msg.end() && !calls->is_null() && *role == "assistant")
      if (json c = tool_calls_of(*calls, cat("messages[", i, "].tool_calls")); !c.empty()) m["tool_calls"] = std::move(c);
    for (const char* key : {"reasoning_content", "reasoning", "thinking"})
      if (const auto v = msg.find(key); *role == "assistant" && v != msg.end() && v->is_string() && !v->empty()) {
        m["reasoning_content"] = *v;
        // gpt-oss's template refuses a call with both content and thinking
        // (it renders one of them as the call's analysis): the content, a
        // preamble, is kept then.
        if (!m.contains("tool_calls") || m["content"] == "") m["thinking"] = *v;
        break;
      }
    out.push_back(std::move(m));
  }
  return out;
}

// The function tool_choice names, "" for auto / none / required; 400 for
// anything else.
std::string named_choice(const json& choice, const std::vector<std::string>& names) {
  const char* shape = "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                      "\"function\": {\"name\": ...}}";
  if (choice.is_string() && (choice == "auto" || choice == "none" || choice == "required")) return {};
  const auto f = choice.is_object() ? choice.find("function") : choice.end();
  if (f == choice.end() || !f->is_object() || !f->contains("name") || !(*f)["name"].is_string())
    throw bad_request("tool_choice", cat(shape, ", got ", choice.dump()));
  const std::string name = (*f)["name"];
  if (std::find(names.begin(), names.end(), name) == names.end())
    throw bad_request("tool_choice", cat("tool_choice names the function \"", name, "\", which tools do not offer"));
  return name;
}

// tools, tool_choice and parallel_tool_calls: the tools the template gets
// (null: none), the functions the output is read for, and for "required"
// or a named function the grammar of the calls (returned in grammar).
json chat_tools(const json& body, const ServedModel& m, CompletionRequest& r, std::string& grammar) {
  const json* tools = field(body, "tools");
  const json* choice = field(body, "tool_choice");
  if (tools == nullptr || (tools->is_array() && tools->empty())) {
    if (choice != nullptr && *choice != "none" && *choice != "auto")
      throw bad_request("tool_choice", "tool_choice other than \"none\" or \"auto\" needs tools");
    return nullptr;
  }
  std::vector<std::string> names = check_tools(*tools);
  if (!m.renders_tools)
    throw bad_request("tools", cat("model ", m.name, " does not support tools: its chat template does not read them"));
  r.reading.parallel_tool_calls = boolean(body, "parallel_tool_calls", true);
  if (choice != nullptr && *choice == "none") return nullptr;  // the model is not told of the tools: no calls
  const std::string named = choice == nullptr ? std::string() : named_choice(*choice, names);
  if (!named.empty() || (choice != nullptr && *choice == "required"))
    grammar = tool_call_grammar(m.tool_format, *tools, named.empty() ? names : std::vector<std::string>{named},
                                r.reading.parallel_tool_calls && named.empty());
  r.reading.tool_names = std::move(names);
  return *tools;
}

void refuse_unsupported_chat(const json& body) {
  refuse_logit_bias(body);
  refuse_unsupported_extensions(body);
}

// chat_template_kwargs: an object of variables that are not the template's
// own (messages, tools, ...), with OpenAI's reasoning_effort as the variable
// of that name (gpt-oss's template reads it) unless the object sets it;
// null when there are none.
json template_kwargs(const json& body) {
  const json* k = field(body, "chat_template_kwargs");
  json out = k == nullptr ? json(nullptr) : *k;
  if (!out.is_null() && !out.is_object())
    throw bad_request("chat_template_kwargs", "chat_template_kwargs must be an object of template variables");
  if (out.is_object())
    for (const auto& [name, value] : out.items())
      if (reserved_template_variable(name))
        throw bad_request("chat_template_kwargs", cat("chat_template_kwargs.", name, " is set by the request itself ",
                                                      "(messages, tools, add_generation_prompt); leave it out"));
  if (const json* e = field(body, "reasoning_effort")) {
    if (!e->is_string() || (*e != "minimal" && *e != "low" && *e != "medium" && *e != "high"))
      throw bad_request("reasoning_effort", cat("reasoning_effort must be \"minimal\", \"low\", \"medium\" or "
                                                "\"high\", got ", e->dump()));
    if (out.is_null()) out = json::object();
    if (!out.contains("reasoning_effort")) out["reasoning_effort"] = *e;
  }
  return out;
}

}  // namespace

CompletionRequest parse_chat(const json& body, const ServedModel& m, uint64_t seed) {
  CompletionRequest r;
  r.chat = true;
  r.model = model_of(body, m);
  if (!m.render_chat) throw bad_request("messages", cat("model ", m.name, " has no chat template: use /v1/completions"));
  if (m.tokenizer == nullptr) throw bad_request("messages", cat("model ", m.name, " has no tokenizer"));
  refuse_unsupported_chat(body);
  const json messages = chat_messages(body);
  std::string tool_grammar;
  const json tools = chat_tools(body, m, r, tool_grammar);
  r.seed = seed;
  r.reading.format = m.tool_format;
  r.reading.templated = true;
  std::string text;
  try {
    text = m.render_chat(messages, tools, boolean(body, "add_generation_prompt", true), template_kwargs(body));
  } catch (const loom::Error& e) {
    throw bad_request("messages", cat("the chat template refused the messages: ", e.what()));
  }
  r.prompts.push_back(m.tokenizer->encode_chat(text));  // the template may write the BOS itself
  if (r.prompts[0].empty()) throw bad_request("messages", "the messages render to an empty prompt");
  r.reading.split_reasoning = m.thinks;
  r.reading.think_tags = m.think_tags;
  r.reading.reasoning_inside = prompt_opens_think(text, m.think_tags);
  generation_fields(body, m, seed, r);
  for (const std::string& s : m.chat_stop)
    if (std::find(r.stop.begin(), r.stop.end(), s) == r.stop.end()) r.stop.push_back(s);
  r.logprobs = boolean(body, "logprobs", false);
  r.gen.top_logprobs = integer(body, "top_logprobs", 0, 0, 20);
  if (r.gen.top_logprobs > 0 && !r.logprobs)
    throw bad_request("top_logprobs", "top_logprobs needs logprobs = true");
  const char* name = field(body, "max_completion_tokens") != nullptr ? "max_completion_tokens" : "max_tokens";
  token_limits(body, m, name, m.max_model_len, r);  // not given: the room the messages leave
  structured_output(body, m, std::move(tool_grammar), r);
  return r;
}

void precheck(const json& body, bool chat) {
  (void)stop_strings(body);
  (void)sampler(body, 0);
  (void)integer(body, "n", 1, 1, INT32_MAX);  // the model's limit is checked once it is loaded
  (void)boolean(body, "stream", false);
  (void)boolean(body, "ignore_eos", false);
  if (chat) {
    refuse_unsupported_chat(body);
    (void)boolean(body, "logprobs", false);
    (void)integer(body, "top_logprobs", 0, 0, 20);
    (void)chat_messages(body);
    (void)template_kwargs(body);
    const char* name = field(body, "max_completion_tokens") != nullptr ? "max_completion_tokens" : "max_tokens";
    (void)integer(body, name, 1, 1, INT32_MAX);
    if (const json* tools = field(body, "tools"); tools != nullptr && !(tools->is_array() && tools->empty())) {
      const std::vector<std::string> names = check_tools(*tools);
      if (const json* choice = field(body, "tool_choice")) (void)named_choice(*choice, names);
    }
  } else {
    refuse_unsupported(body);
    (void)integer(body, "logprobs", 0, 0, 20);
    (void)integer(body, "max_tokens", 16, 1, INT32_MAX);
  }
  std::string param;
  if (const std::string g = requested_grammar(body, param); !g.empty()) {
    try {
      (void)infer::parse_gbnf(g);
    } catch (const loom::Error& e) {
      throw bad_request(param, cat(param, ": ", e.what()));
    }
  }
}

}  // namespace loom::serve
