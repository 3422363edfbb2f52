// Statements: text, {{ output }}, if/elif/else, for (targets, filter, else),
// set (name, namespace attribute, block), break/continue.
#include <algorithm>

#include "serve/jinja_parse.h"

namespace loom::serve::jinja {

namespace {

// jinja2 tags loom's subset leaves out: named in the error, unlike a typo.
constexpr std::string_view kUnsupportedTags[] = {"macro",   "call", "filter",     "with",      "include", "import",
                                                 "from",    "extends", "block",   "raw",       "autoescape", "do",
                                                 "generation", "trans", "pluralize", "endraw"};

bool is_constant_name(std::string_view n) {
  return n == "true" || n == "false" || n == "none" || n == "True" || n == "False" || n == "None";
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
  } else if (name == "break" || name == "continue") {
    if (loops_ == 0) fail_at(tag.pos, concat("'", name, "' outside a for loop"));
    expect_block_end();
    body.push_back({name == "break" ? StmtKind::Break : StmtKind::Continue, tag.pos, {}, {}, {}, {}});
  } else if (name == "elif" || name == "else" || name.starts_with("end")) {
    fail_at(tag.pos, concat("unexpected '", name, "': no open block takes it here"));
  } else if (std::find(std::begin(kUnsupportedTags), std::end(kUnsupportedTags), name) != std::end(kUnsupportedTags)) {
    fail_at(tag.pos, concat("the '", name, "' tag is not supported by loom's jinja"));
  } else {
    fail_at(tag.pos, concat("unknown tag '", name, "' (loom's jinja has if, elif, else, for, set, break, continue)"));
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
  s.targets.push_back(expect_name());
  if (is_constant_name(s.targets.back())) fail_at(pos, concat("cannot assign to '", s.targets.back(), "'"));
  if (at_op(".")) {
    next();
    s.targets.push_back(expect_name());
  }
  if (at_op(",")) fail_here("assigning several names at once is not supported by loom's jinja");
  if (at_op("=")) {
    next();
    s.exprs.push_back(parse_expression());
    if (at_op(",")) fail_here("tuples are not supported by loom's jinja");
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

Body parse_tokens(const std::vector<Token>& tokens) { return Parser(tokens).parse_template(); }

}  // namespace loom::serve::jinja
