// The parsed form of a Jinja2 template (private to src/serve/jinja*.cpp):
// tokens from the lexer, then statements and expressions from the parser.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "serve/jinja/jinja.h"

namespace loom::serve::jinja {

using json = nlohmann::ordered_json;

// Nesting limit for blocks, brackets and expression trees: a malformed or
// hostile template gets an error, not a stack overflow (parse, render and
// destruction all recurse over the tree).
constexpr int kMaxDepth = 256;

struct Pos {
  int line = 1;
  int col = 1;  // 1-based, in bytes
};

// loom::Error "jinja:LINE:COL: message".
[[noreturn]] void fail_at(Pos pos, std::string_view message);

enum class Tok : uint8_t { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok kind;
  Pos pos;
  std::string text;  // Text and String: the value; Name, Op: as written
  int64_t int_value = 0;
  double float_value = 0.0;
};

// The template's tokens, whitespace control applied to the text between
// tags; ends with Eof. Comments produce no tokens.
std::vector<Token> lex(std::string_view source, const Options& options);

enum class ExprKind : uint8_t {
  Literal,   // literal
  Name,      // name
  List,      // args: items
  Dict,      // args: key, value, key, value...
  Attr,      // args[0].name
  Item,      // args[0][args[1]]
  Slice,     // args[0][args[1]:args[2]:args[3]], each bound may be null
  Call,      // args[0](args[1:], kwargs)
  Filter,    // args[0] | name(args[1:], kwargs)
  Test,      // args[0] is [not] name(args[1:], kwargs)
  Unary,     // name args[0]; name is "-", "+" or "not"
  Binary,    // args[0] name args[1]; name is + - * / // % **
  Concat,    // args[0] ~ args[1] ~ ...
  Compare,   // args[0] ops[0] args[1] ops[1] args[2]...
  And,       // args[0] and args[1]
  Or,        // args[0] or args[1]
  CondExpr,  // args[0] if args[1] else args[2] (null: undefined)
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind;
  Pos pos;
  std::string name;
  std::shared_ptr<const json> literal;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // Compare: == != < > <= >= in notin
  bool negated = false;          // Test: `is not`
  int depth = 1;                 // of this tree; at most kMaxDepth
};

enum class StmtKind : uint8_t {
  Text, Output, If, For, Set, SetBlock, Break, Continue, Macro, CallBlock, FilterBlock, Block
};

// If: exprs are the conditions, bodies one per condition plus an optional
// else. For: exprs = {iterable, filter or null}, bodies = {body, else},
// targets the loop variables. Set: targets = {name} or {namespace, attr}
// (or with kUnpack, names a value unpacks to), exprs = {value}. SetBlock:
// targets = {name}, bodies = {body}. Macro: text = its name, targets = the
// parameters, exprs = their defaults (null: none), bodies = {body}, flags.
// CallBlock: exprs = {the call, then the defaults of caller's parameters},
// targets = caller's parameters, bodies = {caller's body}. FilterBlock:
// exprs = {filters applied to the name kBlockText}, bodies = {body}. Block
// ({% generation %}): bodies = {body}, run in a scope of its own.
struct Stmt {
  enum Flags : uint8_t { kUnpack = 1, kVarargs = 2, kKwargs = 4 };
  StmtKind kind;
  Pos pos;
  std::string text;
  std::vector<ExprPtr> exprs;
  std::vector<std::vector<Stmt>> bodies;
  std::vector<std::string> targets;
  uint8_t flags = 0;
};

// The name a {% filter %} block's captured text has in its filter chain (no
// template can write it).
inline constexpr std::string_view kBlockText = "\x01" "block";

using Body = std::vector<Stmt>;

// Statements from tokens; loom::Error for a syntax error, an unknown tag,
// filter or test.
Body parse_tokens(const std::vector<Token>& tokens);

// The filters and tests the evaluator has (checked at parse time).
bool has_filter(std::string_view name);
bool has_test(std::string_view name);

}  // namespace loom::serve::jinja
