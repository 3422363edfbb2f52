// jinja2's filters and tests that chat templates use, with jinja2 3.1's
// signatures and behaviour on undefined values (jinja2/filters.py, tests.py).
// select/reject/map give lists where jinja2 gives generators: the same
// items once listed, joined or counted; printed, they show as a list.
// safe and escape give Markup (Value::safe), and the filters that keep
// Markup in jinja2 (trim, upper, string, ...) keep it here; tojson is
// transformers' (a plain str).
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <optional>

#include "serve/jinja/jinja_eval.h"
#include "serve/jinja/jinja_text.h"

namespace loom::serve::jinja {

namespace {

using FilterFn = Value (*)(const Value& v, const Args& a);
using TestFn = bool (*)(const Value& v, const Args& a);

const Value& need(const Args& a, size_t i, std::string_view name, std::string_view callee) {
  const Value* v = a.get(i, name);
  if (v == nullptr) eval_fail(callee, "() is missing its argument '", name, "'");
  return *v;
}

bool is_none(const Value* v) { return v == nullptr || (v->is_data() && v->j().is_null()); }

Value list_of(const std::vector<Value>& items) {
  json out = json::array();
  for (const Value& item : items) out.push_back(to_data(item));
  return Value::of(std::move(out));
}

// jinja2's attribute getter: "a.b.0" looks up a, then b, then index 0.
Value attr_path(const Value& item, const std::string& path) {
  static const std::string kDot = ".";
  Value v = item;
  for (const std::string& part : text::split(path, &kDot, -1)) {
    const bool digits = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
    v = get_item(v, digits && part.size() < 18 ? Value::of(std::stoll(part)) : Value::of(part));
  }
  return v;
}

Value f_trim(const Value& v, const Args& a) {
  a.check("trim", {"chars"});
  const Value* chars = a.get(0, "chars");
  if (!is_none(chars) && !chars->is_string()) eval_fail("trim(): chars must be a string");
  return v.same_safety(text::strip(to_str(v), is_none(chars) ? nullptr : &chars->str(), true, true));
}

// items as a jinja2 generator (Value::generator).
Value generator_of(const std::vector<Value>& items) {
  Value g = list_of(items);
  g.generator = true;
  return g;
}

Value f_length(const Value& v, const Args& a) {
  a.check("length", {});
  if (v.generator) eval_fail("object of type 'generator' has no len()");
  return Value::of(length(v));
}

template <std::string (*Map)(std::string_view)>
Value f_case(const Value& v, const Args& a) {
  a.check("filter", {});
  return v.same_safety(Map(to_str(v)));
}

Value f_default(const Value& v, const Args& a) {
  a.check("default", {"default_value", "boolean"});
  const Value* fallback = a.get(0, "default_value");
  const Value* boolean = a.get(1, "boolean");
  if (v.is_undefined() || (boolean != nullptr && truthy(*boolean) && !truthy(v)))
    return fallback != nullptr ? *fallback : Value::of("");
  return v;
}

Value f_join(const Value& v, const Args& a) {
  a.check("join", {"d", "attribute"});
  const Value* sep = a.get(0, "d");
  const Value* attribute = a.get(1, "attribute");
  const std::string separator = sep != nullptr ? to_str(*sep) : "";
  std::string out;
  bool first = true;
  for (const Value& item : iterate(v)) {
    if (!first) out += separator;
    first = false;
    out += to_str(is_none(attribute) ? item : attr_path(item, to_str(*attribute)));
    if (out.size() > kMaxSize) eval_fail("join(): the result is over ", kMaxSize, " bytes");
  }
  return Value::of(std::move(out));
}

Value f_first(const Value& v, const Args& a) {
  a.check("first", {});
  const std::vector<Value> items = iterate(v);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value f_last(const Value& v, const Args& a) {
  a.check("last", {});
  if (v.generator) eval_fail("'generator' object is not reversible");
  const std::vector<Value> items = iterate(v);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

Value f_list(const Value& v, const Args& a) {
  a.check("list", {});
  return list_of(iterate(v));
}

Value f_string(const Value& v, const Args& a) {
  a.check("string", {});
  return v.same_safety(to_str(v));
}

// s as Python's int() and float() read it: surrounding whitespace dropped,
// '_' only between digits (then removed); false if misplaced.
bool clean_number(std::string s, std::string& clean) {
  s = text::strip(s, nullptr, true, true);
  for (size_t i = 0; i < s.size(); ++i) {
    const bool between = i > 0 && i + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[i - 1])) &&
                         std::isdigit(static_cast<unsigned char>(s[i + 1]));
    if (s[i] == '_' && !between) return false;
    if (s[i] != '_') clean += s[i];
  }
  return true;
}

// Python's int(s) for a str in base 10, exactly; nothing if s is not an
// integer; EvalError past 64 bits (Python's ints have no bound).
std::optional<int64_t> parse_int(const std::string& s) {
  std::string clean;
  if (!clean_number(s, clean)) return std::nullopt;
  const size_t body = !clean.empty() && (clean[0] == '+' || clean[0] == '-') ? 1 : 0;
  if (clean.size() == body || clean.find_first_not_of("0123456789", body) != std::string::npos) return std::nullopt;
  const char* first = clean.data() + (clean[0] == '+' ? 1 : 0);
  int64_t n = 0;
  const auto [end, ec] = std::from_chars(first, clean.data() + clean.size(), n);
  if (ec == std::errc::result_out_of_range) eval_fail("integer ", clean, " is past loom's 64-bit integers");
  if (ec != std::errc() || end != clean.data() + clean.size()) return std::nullopt;
  return n;
}

// Python's float(s) for a str: surrounding whitespace, '_' between digits,
// inf and nan.
bool parse_float(const std::string& s, double& out) {
  std::string clean;
  if (!clean_number(s, clean)) return false;
  const std::string lower = text::lower(clean);
  const size_t body = !lower.empty() && (lower[0] == '+' || lower[0] == '-') ? 1 : 0;
  const std::string word = lower.substr(body);
  if (word == "inf" || word == "infinity" || word == "nan") {
    out = word == "nan" ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
    if (lower[0] == '-') out = -out;
    return true;
  }
  if (clean.empty() || clean.find_first_not_of("0123456789+-.eE") != std::string::npos) return false;
  char* end = nullptr;
  out = std::strtod(clean.c_str(), &end);
  return end == clean.c_str() + clean.size();
}

Value f_int(const Value& v, const Args& a) {
  a.check("int", {"default", "base"});
  const Value* fallback = a.get(0, "default");
  const Value* base = a.get(1, "base");
  if (v.is_undefined()) v.fail_undefined();
  if (base != nullptr && !(base->is_data() && is_int(base->j()) && as_int(base->j()) == 10))
    eval_fail("int(): loom's jinja converts base 10 only");
  const Value result = fallback != nullptr ? *fallback : Value::of(0);
  if (!v.is_data()) return result;
  const json& j = v.j();
  if (is_int(j)) return Value::of(as_int(j));
  double x = 0.0;
  if (j.is_number_float()) {
    x = j.get<double>();
  } else if (!j.is_string()) {
    return result;
  } else if (const std::optional<int64_t> n = parse_int(j.get_ref<const std::string&>())) {
    return Value::of(*n);
  } else if (!parse_float(j.get_ref<const std::string&>(), x)) {
    return result;
  }
  // int(float(s)): nan is a ValueError (the default), inf an OverflowError.
  if (std::isnan(x)) return result;
  if (std::isinf(x)) eval_fail("cannot convert float infinity to integer");
  if (x >= 0x1p63 || x < -0x1p63) eval_fail("int(", float_repr(x), ") is past loom's 64-bit integers");
  return Value::of(static_cast<int64_t>(x));
}

Value f_float(const Value& v, const Args& a) {
  a.check("float", {"default"});
  const Value* fallback = a.get(0, "default");
  if (v.is_undefined()) v.fail_undefined();
  const Value result = fallback != nullptr ? *fallback : Value::of(0.0);
  if (!v.is_data()) return result;
  const json& j = v.j();
  if (is_int(j)) return Value::of(static_cast<double>(as_int(j)));
  if (j.is_number_float()) return v;
  double x = 0.0;
  return j.is_string() && parse_float(j.get_ref<const std::string&>(), x) ? Value::of(x) : result;
}

Value f_replace(const Value& v, const Args& a) {
  a.check("replace", {"old", "new", "count"});
  const Value* count = a.get(2, "count");
  if (!is_none(count) && !(count->is_data() && is_int(count->j()))) eval_fail("replace(): count must be an integer");
  const std::string out = text::replace(to_str(v), to_str(need(a, 0, "old", "replace")),
                                        to_str(need(a, 1, "new", "replace")), is_none(count) ? -1 : as_int(count->j()));
  if (out.size() > kMaxSize) eval_fail("replace(): the result is over ", kMaxSize, " bytes");
  return Value::of(out);
}

// transformers' tojson(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False): json.dumps with those arguments, a plain str.
Value f_tojson(const Value& v, const Args& a) {
  a.check("tojson", {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonFormat f;
  const Value* ascii = a.get(0, "ensure_ascii");
  const Value* indent = a.get(1, "indent");
  const Value* separators = a.get(2, "separators");
  const Value* sort_keys = a.get(3, "sort_keys");
  f.ensure_ascii = ascii != nullptr && truthy(*ascii);
  f.sort_keys = sort_keys != nullptr && truthy(*sort_keys);
  if (!is_none(indent)) {
    if (indent->is_string()) {
      f.indent = indent->str();
    } else if (indent->is_data() && is_int(indent->j())) {
      const int64_t n = as_int(indent->j());
      if (n > 64) eval_fail("tojson(): indent ", n, " is over loom's limit of 64");
      f.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, n)), ' ');
    } else {
      eval_fail("tojson(): indent must be an integer or a string, not ", type_name(*indent));
    }
    f.item_separator = ",";
  }
  if (!is_none(separators)) {
    const std::vector<Value> parts = separators->is_data() && separators->j().is_array() ? iterate(*separators)
                                                                                          : std::vector<Value>{};
    if (parts.size() != 2 || !parts[0].is_string() || !parts[1].is_string())
      eval_fail("tojson(): separators must be a pair of strings (item, key)");
    f.item_separator = parts[0].str();
    f.key_separator = parts[1].str();
  }
  return Value::of(to_json(v, f));
}

// jinja2's indent(s, width=4, first=False, blank=False): a newline appended,
// then the lines (splitlines) after the first indented, empty ones too only
// with blank. s must be a str: jinja2's `s += newline` fails for the rest.
Value f_indent(const Value& v, const Args& a) {
  a.check("indent", {"width", "first", "blank"});
  if (v.is_undefined()) v.fail_undefined();
  if (v.is_data() && v.j().is_array()) eval_fail("'list' object has no attribute 'splitlines'");
  if (!v.is_string()) eval_fail("unsupported operand type(s) for +=: '", type_name(v), "' and 'str'");
  const Value* width = a.get(0, "width");
  const Value* first = a.get(1, "first");
  const Value* blank = a.get(2, "blank");
  std::string pad(4, ' ');
  if (width != nullptr && width->is_string()) {
    pad = width->str();
  } else if (width != nullptr) {
    if (!width->is_data() || !is_int(width->j())) eval_fail("indent(): width must be an integer or a string");
    const int64_t n = as_int(width->j());
    if (n > 1024) eval_fail("indent(): width ", n, " is over loom's limit of 1024");
    pad.assign(static_cast<size_t>(std::max<int64_t>(0, n)), ' ');
  }
  std::string subject = v.str();
  subject += '\n';
  const std::vector<std::string> lines = text::splitlines(subject);
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += '\n';
    if (i > 0 && (!lines[i].empty() || (blank != nullptr && truthy(*blank)))) out += pad;
    out += lines[i];
    if (out.size() > kMaxSize) eval_fail("indent(): the result is over ", kMaxSize, " bytes");
  }
  if (first != nullptr && truthy(*first)) out.insert(0, pad);
  return v.same_safety(std::move(out));
}

