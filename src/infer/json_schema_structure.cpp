// The JSON-schema compiler's structural keywords: objects (declared
// properties in order, then additional ones whose keys differ from every
// declared key), arrays (prefixItems, items, count bounds), $ref, allOf
// (merged), anyOf/oneOf and enum/const.
#include <algorithm>
#include <map>
#include <optional>

#include "core/error.h"
#include "infer/json_schema_converter.h"
#include "infer/json_schema_parts.h"

namespace loom::infer::json_schema {
namespace {

bool is_annotation(const std::string& k) {
  static const std::set<std::string> kAnnotations = {"title", "description", "default", "examples", "$schema", "$id",
                                                     "$comment", "deprecated", "readOnly", "writeOnly", "$defs",
                                                     "definitions", "$anchor", "contentMediaType", "contentEncoding"};
  return kAnnotations.count(k) > 0;
}

std::string pointer_escape(const std::string& k) {
  std::string out;
  for (char c : k) out += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
  return out;
}

}  // namespace

const Json& Converter::resolve(const std::string& ref, const std::string& path) const {
  if (ref.empty() || ref[0] != '#') bad(path, concat("$ref '", ref, "': only references into this schema (#/...)"));
  const Json* at = &doc_;
  size_t i = 1;
  while (i < ref.size()) {
    if (ref[i] != '/') bad(path, concat("$ref '", ref, "' is not a JSON pointer (#/$defs/name)"));
    const size_t end = std::min(ref.find('/', i + 1), ref.size());
    std::string key;
    for (size_t j = i + 1; j < end; ++j) key += ref[j] == '~' && j + 1 < end ? (ref[++j] == '1' ? '/' : '~') : ref[j];
    if (at->is_object() && at->contains(key)) at = &(*at)[key];
    else if (at->is_array() && !key.empty() && key.size() < 10 && key.find_first_not_of("0123456789") == std::string::npos &&
             std::stoul(key) < at->size()) at = &(*at)[std::stoul(key)];
    else bad(path, concat("$ref '", ref, "' points to nothing"));
    i = end;
  }
  return *at;
}

std::string Converter::visit_ref(const Json& s, const std::string& path) {
  for (const auto& [k, v] : s.items())
    if (k != "$ref" && !is_annotation(k)) bad(path, concat("$ref with '", k, "' beside it cannot be enforced"));
  if (!s["$ref"].is_string()) bad(path, "$ref must be a string");
  const std::string ref = s["$ref"].get<std::string>();
  if (auto it = refs_.find(ref); it != refs_.end()) return it->second;
  const std::string name = name_for("ref-" + ref.substr(ref.rfind('/') + 1));
  refs_[ref] = name;  // before visiting: the target may refer to itself
  rules_.emplace_back(name, "");
  const size_t at = rules_.size() - 1;
  const std::string body = visit(resolve(ref, path), ref.substr(1), name.substr(root_.size() + 1));
  rules_[at].second = body;
  return name;
}

// allOf of object schemas: one schema with their properties, required and
// other keywords merged (a keyword given twice must agree).
std::string Converter::visit_all_of(const Json& s, const std::string& path, const std::string& hint) {
  Json merged = Json::object();
  // s and its members, a member's own allOf flattened in (through $refs;
  // nesting past 32 levels is a cycle or no schema anyone writes).
  std::vector<const Json*> parts;
  auto add = [&](auto& self, const Json& part, int depth) -> void {
    if (depth > 32) bad(path + "/allOf", "allOf nests more than 32 levels deep (a $ref cycle?)");
    parts.push_back(&part);
    if (!part.is_object() || !part.contains("allOf")) return;
    if (!part["allOf"].is_array()) bad(path, "allOf must be a list");
    for (const Json& m : part["allOf"]) {
      const bool only_ref = m.is_object() && m.contains("$ref") && m["$ref"].is_string() && m.size() == 1;
      self(self, only_ref ? resolve(m["$ref"].get<std::string>(), path) : m, depth + 1);
    }
  };
  add(add, s, 0);
  int with_properties = 0;
  bool with_additional = false;
  for (const Json* part : parts) {
    if (!part->is_object()) bad(path + "/allOf", "allOf members must be object schemas");
    with_properties += part->contains("properties") ? 1 : 0;
    with_additional |= part->contains("additionalProperties");
    for (const auto& [k, v] : part->items()) {
      if (k == "allOf" || is_annotation(k)) continue;
      if (k == "properties") {
        for (const auto& [pk, pv] : v.items()) {
          if (merged["properties"].contains(pk) && merged["properties"][pk] != pv)
            bad(path + "/allOf", concat("property '", pk, "' is given two different schemas"));
          merged["properties"][pk] = pv;
        }
      } else if (k == "required") {
        for (const Json& r : v)
          if (!merged.contains("required") || std::find(merged["required"].begin(), merged["required"].end(), r) == merged["required"].end())
            merged["required"].push_back(r);
      } else if (k == "anyOf" || k == "oneOf" || k == "$ref") {
        bad(path + "/allOf", concat("'", k, "' inside allOf cannot be merged"));
      } else {
        if (merged.contains(k) && merged[k] != v) bad(path + "/allOf", concat("'", k, "' is given two different values"));
        merged[k] = v;
      }
    }
  }
  if (with_additional && with_properties > 1)
    bad(path + "/allOf", "additionalProperties beside properties of another member cannot be merged");
  return visit(merged, path, hint);
}

// The JSON types a branch can have (all seven when it does not say).
static std::set<std::string> branch_types(const Json& b) {
  std::set<std::string> out;
  auto add = [&](const std::string& t) {
    out.insert(t);
    if (t == "number") out.insert("integer");
  };
  if (b.is_object() && (b.contains("const") || b.contains("enum"))) {
    for (const Json& v : b.contains("const") ? Json::array({b["const"]}) : b["enum"]) add(json_type_of(v));
    if (out.count("integer")) out.insert("number");  // 1 == 1.0
  } else if (b.is_object() && b.contains("type")) {
    for (const Json& t : b["type"].is_array() ? b["type"] : Json::array({b["type"]})) add(t.is_string() ? t.get<std::string>() : "?");
  } else {
    for (const char* t : {"object", "array", "string", "number", "integer", "boolean", "null"}) out.insert(t);
  }
  return out;
}

bool Converter::provably_disjoint(const Json& branches, const std::string& path) const {
  std::vector<std::set<std::string>> types;
  std::vector<Json> values;  // every branch's const/enum values, when all are const/enum
  bool all_values = true;
  for (const Json& raw : branches) {
    const Json& b = raw.is_object() && raw.contains("$ref") && raw["$ref"].is_string() ? resolve(raw["$ref"].get<std::string>(), path) : raw;
    types.push_back(branch_types(b));
    if (b.is_object() && (b.contains("const") || b.contains("enum"))) {
      for (const Json& v : b.contains("const") ? Json::array({b["const"]}) : b["enum"]) {
        if (std::find(values.begin(), values.end(), v) != values.end()) return false;
        values.push_back(v);
      }
    } else {
      all_values = false;
    }
  }
  if (all_values) return true;
  for (size_t i = 0; i < types.size(); ++i)
    for (size_t j = i + 1; j < types.size(); ++j)
      for (const std::string& t : types[i])
        if (types[j].count(t)) return false;
  return true;
}

std::string Converter::visit_any_of(const Json& s, const std::string& path, const std::string& hint) {
  const std::string key = s.contains("anyOf") ? "anyOf" : "oneOf";
  for (const auto& [k, v] : s.items())
    if (k != key && !is_annotation(k)) bad(path, concat(key, " with '", k, "' beside it cannot be enforced (move it into each branch)"));
  const Json& branches = s[key];
  if (!branches.is_array() || branches.empty()) bad(path, concat(key, " must be a non-empty list"));
  if (key == "oneOf" && !provably_disjoint(branches, path))
    bad(path, "oneOf whose branches may overlap cannot be enforced (use anyOf, or branches of distinct types or values)");
  std::string body;
  for (size_t i = 0; i < branches.size(); ++i)
    body += (i ? " | " : "") + visit(branches[i], concat(path, "/", key, "/", i), concat(hint, "-", i));
  return rule(hint, body);
}

std::string Converter::const_value(const Json& v) {
  const std::string ws = primitive("ws");
  if (v.is_object()) {
    std::string out = "\"{\" " + ws;
    bool first = true;
    for (const auto& [k, x] : v.items()) {
      out += (first ? " " : " \",\" " + ws + " ") + gbnf_literal(Json(k).dump()) + " " + ws + " \":\" " + ws + " " + const_value(x);
      first = false;
    }
    return "(" + out + " \"}\" " + ws + ")";
  }
  if (v.is_array()) {
    std::string out = "\"[\" " + ws;
    for (size_t i = 0; i < v.size(); ++i) out += (i ? " \",\" " + ws + " " : " ") + const_value(v[i]);
    return "(" + out + " \"]\" " + ws + ")";
  }
  return gbnf_literal(v.dump()) + " " + ws;
}

std::string Converter::visit_enum(const Json& s, const std::string& path, const std::string& hint) {
  for (const auto& [k, v] : s.items())
    if (k != "enum" && k != "const" && k != "type" && !is_annotation(k))
      bad(path, concat("enum/const with '", k, "' beside it cannot be enforced"));
  if (s.contains("enum") && s.contains("const")) bad(path, "enum and const together cannot be enforced");
  if (s.contains("enum") && !s["enum"].is_array()) bad(path, "enum must be a list");
  const Json values = s.contains("const") ? Json::array({s["const"]}) : s["enum"];
  std::string body;
  for (const Json& v : values) {
    if (s.contains("type")) {  // keep the values of the schema's type(s)
      std::set<std::string> allowed = branch_types(Json{{"type", s["type"]}});
      const bool integral = v.is_number_float() && std::floor(v.get<double>()) == v.get<double>();
      if (!allowed.count(json_type_of(v)) && !(integral && allowed.count("integer"))) continue;
    }
    body += (body.empty() ? "" : " | ") + const_value(v);
  }
  if (body.empty()) bad(path, "no enum/const value has the schema's type");
  return rule(hint, body);
}

// An additional property's key: a string that differs from every declared
// key. It follows the trie of the declared keys' JSON text while it agrees
// with one, raw characters only (an escape could spell a declared key's
// character another way), and is free once it has left them all.
std::string Converter::extra_key(const std::vector<std::string>& declared, const std::string& hint) {
  struct Node {
    std::map<std::string, size_t> children;  // a raw character's bytes or a whole escape -> node
    bool is_key = false;
  };
  std::vector<Node> trie(1);
  for (const std::string& k : declared) {
    const std::string text = Json(k).dump();
    size_t n = 0;
    for (size_t i = 1; i + 1 < text.size();) {
      const auto b = static_cast<unsigned char>(text[i]);
      const size_t len = text[i] == '\\' ? (text[i + 1] == 'u' ? 6 : 2) : b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
      const std::string unit = text.substr(i, len);
      i += len;
      auto it = trie[n].children.find(unit);
      if (it == trie[n].children.end()) {
        trie.push_back({});
        it = trie[n].children.emplace(unit, trie.size() - 1).first;
      }
      n = it->second;
    }
    trie[n].is_key = true;
  }
  const std::string free_rest = primitive("char") + "* \"\\\"\"";
  std::vector<std::string> names(trie.size());
  for (size_t n = trie.size(); n-- > 0;) {  // children were made after their parent: bottom-up
    Ranges taken = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
    std::string body;
    for (const auto& [unit, child] : trie[n].children) {
      body += (body.empty() ? "" : " | ") + gbnf_literal(unit) + " " + names[child];
      if (unit[0] != '\\') {
        uint32_t cp = static_cast<unsigned char>(unit[0]);
        if (unit.size() > 1) cp &= 0xFF >> (unit.size() + 1);
        for (size_t j = 1; j < unit.size(); ++j) cp = (cp << 6) | (unit[j] & 0x3F);
        taken.emplace_back(cp, cp);
      }
    }
    body += (body.empty() ? "" : " | ") + gbnf_class(ranges_complement(taken)) + " " + free_rest;
    if (!trie[n].is_key) body += " | \"\\\"\"";
    names[n] = rule(concat(hint, "-key-", n), body);
  }
  return "\"\\\"\" " + names[0] + " " + primitive("ws");
}

std::string Converter::visit_object(const Json& s, const std::string& path, const std::string& hint) {
  const Json props = s.contains("properties") ? s["properties"] : Json::object();
  const Json required = s.contains("required") ? s["required"] : Json::array();
  if (!props.is_object()) bad(path, "properties must be an object");
  if (!required.is_array()) bad(path, "required must be a list of strings");
  // Absent additionalProperties: none beside declared properties (an empty
  // "properties" too: how tools declare "no arguments"); any when neither
  // properties nor required is given.
  const bool declared = s.contains("properties") || s.contains("required");
  const Json additional = s.contains("additionalProperties") ? s["additionalProperties"] : Json(!declared);
  if (props.empty() && required.empty() && additional == Json(true)) return primitive("object");
  const std::string ws = primitive("ws");
  struct Entry {
    std::string key, value;
    bool required;
  };
  std::vector<Entry> entries;
  std::vector<std::string> keys;
  auto is_required = [&](const std::string& k) { return std::find(required.begin(), required.end(), Json(k)) != required.end(); };
  for (const auto& [k, sub] : props.items()) {
    entries.push_back({k, visit(sub, path + "/properties/" + pointer_escape(k), hint + "-" + k), is_required(k)});
    keys.push_back(k);
  }
  for (const Json& r : required) {
    if (!r.is_string()) bad(path, "required must be a list of strings");
    if (!props.contains(r.get<std::string>())) entries.push_back({r.get<std::string>(), primitive("value"), true}), keys.push_back(r.get<std::string>());
  }
  std::string tail = "\"\"", first_tail = "\"\"";  // after the last declared property: none yet / some before
  if (additional != Json(false)) {
    const std::string value = additional == Json(true) ? primitive("value") : visit(additional, path + "/additionalProperties", hint + "-additional");
    const std::string kv = rule(hint + "-extra", extra_key(keys, hint) + " \":\" " + ws + " " + value);
    tail = rule(hint + "-extras", "(\",\" " + ws + " " + kv + ")*");
    first_tail = rule(hint + "-extras-first", "(" + kv + " " + tail + ")?");
  }
  for (size_t i = entries.size(); i-- > 0;) {
    const Entry& e = entries[i];
    const std::string kv = gbnf_literal(Json(e.key).dump()) + " " + ws + " \":\" " + ws + " " + e.value;
    const std::string next_tail = e.required ? concat("\",\" ", ws, " ", kv, " ", tail) : concat("(\",\" ", ws, " ", kv, ")? ", tail);
    const std::string next_first = e.required ? concat(kv, " ", tail) : concat(kv, " ", tail, " | ", first_tail);
    tail = rule(concat(hint, "-after-", i), next_tail);
    first_tail = rule(concat(hint, "-from-", i), next_first);
  }
  return rule(hint, "\"{\" " + ws + " " + first_tail + " \"}\" " + ws);
}

std::string Converter::visit_array(const Json& s, const std::string& path, const std::string& hint) {
  if (s.contains("items") && s["items"].is_array()) bad(path, "items as a list (draft 7 tuples) is not supported: use prefixItems");
  std::vector<std::string> prefix;
  if (s.contains("prefixItems")) {
    if (!s["prefixItems"].is_array()) bad(path, "prefixItems must be a list");
    for (size_t i = 0; i < s["prefixItems"].size(); ++i)
      prefix.push_back(visit(s["prefixItems"][i], concat(path, "/prefixItems/", i), concat(hint, "-", i)));
  }
  const bool no_more = s.contains("items") && s["items"] == Json(false);
  const std::string item = no_more ? "" : s.contains("items") ? visit(s["items"], path + "/items", hint + "-item") : primitive("value");
  auto count = [&](const char* key) -> std::optional<size_t> {
    if (!s.contains(key)) return std::nullopt;
    if (!s[key].is_number_unsigned() && !(s[key].is_number_integer() && s[key].get<int64_t>() >= 0))
      bad(path, concat(key, " must be a non-negative integer"));
    if (s[key].get<uint64_t>() > 100000) bad(path, concat(key, " over 100000 is not supported"));
    return size_t(s[key].get<uint64_t>());
  };
  const size_t lo = count("minItems").value_or(0);
  std::optional<size_t> hi = count("maxItems");
  if (no_more) hi = std::min(hi.value_or(prefix.size()), prefix.size());
  if (hi && *hi < lo) bad(path, "no array has that many items (maxItems < minItems, or items false)");
  const std::string ws = primitive("ws");
  auto elem = [&](size_t i) { return i < prefix.size() ? prefix[i] : item; };
  // rest: the items after the first i, as a rule; from `bound` on, either none (maxItems) or any number.
  const size_t bound = hi ? *hi : std::max(prefix.size(), lo);
  std::string rest = hi ? "\"\"" : rule(hint + "-more", "(\",\" " + ws + " " + item + ")*");
  for (size_t i = bound; i-- > 1;) {
    const std::string part = concat("\",\" ", ws, " ", elem(i), " ", rest);
    rest = rule(concat(hint, "-rest-", i), i >= lo ? "(" + part + ")?" : part);
  }
  std::string body = "\"[\" " + ws;
  if (bound > 0 || !hi) body += lo > 0 ? concat(" ", elem(0), " ", rest) : concat(" (", elem(0), " ", rest, ")?");
  return rule(hint, body + " \"]\" " + ws);
}

}  // namespace loom::infer::json_schema
