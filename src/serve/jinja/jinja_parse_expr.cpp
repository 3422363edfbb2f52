// Expressions, loosest first as in jinja2: `x if c else y`, or, and, not,
// comparisons and `in`, + -, ~, * / // %, **, unary - +, then postfix
// (.attr, [item], [a:b:c], calls), filters `|f(...)` and tests `is [not] t`.
#include <algorithm>

#include "serve/jinja/jinja_parse.h"

namespace loom::serve::jinja {

namespace {

std::shared_ptr<const json> constant(const Token& t) {
  const std::string& n = t.text;
  if (n == "true" || n == "True") return std::make_shared<const json>(true);
  if (n == "false" || n == "False") return std::make_shared<const json>(false);
  if (n == "none" || n == "None") return std::make_shared<const json>(nullptr);
  return nullptr;
}

bool is_compare_op(const Token& t) {
  return t.kind == Tok::Op && (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == ">" ||
                               t.text == "<=" || t.text == ">=");
}

}  // namespace

void Parser::finish_depth(Expr& e) {
  int deepest = 0;
  for (const ExprPtr& a : e.args)
    if (a) deepest = std::max(deepest, a->depth);
  for (const auto& [name, a] : e.kwargs) deepest = std::max(deepest, a->depth);
  e.depth = deepest + 1;
  if (e.depth > kMaxDepth) fail_at(e.pos, concat("the expression nests deeper than ", kMaxDepth, " levels"));
}

ExprPtr Parser::node(ExprKind kind, Pos pos, std::vector<ExprPtr> args, std::string name) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->pos = pos;
  e->name = std::move(name);
  e->args = std::move(args);
  finish_depth(*e);
  return e;
}

ExprPtr Parser::parse_expression(bool condexpr) {
  const DepthGuard guard(*this, peek().pos);
  ExprPtr e = parse_or();
  while (condexpr && at_name("if")) {
    const Pos pos = next().pos;
    ExprPtr cond = parse_or();
    ExprPtr otherwise;
    if (at_name("else")) {
      next();
      otherwise = parse_expression();
    }
    std::vector<ExprPtr> args;
    args.push_back(std::move(e));
    args.push_back(std::move(cond));
    args.push_back(std::move(otherwise));
    e = node(ExprKind::CondExpr, pos, std::move(args));
  }
  return e;
}

// A left-associative chain of the keyword operator `word` over sub().
ExprPtr Parser::parse_chain(const char* word, ExprKind kind, ExprPtr (Parser::*sub)()) {
  ExprPtr e = (this->*sub)();
  while (at_name(word)) {
    const Pos pos = next().pos;
    std::vector<ExprPtr> args;
    args.push_back(std::move(e));
    args.push_back((this->*sub)());
    e = node(kind, pos, std::move(args));
  }
  return e;
}

ExprPtr Parser::parse_or() { return parse_chain("or", ExprKind::Or, &Parser::parse_and); }

ExprPtr Parser::parse_and() { return parse_chain("and", ExprKind::And, &Parser::parse_not); }

ExprPtr Parser::parse_not() {
  if (!at_name("not")) return parse_compare();
  const Pos pos = next().pos;
  const DepthGuard guard(*this, pos);
  std::vector<ExprPtr> args;
  args.push_back(parse_not());
  return node(ExprKind::Unary, pos, std::move(args), "not");
}

ExprPtr Parser::parse_compare() {
  const Pos pos = peek().pos;
  std::vector<ExprPtr> args;
  args.push_back(parse_math1());
  std::vector<std::string> ops;
  while (true) {
    if (is_compare_op(peek())) {
      ops.push_back(next().text);
    } else if (at_name("in")) {
      next();
      ops.emplace_back("in");
    } else if (at_name("not") && peek(1).kind == Tok::Name && peek(1).text == "in") {
      next(), next();
      ops.emplace_back("notin");
    } else {
      break;
    }
    args.push_back(parse_math1());
  }
  if (ops.empty()) return std::move(args[0]);
  ExprPtr e = node(ExprKind::Compare, pos, std::move(args));
  e->ops = std::move(ops);
  return e;
}

ExprPtr Parser::parse_math1() {
  ExprPtr e = parse_concat();
  while (at_op("+") || at_op("-")) {
    const Token& op = next();
    std::vector<ExprPtr> args;
    args.push_back(std::move(e));
    args.push_back(parse_concat());
    e = node(ExprKind::Binary, op.pos, std::move(args), op.text);
  }
  return e;
}

