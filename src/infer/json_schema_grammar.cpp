// JSON schema -> GBNF: one rule per schema node, named root_name + "-" +
// where it is; primitives (whitespace, string, number, any value) added on
// first use. See json_schema_grammar.h for the form and what is supported.
#include "infer/json_schema_grammar.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "core/error.h"
#include "infer/json_schema_converter.h"
#include "infer/json_schema_parts.h"

namespace loom::infer::json_schema {
namespace {
const std::set<std::string> kAnnotations = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                            "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "$anchor",
                                            "contentMediaType", "contentEncoding"};
const std::set<std::string> kStringKw = {"minLength", "maxLength", "pattern", "format"};
const std::set<std::string> kIntegerKw = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
const std::set<std::string> kObjectKw = {"properties", "required", "additionalProperties"};
const std::set<std::string> kArrayKw = {"items", "prefixItems", "minItems", "maxItems"};
const std::set<std::string> kCombinators = {"$ref", "anyOf", "oneOf", "allOf", "enum", "const", "type"};
const char* const kTypes[] = {"object", "array", "string", "number", "integer", "boolean", "null"};

}  // namespace

std::string sanitize(const std::string& s) {
  std::string out;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (ok) out += c;
    else if (!out.empty() && out.back() != '-') out += '-';
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out.empty() ? "x" : out;
}

std::string json_type_of(const Json& v) {
  if (v.is_object()) return "object";
  if (v.is_array()) return "array";
  if (v.is_string()) return "string";
  if (v.is_number_integer() || v.is_number_unsigned()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_boolean()) return "boolean";
  return "null";
}

Converter::Converter(const Json& doc, const std::string& root) : doc_(doc), root_(sanitize(root) == root ? root : "") {
  LOOM_REQUIRE(!root_.empty(), "json_schema_to_gbnf: root name '", root, "' is not a GBNF rule name ([a-zA-Z0-9-]+)");
}

std::string Converter::run() {
  const std::string body = visit(doc_, "", "");
  std::string out = root_ + " ::= " + body + "\n";
  for (const auto& [name, r] : rules_) out += name + " ::= " + r + "\n";
  return out;
}

void Converter::bad(const std::string& path, const std::string& what) {
  fail("schema at ", path.empty() ? "/" : path, ": ", what);
}

std::string Converter::name_for(const std::string& hint) {
  std::string base = root_ + (hint.empty() ? "" : "-" + sanitize(hint));
  std::string name = base;
  for (int i = 2; names_.count(name) || name == root_; ++i) name = base + "-" + std::to_string(i);
  names_.insert(name);
  return name;
}

std::string Converter::rule(const std::string& hint, const std::string& body) {
  if (auto it = by_body_.find(body); it != by_body_.end()) return it->second;
  const std::string name = name_for(hint);
  rules_.emplace_back(name, body);
  by_body_.emplace(body, name);
  return name;
}

std::string Converter::primitive(const std::string& which) {
  if (which == "ws") return rule("ws", R"(| " " | "\n" [ \t]{0,20})");
  if (which == "hex") return rule("hex", "[0-9a-fA-F]");
  if (which == "char") {
    const std::string h = primitive("hex");
    return rule("char", R"([^"\\\x00-\x1F] | "\\" ["\\/bfnrt] | "\\u" ([0-9a-cA-CeEfF] )" + h + "{3} | [dD] [0-7] " + h +
                            "{2}) | \"\\\\u\" [dD] [89abAB] " + h + "{2} \"\\\\u\" [dD] [c-fC-F] " + h + "{2}");
  }
  if (which == "string") return rule("string", "\"\\\"\" " + primitive("char") + "* \"\\\"\" " + primitive("ws"));
  if (which == "int") return rule("int", R"("-"? ("0" | [1-9] [0-9]{0,15}))");
  if (which == "integer") return rule("integer", primitive("int") + " " + primitive("ws"));
  if (which == "number")
    return rule("number", primitive("int") + R"( ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})? )" + primitive("ws"));
  if (which == "boolean") return rule("boolean", "(\"true\" | \"false\") " + primitive("ws"));
  if (which == "null") return rule("null", "\"null\" " + primitive("ws"));
  const std::string ws = primitive("ws");
  if (which == "value") {
    const std::string name = name_for("value");  // recursive with object and array: named first
    by_body_.emplace("@value", name);
    rules_.emplace_back(name, "");
    const size_t at = rules_.size() - 1;
    rules_[at].second = primitive("object") + " | " + primitive("array") + " | " + primitive("string") + " | " +
                        primitive("number") + " | " + primitive("boolean") + " | " + primitive("null");
    return name;
  }
  if (!by_body_.count("@value")) {
    primitive("value");  // names object and array too
    return primitive(which);
  }
  const std::string value = by_body_.at("@value");
  if (which == "object") {
    const std::string kv = primitive("string") + " \":\" " + ws + " " + value;
    return rule("object", "\"{\" " + ws + " (" + kv + " (\",\" " + ws + " " + kv + ")*)? \"}\" " + ws);
  }
  if (which == "array")
    return rule("array", "\"[\" " + ws + " (" + value + " (\",\" " + ws + " " + value + ")*)? \"]\" " + ws);
  LOOM_CHECK(false, "unknown primitive ", which);
  return "";
}

