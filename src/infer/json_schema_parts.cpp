// Text pieces of the JSON-schema compiler: GBNF literals and classes, JSON
// string characters, integer ranges as digit patterns, patterns, formats.
#include "infer/json_schema_parts.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"

namespace loom::infer::json_schema {
namespace {

constexpr uint32_t kMaxCp = 0x10FFFF;

std::string class_char(uint32_t cp) {
  if ((cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return std::string(1, char(cp));
  char buf[16];
  if (cp < 0x100) std::snprintf(buf, sizeof buf, "\\x%02X", cp);
  else if (cp < 0x10000) std::snprintf(buf, sizeof buf, "\\u%04X", cp);
  else std::snprintf(buf, sizeof buf, "\\U%08X", cp);
  return buf;
}

Ranges intersect(const Ranges& a, uint32_t lo, uint32_t hi) {
  Ranges out;
  for (const auto& [x, y] : a)
    if (x <= hi && lo <= y) out.emplace_back(std::max(x, lo), std::min(y, hi));
  return out;
}

Ranges complement(const Ranges& a) {
  Ranges out;
  uint32_t next = 0;
  for (const auto& [x, y] : a) {
    if (x > next) out.emplace_back(next, x - 1);
    next = y + 1;
  }
  if (next <= kMaxCp) out.emplace_back(next, kMaxCp);
  return out;
}

Ranges normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& x : r) {
    if (!out.empty() && x.first <= out.back().second + 1) out.back().second = std::max(out.back().second, x.second);
    else out.push_back(x);
  }
  return out;
}

// json.dumps(ensure_ascii=False)'s escape of a character that needs one.
std::string json_escape(uint32_t cp) {
  switch (cp) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\b': return "\\b";
    case '\f': return "\\f";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    default: {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      return buf;
    }
  }
}

}  // namespace

std::string gbnf_literal(const std::string& bytes) {
  std::string out = "\"";
  for (char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') out += '\\', out += c;
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (b < 0x20 || b == 0x7F) out += class_char(b);
    else out += c;
  }
  return out + "\"";
}

std::string gbnf_class(const Ranges& ranges, bool negated) {
  std::string out = negated ? "[^" : "[";
  for (const auto& [lo, hi] : ranges) out += hi > lo ? class_char(lo) + "-" + class_char(hi) : class_char(lo);
  return out + "]";
}

std::string json_char_set(const Ranges& ranges) {
  const Ranges plain = {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, kMaxCp}};
  Ranges raw;
  for (const auto& [lo, hi] : plain)
    for (const auto& r : intersect(ranges, lo, hi)) raw.push_back(r);
  std::vector<std::string> alts;
  if (!raw.empty()) alts.push_back(gbnf_class(raw));
  for (uint32_t cp = 0; cp <= 0x5C; cp = cp == 0x1F ? 0x22 : cp == 0x22 ? 0x5C : cp + 1)
    if (!intersect(ranges, cp, cp).empty()) alts.push_back(gbnf_literal(json_escape(cp)));
  if (alts.empty()) return "[]";
  if (alts.size() == 1) return alts[0];
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out + ")";
}

namespace {

// Decimal strings x <= y of one length -> a digit pattern for [x, y].
std::string same_length(const std::string& x, const std::string& y) {
  if (x.empty()) return "";
  const size_t n = x.size() - 1;
  const std::string any = n ? concat(" [0-9]{", n, "}") : "";
  if (x[0] == y[0]) {
    const std::string rest = same_length(x.substr(1), y.substr(1));
    return concat("\"", x[0], "\"", rest.empty() ? "" : " " + rest);
  }
  const bool x_low = x.find_first_not_of('0', 1) == std::string::npos;
  const bool y_high = y.find_first_not_of('9', 1) == std::string::npos;
  std::vector<std::string> alts;
  const char from = x_low ? x[0] : char(x[0] + 1), to = y_high ? y[0] : char(y[0] - 1);
  if (!x_low) alts.push_back(concat("\"", x[0], "\" (", same_length(x.substr(1), std::string(n, '9')), ")"));
  if (from <= to) alts.push_back(concat("[", from, "-", to, "]", any));
  if (!y_high) alts.push_back(concat("\"", y[0], "\" (", same_length(std::string(n, '0'), y.substr(1)), ")"));
  std::string out;
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return alts.size() == 1 ? out : "(" + out + ")";
}

// Non-negative a <= b -> alternatives, one per digit count.
void non_negative(int64_t a, int64_t b, std::vector<std::string>& alts, const std::string& sign) {
  int64_t low = 0, high = 9;  // the numbers of the current digit count
  for (int digits = 1; digits <= 16 && low <= b; ++digits, low = high + 1, high = high * 10 + 9) {
    const int64_t x = std::max(a, low), y = std::min(b, high);
    if (x <= y) alts.push_back(sign + "(" + same_length(std::to_string(x), std::to_string(y)) + ")");
  }
}

}  // namespace

std::string integer_range(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  constexpr int64_t kBig = 9999999999999999;  // 16 digits
  const int64_t a = std::max(lo.value_or(-kBig), -kBig), b = std::min(hi.value_or(kBig), kBig);
  LOOM_REQUIRE(a <= b, "no integer is in [", a, ", ", b, "]");
  std::vector<std::string> alts;
  if (a < 0) non_negative(std::max<int64_t>(1, -b), -a, alts, "\"-\" ");
  if (b >= 0) non_negative(std::max<int64_t>(0, a), b, alts, "");
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out + ")";
}

std::optional<std::string> format_to_gbnf(const std::string& format) {
  const std::string year = R"(([0-9]{3} [1-9] | [0-9]{2} [1-9] "0" | [0-9] [1-9] "00" | [1-9] "000"))";
  const std::string by4 = R"(("0" [48] | [2468] [048] | [13579] [26]))";
  const std::string leap = "([0-9]{2} " + by4 + " | " + by4 + " \"00\")";
  const std::string d28 = R"("0" [1-9] | "1" [0-9] | "2" [0-8])";
  const std::string date = "(" + year + " \"-\" ((\"01\" | \"03\" | \"05\" | \"07\" | \"08\" | \"10\" | \"12\") \"-\" (" +
                           d28 + " | \"29\" | \"30\" | \"31\") | (\"04\" | \"06\" | \"09\" | \"11\") \"-\" (" + d28 +
                           " | \"29\" | \"30\") | \"02-\" (" + d28 + ")) | " + leap + " \"-02-29\")";
  const std::string hour = R"(([01] [0-9] | "2" [0-3]))";
  const std::string time = "(" + hour + " \":\" [0-5] [0-9] \":\" ([0-5] [0-9] | \"60\") (\".\" [0-9]{1,9})? ([Zz] | [-+] " +
                           hour + " \":\" [0-5] [0-9]))";
  if (format == "date") return date;
  if (format == "time") return time;
  if (format == "date-time") return date + " [Tt] " + time;
  if (format == "uuid") {
    const std::string h = "[0-9a-fA-F]";
    return h + "{8} \"-\" " + h + "{4} \"-\" " + h + "{4} \"-\" " + h + "{4} \"-\" " + h + "{12}";
  }
  return std::nullopt;
}

// Used by the pattern translator (json_schema_pattern.cpp).
Ranges ranges_complement(const Ranges& a) { return complement(normalize(a)); }
Ranges ranges_normalize(const Ranges& a) { return normalize(a); }

}  // namespace loom::infer::json_schema
