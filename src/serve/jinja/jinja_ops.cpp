// Operators with Python's semantics: ints stay ints (/ always gives a
// float, // and % floor), bools count as ints, + joins strs and lists, *
// repeats them; undefined operands are jinja2's errors.
#include <cmath>
#include <limits>

#include "serve/jinja/jinja_eval.h"
#include "serve/jinja/jinja_text.h"

namespace loom::serve::jinja {

namespace {

bool number_like(const Value& v) { return v.is_data() && (v.j().is_number() || v.j().is_boolean()); }
bool both_int(const Value& a, const Value& b) { return is_int(a.j()) && is_int(b.j()); }
double as_double(const json& j) { return is_int(j) ? static_cast<double>(as_int(j)) : j.get<double>(); }

[[noreturn]] void overflow() { eval_fail("integer overflow: loom's jinja has 64-bit integers"); }

[[noreturn]] void unsupported(std::string_view op, const Value& a, const Value& b) {
  eval_fail("unsupported operand type(s) for ", op, ": '", type_name(a), "' and '", type_name(b), "'");
}

// Python's float divmod: the quotient floored, the remainder with b's sign.
std::pair<double, double> float_divmod(double a, double b) {
  if (b == 0.0) eval_fail("float division by zero");
  double mod = std::fmod(a, b);
  double div = (a - mod) / b;
  if (mod != 0.0) {
    if ((b < 0) != (mod < 0)) {
      mod += b;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, b);
  }
  double floordiv = 0.0;
  if (div != 0.0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, a / b);
  }
  return {floordiv, mod};
}

Value int_op(char op, int64_t a, int64_t b) {
  int64_t r = 0;
  switch (op) {
    case '+': if (__builtin_add_overflow(a, b, &r)) overflow(); return Value::of(r);
    case '-': if (__builtin_sub_overflow(a, b, &r)) overflow(); return Value::of(r);
    case '*': if (__builtin_mul_overflow(a, b, &r)) overflow(); return Value::of(r);
    default: break;
  }
  if (b == 0) eval_fail("integer division or modulo by zero");
  if (b == -1) {  // a // -1 and a % -1 without INT64_MIN / -1's overflow
    if (op == '%') return Value::of(int64_t{0});
    if (a == std::numeric_limits<int64_t>::min()) overflow();
    return Value::of(-a);
  }
  int64_t q = a / b, m = a % b;
  if (m != 0 && ((m < 0) != (b < 0))) --q, m += b;
  return Value::of(op == '%' ? m : q);
}

Value int_pow(int64_t base, int64_t exp) {
  if (exp < 0) {
    if (base == 0) eval_fail("0.0 cannot be raised to a negative power");
    return Value::of(std::pow(static_cast<double>(base), static_cast<double>(exp)));
  }
  int64_t result = 1;
  while (exp > 0) {
    if ((exp & 1) && __builtin_mul_overflow(result, base, &result)) overflow();
    exp >>= 1;
    if (exp > 0 && __builtin_mul_overflow(base, base, &base)) overflow();
  }
  return Value::of(result);
}

Value arithmetic(std::string_view op, const Value& a, const Value& b) {
  const char c = op == "//" ? 'f' : op == "**" ? 'p' : op[0];
  if (both_int(a, b)) {
    const int64_t x = as_int(a.j()), y = as_int(b.j());
    if (c == '/') {
      if (y == 0) eval_fail("division by zero");
      return Value::of(static_cast<double>(x) / static_cast<double>(y));
    }
    if (c == 'p') return int_pow(x, y);
    return int_op(c == 'f' ? '/' : c, x, y);
  }
  const double x = as_double(a.j()), y = as_double(b.j());
  switch (c) {
    case '+': return Value::of(x + y);
    case '-': return Value::of(x - y);
    case '*': return Value::of(x * y);
    case '/':
      if (y == 0.0) eval_fail("float division by zero");
      return Value::of(x / y);
    case 'f': return Value::of(float_divmod(x, y).first);
    case '%': return Value::of(float_divmod(x, y).second);
    default: break;
  }
  if (x == 0.0 && y < 0) eval_fail("0.0 cannot be raised to a negative power");
  if (x < 0 && y != std::floor(y)) eval_fail("a negative number to a fractional power is complex");
  return Value::of(std::pow(x, y));
}

// s * n or list * n.
Value repeat(const Value& seq, int64_t n) {
  const json& j = seq.j();
  const size_t size = j.is_string() ? j.get_ref<const std::string&>().size() : j.size();
  if (n > 0 && size > 0 && static_cast<uint64_t>(n) > kMaxSize / size)
    eval_fail("the repeated ", type_name(seq), " would be over ", kMaxSize, " bytes or items");
  json out = j.is_string() ? json(std::string()) : json::array();
  if (size == 0) return seq.safe ? Value::markup("") : Value::of(std::move(out));
  for (int64_t k = 0; k < n; ++k) {
    if (j.is_string()) {
      out.get_ref<std::string&>() += j.get_ref<const std::string&>();
    } else {
      for (const json& e : j) out.push_back(e);
    }
  }
  Value result = Value::of(std::move(out));
  result.safe = seq.safe;
  return result;
}

}  // namespace

