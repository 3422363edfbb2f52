// The recursive-descent parser (private to src/serve/jinja*.cpp): statements
// in jinja_parse.cpp, expressions in jinja_parse_expr.cpp, with jinja2's
// grammar and precedence (jinja2/parser.py, 3.1). Every recursion passes a
// DepthGuard, so nesting past kMaxDepth is an error, not a stack overflow.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "serve/jinja/jinja_ast.h"

namespace loom::serve::jinja {

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : tokens_(tokens) {}
  Body parse_template();

  // Expressions (jinja_parse_expr.cpp). condexpr: `a if b else c` allowed
  // (jinja2 leaves it out of if tests and for iterables).
  ExprPtr parse_expression(bool condexpr = true);

 private:
  class DepthGuard {
   public:
    DepthGuard(Parser& parser, Pos pos);
    ~DepthGuard() { --parser_.depth_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;

   private:
    Parser& parser_;
  };

  // Statements (jinja_parse.cpp).
  Body parse_body(const std::vector<std::string_view>& ends, const Token* opener);
  void parse_statement(Body& body, const Token& tag);
  Stmt parse_if(Pos pos);
  Stmt parse_for(Pos pos);
  Stmt parse_set(Pos pos);
  Stmt parse_macro(Pos pos);
  Stmt parse_call_block(Pos pos);
  Stmt parse_filter_block(Pos pos);
  Stmt parse_scope_block(Pos pos, std::string_view end);
  void parse_callable_body(Stmt& s, std::string_view end, const Token& opener);
  void parse_params(std::vector<std::string>& names, std::vector<ExprPtr>& defaults);
  void expect_block_end();

  // Expressions (jinja_parse_expr.cpp).
  std::string expect_dotted_name();
  ExprPtr parse_call(ExprPtr callee);
  ExprPtr parse_chain(const char* word, ExprKind kind, ExprPtr (Parser::*sub)());
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary(bool with_filter);
  ExprPtr parse_primary();
  ExprPtr parse_collection(Pos pos, char close);
  ExprPtr parse_postfix(ExprPtr e);
  ExprPtr parse_subscript(ExprPtr e);
  ExprPtr parse_filters(ExprPtr e);
  ExprPtr parse_filter(ExprPtr e, bool piped = true);
  ExprPtr parse_test(ExprPtr e);
  void parse_call_args(Expr& call);
  ExprPtr node(ExprKind kind, Pos pos, std::vector<ExprPtr> args, std::string name = {});
  static void finish_depth(Expr& e);

  // Tokens.
  const Token& peek(size_t ahead = 0) const;
  const Token& next();
  bool at_op(std::string_view op) const;
  bool at_name(std::string_view name) const;
  void expect_op(std::string_view op);
  std::string expect_name();
  [[noreturn]] void fail_here(std::string_view what) const;
  static std::string describe(const Token& t);

  const std::vector<Token>& tokens_;
  size_t at_ = 0;
  int depth_ = 0;
  int loops_ = 0;  // for loops around the statement being parsed (break, continue)
};

}  // namespace loom::serve::jinja
