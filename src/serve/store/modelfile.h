// Modelfiles, as ollama writes them: the recipe `loom create` turns into a
// store model.
//
//   # comment
//   FROM ./out/quickstart            (a model directory, loom or Hugging Face, or a store model's name)
//   PARAMETER temperature 0.7
//   PARAMETER stop "User:"
//   TEMPLATE """{% for m in messages %}...{% endfor %}"""
//   SYSTEM You are a helpful assistant.
//   MESSAGE user Hello
//   MESSAGE assistant Hi!
//   LICENSE """MIT ..."""
//
// Instructions are case-insensitive; a value is the rest of the line, or a
// "quoted" or """triple-quoted""" string, either spanning lines up to the
// first line end where it closes (ollama's parser; nothing inside is
// unescaped). A UTF-8 byte order mark at the start is ignored. TEMPLATE is a
// Jinja chat template (serve/jinja.h), not ollama's Go template. Every error
// names the line.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace loom::serve {

struct Modelfile {
  std::string from;
  int from_line = 0;
  nlohmann::json parameters = nlohmann::json::object();  // checked values, e.g. {"temperature": 0.7, "stop": [...]}
  bool has_template = false, has_system = false, has_license = false;
  std::string chat_template, system, license;
  int template_line = 0;
  std::vector<std::pair<std::string, std::string>> messages;  // role, content

  // where: the file's name, for errors ("Modelfile:3: ...").
  static Modelfile parse(std::string_view text, const std::string& where);
};

// text as a Modelfile value that reads back as text: in """quotes""" (triple)
// or "quotes", whichever a line of text ending in those quotes would not
// close early.
std::string modelfile_quote(const std::string& text, bool triple);

// A PARAMETER's value checked and converted (number, integer or string;
// "stop" may repeat): loom::Error naming the parameter and what is allowed.
// The names are ollama's: temperature, top_k, top_p, min_p, seed,
// num_predict, num_ctx, stop, repeat_penalty, repeat_last_n,
// presence_penalty, frequency_penalty; mirostat only at 0 (off, what loom
// does); and the options that change nothing on a CPU (num_gpu,
// num_thread, ...), kept and ignored.
void set_parameter(nlohmann::json& params, const std::string& name, const std::string& value);

}  // namespace loom::serve