Value binary_op(std::string_view op, const Value& a, const Value& b) {
  if (a.is_undefined()) a.fail_undefined();
  if (b.is_undefined()) b.fail_undefined();
  if (number_like(a) && number_like(b)) return arithmetic(op, a, b);
  if (!a.is_data() || !b.is_data()) unsupported(op, a, b);
  const json &x = a.j(), &y = b.j();
  if (op == "+" && x.type() == y.type() && (x.is_string() || x.is_array())) {
    const auto size = [](const json& j) { return j.is_string() ? j.get_ref<const std::string&>().size() : j.size(); };
    if (size(x) + size(y) > kMaxSize) eval_fail("the sum would be over ", kMaxSize, " bytes or items");
    if (x.is_string() && (a.safe || b.safe)) {  // Markup + str escapes the str
      std::string sum = a.safe ? a.str() : text::html_escape(a.str());
      sum += b.safe ? b.str() : text::html_escape(b.str());
      return Value::markup(std::move(sum));
    }
    json sum = x;
    if (x.is_string()) {
      sum.get_ref<std::string&>() += y.get_ref<const std::string&>();
    } else {
      for (const json& e : y) sum.push_back(e);
    }
    return Value::of(std::move(sum));
  }
  if (op == "*" && (x.is_string() || x.is_array()) && is_int(y)) return repeat(a, as_int(y));
  if (op == "*" && (y.is_string() || y.is_array()) && is_int(x)) return repeat(b, as_int(x));
  if (op == "%" && x.is_string()) eval_fail("loom's jinja does not support % string formatting");
  unsupported(op, a, b);
}

Value unary_op(std::string_view op, const Value& a) {
  if (a.is_undefined()) a.fail_undefined();
  if (!number_like(a)) eval_fail("bad operand type for unary ", op, ": '", type_name(a), "'");
  if (!is_int(a.j())) return Value::of(op == "-" ? -a.j().get<double>() : a.j().get<double>());
  const int64_t x = as_int(a.j());
  if (op == "+") return Value::of(x);
  if (x == std::numeric_limits<int64_t>::min()) overflow();
  return Value::of(-x);
}

bool contains(const Value& container, const Value& item) {
  if (container.is_undefined()) return false;
  if (!container.is_data()) eval_fail("argument of type '", type_name(container), "' is not iterable");
  const json& c = container.j();
  if (c.is_string()) {
    if (!item.is_string()) eval_fail("'in <string>' requires string as left operand, not ", type_name(item));
    return c.get_ref<const std::string&>().find(item.str()) != std::string::npos;
  }
  if (c.is_array()) {
    for (const json& e : c)
      if (equal(Value::alias(container, e), item)) return true;
    return false;
  }
  if (c.is_object()) return item.is_string() && c.contains(item.str());
  eval_fail("argument of type '", type_name(container), "' is not iterable");
}

Value slice(const Value& v, const Value* start, const Value* stop, const Value* step) {
  if (v.is_undefined()) v.fail_undefined();
  const auto bound = [](const Value* b, int64_t& out) {
    if (b == nullptr || (b->is_data() && b->j().is_null())) return true;
    if (!b->is_data() || !is_int(b->j())) return false;
    out = as_int(b->j());
    return true;
  };
  const bool seq = v.is_data() && (v.j().is_array() || v.j().is_string());
  int64_t first = 0, last = 0, stride = 1;
  const bool has_first = start != nullptr && !(start->is_data() && start->j().is_null());
  const bool has_last = stop != nullptr && !(stop->is_data() && stop->j().is_null());
  if (!seq || !bound(step, stride) || !bound(start, first) || !bound(stop, last))
    return Value::undefined(concat("'", type_name(v), " object' cannot be sliced that way"));
  if (stride == 0) eval_fail("slice step cannot be zero");
  const int64_t n = length(v);
  // Python's PySlice_AdjustIndices.
  const auto adjust = [&](bool given, int64_t x, int64_t fallback) {
    if (!given) return fallback;
    if (x < 0) x += n;
    if (x < 0) return stride < 0 ? int64_t{-1} : int64_t{0};
    if (x >= n) return stride < 0 ? n - 1 : n;
    return x;
  };
  first = adjust(has_first, first, stride < 0 ? n - 1 : 0);
  last = adjust(has_last, last, stride < 0 ? -1 : n);
  const bool is_string = v.j().is_string();
  const std::vector<size_t> starts = is_string ? text::char_starts(v.str()) : std::vector<size_t>{};
  json out = is_string ? json(std::string()) : json::array();
  const uint64_t magnitude = stride < 0 ? uint64_t{0} - static_cast<uint64_t>(stride) : static_cast<uint64_t>(stride);
  const int64_t span = stride > 0 ? last - first : first - last;  // both in [-1, n]
  const uint64_t count = span > 0 ? (static_cast<uint64_t>(span) - 1) / magnitude + 1 : 0;
  for (uint64_t step_k = 0; step_k < count; ++step_k) {  // count > 1 only when |stride| < n
    const auto k = static_cast<size_t>(first + static_cast<int64_t>(step_k) * stride);
    if (is_string) {
      out.get_ref<std::string&>() += v.str().substr(starts[k], starts[k + 1] - starts[k]);
    } else {
      out.push_back(v.j()[k]);
    }
  }
  Value result = Value::of(std::move(out));
  result.safe = v.safe;
  return result;
}

}  // namespace loom::serve::jinja