void Converter::check_keywords(const Json& s, const std::string& path) const {
  for (const auto& [key, value] : s.items()) {
    if (kAnnotations.count(key) || kStringKw.count(key) || kIntegerKw.count(key) || kObjectKw.count(key) ||
        kArrayKw.count(key) || kCombinators.count(key))
      continue;
    static const std::set<std::string> kRefused = {
        "multipleOf", "uniqueItems", "contains", "minContains", "maxContains", "patternProperties", "propertyNames",
        "minProperties", "maxProperties", "dependentRequired", "dependentSchemas", "dependencies", "if", "then",
        "else", "not", "unevaluatedProperties", "unevaluatedItems", "additionalItems", "$dynamicRef", "$recursiveRef"};
    if (kRefused.count(key)) bad(path, concat("keyword '", key, "' cannot be enforced by the grammar"));
  }
}

std::string Converter::visit(const Json& s, const std::string& path, const std::string& hint) {
  if (s.is_boolean()) {
    if (!s.get<bool>()) bad(path, "the schema false allows no value");
    return primitive("value");
  }
  if (!s.is_object()) bad(path, "a schema must be an object or a boolean");
  check_keywords(s, path);
  if (s.contains("$ref")) return visit_ref(s, path);
  if (s.contains("allOf")) return visit_all_of(s, path, hint);
  if (s.contains("anyOf") || s.contains("oneOf")) return visit_any_of(s, path, hint);
  if (s.contains("enum") || s.contains("const")) return visit_enum(s, path, hint);
  std::vector<std::string> types;
  if (!s.contains("type")) types.assign(std::begin(kTypes), std::end(kTypes));
  else if (s["type"].is_string()) types.push_back(s["type"].get<std::string>());
  else if (s["type"].is_array())
    for (const Json& t : s["type"]) types.push_back(t.is_string() ? t.get<std::string>() : "?");
  else bad(path, "type must be a string or a list of strings");
  const bool has_number = std::find(types.begin(), types.end(), "number") != types.end();
  std::string body;
  for (const std::string& t : types) {
    if (t == "integer" && has_number) continue;  // number's form holds every integer
    const std::string r = visit_type(s, t, path, hint);
    body += (body.empty() ? "" : " | ") + r;
  }
  if (body.empty()) bad(path, "type [] allows no value");
  return types.size() == 1 ? body : rule(hint, body);
}

std::string Converter::visit_type(const Json& s, const std::string& t, const std::string& path, const std::string& hint) {
  if (t == "string") return visit_string(s, path, hint);
  if (t == "integer") return visit_integer(s, path, hint);
  if (t == "number") {
    for (const std::string& k : kIntegerKw)
      if (s.contains(k)) bad(path, concat("'", k, "' on a number cannot be enforced (only on integers: use type integer)"));
    return primitive("number");
  }
  if (t == "object") return visit_object(s, path, hint);
  if (t == "array") return visit_array(s, path, hint);
  if (t == "boolean") return primitive("boolean");
  if (t == "null") return primitive("null");
  bad(path, concat("unknown type '", t, "': allowed are object, array, string, number, integer, boolean, null"));
}

