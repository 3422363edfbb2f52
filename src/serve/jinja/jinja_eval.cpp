#include "serve/jinja/jinja_eval.h"

#include <algorithm>

namespace loom::serve::jinja {

const Value* Args::get(size_t index, std::string_view name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [key, value] : named)
    if (key == name) return &value;
  return nullptr;
}

void Args::check(std::string_view callee, std::initializer_list<std::string_view> names) const {
  if (positional.size() > names.size())
    eval_fail(callee, "() takes at most ", names.size(), " argument(s) (", positional.size(), " given)");
  for (const auto& [key, value] : named) {
    const auto it = std::find(names.begin(), names.end(), key);
    if (it == names.end()) eval_fail(callee, "() got an unexpected keyword argument '", key, "'");
    if (static_cast<size_t>(it - names.begin()) < positional.size())
      eval_fail(callee, "() got multiple values for argument '", key, "'");
  }
}

Renderer::Renderer(const json& variables, const Options& options)
    : variables_(Value::from(std::shared_ptr<const json>(&variables, [](const json*) {}))), options_(options) {
  push_frame();
}

Renderer::~Renderer() {
  for (const auto& ns : namespaces_) ns->attrs.clear();
}

void Renderer::render(const Body& body, std::string& out) { exec(body, out); }

Renderer::Flow Renderer::exec(const Body& body, std::string& out) {
  for (const Stmt& s : body) {
    const Flow flow = exec_stmt(s, out);
    if (out.size() > kMaxSize) fail_at(s.pos, concat("the output is over ", kMaxSize, " bytes"));
    if (flow != Flow::Normal) return flow;
  }
  return Flow::Normal;
}

Renderer::Flow Renderer::exec_stmt(const Stmt& s, std::string& out) {
  try {
    switch (s.kind) {
      case StmtKind::Text: out += s.text; break;
      case StmtKind::Output: out += to_str(eval(*s.exprs[0])); break;
      case StmtKind::If:
        for (size_t i = 0; i < s.exprs.size(); ++i)
          if (truthy(eval(*s.exprs[i]))) return exec(s.bodies[i], out);
        if (s.bodies.size() > s.exprs.size()) return exec(s.bodies.back(), out);
        break;
      case StmtKind::For: return exec_for(s, out);
      case StmtKind::Set:
      case StmtKind::SetBlock: exec_set(s, out); break;
      case StmtKind::Break: return Flow::Break;
      case StmtKind::Continue: return Flow::Continue;
      case StmtKind::Macro: {
        auto closure = std::make_shared<Closure>(Closure{{frames_.begin(), frames_.end() - 1}, frames_.back()});
        Value& macro = (*frames_.back())[s.text];
        macro = Value::function(s.text);
        macro.macro = &s;
        macro.closure = std::move(closure);
        break;
      }
      case StmtKind::CallBlock: exec_call_block(s, out); break;
      case StmtKind::FilterBlock: exec_filter_block(s, out); break;
      case StmtKind::Block:
        push_frame();
        exec(s.bodies[0], out);
        frames_.pop_back();
        break;
    }
  } catch (const EvalError& e) {
    fail_at(s.pos, e.what());
  }
  return Flow::Normal;
}