// The key unique and dictsort compare: str lower-cased unless case_sensitive.
Value fold_key(Value key, const Value* case_sensitive) {
  if ((case_sensitive == nullptr || !truthy(*case_sensitive)) && key.is_string()) return Value::of(text::lower(key.str()));
  return key;
}

Value f_unique(const Value& v, const Args& a) {
  a.check("unique", {"case_sensitive", "attribute"});
  const Value* attribute = a.get(1, "attribute");
  std::vector<Value> seen, kept;
  for (const Value& item : iterate(v)) {
    const Value key = fold_key(is_none(attribute) ? item : attr_path(item, to_str(*attribute)), a.get(0, "case_sensitive"));
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, key); })) continue;
    seen.push_back(key);
    kept.push_back(item);
  }
  return generator_of(kept);
}

// dictsort(value, case_sensitive=False, by='key', reverse=False): the
// (key, value) pairs, sorted (stable) by either.
Value f_dictsort(const Value& v, const Args& a) {
  a.check("dictsort", {"case_sensitive", "by", "reverse"});
  const Value* by = a.get(1, "by");
  const Value* reverse = a.get(2, "reverse");
  const std::string what = by != nullptr ? to_str(*by) : "key";
  if (what != "key" && what != "value") eval_fail("You can only sort by either \"key\" or \"value\"");
  if (!v.is_data() || !v.j().is_object()) eval_fail("dictsort(): ", type_name(v), " is not a mapping");
  std::vector<std::pair<Value, json>> keyed;
  for (auto it = v.j().begin(); it != v.j().end(); ++it)
    keyed.emplace_back(fold_key(what == "key" ? Value::of(it.key()) : Value::alias(v, it.value()), a.get(0, "case_sensitive")),
                       json::array({it.key(), it.value()}));
  const bool descending = reverse != nullptr && truthy(*reverse);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return descending ? order(y.first, x.first, "<") < 0 : order(x.first, y.first, "<") < 0;
  });
  json out = json::array();
  for (auto& [key, pair] : keyed) out.push_back(std::move(pair));
  return Value::of(std::move(out));
}