std::string Converter::visit_string(const Json& s, const std::string& path, const std::string& hint) {
  const std::string quote = R"("\"")", ws = primitive("ws");
  const bool lengths = s.contains("minLength") || s.contains("maxLength");
  if (s.contains("format")) {
    if (lengths || s.contains("pattern")) bad(path, "format with pattern/minLength/maxLength cannot be enforced together");
    const std::string f = s["format"].is_string() ? s["format"].get<std::string>() : "?";
    const auto text = format_to_gbnf(f);
    if (!text) bad(path, concat("format '", f, "' cannot be enforced (supported: date, time, date-time, uuid)"));
    return rule(hint, quote + " " + *text + " " + quote + " " + ws);
  }
  if (s.contains("pattern")) {
    if (lengths) bad(path, "pattern with minLength/maxLength cannot be enforced together");
    if (!s["pattern"].is_string()) bad(path, "pattern must be a string");
    const std::string where = concat("schema at ", path.empty() ? "/" : path, ": ");
    return rule(hint, quote + " " + pattern_to_gbnf(s["pattern"].get<std::string>(), primitive("char"), where) + " " +
                          quote + " " + ws);
  }
  if (!lengths) return primitive("string");
  auto count = [&](const char* key, int64_t fallback) {
    if (!s.contains(key)) return fallback;
    const Json& v = s[key];
    if (!v.is_number_integer() && !v.is_number_unsigned()) bad(path, concat(key, " must be a non-negative integer"));
    const int64_t n = v.get<int64_t>();
    if (n < 0 || n > 100000) bad(path, concat(key, " = ", n, ": allowed are 0 .. 100000"));
    return n;
  };
  const int64_t lo = count("minLength", 0), hi = count("maxLength", -1);
  if (hi >= 0 && hi < lo) bad(path, "maxLength < minLength: no string is valid");
  const std::string reps = hi < 0 ? concat("{", lo, ",}") : concat("{", lo, ",", hi, "}");
  return rule(hint, quote + " " + primitive("char") + reps + " " + quote + " " + ws);
}

// Integer bounds (draft 6+ numbers, or draft 4's boolean exclusive flags).
std::string Converter::visit_integer(const Json& s, const std::string& path, const std::string& hint) {
  std::optional<int64_t> lo, hi;
  constexpr double kClamp = 1e17;  // past the grammar's 16 digits either way
  auto bound = [&](const char* key) -> double {
    if (!s[key].is_number()) bad(path, concat(key, " must be a number"));
    return std::clamp(s[key].get<double>(), -kClamp, kClamp);
  };
  auto flag = [&](const char* key) { return s.contains(key) && s[key].is_boolean() && s[key].get<bool>(); };
  if (s.contains("minimum")) lo = int64_t(std::ceil(bound("minimum"))) + (flag("exclusiveMinimum") ? 1 : 0);
  if (s.contains("maximum")) hi = int64_t(std::floor(bound("maximum"))) - (flag("exclusiveMaximum") ? 1 : 0);
  if (s.contains("exclusiveMinimum") && !s["exclusiveMinimum"].is_boolean()) {
    const int64_t v = int64_t(std::floor(bound("exclusiveMinimum"))) + 1;
    lo = lo ? std::max(*lo, v) : v;
  }
  if (s.contains("exclusiveMaximum") && !s["exclusiveMaximum"].is_boolean()) {
    const int64_t v = int64_t(std::ceil(bound("exclusiveMaximum"))) - 1;
    hi = hi ? std::min(*hi, v) : v;
  }
  if (!lo && !hi) return primitive("integer");
  if (lo && hi && *lo > *hi) bad(path, concat("no integer is in [", *lo, ", ", *hi, "]"));
  return rule(hint, integer_range(lo, hi) + " " + primitive("ws"));
}

}  // namespace loom::infer::json_schema

namespace loom::infer {

std::string json_schema_to_gbnf_ordered(const nlohmann::ordered_json& schema, const std::string& root_name) {
  return json_schema::Converter(schema, root_name).run();
}

std::string json_schema_to_gbnf(const nlohmann::json& schema, const std::string& root_name) {
  return json_schema_to_gbnf_ordered(nlohmann::ordered_json::parse(schema.dump()), root_name);
}

}  // namespace loom::infer
