#include "serve/jinja/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cmath>
#include <iterator>
#include <limits>
#include <random>

#include "serve/jinja/jinja_text.h"

namespace loom::serve::jinja {

Value Value::from(std::shared_ptr<const json> j) {
  Value v;
  v.kind = Kind::Data;
  v.data = std::move(j);
  return v;
}

namespace {

thread_local CallableTable* g_callables = nullptr;

}  // namespace

const Value* callable_of(const json& j) {
  if (g_callables == nullptr || !j.is_object() || j.size() != 2) return nullptr;
  const auto index = j.find(kCallableKey), nonce = j.find(kNonceKey);
  if (index == j.end() || nonce == j.end() || !index->is_number_unsigned() || !nonce->is_number_unsigned() ||
      nonce->get<uint64_t>() != g_callables->nonce || index->get<uint64_t>() >= g_callables->values.size())
    return nullptr;
  return &g_callables->values[index->get<uint64_t>()];
}

uint64_t random_u64() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) | rd();
}

CallableTable::CallableTable() : nonce(random_u64()) {
  previous_ = g_callables;
  g_callables = this;
}

CallableTable::~CallableTable() { g_callables = previous_; }

Value Value::alias(const Value& parent, const json& element) {
  if (const Value* callable = callable_of(element)) return *callable;
  return from(std::shared_ptr<const json>(parent.data, &element));
}

Value Value::undefined(std::string why) {
  Value v;
  v.name = std::move(why);
  return v;
}

Value Value::function(std::string function_name) {
  Value v;
  v.kind = Kind::Function;
  v.name = std::move(function_name);
  return v;
}

Value Value::method(const Value& self, std::string method_name) {
  Value v = function(std::move(method_name));
  v.data = self.data;
  v.safe = self.safe;
  return v;
}

void Value::fail_undefined() const { eval_fail(name.empty() ? std::string("undefined value") : name); }

const Value* Object::find(std::string_view attr) const {
  for (const auto& [key, value] : attrs)
    if (key == attr) return &value;
  return nullptr;
}

void Object::set(const std::string& attr, Value value) {
  for (auto& [key, old] : attrs) {
    if (key == attr) {
      old = std::move(value);
      return;
    }
  }
  attrs.emplace_back(attr, std::move(value));
}

namespace {

std::string json_type_name(const json& j) {
  switch (j.type()) {
    case json::value_t::null: return "NoneType";
    case json::value_t::boolean: return "bool";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "int";
    case json::value_t::number_float: return "float";
    case json::value_t::string: return "str";
    case json::value_t::array: return "list";
    case json::value_t::object: return "dict";
    default: return "object";
  }
}

// jinja2's object_type_repr, for undefined messages: 'None' or 'list object'.
std::string object_type_repr(const Value& v) {
  if (v.is_data() && v.j().is_null()) return "None";
  return concat(type_name(v), " object");
}

bool is_number_like(const json& j) { return j.is_number() || j.is_boolean(); }

// Exact for every int64, uint64 and double (x86's 64-bit mantissa), as
// Python compares ints with floats exactly.
long double to_ld(const json& j) {
  if (j.is_boolean()) return j.get<bool>() ? 1.0L : 0.0L;
  if (j.is_number_unsigned()) return static_cast<long double>(j.get<uint64_t>());
  if (j.is_number_integer()) return static_cast<long double>(j.get<int64_t>());
  return static_cast<long double>(j.get<double>());
}

bool json_equal(const json& a, const json& b) {
  if (is_number_like(a) && is_number_like(b)) return to_ld(a) == to_ld(b);
  if (a.type() != b.type()) return false;
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!json_equal(a[i], b[i])) return false;
    return true;
  }
  if (a.is_object()) {  // Python's dicts are equal in any order
    if (a.size() != b.size()) return false;
    for (auto ia = a.begin(); ia != a.end(); ++ia) {
      const auto ib = b.find(ia.key());
      if (ib == b.end() || !json_equal(ia.value(), ib.value())) return false;
    }
    return true;
  }
  return a == b;
}

