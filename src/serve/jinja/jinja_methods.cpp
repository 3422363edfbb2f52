// Methods templates call on values ('x'.strip(), d.items(), loop.cycle())
// and the global functions: range() (with jinja2's sandbox limit),
// namespace(), dict() and transformers' raise_exception() and
// strftime_now(). Lists have no methods: the immutable sandbox transformers
// uses refuses append and the like.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <iterator>

#include "serve/jinja/jinja_eval.h"
#include "serve/jinja/jinja_text.h"

namespace loom::serve::jinja {

namespace {

constexpr int64_t kMaxRange = 100000;  // jinja2.sandbox.MAX_RANGE

bool is_none(const Value* v) { return v == nullptr || (v->is_data() && v->j().is_null()); }

const std::string* optional_str(const Args& a, size_t i, std::string_view name, std::string_view method) {
  const Value* v = a.get(i, name);
  if (is_none(v)) return nullptr;
  if (!v->is_string()) eval_fail(method, "() argument must be str or None, not ", type_name(*v));
  return &v->str();
}

const std::string& required_str(const Args& a, size_t i, std::string_view name, std::string_view method) {
  const std::string* s = optional_str(a, i, name, method);
  if (s == nullptr) eval_fail(method, "() needs a str argument '", name, "'");
  return *s;
}

int64_t optional_int(const Args& a, size_t i, std::string_view name, int64_t fallback) {
  const Value* v = a.get(i, name);
  if (is_none(v)) return fallback;
  if (!v->is_data() || !is_int(v->j())) eval_fail("'", type_name(*v), "' object cannot be interpreted as an integer");
  return as_int(v->j());
}

Value strings(const std::vector<std::string>& parts) {
  json out = json::array();
  for (const std::string& p : parts) out.push_back(p);
  return Value::of(std::move(out));
}

// startswith / endswith take a str or a list (Python: a tuple) of them.
bool affix(const std::string& s, const Value& which, bool prefix) {
  std::vector<Value> options = which.is_data() && which.j().is_array() ? iterate(which) : std::vector<Value>{which};
  return std::any_of(options.begin(), options.end(), [&](const Value& o) {
    if (!o.is_string()) eval_fail(prefix ? "startswith" : "endswith", " first arg must be str or a list of str");
    return prefix ? s.starts_with(o.str()) : s.ends_with(o.str());
  });
}

// Markup's methods escape their str arguments and return Markup.
Args escaped(const Value& subject, const Args& a) {
  if (!subject.safe) return a;
  Args out = a;
  for (Value& v : out.positional)
    if (v.is_string() && !v.safe) v = Value::markup(text::html_escape(v.str()));
  for (auto& [name, v] : out.named)
    if (v.is_string() && !v.safe) v = Value::markup(text::html_escape(v.str()));
  return out;
}

// The argument one replacement field of str.format names: {} or {0} (a
// positional one), {name} (a keyword one). auto_next counts {} fields; -1
// once {0} is seen.
const Value& format_field(const std::string& field, const Args& a, int64_t& auto_next) {
  if (field.find_first_of(":!.[{") != std::string::npos)
    eval_fail("loom's jinja takes no str.format fields other than {}, {0} and {name}: {", field, "}");
  const bool number = !field.empty() && field.size() < 10 && field.find_first_not_of("0123456789") == std::string::npos;
  if (!field.empty() && !number) {
    for (const auto& [key, value] : a.named)
      if (key == field) return value;
    eval_fail("format(): no argument named '", field, "'");
  }
  if (field.empty() ? auto_next < 0 : auto_next > 0)  // one message both ways, as string.Formatter's
    eval_fail("cannot switch from manual field specification to automatic field numbering");
  const size_t index = field.empty() ? static_cast<size_t>(auto_next++) : std::stoul(field);
  if (!field.empty()) auto_next = -1;
  if (index >= a.positional.size()) eval_fail("format(): replacement index ", index, " out of range");
  return a.positional[index];
}

// Python's str.format with plain fields (format_field) and {{ }} escapes.
// Markup's escapes what it inserts (escaped() did the str arguments).
Value str_format(const Value& subject, const Args& a) {
  const std::string& s = subject.str();
  std::string out;
  int64_t auto_next = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const bool doubled = i + 1 < s.size() && s[i + 1] == s[i];
    if ((s[i] == '{' || s[i] == '}') && doubled) {
      out += s[i++];
      continue;
    }
    if (s[i] == '}') eval_fail("Single '}' encountered in format string");
    if (s[i] != '{') {
      out += s[i];
      continue;
    }
    const size_t close = s.find('}', i + 1);
    if (close == std::string::npos) eval_fail("Single '{' encountered in format string");
    const std::string field = s.substr(i + 1, close - i - 1);
    const Value& arg = format_field(field, a, auto_next);
    out += subject.safe && !arg.safe ? text::html_escape(to_str(arg)) : to_str(arg);
    if (out.size() > kMaxSize) eval_fail("format(): the result is over ", kMaxSize, " bytes");
    i = close;
  }
  return subject.same_safety(std::move(out));
}

Value string_method(const Value& subject, const std::string& name, const Args& args) {
  const std::string& s = subject.str();
  static constexpr std::string_view kMethods[] = {"strip", "lstrip", "rstrip", "startswith", "endswith",
                                                  "split", "replace", "join", "upper", "lower",
                                                  "title", "capitalize", "format"};
  if (std::find(std::begin(kMethods), std::end(kMethods), name) == std::end(kMethods))
    eval_fail("loom's jinja has no str method '", name, "'");
  const Args a = escaped(subject, args);
  if (name == "format") return str_format(subject, a);
  // Of these, only split takes keyword arguments in Python.
  if (name != "split" && !a.named.empty()) eval_fail("str.", name, "() takes no keyword arguments");
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    a.check(name, {"chars"});
    return subject.same_safety(text::strip(s, optional_str(a, 0, "chars", name), name != "rstrip", name != "lstrip"));
  }
  if (name == "startswith" || name == "endswith") {
    a.check(name, {"prefix"});
    const Value* which = a.get(0, "prefix");
    if (which == nullptr) eval_fail(name, "() takes at least 1 argument (0 given)");
    return Value::of(affix(s, *which, name == "startswith"));
  }
  if (name == "split") {
    a.check(name, {"sep", "maxsplit"});
    const std::string* sep = optional_str(a, 0, "sep", name);
    if (sep != nullptr && sep->empty()) eval_fail("empty separator");
    return strings(text::split(s, sep, optional_int(a, 1, "maxsplit", -1)));
  }
  if (name == "replace") {
    a.check(name, {"old", "new", "count"});
    const std::string out = text::replace(s, required_str(a, 0, "old", name), required_str(a, 1, "new", name),
                                          optional_int(a, 2, "count", -1));
    if (out.size() > kMaxSize) eval_fail("replace(): the result is over ", kMaxSize, " bytes");
    return subject.same_safety(out);
  }
  if (name == "join") {
    a.check(name, {"iterable"});
    const Value* items = a.get(0, "iterable");
    if (items == nullptr) eval_fail("join() takes exactly one argument (0 given)");
    std::string out;
    bool first = true;
    for (const Value& item : iterate(*items)) {
      if (!item.is_string()) eval_fail("sequence item: expected str instance, ", type_name(item), " found");
      if (!first) out += s;
      first = false;
      out += item.str();
      if (out.size() > kMaxSize) eval_fail("join(): the result is over ", kMaxSize, " bytes");
    }
    return Value::of(std::move(out));
  }
  a.check(name, {});
  if (name == "upper") return subject.same_safety(text::upper(s));
  if (name == "lower") return subject.same_safety(text::lower(s));
  if (name == "title") return subject.same_safety(text::str_title(s));
  return subject.same_safety(text::capitalize(s));
}

