#include "serve/jinja/jinja_text.h"

#include <cstdio>

namespace loom::serve::jinja::text {

std::pair<uint32_t, size_t> decode(std::string_view s, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) return {b, 1};
  size_t len = 0;
  uint32_t cp = 0, min = 0;
  if ((b & 0xE0) == 0xC0) {
    len = 2, cp = b & 0x1F, min = 0x80;
  } else if ((b & 0xF0) == 0xE0) {
    len = 3, cp = b & 0x0F, min = 0x800;
  } else if ((b & 0xF8) == 0xF0) {
    len = 4, cp = b & 0x07, min = 0x10000;
  } else {
    return {0xFFFD, 1};
  }
  if (i + len > s.size()) return {0xFFFD, 1};
  for (size_t k = 1; k < len; ++k) {
    const auto c = static_cast<unsigned char>(s[i + k]);
    if ((c & 0xC0) != 0x80) return {0xFFFD, 1};
    cp = (cp << 6) | (c & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {0xFFFD, 1};
  return {cp, len};
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::vector<size_t> char_starts(std::string_view s) {
  std::vector<size_t> starts;
  for (size_t i = 0; i < s.size(); i += decode(s, i).second) starts.push_back(i);
  starts.push_back(s.size());
  return starts;
}

size_t char_count(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); i += decode(s, i).second) ++n;
  return n;
}

bool is_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

size_t space_len_at(std::string_view s, size_t i) {
  const auto [cp, len] = decode(s, i);
  return is_space(cp) ? len : 0;
}

bool all_space(std::string_view s) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size();) {
    const size_t n = space_len_at(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string_view rstrip_space(std::string_view s) {
  const std::vector<size_t> starts = char_starts(s);
  size_t end = starts.size() - 1;
  while (end > 0 && is_space(decode(s, starts[end - 1]).first)) --end;
  return s.substr(0, starts[end]);
}

std::string strip(std::string_view s, const std::string* chars, bool left, bool right) {
  std::vector<uint32_t> set;
  if (chars != nullptr)
    for (size_t i = 0; i < chars->size(); i += decode(*chars, i).second) set.push_back(decode(*chars, i).first);
  const auto strips = [&](uint32_t cp) {
    if (chars == nullptr) return is_space(cp);
    for (uint32_t c : set)
      if (c == cp) return true;
    return false;
  };
  const std::vector<size_t> starts = char_starts(s);
  size_t begin = 0, end = starts.size() - 1;
  while (left && begin < end && strips(decode(s, starts[begin]).first)) ++begin;
  while (right && end > begin && strips(decode(s, starts[end - 1]).first)) --end;
  return std::string(s.substr(starts[begin], starts[end] - starts[begin]));
}

namespace {

std::vector<std::string> split_space(std::string_view s, int64_t maxsplit) {
  std::vector<std::string> parts;
  size_t i = 0;
  const auto skip = [&] {
    while (i < s.size() && space_len_at(s, i) > 0) i += space_len_at(s, i);
  };
  skip();
  while (i < s.size()) {
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
      parts.emplace_back(s.substr(i));
      break;
    }
    size_t j = i;
    while (j < s.size() && space_len_at(s, j) == 0) j += decode(s, j).second;
    parts.emplace_back(s.substr(i, j - i));
    i = j;
    skip();
  }
  return parts;
}

}  // namespace

std::vector<std::string> split(std::string_view s, const std::string* sep, int64_t maxsplit) {
  if (sep == nullptr) return split_space(s, maxsplit);
  std::vector<std::string> parts;
  size_t i = 0;
  while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
    const size_t at = s.find(*sep, i);
    if (at == std::string_view::npos) break;
    parts.emplace_back(s.substr(i, at - i));
    i = at + sep->size();
  }
  parts.emplace_back(s.substr(i));
  return parts;
}

std::string replace(std::string_view s, std::string_view old, std::string_view with, int64_t count) {
  std::string out;
  int64_t done = 0;
  if (old.empty()) {  // Python inserts `with` around every character
    const std::vector<size_t> starts = char_starts(s);
    for (size_t k = 0; k + 1 < starts.size(); ++k) {
      if (count < 0 || done++ < count) out += with;
      out += s.substr(starts[k], starts[k + 1] - starts[k]);
    }
    if (count < 0 || done < count) out += with;
    return out;
  }
  size_t i = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(old, i);
    if (at == std::string_view::npos) break;
    out += s.substr(i, at - i);
    out += with;
    i = at + old.size();
    ++done;
  }
  out += s.substr(i);
  return out;
}