int json_order(const json& a, const json& b, bool& ordered) {
  if (is_number_like(a) && is_number_like(b)) {
    const long double x = to_ld(a), y = to_ld(b);
    return x < y ? -1 : y < x ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.get_ref<const std::string&>().compare(b.get_ref<const std::string&>());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_array() && b.is_array()) {
    for (size_t i = 0; i < a.size() && i < b.size(); ++i)
      if (!json_equal(a[i], b[i])) return json_order(a[i], b[i], ordered);
    return a.size() < b.size() ? -1 : a.size() > b.size() ? 1 : 0;
  }
  ordered = false;
  return 0;
}

}  // namespace

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "Undefined";
    case Value::Kind::Data: return json_type_name(v.j());
    case Value::Kind::Object: return v.object->type == Object::Type::Loop ? "LoopContext" : "Namespace";
    case Value::Kind::Function:
      return v.macro != nullptr ? "Macro" : v.is_method() ? "builtin_function_or_method" : "function";
  }
  return "object";
}

bool is_int(const json& j) { return j.is_number_integer() || j.is_boolean(); }

int64_t as_int(const json& j) {
  if (j.is_boolean()) return j.get<bool>() ? 1 : 0;
  if (j.is_number_unsigned()) {
    const uint64_t u = j.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      eval_fail("integer ", u, " is past loom's 64-bit integers");
    return static_cast<int64_t>(u);
  }
  return j.get<int64_t>();
}

bool truthy(const Value& v) {
  if (v.kind == Value::Kind::Undefined) return false;
  if (v.generator) return true;  // a generator object is true even when it yields nothing
  if (v.kind != Value::Kind::Data) return true;
  const json& j = v.j();
  switch (j.type()) {
    case json::value_t::null: return false;
    case json::value_t::boolean: return j.get<bool>();
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return to_ld(j) != 0;
    case json::value_t::number_float: return j.get<double>() != 0.0;
    case json::value_t::string: return !j.get_ref<const std::string&>().empty();
    default: return !j.empty();
  }
}

std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  const std::string sci(buf, result.ptr);  // shortest round trip: "-1.2345e+02"
  const size_t e_at = sci.find('e');
  const bool negative = sci[0] == '-';
  std::string digits;
  for (size_t i = negative ? 1 : 0; i < e_at; ++i)
    if (sci[i] != '.') digits += sci[i];
  const int exp = std::stoi(sci.substr(e_at + 1));
  std::string out = negative ? "-" : "";
  if (exp >= -4 && exp < 16) {  // Python's repr switches to exponents outside [1e-4, 1e16)
    if (exp < 0) {
      out += "0.";
      out.append(static_cast<size_t>(-exp - 1), '0');
      out += digits;
      return out;
    }
    const auto int_len = static_cast<size_t>(exp + 1);
    if (digits.size() <= int_len) {
      out += digits;
      out.append(int_len - digits.size(), '0');
      out += ".0";
      return out;
    }
    out += std::string_view(digits).substr(0, int_len);
    out += '.';
    out += std::string_view(digits).substr(int_len);
    return out;
  }
  out += digits[0];
  if (digits.size() > 1) {
    out += '.';
    out += std::string_view(digits).substr(1);
  }
  const int mag = exp < 0 ? -exp : exp;
  out += exp < 0 ? "e-" : "e+";
  if (mag < 10) out += '0';
  out += std::to_string(mag);
  return out;
}

std::string repr(const json& j) {
  if (const Value* callable = callable_of(j)) return repr(*callable);
  switch (j.type()) {
    case json::value_t::null: return "None";
    case json::value_t::boolean: return j.get<bool>() ? "True" : "False";
    case json::value_t::number_integer: return std::to_string(j.get<int64_t>());
    case json::value_t::number_unsigned: return std::to_string(j.get<uint64_t>());
    case json::value_t::number_float: return float_repr(j.get<double>());
    case json::value_t::string: return text::repr(j.get_ref<const std::string&>());
    case json::value_t::array: {
      std::string out = "[";
      for (size_t i = 0; i < j.size(); ++i) {
        if (i > 0) out += ", ";
        out += repr(j[i]);
      }
      out += ']';
      return out;
    }
    case json::value_t::object: {
      std::string out = "{";
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (it != j.begin()) out += ", ";
        out += text::repr(it.key());
        out += ": ";
        out += repr(it.value());
      }
      out += '}';
      return out;
    }
    default: return "<object>";
  }
}

