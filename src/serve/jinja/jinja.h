// A Jinja2 subset for Hugging Face chat templates (tokenizer_config.json's
// `chat_template`), rendered without Python. It follows jinja2 3.1 as
// transformers runs it (ImmutableSandboxedEnvironment(trim_blocks=True,
// lstrip_blocks=True) with loopcontrols, the {% generation %} block, a
// raise_exception and a strftime_now global, and tojson as json.dumps with
// ensure_ascii=False and keys unsorted), and is checked against the real
// jinja2 by tests/serve/test_chat_template.cpp and, on every published
// template of ../shared/jinja-cases and the peer suite there,
// tests/serve/test_jinja_cases.cpp.
//
// Statements: if/elif/else, for (with `else`, a filter `if`, `k, v` targets,
// the loop variable, break/continue), set (names, `a, b = ...`, `ns.attr`,
// `{% set x %}` blocks), macro (defaults, varargs, kwargs, caller), call
// blocks, filter blocks, generation blocks, comments and whitespace control.
// Expressions: literals, lists, dicts, attributes, subscripts and slices,
// arithmetic, comparisons, `in`, and/or/not, `~`, conditional expressions,
// calls with *args and **kwargs, filters, tests, string and dict methods,
// range(), namespace(), raise_exception(), strftime_now(). Values are JSON
// whose objects keep their keys in order (as Python's dicts), plus jinja2's
// undefined, namespaces, the loop object, functions and macros.
//
// Not supported, each refused with an error: raw/with/autoescape blocks,
// include/import/extends, tuples printed or passed outside a set, `%`
// string formatting and str.format fields other than {}, {0} and {name},
// integers past 64 bits, dict keys that are not strings.
// Differences that give other output: tuples print as lists; range() is a
// list; select/map/... give lists where jinja2 gives generators; a call
// block's caller kept and called after the block is an error; a macro kept
// and called after the scope that defined it ended no longer sees that
// scope's variables.
//
// Limits, each an error: nesting past 256 levels (blocks, brackets,
// expressions, macro calls), data past 512 levels, 1M loop iterations per
// render, strings, lists and the output past 64 MiB, range() past 100000
// items (the sandbox's limit).
#pragma once

#include <cstdint>
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
  // The time strftime_now() formats, in seconds since 1970 read as UTC; -1:
  // the clock's local time, as transformers' datetime.now(). (For tests.)
  int64_t now_unix = -1;
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
  // The same with the keys of objects in the order given (as Python's dicts).
  std::string render(const nlohmann::ordered_json& variables) const;

 private:
  Template(std::shared_ptr<const std::vector<Stmt>> body, const Options& options)
      : body_(std::move(body)), options_(options) {}
  std::shared_ptr<const std::vector<Stmt>> body_;
  Options options_;
};

}  // namespace loom::serve::jinja
