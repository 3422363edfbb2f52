// A model's chat template: the Jinja source (serve/jinja.h) that turns a
// conversation into the prompt text, with the special tokens it may name
// (bos_token, eos_token) and the stop strings where its turns end. Found in a
// Hugging Face model directory's tokenizer_config.json (chat_template, a
// string or a list of named templates: "default" is used), given as a file
// (--chat-template), read from a GGUF file's tokenizer.chat_template, or the
// plain template for base models, which have none:
//
//   System text
//
//   User: Hello
//   Assistant:
//
// (the model continues after "Assistant:"; "\nUser:" stops it). Tools, when a
// request offers them, are listed before the conversation with how to call
// one in the hermes form (tool_calls.h).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace loom::serve {

struct ChatTemplate {
  std::string source;
  std::string bos_token, eos_token;
  std::vector<std::string> stop;
  std::string origin;  // where it came from, for logs
  bool is_plain = false;  // loom's plain template (the model has none of its own)

  static ChatTemplate plain();
  // dir's tokenizer_config.json template, or plain() when it has none
  // (dir may be a .gguf file: for_gguf). loom::Error for a
  // tokenizer_config.json that cannot be read.
  static ChatTemplate for_model_dir(const std::string& dir);
  // A GGUF file's tokenizer.chat_template, with the texts of its BOS and EOS
  // tokens; plain() when it has none.
  static ChatTemplate for_gguf(const std::string& path);
  // A Jinja file; the special tokens of dir's tokenizer_config.json if any.
  static ChatTemplate from_file(const std::string& path, const std::string& dir);
};

// messages, tools (null: none), add_generation_prompt, and more variables
// for the template (null or an object: transformers' chat_template_kwargs,
// e.g. enable_thinking) -> the prompt's text.
using ChatRenderer =
    std::function<std::string(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                              bool add_generation_prompt, const nlohmann::ordered_json& kwargs)>;

// The variables a chat template is always given, which kwargs may not set.
bool reserved_template_variable(const std::string& name);

// Compiles t (loom::Error naming the line for a template the Jinja engine
// cannot parse) into the function ServedModel::render_chat takes.
ChatRenderer chat_renderer(const ChatTemplate& t);

}  // namespace loom::serve