namespace {

// Namespaces can hold themselves: past a few levels they print as "...".
std::string repr_at(const Value& v, int depth) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "Undefined";
    case Value::Kind::Data: return repr(v.j());
    case Value::Kind::Function:
      if (v.is_method()) return concat("<built-in method ", v.name, " of ", type_name(Value::from(v.data)), " object>");
      return v.macro != nullptr ? concat("<Macro '", v.name, "'>") : concat("<function ", v.name, ">");
    case Value::Kind::Object: break;
  }
  if (v.object->type == Object::Type::Loop) return "<LoopContext>";
  if (depth > 8) return "<Namespace {...}>";
  std::string out = "<Namespace {";
  for (size_t i = 0; i < v.object->attrs.size(); ++i) {
    if (i > 0) out += ", ";
    out += text::repr(v.object->attrs[i].first);
    out += ": ";
    out += repr_at(v.object->attrs[i].second, depth + 1);
  }
  out += "}>";
  return out;
}

}  // namespace

std::string repr(const Value& v) { return repr_at(v, 0); }

std::string to_str(const Value& v) {
  if (v.is_undefined()) return "";
  if (v.is_string()) return v.str();
  return repr(v);
}

bool equal(const Value& a, const Value& b) {
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::Undefined: return true;
    case Value::Kind::Data: return json_equal(a.j(), b.j());
    case Value::Kind::Object: return a.object == b.object;
    case Value::Kind::Function: return a.name == b.name && a.data == b.data;  // a method: of the same object
  }
  return false;
}

int order(const Value& a, const Value& b, std::string_view op) {
  if (a.is_undefined()) a.fail_undefined();
  if (b.is_undefined()) b.fail_undefined();
  bool ordered = a.is_data() && b.is_data();
  const int c = ordered ? json_order(a.j(), b.j(), ordered) : 0;
  if (!ordered)
    eval_fail("'", op, "' not supported between instances of '", type_name(a), "' and '", type_name(b), "'");
  return c;
}

json to_data(const Value& v) {
  if (v.kind == Value::Kind::Function && g_callables != nullptr) {
    g_callables->values.push_back(v);
    return json{{std::string(kCallableKey), g_callables->values.size() - 1}, {std::string(kNonceKey), g_callables->nonce}};
  }
  if (v.is_data()) {
    if ((v.j().is_array() || v.j().is_object()) && data_depth(v.j()) >= kMaxDataDepth)
      eval_fail("loom's jinja keeps data at most ", kMaxDataDepth, " levels deep");
    return v.j();
  }
  if (v.is_undefined())
    eval_fail("loom's jinja cannot put an undefined value in a list or dict (", v.name, ")");
  eval_fail("loom's jinja cannot put a ", type_name(v), " in a list or dict");
}

std::vector<Value> iterate(const Value& v) {
  std::vector<Value> items;
  if (v.is_undefined()) return items;
  if (!v.is_data()) eval_fail("'", type_name(v), "' object is not iterable");
  const json& j = v.j();
  if (j.is_array()) {
    items.reserve(j.size());
    for (const json& e : j) items.push_back(Value::alias(v, e));
  } else if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) items.push_back(Value::of(it.key()));
  } else if (j.is_string()) {
    const std::string& s = v.str();
    const std::vector<size_t> starts = text::char_starts(s);
    for (size_t k = 0; k + 1 < starts.size(); ++k)
      items.push_back(Value::of(s.substr(starts[k], starts[k + 1] - starts[k])));
  } else {
    eval_fail("'", type_name(v), "' object is not iterable");
  }
  return items;
}

int64_t length(const Value& v) {
  if (v.is_undefined()) return 0;
  if (v.is_data()) {
    if (v.j().is_string()) return static_cast<int64_t>(text::char_count(v.str()));
    if (v.j().is_array() || v.j().is_object()) return static_cast<int64_t>(v.j().size());
  }
  eval_fail("object of type '", type_name(v), "' has no len()");
}