Renderer::Flow Renderer::exec_for(const Stmt& s, std::string& out) {
  std::vector<Value> items = iterate(eval(*s.exprs[0]));
  const auto count = [&] {
    if (++iterations_ > kMaxIterations) eval_fail("the template ran more than ", kMaxIterations, " loop iterations");
  };
  if (s.exprs[1]) {  // {% for x in xs if cond %}: the loop sees only the items that pass
    std::vector<Value> kept;
    for (Value& item : items) {
      count();
      push_frame();
      bind(*frames_.back(), s.targets, item);
      const bool keep = truthy(eval(*s.exprs[1]));
      frames_.pop_back();
      if (keep) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    push_frame();
    exec(s.bodies[1], out);
    frames_.pop_back();
    return Flow::Normal;
  }
  const auto shared = std::make_shared<const std::vector<Value>>(std::move(items));
  for (size_t i = 0; i < shared->size(); ++i) {
    count();
    push_frame();
    bind(*frames_.back(), s.targets, (*shared)[i]);
    Value& loop = (*frames_.back())["loop"];
    loop.kind = Value::Kind::Object;
    loop.object = std::make_shared<Object>(Object{Object::Type::Loop, {}, shared, i});
    const Flow flow = exec(s.bodies[0], out);
    frames_.pop_back();
    if (flow == Flow::Break) break;
  }
  return Flow::Normal;
}

void Renderer::bind(Frame& frame, const std::vector<std::string>& targets, const Value& item) {
  if (targets.size() == 1) {
    frame[targets[0]] = item;
    return;
  }
  const bool iterable = item.is_data() && (item.j().is_array() || item.j().is_string() || item.j().is_object());
  if (!item.is_undefined() && !iterable) eval_fail("cannot unpack non-iterable ", type_name(item), " object");
  const std::vector<Value> parts = iterate(item);
  if (parts.size() > targets.size()) eval_fail("too many values to unpack (expected ", targets.size(), ")");
  if (parts.size() < targets.size())
    eval_fail("not enough values to unpack (expected ", targets.size(), ", got ", parts.size(), ")");
  for (size_t k = 0; k < targets.size(); ++k) frame[targets[k]] = parts[k];
}

void Renderer::exec_set(const Stmt& s, std::string& out) {
  Value value;
  if (s.kind == StmtKind::SetBlock) {
    std::string captured;
    push_frame();
    exec(s.bodies[0], captured);
    frames_.pop_back();
    value = Value::of(std::move(captured));
  } else {
    value = eval(*s.exprs[0]);
  }
  if (s.targets.size() == 1 || (s.flags & Stmt::kUnpack) != 0) {
    bind(*frames_.back(), s.targets, value);
    return;
  }
  const Value ns = lookup(s.targets[0]);
  if (ns.kind != Value::Kind::Object || ns.object->type != Object::Type::Namespace)
    eval_fail("cannot assign attribute on non-namespace object");
  ns.object->set(s.targets[1], std::move(value));
}

Value Renderer::lookup(const std::string& name) const {
  for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
    const auto found = (*it)->find(name);
    if (found != (*it)->end()) return found->second;
  }
  const auto var = variables_.j().find(name);
  if (var != variables_.j().end()) return Value::alias(variables_, *var);
  if (is_global(name)) return Value::function(name);
  return Value::undefined(concat("'", name, "' is undefined"));
}

Value Renderer::eval(const Expr& e) {
  try {
    return eval_node(e);
  } catch (const EvalError& err) {
    fail_at(e.pos, err.what());
  }
}

Value Renderer::eval_node(const Expr& e) {
  const auto arg = [&](size_t i) { return eval(*e.args[i]); };
  switch (e.kind) {
    case ExprKind::Literal: return Value::from(e.literal);
    case ExprKind::Name: return lookup(e.name);
    case ExprKind::List:
    case ExprKind::Dict: return eval_collection(e);
    case ExprKind::Attr: return get_attr(arg(0), e.name);
    case ExprKind::Item: return get_item(arg(0), arg(1));
    case ExprKind::Slice: {
      const Value v = arg(0);
      Value bounds[3];
      for (size_t k = 0; k < 3; ++k)
        if (e.args[k + 1]) bounds[k] = arg(k + 1);
      return slice(v, e.args[1] ? &bounds[0] : nullptr, e.args[2] ? &bounds[1] : nullptr,
                   e.args[3] ? &bounds[2] : nullptr);
    }
    case ExprKind::Call: return eval_call(e);
    case ExprKind::Filter: {
      const Value subject = arg(0);
      return apply_filter(e.name, subject, eval_args(e));
    }
    case ExprKind::Test: {
      const Value subject = arg(0);
      return Value::of(e.negated != apply_test(e.name, subject, eval_args(e)));
    }
    case ExprKind::Unary: return e.name == "not" ? Value::of(!truthy(arg(0))) : unary_op(e.name, arg(0));
    case ExprKind::Binary: {
      const Value a = arg(0);
      return binary_op(e.name, a, arg(1));
    }
    case ExprKind::Concat: {
      std::string s;
      for (size_t i = 0; i < e.args.size(); ++i) {
        s += to_str(arg(i));
        if (s.size() > kMaxSize) eval_fail("a string is over ", kMaxSize, " bytes");
      }
      return Value::of(std::move(s));
    }
    case ExprKind::Compare: return eval_compare(e);
    case ExprKind::And: {
      Value a = arg(0);
      return truthy(a) ? arg(1) : a;
    }
    case ExprKind::Or: {
      Value a = arg(0);
      return truthy(a) ? a : arg(1);
    }
    case ExprKind::CondExpr:
      if (truthy(arg(1))) return arg(0);
      if (e.args[2]) return arg(2);
      return Value::undefined("the inline if-expression evaluated to false and has no else");
  }
  eval_fail("unknown expression");
}