Value f_items(const Value& v, const Args& a) {
  a.check("items", {});
  json out = json::array();
  if (v.is_undefined()) return Value::of(std::move(out));
  if (!v.is_data() || !v.j().is_object()) eval_fail("Can only get item pairs from a mapping.");
  for (auto it = v.j().begin(); it != v.j().end(); ++it) out.push_back(json::array({it.key(), it.value()}));
  return Value::of(std::move(out));
}

// select / reject (attr false) and selectattr / rejectattr (attr true).
// Like map, nothing for a false value (none, '', []): jinja2 checks
// `if value:` before it reads the arguments.
Value select_items(const Value& v, const Args& a, bool attr, bool keep) {
  if (!truthy(v)) return generator_of({});
  if (!a.named.empty()) eval_fail("select filters take no keyword arguments in loom's jinja");
  const size_t test_at = attr ? 1 : 0;
  if (attr && a.positional.empty()) eval_fail("selectattr(): the attribute is missing");
  std::string test;
  if (a.positional.size() > test_at) {
    if (!a.positional[test_at].is_string()) eval_fail("select filters name their test with a string");
    test = a.positional[test_at].str();
    if (!has_test(test)) eval_fail("no test named '", test, "'");
  }
  Args test_args;
  for (size_t i = test_at + 1; i < a.positional.size(); ++i) test_args.positional.push_back(a.positional[i]);
  std::vector<Value> kept;
  for (const Value& item : iterate(v)) {
    const Value x = attr ? attr_path(item, to_str(a.positional[0])) : item;
    if ((test.empty() ? truthy(x) : apply_test(test, x, test_args)) == keep) kept.push_back(item);
  }
  return generator_of(kept);
}