Value dict_method(const Value& subject, const std::string& name, const Args& a) {
  const json& d = subject.j();
  if (name == "get") {
    a.check(name, {"key", "default"});
    const Value* key = a.get(0, "key");
    if (key == nullptr) eval_fail("get expected at least 1 argument, got 0");
    const Value* fallback = a.get(1, "default");
    if (key->is_string()) {
      const auto it = d.find(key->str());
      if (it != d.end()) return Value::alias(subject, *it);
    }
    return fallback != nullptr ? *fallback : Value::of(nullptr);
  }
  a.check(name, {});
  json out = json::array();
  for (auto it = d.begin(); it != d.end(); ++it) {
    if (name == "items") {
      out.push_back(json::array({it.key(), it.value()}));
    } else if (name == "keys") {
      out.push_back(it.key());
    } else if (name == "values") {
      out.push_back(it.value());
    } else {
      eval_fail("loom's jinja has no dict method '", name, "'");
    }
  }
  return Value::of(std::move(out));
}

}  // namespace

Value call_method(const Value& subject, const std::string& name, const Args& a) {
  if (subject.is_string()) return string_method(subject, name, a);
  if (subject.is_data() && subject.j().is_object()) return dict_method(subject, name, a);
  if (subject.kind == Value::Kind::Object && subject.object->type == Object::Type::Loop && name == "cycle") {
    if (a.positional.empty()) eval_fail("no items for cycling given");
    return a.positional[subject.object->index % a.positional.size()];
  }
  eval_fail("'", type_name(subject), " object' has no attribute '", name, "' callable in loom's jinja");
}

