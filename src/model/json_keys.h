// Typed, error-reporting access to a JSON config's keys, shared by the readers
// of loom_config.json and of Hugging Face's config.json (config_json.h).
#pragma once

#include <charconv>
#include <cmath>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/config.h"

namespace loom::model {

// One JSON object's keys, with errors naming where and the key.
class Keys {
 public:
  using json = nlohmann::json;
  Keys(const json& j, const std::string& where) : j_(j), where_(where) {
    LOOM_REQUIRE(j.is_object(), where, ": expected a JSON object, got ", j.type_name());
  }
  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  int64_t integer(const char* key) const {
    const json& v = at(key);
    LOOM_REQUIRE(v.is_number_integer(), where_, ": key '", key, "' = ", v.dump(), " is not an integer");
    return v.get<int64_t>();
  }
  float number(const char* key) const {
    const json& v = at(key);
    LOOM_REQUIRE(v.is_number(), where_, ": key '", key, "' = ", v.dump(), " is not a number");
    const double d = v.get<double>();
    LOOM_REQUIRE(std::abs(d) <= std::numeric_limits<float>::max(), where_, ": key '", key, "' = ", v.dump(),
                 " is out of range: at most ", std::numeric_limits<float>::max(), " in magnitude");
    return static_cast<float>(d);
  }
  bool boolean(const char* key) const {
    const json& v = at(key);
    LOOM_REQUIRE(v.is_boolean(), where_, ": key '", key, "' = ", v.dump(), " is not true or false");
    return v.get<bool>();
  }
  std::string string(const char* key) const {
    const json& v = at(key);
    LOOM_REQUIRE(v.is_string(), where_, ": key '", key, "' = ", v.dump(), " is not a string");
    return v.get<std::string>();
  }
  const json& at(const char* key) const {
    LOOM_REQUIRE(has(key), where_, ": key '", key, "' is missing");
    return j_[key];
  }
  template <typename T, typename F>
  void maybe(const char* key, T& dst, F get) const {
    if (has(key)) dst = (this->*get)(key);
  }
  const json& object() const { return j_; }
  const std::string& where() const { return where_; }

 private:
  const json& j_;
  const std::string& where_;
};

// Prefixes a config validation error with where it came from.
inline void validate_at(const ModelConfig& cfg, const std::string& where) {
  try {
    cfg.validate();
  } catch (const Error& e) {
    fail(where, ": ", e.what());
  }
}

// A float as the double with the same shortest decimal form, so 1e-5f is
// written 1e-05, not 9.999999747378752e-06.
inline double decimal(float f) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, f);
  return std::stod(std::string(buf, r.ptr));
}

}  // namespace loom::model
