// A Jinja2 subset for Hugging Face chat templates (tokenizer_config.json's
// `chat_template`), rendered without Python. It follows jinja2 3.1 as
// transformers runs it (ImmutableSandboxedEnvironment(trim_blocks=True,
// lstrip_blocks=True) with loopcontrols and a raise_exception global), and is
// checked against the real jinja2 by tests/serve/test_chat_template.cpp.
//
// Statements: if/elif/else, for (with `else`, a filter `if`, `k, v` targets,
// the loop variable, break/continue), set (names, `ns.attr`, `{% set x %}`
// blocks), comments and whitespace control. Expressions: literals, lists,
// dicts, attributes, subscripts and slices, arithmetic, comparisons, `in`,
// and/or/not, `~`, conditional expressions, filters, tests, string and dict
// methods, range(), namespace(), raise_exception(). Values are JSON, plus
// jinja2's undefined, namespaces and the loop object.
//
// Not supported, each refused with an error: macros, raw/call/filter/with
// blocks, include/extends, tuples outside parentheses, strftime_now() (so
// `strftime_now is defined` is false, as in plain jinja2), `%` string
// formatting, `*args`/`**kwargs`, integers past 64 bits, dict keys that are
// not strings. Differences that give other output: dicts iterate and print
// in sorted key order (nlohmann::json), not insertion order (tojson sorts in
// both); tuples print as lists; range() is a list.
//
// Limits, each an error: nesting past 256 levels (blocks, brackets,
// expressions), data past 512 levels, 1M loop iterations per render,
// strings, lists and the output past 64 MiB, range() past 100000 items (the
// sandbox's limit).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace loom::serve::jinja {

// jinja2's Environment options that change the output; the defaults are
// transformers' (keep_trailing_newline is jinja2's own default).
struct Options {
  bool trim_blocks = true;             // drop the first newline after a block or comment tag
  bool lstrip_blocks = true;           // drop the spaces before a block or comment tag that starts a line
  bool keep_trailing_newline = false;  // false: a single newline ending the template is dropped
};

struct Stmt;  // a parsed statement (jinja_ast.h)

class Template {
 public:
  // Parses source; loom::Error naming the line and column ("jinja:3:14: ...")
  // for a syntax error or an unknown tag, filter or test.
  static Template parse(std::string_view source, const Options& options = {});

  // Renders with variables, a JSON object ({"messages": [...],
  // "add_generation_prompt": true, "bos_token": "<s>", ...}). loom::Error
  // for an evaluation error, naming the line: raise_exception("msg") gives
  // one whose message contains msg.
  std::string render(const nlohmann::json& variables) const;

 private:
  explicit Template(std::shared_ptr<const std::vector<Stmt>> body) : body_(std::move(body)) {}
  std::shared_ptr<const std::vector<Stmt>> body_;
};

}  // namespace loom::serve::jinja