Value loop_attr(const Object& loop, std::string_view attr) {
  const auto n = static_cast<int64_t>(loop.items->size());
  const auto i = static_cast<int64_t>(loop.index);
  if (attr == "index") return Value::of(i + 1);
  if (attr == "index0") return Value::of(i);
  if (attr == "first") return Value::of(i == 0);
  if (attr == "last") return Value::of(i == n - 1);
  if (attr == "length") return Value::of(n);
  if (attr == "revindex") return Value::of(n - i);
  if (attr == "revindex0") return Value::of(n - i - 1);
  if (attr == "depth") return Value::of(1);
  if (attr == "depth0") return Value::of(0);
  if (attr == "previtem") return i > 0 ? (*loop.items)[loop.index - 1] : Value::undefined("there is no previous item");
  if (attr == "nextitem") return i + 1 < n ? (*loop.items)[loop.index + 1] : Value::undefined("there is no next item");
  return Value::undefined(concat("'LoopContext object' has no attribute '", attr, "'"));
}

namespace {

// Python's methods of str and of dict, less those the immutable sandbox
// hides (kDictMutators).
constexpr std::string_view kStrMethods[] = {
    "capitalize", "casefold", "center", "count", "encode", "endswith", "expandtabs", "find", "format",
    "format_map", "index", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier", "islower",
    "isnumeric", "isprintable", "isspace", "istitle", "isupper", "join", "ljust", "lower", "lstrip", "maketrans",
    "partition", "removeprefix", "removesuffix", "replace", "rfind", "rindex", "rjust", "rpartition", "rsplit",
    "rstrip", "split", "splitlines", "startswith", "strip", "swapcase", "title", "translate", "upper", "zfill"};
constexpr std::string_view kDictMethods[] = {"copy", "fromkeys", "get", "items", "keys", "values"};
constexpr std::string_view kDictMutators[] = {"clear", "pop", "popitem", "setdefault", "update"};

template <size_t N>
bool listed(const std::string_view (&names)[N], std::string_view name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

// getattr(v, attr) in jinja2's ImmutableSandboxedEnvironment for a str or
// dict: a bound method, or undefined for a method that changes the dict;
// nothing where Python has no such attribute.
std::optional<Value> python_attr(const Value& v, std::string_view attr) {
  if (!v.is_data() || !(v.j().is_string() || v.j().is_object())) return std::nullopt;
  if (v.j().is_string() ? listed(kStrMethods, attr) : listed(kDictMethods, attr))
    return Value::method(v, std::string(attr));
  if (v.j().is_object() && listed(kDictMutators, attr))
    return Value::undefined(concat("access to attribute '", attr, "' of 'dict' object is unsafe."));
  return std::nullopt;
}

// v[key] for a dict, a namespace or the loop: the key, or the attribute.
Value get_key(const Value& v, std::string_view key, bool attribute_first) {
  if (attribute_first)
    if (std::optional<Value> attr = python_attr(v, key)) return *attr;
  if (v.kind == Value::Kind::Object && v.object->type == Object::Type::Loop) return loop_attr(*v.object, key);
  if (v.kind == Value::Kind::Object) {
    if (const Value* found = v.object->find(key)) return *found;
  } else if (v.is_data() && v.j().is_object()) {
    const auto it = v.j().find(key);
    if (it != v.j().end()) return Value::alias(v, *it);
  }
  if (!attribute_first)
    if (std::optional<Value> attr = python_attr(v, key)) return *attr;
  return Value::undefined(concat("'", object_type_repr(v), "' has no attribute '", key, "'"));
}

}  // namespace

Value get_attr(const Value& v, std::string_view attr) {
  if (v.is_undefined()) v.fail_undefined();
  return get_key(v, attr, true);
}

Value get_item(const Value& v, const Value& key) {
  if (v.is_undefined()) v.fail_undefined();
  if (key.is_string()) return get_key(v, key.str(), false);
  if (v.is_data() && key.is_data() && is_int(key.j()) && (v.j().is_array() || v.j().is_string())) {
    const int64_t n = length(v);
    int64_t i = as_int(key.j());
    if (i < 0) i += n;
    if (i >= 0 && i < n) {
      if (v.j().is_array()) return Value::alias(v, v.j()[static_cast<size_t>(i)]);
      const std::vector<size_t> starts = text::char_starts(v.str());
      const auto k = static_cast<size_t>(i);
      return v.same_safety(v.str().substr(starts[k], starts[k + 1] - starts[k]));
    }
  }
  return Value::undefined(concat("'", object_type_repr(v), "' has no element ", repr(key)));
}


}  // namespace loom::serve::jinja