Value f_select(const Value& v, const Args& a) { return select_items(v, a, false, true); }
Value f_reject(const Value& v, const Args& a) { return select_items(v, a, false, false); }
Value f_selectattr(const Value& v, const Args& a) { return select_items(v, a, true, true); }
Value f_rejectattr(const Value& v, const Args& a) { return select_items(v, a, true, false); }

Value f_map(const Value& v, const Args& a) {
  if (!truthy(v)) return generator_of({});
  const Value* attribute = a.get(std::numeric_limits<size_t>::max(), "attribute");
  std::vector<Value> out;
  if (attribute != nullptr) {
    a.check("map", {"attribute", "default"});
    const Value* fallback = a.get(std::numeric_limits<size_t>::max(), "default");
    for (const Value& item : iterate(v)) {
      Value x = attr_path(item, to_str(*attribute));
      out.push_back(x.is_undefined() && fallback != nullptr ? *fallback : x);
    }
    return generator_of(out);
  }
  if (a.positional.empty() || !a.positional[0].is_string()) eval_fail("map() needs a filter name or attribute=");
  const std::string name = a.positional[0].str();
  if (!has_filter(name)) eval_fail("no filter named '", name, "'");
  Args rest;
  rest.positional.assign(a.positional.begin() + 1, a.positional.end());
  rest.named = a.named;
  for (const Value& item : iterate(v)) out.push_back(apply_filter(name, item, rest));
  return generator_of(out);
}