Args Renderer::eval_args(const Expr& e) {
  Args args;
  for (size_t i = 1; i < e.args.size(); ++i) {
    const Expr& arg = *e.args[i];
    if (arg.kind != ExprKind::Unary || arg.name != "*") {
      args.positional.push_back(eval(arg));
      continue;
    }
    const Value spread = eval(*arg.args[0]);  // f(*xs): xs's items
    if (!spread.is_data() || spread.j().is_number() || spread.j().is_boolean() || spread.j().is_null())
      eval_fail("argument after * must be an iterable, not ", type_name(spread));
    for (Value& item : iterate(spread)) args.positional.push_back(std::move(item));
  }
  for (const auto& [name, value] : e.kwargs) {
    if (name != "**") {
      args.named.emplace_back(name, eval(*value));
      continue;
    }
    const Value spread = eval(*value);  // f(**d): d's items
    if (!spread.is_data() || !spread.j().is_object())
      eval_fail("argument after ** must be a mapping, not ", type_name(spread));
    for (auto it = spread.j().begin(); it != spread.j().end(); ++it)
      args.named.emplace_back(it.key(), Value::alias(spread, it.value()));
  }
  return args;
}

Value Renderer::eval_call(const Expr& e) {
  const Expr& callee = *e.args[0];
  if (callee.kind == ExprKind::Attr) {  // a method: 'a'.strip(), d.items(), loop.cycle(...)
    const Value object = eval(*callee.args[0]);
    // ...or a function or macro kept in a namespace or a dict: ns.render(x)
    const Value held = get_attr(object, callee.name);
    if (held.kind == Value::Kind::Function) return call_value(held, e);
    return call_method(object, callee.name, eval_args(e));
  }
  return call_value(eval(callee), e);
}

Value Renderer::call_value(const Value& f, const Expr& e) {
  if (f.kind == Value::Kind::Function && f.macro != nullptr) return call_macro(f, eval_args(e), nullptr);
  if (f.is_method()) {
    Value self = Value::from(f.data);
    self.safe = f.safe;
    return call_method(self, f.name, eval_args(e));
  }
  if (f.kind == Value::Kind::Function) {
    Value result = call_global(f.name, eval_args(e), options_.now_unix);
    if (result.kind == Value::Kind::Object) namespaces_.push_back(result.object);
    return result;
  }
  if (f.is_undefined()) f.fail_undefined();
  eval_fail("'", type_name(f), "' object is not callable");
}

Value Renderer::eval_compare(const Expr& e) {
  Value left = eval(*e.args[0]);
  for (size_t i = 0; i < e.ops.size(); ++i) {
    Value right = eval(*e.args[i + 1]);
    const std::string& op = e.ops[i];
    bool result = false;
    if (op == "==" || op == "!=") {
      result = equal(left, right) == (op == "==");
    } else if (op == "in" || op == "notin") {
      result = contains(right, left) == (op == "in");
    } else {
      const int c = order(left, right, op);
      result = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
    }
    if (!result) return Value::of(false);
    left = std::move(right);
  }
  return Value::of(true);
}

Value Renderer::eval_collection(const Expr& e) {
  json result = e.kind == ExprKind::List ? json::array() : json::object();
  for (size_t i = 0; i < e.args.size(); ++i) {
    if (e.kind == ExprKind::List) {
      result.push_back(to_data(eval(*e.args[i])));
      continue;
    }
    const Value key = eval(*e.args[i]);
    if (!key.is_string()) eval_fail("loom's jinja takes only string keys in a dict, not ", type_name(key));
    result[key.str()] = to_data(eval(*e.args[++i]));
  }
  return Value::of(std::move(result));
}

void Renderer::exec_call_block(const Stmt& s, std::string& out) {
  const Expr& call = *s.exprs[0];
  const Value f = eval(*call.args[0]);
  if (f.kind != Value::Kind::Function || f.macro == nullptr) {
    if (f.is_undefined()) f.fail_undefined();
    eval_fail("a call block calls a macro, not a ", type_name(f));
  }
  // caller() runs the block's body in this scope, which call_macro is about
  // to leave for the macro's: it is outer_'s next entry then.
  Value caller = Value::function("caller");
  caller.macro = &s;
  caller.scope = outer_.size() + 1;
  out += to_str(call_macro(f, eval_args(call), &caller));
}

