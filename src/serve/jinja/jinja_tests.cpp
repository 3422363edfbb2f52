// jinja2's tests (`x is defined`, `n is divisibleby 3`), as jinja2/tests.py
// defines them; undefined is iterable and a sequence there, and even/odd
// compute value % 2 as Python does.
#include <map>

#include "serve/jinja/jinja_eval.h"

namespace loom::serve::jinja {

namespace {

using TestFn = bool (*)(const Value& v, const Args& a);

bool data_is(const Value& v, bool (json::*is)() const noexcept) { return v.is_data() && (v.j().*is)(); }

const Value& argument(const Args& a, std::string_view test) {
  a.check(test, {"other"});
  const Value* other = a.get(0, "other");
  if (other == nullptr) eval_fail("the '", test, "' test needs an argument");
  return *other;
}

bool t_defined(const Value& v, const Args&) { return !v.is_undefined(); }
bool t_undefined(const Value& v, const Args&) { return v.is_undefined(); }
bool t_none(const Value& v, const Args&) { return data_is(v, &json::is_null); }
bool t_string(const Value& v, const Args&) { return data_is(v, &json::is_string); }
bool t_mapping(const Value& v, const Args&) { return data_is(v, &json::is_object); }
bool t_boolean(const Value& v, const Args&) { return data_is(v, &json::is_boolean); }
bool t_float(const Value& v, const Args&) { return data_is(v, &json::is_number_float); }
bool t_integer(const Value& v, const Args&) { return data_is(v, &json::is_number_integer); }
bool t_number(const Value& v, const Args&) { return data_is(v, &json::is_number) || t_boolean(v, {}); }
bool t_true(const Value& v, const Args&) { return t_boolean(v, {}) && v.j().get<bool>(); }
bool t_false(const Value& v, const Args&) { return t_boolean(v, {}) && !v.j().get<bool>(); }
bool t_callable(const Value& v, const Args&) { return v.kind == Value::Kind::Function; }

bool t_iterable(const Value& v, const Args&) {
  return v.is_undefined() || data_is(v, &json::is_string) || data_is(v, &json::is_array) || t_mapping(v, {});
}

bool remainder_is(const Value& v, const Value& divisor, int64_t expected) {
  return equal(binary_op("%", v, divisor), Value::of(expected));
}

bool t_even(const Value& v, const Args&) { return remainder_is(v, Value::of(2), 0); }
bool t_odd(const Value& v, const Args&) { return remainder_is(v, Value::of(2), 1); }
bool t_divisibleby(const Value& v, const Args& a) { return remainder_is(v, argument(a, "divisibleby"), 0); }
bool t_eq(const Value& v, const Args& a) { return equal(v, argument(a, "eq")); }
bool t_ne(const Value& v, const Args& a) { return !equal(v, argument(a, "ne")); }
bool t_lt(const Value& v, const Args& a) { return order(v, argument(a, "lt"), "<") < 0; }
bool t_le(const Value& v, const Args& a) { return order(v, argument(a, "le"), "<=") <= 0; }
bool t_gt(const Value& v, const Args& a) { return order(v, argument(a, "gt"), ">") > 0; }
bool t_ge(const Value& v, const Args& a) { return order(v, argument(a, "ge"), ">=") >= 0; }
bool t_in(const Value& v, const Args& a) { return contains(argument(a, "in"), v); }

// Python's `is`: None, True and False are single objects; other values are
// the same object only when they are the same data.
bool t_sameas(const Value& v, const Args& a) {
  const Value& other = argument(a, "sameas");
  if (!v.is_data() || !other.is_data()) return v.kind == other.kind && equal(v, other);
  if (v.j().is_null() || v.j().is_boolean()) return v.j() == other.j() && v.j().type() == other.j().type();
  return v.data == other.data;
}

const std::map<std::string_view, TestFn>& tests() {
  static const std::map<std::string_view, TestFn> table = {
      {"!=", t_ne},         {"<", t_lt},          {"<=", t_le},           {"==", t_eq},
      {">", t_gt},          {">=", t_ge},         {"boolean", t_boolean}, {"callable", t_callable},
      {"defined", t_defined}, {"divisibleby", t_divisibleby}, {"eq", t_eq}, {"equalto", t_eq},
      {"even", t_even},     {"false", t_false},   {"float", t_float},     {"ge", t_ge},
      {"greaterthan", t_gt}, {"gt", t_gt},        {"in", t_in},           {"integer", t_integer},
      {"iterable", t_iterable}, {"le", t_le},     {"lessthan", t_lt},     {"lt", t_lt},
      {"mapping", t_mapping}, {"ne", t_ne},       {"none", t_none},       {"number", t_number},
      {"odd", t_odd},       {"sameas", t_sameas}, {"sequence", t_iterable}, {"string", t_string},
      {"true", t_true},     {"undefined", t_undefined},
  };
  return table;
}

}  // namespace

bool has_test(std::string_view name) { return tests().contains(name); }

bool apply_test(const std::string& name, const Value& subject, const Args& args) {
  const auto it = tests().find(name);
  if (it == tests().end()) eval_fail("no test named '", name, "'");
  // `x is defined not in y` passes `not` as an argument, as in jinja2.
  const auto t = it->second;
  const bool takes_argument = t == t_divisibleby || t == t_eq || t == t_ne || t == t_lt || t == t_le || t == t_gt ||
                              t == t_ge || t == t_in || t == t_sameas;
  if (!takes_argument && !(args.positional.empty() && args.named.empty()))
    eval_fail("test_", name, "() takes 1 positional argument but ", 1 + args.positional.size(), " were given");
  return t(subject, args);
}

}  // namespace loom::serve::jinja