Value f_reverse(const Value& v, const Args& a) {
  a.check("reverse", {});
  if (v.is_string()) {
    std::vector<Value> chars = iterate(v);
    std::string out;
    for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += it->str();
    return Value::of(std::move(out));
  }
  std::vector<Value> items = iterate(v);
  std::reverse(items.begin(), items.end());
  return list_of(items);
}

Value f_sort(const Value& v, const Args& a) {
  a.check("sort", {"reverse", "case_sensitive", "attribute"});
  const Value* reverse = a.get(0, "reverse");
  const Value* case_sensitive = a.get(1, "case_sensitive");
  const Value* attribute = a.get(2, "attribute");
  const bool descending = reverse != nullptr && truthy(*reverse);
  const bool fold = case_sensitive == nullptr || !truthy(*case_sensitive);
  std::vector<std::pair<Value, Value>> keyed;  // (sort key, item)
  for (const Value& item : iterate(v)) {
    Value key = is_none(attribute) ? item : attr_path(item, to_str(*attribute));
    if (fold && key.is_string()) key = Value::of(text::lower(key.str()));
    keyed.emplace_back(std::move(key), item);
  }
  // Python's sort is stable in both directions.
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return descending ? order(y.first, x.first, "<") < 0 : order(x.first, y.first, "<") < 0;
  });
  std::vector<Value> items;
  for (auto& [key, item] : keyed) items.push_back(std::move(item));
  return list_of(items);
}

Value f_abs(const Value& v, const Args& a) {
  a.check("abs", {});
  if (!v.is_data() || !(v.j().is_number() || v.j().is_boolean()))
    eval_fail("bad operand type for abs(): '", type_name(v), "'");
  if (v.j().is_number_float()) return Value::of(std::fabs(v.j().get<double>()));
  const int64_t x = as_int(v.j());
  return x < 0 ? unary_op("-", v) : Value::of(x);
}

Value f_safe(const Value& v, const Args& a) {
  a.check("safe", {});
  return Value::markup(to_str(v));
}

Value f_escape(const Value& v, const Args& a) {
  a.check("escape", {});
  return v.safe ? v : Value::markup(text::html_escape(to_str(v)));
}

const std::map<std::string_view, FilterFn>& filters() {
  static const std::map<std::string_view, FilterFn> table = {
      {"abs", f_abs},          {"capitalize", f_case<text::capitalize>},
      {"count", f_length},     {"d", f_default},
      {"dictsort", f_dictsort}, {"indent", f_indent},
      {"unique", f_unique},
      {"default", f_default},  {"e", f_escape},
      {"escape", f_escape},    {"first", f_first},
      {"float", f_float},      {"int", f_int},
      {"items", f_items},      {"join", f_join},
      {"last", f_last},        {"length", f_length},
      {"list", f_list},        {"lower", f_case<text::lower>},
      {"map", f_map},          {"reject", f_reject},
      {"rejectattr", f_rejectattr}, {"replace", f_replace},
      {"reverse", f_reverse},  {"safe", f_safe},
      {"select", f_select},    {"selectattr", f_selectattr},
      {"sort", f_sort},        {"string", f_string},
      {"title", f_case<text::filter_title>}, {"tojson", f_tojson},
      {"trim", f_trim},        {"upper", f_case<text::upper>},
  };
  return table;
}

}  // namespace

bool has_filter(std::string_view name) { return filters().contains(name); }

Value apply_filter(const std::string& name, const Value& subject, const Args& args) {
  const auto it = filters().find(name);
  if (it == filters().end()) eval_fail("no filter named '", name, "'");
  return it->second(subject, args);
}

}  // namespace loom::serve::jinja
