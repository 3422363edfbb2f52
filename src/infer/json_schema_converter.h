// The JSON-schema compiler's walker, shared by json_schema_grammar.cpp
// (types, strings, integers, primitives) and json_schema_structure.cpp
// (objects, arrays, $ref, allOf, anyOf/oneOf, enum/const).
#pragma once

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace loom::infer::json_schema {

using Json = nlohmann::ordered_json;

std::string sanitize(const std::string& s);  // a GBNF rule name piece: [a-zA-Z0-9-]
std::string json_type_of(const Json& v);     // "integer" for integral numbers

class Converter {
 public:
  Converter(const Json& doc, const std::string& root);
  std::string run();

 private:
  [[noreturn]] static void bad(const std::string& path, const std::string& what);

  std::string name_for(const std::string& hint);
  // A rule with this body (the existing one if an equal body has a name).
  std::string rule(const std::string& hint, const std::string& body);

  std::string primitive(const std::string& which);
  std::string visit(const Json& s, const std::string& path, const std::string& hint);
  std::string visit_ref(const Json& s, const std::string& path);
  std::string visit_any_of(const Json& s, const std::string& path, const std::string& hint);
  std::string visit_all_of(const Json& s, const std::string& path, const std::string& hint);
  std::string visit_enum(const Json& s, const std::string& path, const std::string& hint);
  std::string visit_type(const Json& s, const std::string& type, const std::string& path, const std::string& hint);
  std::string visit_string(const Json& s, const std::string& path, const std::string& hint);
  std::string visit_integer(const Json& s, const std::string& path, const std::string& hint);
  std::string visit_object(const Json& s, const std::string& path, const std::string& hint);
  std::string visit_array(const Json& s, const std::string& path, const std::string& hint);
  std::string extra_key(const std::vector<std::string>& declared, const std::string& hint);
  std::string const_value(const Json& v);
  const Json& resolve(const std::string& ref, const std::string& path) const;
  bool provably_disjoint(const Json& branches, const std::string& path) const;
  void check_keywords(const Json& s, const std::string& path) const;

  const Json& doc_;
  std::string root_;
  std::vector<std::pair<std::string, std::string>> rules_;
  std::map<std::string, std::string> by_body_;
  std::set<std::string> names_;
  std::map<std::string, std::string> refs_;  // "#/..." -> its rule
};


}  // namespace loom::infer::json_schema