void Renderer::exec_filter_block(const Stmt& s, std::string& out) {
  std::string captured;
  push_frame();
  exec(s.bodies[0], captured);
  (*frames_.back())[std::string(kBlockText)] = Value::of(std::move(captured));
  out += to_str(eval(*s.exprs[0]));
  frames_.pop_back();
}

Value Renderer::call_macro(const Value& macro, const Args& args, const Value* caller) {
  if (outer_.size() >= static_cast<size_t>(kMaxDepth))
    eval_fail("macros call each other more than ", kMaxDepth, " levels deep");
  const Stmt& m = *macro.macro;
  // A macro sees the scopes it was defined in; caller() its call block's.
  std::vector<std::shared_ptr<Frame>> scope;
  if (m.kind == StmtKind::CallBlock) {
    // Its call block's scope is on outer_ while the macro it called runs.
    if (macro.scope == 0 || macro.scope > outer_.size()) eval_fail("caller() called outside its call block");
    scope = outer_[macro.scope - 1];
  } else {
    LOOM_CHECK(macro.closure != nullptr, "a macro without its closure", m.text);
    scope = macro.closure->outer;
    if (std::shared_ptr<Frame> own = macro.closure->own.lock()) scope.push_back(std::move(own));
  }
  scope.push_back(std::make_shared<Frame>());
  outer_.push_back(std::move(frames_));
  frames_ = std::move(scope);
  std::string out;
  try {
    bind_params(m, args, caller);
    exec(m.bodies[0], out);
  } catch (...) {
    frames_ = std::move(outer_.back());
    outer_.pop_back();
    throw;
  }
  frames_ = std::move(outer_.back());
  outer_.pop_back();
  return Value::of(std::move(out));
}

// Python's binding of a call's arguments to the parameters, as jinja2's
// Macro: extra positional ones to varargs and unknown names to kwargs where
// the body reads them, an error otherwise; a missing one is undefined.
void Renderer::bind_params(const Stmt& m, const Args& args, const Value* caller) {
  const bool is_caller = m.kind == StmtKind::CallBlock;
  const std::string what = is_caller ? std::string("caller") : concat("macro '", m.text, "'");
  Frame& frame = *frames_.back();
  const size_t n = m.targets.size();
  if (args.positional.size() > n && (m.flags & Stmt::kVarargs) == 0)
    eval_fail(what, " takes not more than ", n, " argument(s)");
  json varargs = json::array(), kwargs = json::object();
  for (size_t i = n; i < args.positional.size(); ++i) varargs.push_back(to_data(args.positional[i]));
  std::vector<bool> given(n, false);
  for (size_t i = 0; i < std::min(n, args.positional.size()); ++i) frame[m.targets[i]] = args.positional[i], given[i] = true;
  for (const auto& [key, value] : args.named) {
    const auto it = std::find(m.targets.begin(), m.targets.end(), key);
    if (it != m.targets.end()) {
      const auto k = static_cast<size_t>(it - m.targets.begin());
      if (given[k]) eval_fail(what, " got multiple values for argument '", key, "'");
      frame[key] = value, given[k] = true;
    } else if (key == "caller" && !is_caller) {
      eval_fail(what, " takes no keyword argument 'caller'");
    } else if ((m.flags & Stmt::kKwargs) != 0) {
      kwargs[key] = to_data(value);
    } else {
      eval_fail(what, " takes no keyword argument '", key, "'");
    }
  }
  const size_t first_default = is_caller ? 1 : 0;  // a call block's exprs start with the call
  for (size_t k = 0; k < n; ++k) {
    if (given[k]) continue;
    const Expr* fallback = m.exprs[first_default + k].get();
    frame[m.targets[k]] = fallback != nullptr ? eval(*fallback)
                                              : Value::undefined(concat("parameter '", m.targets[k], "' was not provided"));
  }
  if ((m.flags & Stmt::kVarargs) != 0) frame["varargs"] = Value::of(std::move(varargs));
  if ((m.flags & Stmt::kKwargs) != 0) frame["kwargs"] = Value::of(std::move(kwargs));
  if (caller != nullptr) frame["caller"] = *caller;
}

}  // namespace loom::serve::jinja