ExprPtr Parser::parse_concat() {
  const Pos pos = peek().pos;
  std::vector<ExprPtr> args;
  args.push_back(parse_math2());
  while (at_op("~")) {
    next();
    args.push_back(parse_math2());
  }
  if (args.size() == 1) return std::move(args[0]);
  return node(ExprKind::Concat, pos, std::move(args));
}

ExprPtr Parser::parse_math2() {
  ExprPtr e = parse_pow();
  while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
    const Token& op = next();
    std::vector<ExprPtr> args;
    args.push_back(std::move(e));
    args.push_back(parse_pow());
    e = node(ExprKind::Binary, op.pos, std::move(args), op.text);
  }
  return e;
}

ExprPtr Parser::parse_pow() {
  ExprPtr e = parse_unary(true);
  while (at_op("**")) {
    const Token& op = next();
    std::vector<ExprPtr> args;
    args.push_back(std::move(e));
    args.push_back(parse_unary(true));
    e = node(ExprKind::Binary, op.pos, std::move(args), op.text);
  }
  return e;
}

ExprPtr Parser::parse_unary(bool with_filter) {
  ExprPtr e;
  if (at_op("-") || at_op("+")) {
    const Token& op = next();
    const DepthGuard guard(*this, op.pos);
    std::vector<ExprPtr> args;
    args.push_back(parse_unary(false));
    e = node(ExprKind::Unary, op.pos, std::move(args), op.text);
  } else {
    e = parse_primary();
  }
  e = parse_postfix(std::move(e));
  return with_filter ? parse_filters(std::move(e)) : std::move(e);
}

ExprPtr Parser::parse_primary() {
  const Token& t = peek();
  auto literal = [&](std::shared_ptr<const json> value) {
    ExprPtr e = node(ExprKind::Literal, t.pos, {});
    e->literal = std::move(value);
    return e;
  };
  if (t.kind == Tok::Name) {
    next();
    if (auto c = constant(t)) return literal(std::move(c));
    return node(ExprKind::Name, t.pos, {}, t.text);
  }
  if (t.kind == Tok::String) {
    std::string s;
    while (peek().kind == Tok::String) s += next().text;  // adjacent strings join, as in Python
    return literal(std::make_shared<const json>(std::move(s)));
  }
  if (t.kind == Tok::Int) return next(), literal(std::make_shared<const json>(t.int_value));
  if (t.kind == Tok::Float) return next(), literal(std::make_shared<const json>(t.float_value));
  if (at_op("(") || at_op("[") || at_op("{")) {
    next();
    const DepthGuard guard(*this, t.pos);
    return parse_collection(t.pos, t.text == "(" ? ')' : t.text == "[" ? ']' : '}');
  }
  fail_here("expected an expression");
}

// After '(', '[' or '{': a parenthesized expression, a tuple (as a list), a
// list or a dict.
ExprPtr Parser::parse_collection(Pos pos, char close) {
  const std::string end(1, close);
  std::vector<ExprPtr> items;
  bool comma = false;
  while (!at_op(end)) {
    if (!items.empty()) {
      expect_op(",");
      comma = true;
      if (at_op(end)) break;
    }
    items.push_back(parse_expression());
    if (close == '}') {
      expect_op(":");
      items.push_back(parse_expression());
    }
  }
  next();
  if (close == ')' && items.size() == 1 && !comma) return std::move(items[0]);
  if (close == ')' && items.empty()) fail_at(pos, "empty tuples are not supported by loom's jinja");
  return node(close == '}' ? ExprKind::Dict : ExprKind::List, pos, std::move(items));
}

// callee(...): the call's node, its arguments parsed.
ExprPtr Parser::parse_call(ExprPtr callee) {
  const Pos pos = peek().pos;
  std::vector<ExprPtr> args;
  args.push_back(std::move(callee));
  ExprPtr call = node(ExprKind::Call, pos, std::move(args));
  parse_call_args(*call);
  return call;
}

ExprPtr Parser::parse_postfix(ExprPtr e) {
  while (true) {
    if (at_op(".") || at_op("[")) {
      e = parse_subscript(std::move(e));
    } else if (at_op("(")) {
      e = parse_call(std::move(e));
    } else {
      return e;
    }
  }
}

