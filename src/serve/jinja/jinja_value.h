// Values as a Jinja2 template sees them (private to src/serve/jinja*.cpp):
// JSON data shared, never copied, between variables, elements and results;
// jinja2's undefined; namespace() and loop objects; global functions. The
// operations follow Python's semantics for str(), repr(), ==, <, len() and
// truthiness, and jinja2's for undefined values.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace loom::serve::jinja {

using json = nlohmann::ordered_json;

// Strings and lists a template builds stay under this many bytes or items.
constexpr size_t kMaxSize = size_t{1} << 26;
// Data nests at most this deep (variables, and what a template builds):
// every walk over data (repr, ==, tojson, copies) recurses once a level.
constexpr size_t kMaxDataDepth = 512;

// An evaluation error whose position the evaluator adds ("jinja:L:C: ...").
class EvalError : public loom::Error {
 public:
  explicit EvalError(const std::string& what) : loom::Error(what) {}
};

template <typename... Args>
[[noreturn]] void eval_fail(Args&&... args) {
  throw EvalError(concat(std::forward<Args>(args)...));
}

struct Closure;
struct Object;
struct Stmt;

struct Value {
  enum class Kind : uint8_t { Undefined, Data, Object, Function };
  Kind kind = Kind::Undefined;
  std::shared_ptr<const json> data;  // Data
  std::shared_ptr<Object> object;    // Object
  std::string name;                  // Undefined: the error using it gives; Function: its name
  // A Function with data is a bound method of that str or dict (d.items,
  // 'x'.upper): what jinja2's getattr finds before a dict's keys.
  // A macro (a Function): its {% macro %} and the scopes it sees, or the
  // {% call %} block whose body `caller` runs and the scope it runs in
  // (Renderer's).
  const Stmt* macro = nullptr;
  std::shared_ptr<const Closure> closure;
  size_t scope = 0;
  // A str that is jinja2's Markup (from tojson, safe, escape): `+` with a
  // plain str HTML-escapes the plain one, as markupsafe does.
  bool safe = false;
  // A list that is jinja2's generator (select, reject, selectattr,
  // rejectattr, map, unique): iterated as a list, but always true, and
  // length / count / last are errors, as jinja2 raises for a generator (a
  // template must |list it). Not modelled: a generator empty on its second pass.
  bool generator = false;

  static Value of(json j) { return from(std::make_shared<const json>(std::move(j))); }
  static Value markup(std::string s) {
    Value v = of(std::move(s));
    v.safe = true;
    return v;
  }
  // s as a str that is Markup when this one is (Markup's str methods keep it).
  Value same_safety(std::string s) const { return safe ? markup(std::move(s)) : of(std::move(s)); }
  static Value from(std::shared_ptr<const json> j);
  // element, which lives inside *parent.data: shares parent's ownership.
  static Value alias(const Value& parent, const json& element);
  static Value undefined(std::string why);
  static Value function(std::string function_name);
  static Value method(const Value& self, std::string method_name);
  bool is_method() const { return kind == Kind::Function && data != nullptr; }

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_data() const { return kind == Kind::Data; }
  const json& j() const { return *data; }
  bool is_string() const { return is_data() && data->is_string(); }
  const std::string& str() const { return data->get_ref<const std::string&>(); }
  // EvalError with the undefined value's message.
  [[noreturn]] void fail_undefined() const;
};

// namespace(...) objects (attributes in the order set) and the loop
// variable (its attributes computed from the items and the index).
struct Object {
  enum class Type : uint8_t { Namespace, Loop };
  Type type = Type::Namespace;
  std::vector<std::pair<std::string, Value>> attrs;  // Namespace
  std::shared_ptr<const std::vector<Value>> items;   // Loop: what the loop iterates
  size_t index = 0;                                  // Loop: the current item
  const Value* find(std::string_view attr) const;
  void set(const std::string& attr, Value value);
};

// loop.index, loop.first, loop.previtem, ...; undefined for other names.
Value loop_attr(const Object& loop, std::string_view attr);

// Python's type name: str, int, float, bool, NoneType, list, dict, ...
std::string type_name(const Value& v);

bool is_int(const json& j);     // int or bool (a bool is an int in Python)
int64_t as_int(const json& j);  // of an is_int value; EvalError past 64 bits

bool truthy(const Value& v);
std::string to_str(const Value& v);  // str(v); undefined gives ""
std::string repr(const json& j);     // repr(j)
std::string float_repr(double x);    // repr(x): 1.0, 0.5, 1e+16, 1e-05
std::string repr(const Value& v);    // repr(v); undefined gives "Undefined"
bool equal(const Value& a, const Value& b);
// -1, 0 or 1 as a is less than, equal to or greater than b; EvalError naming
// op for types Python does not order (op is what the template wrote).
int order(const Value& a, const Value& b, std::string_view op);

// Python's json.dumps(v, ensure_ascii, indent, separators, sort_keys), the
// tojson filter transformers installs: keys in their order unless sorted,
// non-ASCII kept unless ensure_ascii, no HTML escapes (jinja2's own tojson
// has them; chat templates get transformers').
struct JsonFormat {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // per level; none: on one line
  std::string item_separator = ", ";  // "," with an indent
  std::string key_separator = ": ";
  bool sort_keys = false;
};
std::string to_json(const Value& v, const JsonFormat& format);
// v as an element of a list or dict a template builds; EvalError if v is
// undefined, a namespace or loop, or nests kMaxDataDepth deep. A function or
// macro becomes a marker of this render's CallableTable, which reading the
// element turns back into it (templates keep macros in lists).
json to_data(const Value& v);

// The functions and macros a render has put into data, for as long as it
// lives (one per render; Renderer holds it).
inline constexpr std::string_view kCallableKey = "\x01" "callable";
inline constexpr std::string_view kNonceKey = "\x01" "nonce";
// The function or macro a marker in data stands for, or null (not a
// marker, or not this render's: the nonce keeps a client's JSON from naming
// one).
const Value* callable_of(const json& j);
class CallableTable {
 public:
  CallableTable();
  ~CallableTable();
  CallableTable(const CallableTable&) = delete;
  CallableTable& operator=(const CallableTable&) = delete;
  const uint64_t nonce;  // random: a client's JSON cannot name an entry
  std::vector<Value> values;

 private:
  CallableTable* previous_;
};
// How deeply j nests (a scalar is 1), counted up to kMaxDataDepth + 1,
// without recursion (for nlohmann::json too: copying deep data recurses).
template <typename Json>
size_t data_depth(const Json& root) {
  size_t deepest = 0;
  std::vector<std::pair<const Json*, size_t>> stack = {{&root, 1}};
  while (!stack.empty() && deepest <= kMaxDataDepth) {
    const auto [j, depth] = stack.back();
    stack.pop_back();
    deepest = std::max(deepest, depth);
    if (j->is_array() || j->is_object())
      for (const Json& child : *j) stack.emplace_back(&child, depth + 1);
  }
  return deepest;
}

// The items a for loop or a filter iterates: list elements, a string's
// characters, a dict's keys; undefined gives none.
std::vector<Value> iterate(const Value& v);
int64_t length(const Value& v);  // len(v); undefined gives 0

// v.attr and v[key] as jinja2's sandbox resolves them: v.attr is a str's or
// dict's Python method before a dict's key, v['key'] the key first; a
// missing key, attribute or index gives undefined; anything of undefined is
// an error.
Value get_attr(const Value& v, std::string_view attr);
Value get_item(const Value& v, const Value& key);

}  // namespace loom::serve::jinja
