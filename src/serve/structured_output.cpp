#include "serve/structured_output.h"

#include <cstdio>

#include "core/error.h"
#include "infer/json_schema_grammar.h"
#include "serve/harmony.h"
#include "serve/openai/openai_request.h"

namespace loom::serve {
namespace {

using ojson = nlohmann::ordered_json;

const ojson* present(const ojson& body, const char* name) {
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

// A schema as GBNF rules named root_name, or a 400 naming param.
std::string schema_rules(const ojson& schema, const std::string& root_name, const std::string& param) {
  if (!schema.is_object() && !schema.is_boolean())
    throw bad_request(param, param + " must be a JSON schema (an object), got " + std::string(schema.type_name()));
  try {
    return infer::json_schema_to_gbnf_ordered(schema, root_name);
  } catch (const loom::Error& e) {
    throw bad_request(param, param + " cannot be enforced: " + e.what());
  }
}

std::string response_format_grammar(const ojson& f, const std::string& root) {
  if (!f.is_object() || !f.contains("type") || !f["type"].is_string())
    throw bad_request("response_format", "response_format must be {\"type\": \"text\" | \"json_object\" | "
                                         "\"json_schema\", ...}");
  const std::string type = f["type"];
  if (type == "text") return {};
  if (type == "json_object") return schema_rules(ojson{{"type", "object"}}, root, "response_format");
  if (type != "json_schema")
    throw bad_request("response_format.type", "response_format.type \"" + type +
                                                  "\" is unknown: allowed text, json_object, json_schema");
  const ojson* js = present(f, "json_schema");
  if (js == nullptr || !js->is_object())
    throw bad_request("response_format.json_schema", "response_format.json_schema must be {\"name\", \"schema\"}");
  const ojson* schema = present(*js, "schema");
  if (schema == nullptr) throw bad_request("response_format.json_schema.schema", "response_format.json_schema.schema "
                                                                                 "is required");
  return schema_rules(*schema, root, "response_format.json_schema.schema");
}

std::string choice_grammar(const ojson& choices, const std::string& root) {
  if (!choices.is_array() || choices.empty())
    throw bad_request("guided_choice", "guided_choice must be a non-empty list of strings");
  std::string g = root + " ::= ";
  for (size_t i = 0; i < choices.size(); ++i) {
    if (!choices[i].is_string() || choices[i].get<std::string>().empty())
      throw bad_request("guided_choice", "guided_choice must be a non-empty list of non-empty strings");
    g += (i ? " | " : "") + gbnf_literal(choices[i].get<std::string>());
  }
  return g + "\n";
}

}  // namespace

std::string gbnf_literal(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') out += '\\', out += c;
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (u < 0x20 || u == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02X", u);
      out += hex;
    } else {
      out += c;  // UTF-8 bytes pass as they are: the literal is their code points
    }
  }
  return out + "\"";
}

std::string requested_grammar(const ojson& body, std::string& param, const std::string& answer_prefix) {
  // With a prefix the grammar made from a schema or choices is the answer's
  // rule, after it; a GBNF grammar is the client's own, as it is.
  const std::string root = answer_prefix.empty() ? "root" : "answer";
  std::string grammar;
  const auto take = [&](const char* name, auto make) {
    const ojson* f = present(body, name);
    if (f == nullptr) return;
    std::string g = make(*f);
    if (g.empty()) return;
    if (!grammar.empty()) throw bad_request(name, std::string(name) + " and " + param + " cannot both be given");
    grammar = std::move(g);
    param = name;
  };
  take("response_format", [&root](const ojson& f) { return response_format_grammar(f, root); });
  take("guided_json", [&root](const ojson& s) { return schema_rules(s, root, "guided_json"); });
  take("guided_choice", [&root](const ojson& c) { return choice_grammar(c, root); });
  take("guided_grammar", [](const ojson& g) {
    if (!g.is_string() || g.get<std::string>().empty())
      throw bad_request("guided_grammar", "guided_grammar must be GBNF text");
    return g.get<std::string>();
  });
  if (grammar.empty() || answer_prefix.empty() || param == "guided_grammar") return grammar;
  return "root ::= " + gbnf_literal(answer_prefix) + " answer\n" + grammar;
}

// The text around one call's arguments object (the args rule's): what the
// template taught the model.
std::pair<std::string, std::string> call_frame(ToolFormat f, const std::string& name, const std::string& head) {
  switch (f) {
    case ToolFormat::hermes: return {"<tool_call>\n" + head, "}\n</tool_call>"};
    case ToolFormat::deepseek:
      return {"<｜tool▁call▁begin｜>function<｜tool▁sep｜>" + name + "\n```json\n", "\n```<｜tool▁call▁end｜>"};
    case ToolFormat::deepseek_v31: return {"<｜tool▁call▁begin｜>" + name + "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"};
    case ToolFormat::command_r: return {"{\"tool_name\": " + ojson(name).dump() + ", \"parameters\": ", "}"};
    case ToolFormat::command_r7b:
      return {"{\"tool_call_id\": \"0\", \"tool_name\": " + ojson(name).dump() + ", \"parameters\": ", "}"};
    case ToolFormat::functionary_v32: return {name + "\n", ""};  // the recipient line, then the arguments
    case ToolFormat::harmony: return {harmony_call_header(name), ""};  // the message's header, then the arguments
    default: return {head, "}"};
  }
}

// root: the calls (up to 4 with parallel), separated and enclosed as the
// family writes them.
std::string call_list_root(ToolFormat f, bool parallel) {
  std::string open, close, sep = "\", \"";
  switch (f) {
    case ToolFormat::hermes: sep = "\"\\n\""; break;
    case ToolFormat::llama3: sep = "\"; \""; break;
    case ToolFormat::mistral: open = "[", close = "]"; break;
    case ToolFormat::deepseek:
    case ToolFormat::deepseek_v31:
      open = "<｜tool▁calls▁begin｜>", close = "<｜tool▁calls▁end｜>", sep = "\"\\n\"";
      break;
    case ToolFormat::command_r: open = "Action:\n```json\n[", close = "]\n```"; break;
    case ToolFormat::command_r7b: open = "<|START_ACTION|>[", close = "]<|END_ACTION|>"; break;
    case ToolFormat::functionary_v32: sep = "\">>>\""; break;  // the prompt wrote the first ">>>"
    case ToolFormat::harmony: parallel = false; break;  // a call ends the answer (<|call|> is an end token)
  }
  const std::string more = parallel ? " (" + sep + " call){0,3}" : "";
  return "root ::= " + (open.empty() ? "" : gbnf_literal(open) + " ") + "call" + more +
         (close.empty() ? "" : " " + gbnf_literal(close)) + "\n";
}

std::string tool_call_grammar(ToolFormat f, const ojson& tools, const std::vector<std::string>& names, bool parallel) {
  std::string rules, call = "call ::= ";
  bool first = true;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& fn = tools[i]["function"];
    const std::string name = fn["name"];
    const std::string args = "tool" + std::to_string(i) + "-args";
    bool offered = false;
    for (const std::string& n : names) offered = offered || n == name;
    if (!offered) continue;
    const ojson* params = present(fn, "parameters");
    rules += schema_rules(params ? *params : ojson{{"type", "object"}}, args,
                          "tools[" + std::to_string(i) + "].function.parameters");
    const std::string head = "{\"name\": " + ojson(name).dump() + ", \"" +
                             (f == ToolFormat::llama3 ? "parameters" : "arguments") + "\": ";
    const auto [open, close] = call_frame(f, name, head);
    call += (first ? "" : " | ") + gbnf_literal(open) + " " + args + (close.empty() ? "" : " " + gbnf_literal(close));
    first = false;
  }
  return call_list_root(f, parallel) + call + "\n" + rules;
}

std::shared_ptr<const infer::TokenGrammar> compile_grammar(const std::string& gbnf,
                                                           std::shared_ptr<const infer::GrammarVocab> vocab,
                                                           const std::string& param) {
  if (vocab == nullptr) throw bad_request(param, param + " needs a model with a tokenizer");
  try {
    return std::make_shared<const infer::TokenGrammar>(infer::TokenGrammar{infer::parse_gbnf(gbnf), std::move(vocab)});
  } catch (const loom::Error& e) {
    throw bad_request(param, param + ": " + e.what());
  }
}

}  // namespace loom::serve