bool is_global(std::string_view name) {
  return name == "range" || name == "namespace" || name == "dict" || name == "raise_exception" ||
         name == "strftime_now";
}

namespace {

Value range(const Args& a) {
  if (!a.named.empty()) eval_fail("range() takes no keyword arguments");
  if (a.positional.empty() || a.positional.size() > 3)
    eval_fail("range expected 1 to 3 arguments, got ", a.positional.size());
  int64_t bounds[3] = {0, 0, 1};
  for (size_t i = 0; i < a.positional.size(); ++i) {
    const Value& v = a.positional[i];
    if (v.is_undefined()) v.fail_undefined();
    if (!v.is_data() || !is_int(v.j())) eval_fail("'", type_name(v), "' object cannot be interpreted as an integer");
    bounds[a.positional.size() == 1 ? 1 : i] = as_int(v.j());
  }
  const auto [start, stop, step] = bounds;
  if (step == 0) eval_fail("range() arg 3 must not be zero");
  // Lengths in long double: stop - start may not fit in 64 bits.
  const long double span = step > 0 ? static_cast<long double>(stop) - start : static_cast<long double>(start) - stop;
  const long double count = span <= 0 ? 0 : std::ceil(span / std::abs(static_cast<long double>(step)));
  if (count > kMaxRange)
    eval_fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (", kMaxRange, ").");
  json out = json::array();
  // start + k * step in wrapping unsigned arithmetic: the sum fits, k * step may not.
  for (uint64_t k = 0; k < static_cast<uint64_t>(count); ++k)
    out.push_back(static_cast<int64_t>(static_cast<uint64_t>(start) + k * static_cast<uint64_t>(step)));
  return Value::of(std::move(out));
}

Value make_namespace(const Args& a) {
  auto ns = std::make_shared<Object>();
  for (const Value& m : a.positional) {
    if (!m.is_data() || !m.j().is_object()) eval_fail("namespace() takes keyword arguments or a dict");
    for (auto it = m.j().begin(); it != m.j().end(); ++it) ns->set(it.key(), Value::alias(m, it.value()));
  }
  for (const auto& [key, value] : a.named) ns->set(key, value);
  Value v;
  v.kind = Value::Kind::Object;
  v.object = std::move(ns);
  return v;
}

}  // namespace

// transformers' strftime_now(format): datetime.now().strftime(format), in the
// C locale; now_unix >= 0 fixes the time (read as UTC). The datetime is
// naive, so %z and %Z give "".
Value strftime_now(const Args& a, int64_t now_unix) {
  a.check("strftime_now", {"format"});
  const Value* format = a.get(0, "format");
  if (format == nullptr || !format->is_string()) eval_fail("strftime_now() takes a format string");
  const auto now = std::chrono::system_clock::now();
  const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() % 1000000;
  const std::time_t t = now_unix >= 0 ? static_cast<std::time_t>(now_unix) : std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  if (now_unix >= 0 ? gmtime_r(&t, &tm) == nullptr : localtime_r(&t, &tm) == nullptr)
    eval_fail("strftime_now(): the time is out of range");
  std::string spec = format->str();  // datetime's %f (microseconds), which C's strftime lacks
  char micro_digits[8];
  std::snprintf(micro_digits, sizeof micro_digits, "%06d", now_unix >= 0 ? 0 : static_cast<int>(micros));
  for (size_t at = 0; (at = spec.find('%', at)) != std::string::npos;) {
    const char directive = at + 1 < spec.size() ? spec[at + 1] : '\0';
    if (directive == 'z' || directive == 'Z') {
      spec.erase(at, 2);  // datetime.now() is naive: no UTC offset, no zone name
    } else if (directive == 'f') {
      spec.replace(at, 2, micro_digits);
      at += 6;
    } else {
      at += 2;
    }
  }
  if (spec.size() > 4096 || spec.find('\0') != std::string::npos) eval_fail("strftime_now(): bad format");
  std::string out(spec.size() * 16 + 64, '\0');
  out.resize(std::strftime(out.data(), out.size(), spec.c_str(), &tm));
  return Value::of(std::move(out));
}

Value call_global(const std::string& name, const Args& a, int64_t now_unix) {
  if (name == "range") return range(a);
  if (name == "strftime_now") return strftime_now(a, now_unix);
  if (name == "namespace") return make_namespace(a);
  if (name == "raise_exception") {
    a.check(name, {"message"});
    const Value* message = a.get(0, "message");
    eval_fail(message != nullptr ? to_str(*message) : std::string("raise_exception() called"));
  }
  if (!a.positional.empty()) eval_fail("loom's dict() takes keyword arguments only");
  json out = json::object();
  for (const auto& [key, value] : a.named) out[key] = to_data(value);
  return Value::of(std::move(out));
}

}  // namespace loom::serve::jinja