ExprPtr Parser::parse_subscript(ExprPtr e) {
  const Token& t = next();  // '.' or '['
  std::vector<ExprPtr> args;
  args.push_back(std::move(e));
  if (t.text == ".") {
    const Token& a = peek();
    if (a.kind == Tok::Name) return next(), node(ExprKind::Attr, a.pos, std::move(args), a.text);
    if (a.kind != Tok::Int) fail_here("expected an attribute name after '.'");
    next();
    args.push_back(node(ExprKind::Literal, a.pos, {}));
    args.back()->literal = std::make_shared<const json>(a.int_value);
    return node(ExprKind::Item, t.pos, std::move(args));
  }
  const DepthGuard guard(*this, t.pos);
  ExprPtr bounds[3];
  bool slice = false;
  if (!at_op(":")) bounds[0] = parse_expression();
  if (at_op(":")) {
    slice = true;
    next();
    if (!at_op("]") && !at_op(":")) bounds[1] = parse_expression();
    if (at_op(":")) {
      next();
      if (!at_op("]")) bounds[2] = parse_expression();
    }
  }
  if (at_op(",")) fail_here("tuple subscripts are not supported by loom's jinja");
  expect_op("]");
  args.push_back(std::move(bounds[0]));
  if (!slice) return node(ExprKind::Item, t.pos, std::move(args));
  args.push_back(std::move(bounds[1]));
  args.push_back(std::move(bounds[2]));
  return node(ExprKind::Slice, t.pos, std::move(args));
}

ExprPtr Parser::parse_filters(ExprPtr e) {
  while (true) {
    if (at_op("|")) {
      e = parse_filter(std::move(e));
    } else if (at_name("is")) {
      e = parse_test(std::move(e));
    } else if (at_op("(")) {
      e = parse_call(std::move(e));
    } else {
      return e;
    }
  }
}

// A filter's or test's name: a word, or words joined by '.'.
std::string Parser::expect_dotted_name() {
  std::string name = expect_name();
  while (at_op(".")) {
    next();
    name += '.';
    name += expect_name();
  }
  return name;
}

ExprPtr Parser::parse_filter(ExprPtr e, bool piped) {
  if (piped) next();  // '|'
  const Pos pos = peek().pos;
  const std::string name = expect_dotted_name();
  if (!has_filter(name)) fail_at(pos, concat("unknown filter '", name, "'"));
  std::vector<ExprPtr> args;
  args.push_back(std::move(e));
  ExprPtr f = node(ExprKind::Filter, pos, std::move(args), name);
  if (at_op("(")) parse_call_args(*f);
  return f;
}

ExprPtr Parser::parse_test(ExprPtr e) {
  next();  // 'is'
  bool negated = false;
  if (at_name("not")) {
    next();
    negated = true;
  }
  const Pos pos = peek().pos;
  const std::string name = expect_dotted_name();
  if (!has_test(name)) fail_at(pos, concat("unknown test '", name, "'"));
  std::vector<ExprPtr> args;
  args.push_back(std::move(e));
  ExprPtr t = node(ExprKind::Test, pos, std::move(args), name);
  t->negated = negated;
  const Token& a = peek();
  const bool starts_arg = a.kind == Tok::Name || a.kind == Tok::String || a.kind == Tok::Int ||
                          a.kind == Tok::Float || at_op("[") || at_op("{");
  if (at_op("(")) {
    parse_call_args(*t);
  } else if (starts_arg && !at_name("else") && !at_name("or") && !at_name("and")) {
    // jinja2 takes one argument without parentheses: `x is divisibleby 3`.
    if (at_name("is")) fail_here("tests cannot be chained with 'is'");
    const DepthGuard guard(*this, a.pos);
    t->args.push_back(parse_postfix(parse_primary()));
    finish_depth(*t);
  }
  return t;
}

void Parser::parse_call_args(Expr& call) {
  const DepthGuard guard(*this, peek().pos);
  expect_op("(");
  bool first = true;
  while (!at_op(")")) {
    if (!first) {
      expect_op(",");
      if (at_op(")")) break;
    }
    first = false;
    if (at_op("*") || at_op("**")) {  // f(*xs), f(**d): a Unary "*" among args, "**" among kwargs
      const Token& star = next();
      ExprPtr spread = parse_expression();
      if (star.text == "**") {
        call.kwargs.emplace_back("**", std::move(spread));
      } else {
        std::vector<ExprPtr> inner;
        inner.push_back(std::move(spread));
        call.args.push_back(node(ExprKind::Unary, star.pos, std::move(inner), "*"));
      }
    } else if (peek().kind == Tok::Name && peek(1).kind == Tok::Op && peek(1).text == "=") {
      std::string name = next().text;
      next();
      call.kwargs.emplace_back(std::move(name), parse_expression());
    } else {
      if (!call.kwargs.empty()) fail_here("a positional argument follows a keyword argument");
      call.args.push_back(parse_expression());
    }
  }
  next();
  finish_depth(call);
}

}  // namespace loom::serve::jinja
