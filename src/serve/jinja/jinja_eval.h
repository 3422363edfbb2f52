// The evaluator (private to src/serve/jinja*.cpp): runs the statements with
// jinja2's scoping (a for loop's body gets a fresh scope each iteration, so a
// set inside it does not leak; if blocks share their scope) and evaluates
// expressions; filters, tests, methods and global functions live in
// jinja_filters.cpp, jinja_methods.cpp and jinja_ops.cpp.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "serve/jinja/jinja_ast.h"
#include "serve/jinja/jinja_value.h"

namespace loom::serve::jinja {

// Loop iterations one render may run (jinja2 has no limit; a server needs one).
constexpr uint64_t kMaxIterations = 1'000'000;

// A call's arguments, evaluated.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> named;
  // The argument at index, or passed as name; null when absent.
  const Value* get(size_t index, std::string_view name) const;
  // EvalError unless every argument is among names (in order) and at most
  // one is given per name.
  void check(std::string_view callee, std::initializer_list<std::string_view> names) const;
};

using Frame = std::unordered_map<std::string, Value>;

// The scopes a {% macro %} was defined in, which it sees by reference when
// called, as jinja2's macros (nested Python functions) see their enclosing
// variables. The frame holding the macro is weak (it would hold itself): a
// macro kept past that frame's end sees the others only.
struct Closure {
  std::vector<std::shared_ptr<Frame>> outer;
  std::weak_ptr<Frame> own;
};

class Renderer {
 public:
  Renderer(const json& variables, const Options& options);
  ~Renderer();
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;
  void render(const Body& body, std::string& out);
  Value eval(const Expr& e);

 private:
  enum class Flow : uint8_t { Normal, Break, Continue };

  void push_frame() { frames_.push_back(std::make_shared<Frame>()); }
  Flow exec(const Body& body, std::string& out);
  Flow exec_stmt(const Stmt& s, std::string& out);
  Flow exec_for(const Stmt& s, std::string& out);
  void exec_set(const Stmt& s, std::string& out);
  void exec_call_block(const Stmt& s, std::string& out);
  void exec_filter_block(const Stmt& s, std::string& out);
  // Runs a macro (or a call block's caller) with args, in its own scope: the
  // macro's Closure for a macro, the call block's for caller.
  Value call_macro(const Value& macro, const Args& args, const Value* caller);
  void bind_params(const Stmt& m, const Args& args, const Value* caller);
  void bind(Frame& frame, const std::vector<std::string>& targets, const Value& item);
  Value eval_node(const Expr& e);
  Value eval_call(const Expr& e);
  Value call_value(const Value& f, const Expr& e);  // f(e's arguments)
  Value eval_compare(const Expr& e);
  Value eval_collection(const Expr& e);
  Args eval_args(const Expr& e);
  Value lookup(const std::string& name) const;

  CallableTable callables_;
  Value variables_;
  Options options_;
  // Frames are shared: a macro's Closure holds those it was defined in.
  std::vector<std::shared_ptr<Frame>> frames_;
  // The scopes macro calls left, innermost last: caller() runs in the one
  // its call block was in (Value::scope, 1-based).
  std::vector<std::vector<std::shared_ptr<Frame>>> outer_;
  uint64_t iterations_ = 0;
  // Every namespace() made: `{% set ns.self = ns %}` is a reference cycle,
  // broken when the render ends.
  std::vector<std::shared_ptr<Object>> namespaces_;
};

// Operators (jinja_ops.cpp), with Python's semantics: + - * / // % ** on
// ints (64-bit, overflow is an error) and floats, + and * on str and list.
Value binary_op(std::string_view op, const Value& a, const Value& b);
Value unary_op(std::string_view op, const Value& a);  // "-" or "+"
bool contains(const Value& container, const Value& item);  // item in container
Value slice(const Value& v, const Value* start, const Value* stop, const Value* step);

// Filters and tests (jinja_filters.cpp), methods and globals (jinja_methods.cpp).
Value apply_filter(const std::string& name, const Value& subject, const Args& args);
bool apply_test(const std::string& name, const Value& subject, const Args& args);
Value call_method(const Value& subject, const std::string& name, const Args& args);
bool is_global(std::string_view name);
// now_unix: strftime_now()'s time (Options::now_unix).
Value call_global(const std::string& name, const Args& args, int64_t now_unix);

}  // namespace loom::serve::jinja
