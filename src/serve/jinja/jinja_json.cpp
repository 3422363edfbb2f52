// Python's json.dumps as transformers' tojson filter calls it (jinja_value.h:
// to_json), private to src/serve/jinja*.cpp.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "serve/jinja/jinja_text.h"
#include "serve/jinja/jinja_value.h"

namespace loom::serve::jinja {

namespace {

void append_u16(std::string& out, uint32_t unit) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(unit));
  out += buf;
}

// json.dumps of a string: '"', '\\' and control characters escaped, and
// with ensure_ascii everything past '~' as \uXXXX (UTF-16 surrogate pairs).
void dump_string(std::string& out, std::string_view s, bool ascii) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const auto [cp, len] = text::decode(s, i);
    switch (cp) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (cp < 0x20 || (ascii && cp >= 0x7F && cp < 0x10000)) {
          append_u16(out, cp);
        } else if (ascii && cp >= 0x10000) {
          append_u16(out, 0xD800 + ((cp - 0x10000) >> 10));
          append_u16(out, 0xDC00 + ((cp - 0x10000) & 0x3FF));
        } else {
          out.append(s.substr(i, len));
        }
    }
    i += len;
  }
  out += '"';
}

void dump(std::string& out, const json& j, const JsonFormat& f, int64_t level) {
  if (const Value* callable = callable_of(j)) eval_fail("Object of type ", type_name(*callable), " is not JSON serializable");
  const auto newline = [&](int64_t at) {
    if (!f.indent) return;
    out += '\n';
    for (int64_t k = 0; k < at; ++k) out += *f.indent;
  };
  if (j.is_string()) return dump_string(out, j.get_ref<const std::string&>(), f.ensure_ascii);
  if (j.is_number_float()) {
    const double x = j.get<double>();
    out += std::isnan(x) ? "NaN" : std::isinf(x) ? (x > 0 ? "Infinity" : "-Infinity") : float_repr(x);
    return;
  }
  if (!j.is_array() && !j.is_object()) {
    out += j.is_null() ? "null" : j.is_boolean() ? (j.get<bool>() ? "true" : "false") : repr(j);
    return;
  }
  if (j.empty()) {
    out += j.is_array() ? "[]" : "{}";
    return;
  }
  if (out.size() > kMaxSize) eval_fail("tojson: the result is over ", kMaxSize, " bytes");
  out += j.is_array() ? '[' : '{';
  std::vector<json::const_iterator> items;
  for (auto it = j.begin(); it != j.end(); ++it) items.push_back(it);
  if (j.is_object() && f.sort_keys)
    std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.key() < b.key(); });
  for (size_t k = 0; k < items.size(); ++k) {
    if (k > 0) out += f.item_separator;
    newline(level + 1);
    if (j.is_object()) {
      dump_string(out, items[k].key(), f.ensure_ascii);
      out += f.key_separator;
    }
    dump(out, items[k].value(), f, level + 1);
  }
  newline(level);
  out += j.is_array() ? ']' : '}';
}

}  // namespace

std::string to_json(const Value& v, const JsonFormat& format) {
  if (!v.is_data()) eval_fail("Object of type ", type_name(v), " is not JSON serializable");
  std::string out;
  dump(out, v.j(), format, 0);
  return out;
}

}  // namespace loom::serve::jinja