namespace {

uint32_t to_upper(uint32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if (c < 0xB5) return c;
  if (c == 0xB5) return 0x39C;
  if (c >= 0xE0 && c <= 0xFE && c != 0xF7) return c - 0x20;
  if (c == 0xFF) return 0x178;
  if (c >= 0x3B1 && c <= 0x3C9) return c == 0x3C2 ? 0x3A3 : c - 0x20;
  if (c == 0x3AC) return 0x386;
  if (c >= 0x3AD && c <= 0x3AF) return c - 0x25;
  if (c == 0x3CC) return 0x38C;
  if (c == 0x3CD || c == 0x3CE) return c - 0x3F;
  if (c >= 0x430 && c <= 0x44F) return c - 0x20;
  if (c >= 0x450 && c <= 0x45F) return c - 0x50;
  return c;
}

uint32_t to_lower(uint32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c < 0xC0) return c;
  if (c <= 0xDE && c != 0xD7) return c + 0x20;
  if (c == 0x178) return 0xFF;
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 0x20;
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 0x25;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 0x3F;
  if (c >= 0x410 && c <= 0x42F) return c + 0x20;
  if (c >= 0x400 && c <= 0x40F) return c + 0x50;
  return c;
}

bool is_cased(uint32_t c) { return to_upper(c) != c || to_lower(c) != c || c == 0xDF; }

// Maps each code point with map(cp, index, previous code point).
template <typename Map>
std::string map_chars(std::string_view s, Map map) {
  std::string out;
  uint32_t prev = 0;
  size_t index = 0;
  for (size_t i = 0; i < s.size(); ++index) {
    const auto [cp, len] = decode(s, i);
    if (cp == 0xFFFD && len == 1 && static_cast<unsigned char>(s[i]) >= 0x80) {
      out += s[i];  // an invalid byte passes through
    } else {
      append_utf8(out, map(cp, index, prev));
    }
    prev = cp;
    i += len;
  }
  return out;
}

bool title_separator(uint32_t c) { return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || is_space(c); }

}  // namespace

std::string upper(std::string_view s) {
  return map_chars(s, [](uint32_t c, size_t, uint32_t) { return to_upper(c); });
}

std::string lower(std::string_view s) {
  return map_chars(s, [](uint32_t c, size_t, uint32_t) { return to_lower(c); });
}

std::string capitalize(std::string_view s) {
  return map_chars(s, [](uint32_t c, size_t i, uint32_t) { return i == 0 ? to_upper(c) : to_lower(c); });
}

std::string str_title(std::string_view s) {
  return map_chars(s, [](uint32_t c, size_t i, uint32_t prev) {
    return i > 0 && is_cased(prev) ? to_lower(c) : to_upper(c);
  });
}

std::string filter_title(std::string_view s) {
  return map_chars(s, [](uint32_t c, size_t i, uint32_t prev) {
    return i == 0 || title_separator(prev) ? to_upper(c) : to_lower(c);
  });
}

std::string html_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

namespace {

// Python's str.isprintable() is false for these (categories Cc, Cf, Zs but
// the space, Zl, Zp, Co, Cs); unassigned code points are not listed.
bool printable(uint32_t c) {
  if (c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD) return false;
  if ((c >= 0x600 && c <= 0x605) || c == 0x61C || c == 0x6DD || c == 0x70F || c == 0x1680 || c == 0x180E) return false;
  if ((c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) || (c >= 0x205F && c <= 0x206F)) return false;
  if (c == 0x3000 || (c >= 0xD800 && c <= 0xF8FF) || c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFB)) return false;
  return !(c == 0xE0001 || (c >= 0xE0020 && c <= 0xE007F) || c >= 0xF0000);
}

}  // namespace

std::string repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const char quote = has_single && s.find('"') == std::string_view::npos ? '"' : '\'';
  std::string out(1, quote);
  for (size_t i = 0; i < s.size();) {
    const auto [cp, len] = decode(s, i);
    if (cp == static_cast<uint32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n' || cp == '\r' || cp == '\t') {
      out += cp == '\n' ? "\\n" : cp == '\r' ? "\\r" : "\\t";
    } else if (printable(cp)) {
      append_utf8(out, cp);
    } else {
      char buf[16];
      const char* format = cp < 0x100 ? "\\x%02x" : cp < 0x10000 ? "\\u%04x" : "\\U%08x";
      std::snprintf(buf, sizeof buf, format, static_cast<unsigned>(cp));
      out += buf;
    }
    i += len;
  }
  out += quote;
  return out;
}

std::vector<std::string> splitlines(std::string_view s) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < s.size();) {
    const auto [cp, len] = decode(s, i);
    const bool end = cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || (cp >= 0x1C && cp <= 0x1E) ||
                     cp == 0x85 || cp == 0x2028 || cp == 0x2029;
    if (!end) {
      i += len;
      continue;
    }
    lines.emplace_back(s.substr(start, i - start));
    i += len;
    if (cp == '\r' && i < s.size() && s[i] == '\n') ++i;
    start = i;
  }
  if (start < s.size()) lines.emplace_back(s.substr(start));
  return lines;
}

}  // namespace loom::serve::jinja::text
