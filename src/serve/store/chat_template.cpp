#include "serve/store/chat_template.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "core/error.h"
#include "io/gguf.h"
#include "model/config_json.h"
#include "serve/jinja/jinja.h"

namespace loom::serve {
namespace {

using json = nlohmann::json;

// A special token as tokenizer_config.json writes it: a string, or an
// AddedToken object {"content": ...}; "" when absent.
std::string special_token(const json& cfg, const char* key) {
  const auto it = cfg.find(key);
  if (it == cfg.end()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) return (*it)["content"];
  return {};
}

// dir/tokenizer_config.json, or null when there is none.
json tokenizer_config(const std::string& dir) {
  const std::filesystem::path path = std::filesystem::path(dir) / "tokenizer_config.json";
  if (!std::filesystem::exists(path)) return nullptr;
  std::ifstream in(path);
  LOOM_REQUIRE(in.good(), "cannot read ", path.string());
  json cfg = json::parse(in, nullptr, false);
  LOOM_REQUIRE(!cfg.is_discarded() && cfg.is_object(), path.string(), " is not a JSON object");
  return cfg;
}

// chat_template: a string, or [{"name": ..., "template": ...}] (the "default" one).
std::string template_of(const json& cfg, const std::string& where) {
  const auto it = cfg.find("chat_template");
  if (it == cfg.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array())
    for (const json& t : *it)
      if (t.is_object() && t.value("name", "") == "default" && t.contains("template") && t["template"].is_string())
        return t["template"];
  throw loom::Error(where + ": chat_template must be a string or a list holding a {\"name\": \"default\", "
                            "\"template\": ...}");
}

}  // namespace

ChatTemplate ChatTemplate::plain() {
  ChatTemplate t;
  // Tools are offered in the hermes form (tool_calls.h), which the server
  // reads back; a call is written as <tool_call>{"name": ..., "arguments": ...}</tool_call>.
  t.source =
      "{% if tools %}You may call these functions:\n"
      "{% for tool in tools %}{{ (tool.function if tool.function is defined else tool) | tojson }}\n{% endfor %}"
      "To call one, answer with <tool_call>{\"name\": <function name>, \"arguments\": <arguments object>}"
      "</tool_call>.\n\n{% endif %}"
      "{% for m in messages %}"
      "{% if m.role == 'system' or m.role == 'developer' %}{{ m.content }}\n\n"
      "{% elif m.role == 'tool' %}Tool: {{ m.content }}\n"
      "{% else %}{{ m.role | capitalize }}: {{ m.content }}"
      "{% for c in m.tool_calls or [] %}<tool_call>{{ {'name': c.function.name, 'arguments': c.function.arguments} "
      "| tojson }}</tool_call>{% endfor %}{{ '\\n' }}{% endif %}"
      "{% endfor %}"
      "{% if add_generation_prompt %}Assistant:{% endif %}";
  t.stop = {"\nUser:", "\nAssistant:", "\nTool:"};
  t.origin = "loom's plain template (a base model)";
  t.is_plain = true;
  return t;
}

ChatTemplate ChatTemplate::for_gguf(const std::string& path) {
  const io::GgufFile f = io::GgufFile::open(path);
  if (!f.has("tokenizer.chat_template")) return plain();
  ChatTemplate t;
  t.source = std::string(f.get_string("tokenizer.chat_template"));
  if (t.source.empty()) return plain();
  // The special tokens' texts: the vocabulary's entries at the BOS / EOS ids.
  if (f.has("tokenizer.ggml.tokens")) {
    const std::vector<std::string_view> tokens = f.get_string_array("tokenizer.ggml.tokens");
    const auto token = [&](const char* key) -> std::string {
      if (!f.has(key)) return {};
      const auto id = f.get_int<int64_t>(key);
      return id >= 0 && id < static_cast<int64_t>(tokens.size()) ? std::string(tokens[static_cast<size_t>(id)]) : "";
    };
    t.bos_token = token("tokenizer.ggml.bos_token_id");
    t.eos_token = token("tokenizer.ggml.eos_token_id");
  }
  if (!t.eos_token.empty()) t.stop = {t.eos_token};
  t.origin = path + ": tokenizer.chat_template";
  return t;
}

ChatTemplate ChatTemplate::for_model_dir(const std::string& dir) {
  if (model::is_gguf_path(dir) && std::filesystem::is_regular_file(dir)) return for_gguf(dir);
  const json cfg = tokenizer_config(dir);
  if (cfg.is_null()) return plain();
  const std::string where = (std::filesystem::path(dir) / "tokenizer_config.json").string();
  std::string source = template_of(cfg, where);
  if (source.empty()) return plain();
  ChatTemplate t;
  t.source = std::move(source);
  t.bos_token = special_token(cfg, "bos_token");
  t.eos_token = special_token(cfg, "eos_token");
  if (!t.eos_token.empty()) t.stop = {t.eos_token};
  t.origin = where;
  return t;
}

ChatTemplate ChatTemplate::from_file(const std::string& path, const std::string& dir) {
  std::ifstream in(path);
  LOOM_REQUIRE(in.good(), "--chat-template '", path, "' cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  const json cfg = tokenizer_config(dir);
  ChatTemplate t;
  t.source = text.str();
  if (!cfg.is_null()) {
    t.bos_token = special_token(cfg, "bos_token");
    t.eos_token = special_token(cfg, "eos_token");
    if (!t.eos_token.empty()) t.stop = {t.eos_token};
  }
  t.origin = path;
  return t;
}

ChatRenderer chat_renderer(const ChatTemplate& t) {
  auto compiled = std::make_shared<const jinja::Template>(jinja::Template::parse(t.source));
  return [compiled, bos = t.bos_token, eos = t.eos_token](
             const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools, bool add_generation_prompt,
             const nlohmann::ordered_json& kwargs) {
    // The variables transformers' apply_chat_template gives: tools and
    // documents are None when there are none (templates test `is not none`).
    nlohmann::ordered_json variables = {{"messages", messages}, {"tools", tools}, {"documents", nullptr},
                                        {"add_generation_prompt", add_generation_prompt}, {"bos_token", bos},
                                        {"eos_token", eos}};
    if (kwargs.is_object())
      for (const auto& [name, value] : kwargs.items())
        if (!reserved_template_variable(name)) variables[name] = value;
    return compiled->render(variables);
  };
}

bool reserved_template_variable(const std::string& name) {
  for (const char* v : {"messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token"})
    if (name == v) return true;
  return false;
}

}  // namespace loom::serve
