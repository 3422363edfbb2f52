// Statements: text, {{ output }}, if/elif/else, for (targets, filter, else),
// set (names, namespace attribute, block), break/continue, macro, call,
// filter, and transformers' generation block.
#include <algorithm>

#include "serve/jinja/jinja_parse.h"

namespace loom::serve::jinja {

namespace {

// jinja2 tags loom's subset leaves out: named in the error, unlike a typo.
constexpr std::string_view kUnsupportedTags[] = {"with", "include", "import",     "from",  "extends",   "block", "raw",
                                                 "autoescape", "do", "trans", "pluralize", "endraw"};

bool is_constant_name(std::string_view n) {
  return n == "true" || n == "false" || n == "none" || n == "True" || n == "False" || n == "None";
}

bool mentions(const Expr* e, std::string_view name) {
  if (e == nullptr) return false;
  if (e->kind == ExprKind::Name && e->name == name) return true;
  for (const ExprPtr& arg : e->args)
    if (mentions(arg.get(), name)) return true;
  for (const auto& [key, value] : e->kwargs)
    if (mentions(value.get(), name)) return true;
  return false;
}

// Whether a name is read anywhere in body (jinja2 gives a macro varargs,
// kwargs and caller only where its body reads them).
bool mentions(const Body& body, std::string_view name) {
  for (const Stmt& s : body) {
    for (const ExprPtr& e : s.exprs)
      if (mentions(e.get(), name)) return true;
    for (const Body& inner : s.bodies)
      if (mentions(inner, name)) return true;
  }
  return false;
}

}  // namespace

Parser::DepthGuard::DepthGuard(Parser& parser, Pos pos) : parser_(parser) {
  if (++parser_.depth_ > kMaxDepth) {
    --parser_.depth_;
    fail_at(pos, concat("the template nests deeper than ", kMaxDepth, " levels"));
  }
}

const Token& Parser::peek(size_t ahead) const { return tokens_[std::min(at_ + ahead, tokens_.size() - 1)]; }

const Token& Parser::next() {
  const Token& t = peek();
  if (at_ + 1 < tokens_.size()) ++at_;
  return t;
}

bool Parser::at_op(std::string_view op) const { return peek().kind == Tok::Op && peek().text == op; }
bool Parser::at_name(std::string_view name) const { return peek().kind == Tok::Name && peek().text == name; }

void Parser::expect_op(std::string_view op) {
  if (!at_op(op)) fail_here(concat("expected '", op, "'"));
  next();
}

std::string Parser::expect_name() {
  if (peek().kind != Tok::Name) fail_here("expected a name");
  return next().text;
}

std::string Parser::describe(const Token& t) {
  switch (t.kind) {
    case Tok::Text: return "template text";
    case Tok::VarBegin: return "'{{'";
    case Tok::VarEnd: return "the end of the print statement '}}'";
    case Tok::BlockBegin: return "'{%'";
    case Tok::BlockEnd: return "the end of the tag '%}'";
    case Tok::String: return "a string";
    case Tok::Int:
    case Tok::Float: return "a number";
    case Tok::Eof: return "the end of the template";
    default: return concat("'", t.text, "'");
  }
}

void Parser::fail_here(std::string_view what) const { fail_at(peek().pos, concat(what, ", got ", describe(peek()))); }

void Parser::expect_block_end() {
  if (peek().kind != Tok::BlockEnd) fail_here("expected the end of the tag '%}'");
  next();
}

Body Parser::parse_template() { return parse_body({}, nullptr); }

// Statements until the end (ends empty) or a block tag named in ends; then
// the next token is that tag's name.
Body Parser::parse_body(const std::vector<std::string_view>& ends, const Token* opener) {
  const DepthGuard guard(*this, peek().pos);
  Body body;
  while (true) {
    const Token& t = peek();
    if (t.kind == Tok::Eof) {
      if (opener == nullptr) return body;
      fail_at(t.pos, concat("the template ended inside '", opener->text, "' (line ", opener->pos.line, ":",
                            opener->pos.col, "): expected '", ends.back(), "'"));
    }
    if (t.kind == Tok::Text) {
      body.push_back({StmtKind::Text, t.pos, t.text, {}, {}, {}});
      next();
    } else if (t.kind == Tok::VarBegin) {
      next();
      Stmt s{StmtKind::Output, t.pos, {}, {}, {}, {}};
      s.exprs.push_back(parse_expression());
      if (peek().kind != Tok::VarEnd) fail_here(at_op(",") ? "tuples are not supported" : "expected '}}'");
      next();
      body.push_back(std::move(s));
    } else if (t.kind == Tok::BlockBegin) {
      next();
      const Token& tag = peek();
      if (tag.kind != Tok::Name) fail_here("expected a tag name");
      if (std::find(ends.begin(), ends.end(), tag.text) != ends.end()) return body;
      next();
      parse_statement(body, tag);
    } else {
      fail_here("unexpected token");
    }
  }
}

void Parser::parse_statement(Body& body, const Token& tag) {
  const std::string& name = tag.text;
  if (name == "if") {
    body.push_back(parse_if(tag.pos));
  } else if (name == "for") {
    body.push_back(parse_for(tag.pos));
  } else if (name == "set") {
    body.push_back(parse_set(tag.pos));
  } else if (name == "macro") {
    body.push_back(parse_macro(tag.pos));
  } else if (name == "call") {
    body.push_back(parse_call_block(tag.pos));
  } else if (name == "filter") {
    body.push_back(parse_filter_block(tag.pos));
  } else if (name == "generation") {
    body.push_back(parse_scope_block(tag.pos, "endgeneration"));
  } else if (name == "break" || name == "continue") {
    if (loops_ == 0) fail_at(tag.pos, concat("'", name, "' outside a for loop"));
    expect_block_end();
    body.push_back({name == "break" ? StmtKind::Break : StmtKind::Continue, tag.pos, {}, {}, {}, {}});
  } else if (name == "elif" || name == "else" || name.starts_with("end")) {
    fail_at(tag.pos, concat("unexpected '", name, "': no open block takes it here"));
  } else if (std::find(std::begin(kUnsupportedTags), std::end(kUnsupportedTags), name) != std::end(kUnsupportedTags)) {
    fail_at(tag.pos, concat("the '", name, "' tag is not supported by loom's jinja"));
  } else {
    fail_at(tag.pos, concat("unknown tag '", name,
                            "' (loom's jinja has if, elif, else, for, set, break, continue, macro, call, filter, "
                            "generation)"));
  }
}

Stmt Parser::parse_if(Pos pos) {
  const Token& opener = tokens_[at_ - 1];
  Stmt s{StmtKind::If, pos, {}, {}, {}, {}};
  s.exprs.push_back(parse_expression(false));
  expect_block_end();
  while (true) {
    s.bodies.push_back(parse_body({"elif", "else", "endif"}, &opener));
    const std::string tag = next().text;
    if (tag == "elif") {
      s.exprs.push_back(parse_expression(false));
      expect_block_end();
    } else if (tag == "else") {
      expect_block_end();
      s.bodies.push_back(parse_body({"endif"}, &opener));
      next();
      expect_block_end();
      return s;
    } else {
      expect_block_end();
      return s;
    }
  }
}

Stmt Parser::parse_for(Pos pos) {
  const Token& opener = tokens_[at_ - 1];
  Stmt s{StmtKind::For, pos, {}, {}, {}, {}};
  do {
    if (!s.targets.empty()) next();
    s.targets.push_back(expect_name());
    if (is_constant_name(s.targets.back())) fail_at(pos, concat("cannot assign to '", s.targets.back(), "'"));
  } while (at_op(","));
  if (!at_name("in")) fail_here("expected 'in'");
  next();
  s.exprs.push_back(parse_expression(false));
  ExprPtr filter;
  if (at_name("if")) {
    next();
    filter = parse_expression();
  }
  s.exprs.push_back(std::move(filter));
  if (at_name("recursive")) fail_here("recursive for loops are not supported by loom's jinja");
  expect_block_end();
  ++loops_;
  s.bodies.push_back(parse_body({"endfor", "else"}, &opener));
  --loops_;
  if (next().text == "else") {
    expect_block_end();
    s.bodies.push_back(parse_body({"endfor"}, &opener));
    next();
  } else {
    s.bodies.emplace_back();
  }
  expect_block_end();
  return s;
}

Stmt Parser::parse_set(Pos pos) {
  const Token& opener = tokens_[at_ - 1];
  Stmt s{StmtKind::Set, pos, {}, {}, {}, {}};
  if (at_op("(")) {  // {% set (a, b) = pair %}
    next();
    s.flags |= Stmt::kUnpack;
    do {
      if (!s.targets.empty()) next();
      s.targets.push_back(expect_name());
      if (is_constant_name(s.targets.back())) fail_at(pos, concat("cannot assign to '", s.targets.back(), "'"));
    } while (at_op(","));
    expect_op(")");
    if (!at_op("=")) fail_here("expected '='");
  } else {
    s.targets.push_back(expect_name());
  }
  if (is_constant_name(s.targets.back())) fail_at(pos, concat("cannot assign to '", s.targets.back(), "'"));
  if (at_op(".")) {
    next();
    s.targets.push_back(expect_name());
  }
  if (s.targets.size() == 1 && (s.flags & Stmt::kUnpack) == 0 && at_op(",")) {  // {% set a, b = pair %}
    s.flags |= Stmt::kUnpack;
    while (at_op(",")) {
      next();
      s.targets.push_back(expect_name());
      if (is_constant_name(s.targets.back())) fail_at(pos, concat("cannot assign to '", s.targets.back(), "'"));
    }
    if (!at_op("=")) fail_here("expected '='");
  }
  if (at_op("=")) {
    next();
    s.exprs.push_back(parse_expression());
    if (at_op(",")) {  // {% set x = 1, 2 %}: a tuple, which loom keeps as a list
      std::vector<ExprPtr> items;
      items.push_back(std::move(s.exprs[0]));
      while (at_op(",")) {
        next();
        if (peek().kind == Tok::BlockEnd) break;
        items.push_back(parse_expression());
      }
      s.exprs[0] = node(ExprKind::List, pos, std::move(items));
    }
    expect_block_end();
    return s;
  }
  if (s.targets.size() == 1 && peek().kind == Tok::BlockEnd) {
    next();
    s.kind = StmtKind::SetBlock;
    s.bodies.push_back(parse_body({"endset"}, &opener));
    next();
    expect_block_end();
    return s;
  }
  fail_here("expected '='");
}

// '(' name [= default], ... ')': a macro's or caller's parameters.
void Parser::parse_params(std::vector<std::string>& names, std::vector<ExprPtr>& defaults) {
  expect_op("(");
  while (!at_op(")")) {
    if (!names.empty()) expect_op(",");
    const Pos pos = peek().pos;
    names.push_back(expect_name());
    if (is_constant_name(names.back())) fail_at(pos, concat("cannot assign to '", names.back(), "'"));
    if (at_op("=")) {
      next();
      defaults.push_back(parse_expression());
    } else {
      if (!defaults.empty() && defaults.back()) fail_at(pos, "non-default argument follows default argument");
      defaults.emplace_back();
    }
  }
  next();
}

Stmt Parser::parse_macro(Pos pos) {
  const Token& opener = tokens_[at_ - 1];
  Stmt s{StmtKind::Macro, pos, expect_name(), {}, {}, {}};
  parse_params(s.targets, s.exprs);
  expect_block_end();
  parse_callable_body(s, "endmacro", opener);
  return s;
}

// A macro's or caller's body up to end: a loop around the tag is not the
// body's; varargs and kwargs are flagged where the body reads them.
void Parser::parse_callable_body(Stmt& s, std::string_view end, const Token& opener) {
  const int loops = loops_;
  loops_ = 0;
  s.bodies.push_back(parse_body({end}, &opener));
  loops_ = loops;
  next();
  expect_block_end();
  if (mentions(s.bodies[0], "varargs")) s.flags |= Stmt::kVarargs;
  if (mentions(s.bodies[0], "kwargs")) s.flags |= Stmt::kKwargs;
}

Stmt Parser::parse_call_block(Pos pos) {
  const Token& opener = tokens_[at_ - 1];
  Stmt s{StmtKind::CallBlock, pos, {}, {}, {}, {}};
  std::vector<ExprPtr> defaults;
  if (at_op("(")) parse_params(s.targets, defaults);
  const Pos at = peek().pos;
  s.exprs.push_back(parse_expression());
  if (s.exprs[0]->kind != ExprKind::Call) fail_at(at, "expected a macro call after 'call'");
  for (ExprPtr& d : defaults) s.exprs.push_back(std::move(d));
  expect_block_end();
  parse_callable_body(s, "endcall", opener);
  return s;
}

Stmt Parser::parse_filter_block(Pos pos) {
  const Token& opener = tokens_[at_ - 1];
  Stmt s{StmtKind::FilterBlock, pos, {}, {}, {}, {}};
  ExprPtr e = node(ExprKind::Name, pos, {}, std::string(kBlockText));
  e = parse_filter(std::move(e), false);
  while (at_op("|")) e = parse_filter(std::move(e));
  s.exprs.push_back(std::move(e));
  expect_block_end();
  s.bodies.push_back(parse_body({"endfilter"}, &opener));
  next();
  expect_block_end();
  return s;
}

Stmt Parser::parse_scope_block(Pos pos, std::string_view end) {
  const Token& opener = tokens_[at_ - 1];
  Stmt s{StmtKind::Block, pos, {}, {}, {}, {}};
  expect_block_end();
  s.bodies.push_back(parse_body({end}, &opener));
  next();
  expect_block_end();
  return s;
}

Body parse_tokens(const std::vector<Token>& tokens) { return Parser(tokens).parse_template(); }

}  // namespace loom::serve::jinja
