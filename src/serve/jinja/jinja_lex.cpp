// The lexer: jinja2's rules (jinja2/lexer.py, 3.1) for where text ends and a
// tag begins, and for the whitespace around tags: `{%-`/`-%}` strip all
// whitespace on that side, lstrip_blocks drops the indentation before a
// block or comment tag that starts a line (`{%+` keeps it), trim_blocks the
// newline after one (`+%}` keeps it). `}}` and `%}` end a tag only outside
// brackets, so `{{ {'a': {'b': 1}} }}` is one expression.
#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>

#include "serve/jinja/jinja_ast.h"
#include "serve/jinja/jinja_text.h"

namespace loom::serve::jinja {

void fail_at(Pos pos, std::string_view message) {
  throw loom::Error(concat("jinja:", pos.line, ":", pos.col, ": ", message));
}

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

class Lexer {
 public:
  Lexer(std::string_view source, const Options& options) : opt_(options) {
    // Newlines become "\n" everywhere; one trailing newline goes unless kept.
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!opt_.keep_trailing_newline && !src_.empty() && src_.back() == '\n') src_.pop_back();
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> run();

 private:
  Pos pos_of(size_t offset) const {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset) - 1;
    return {static_cast<int>(it - line_starts_.begin()) + 1, static_cast<int>(offset - *it) + 1};
  }
  [[noreturn]] void fail(size_t offset, std::string_view message) const { fail_at(pos_of(offset), message); }
  void emit(Tok kind, size_t offset, std::string text = {}) { out_.push_back({kind, pos_of(offset), std::move(text)}); }
  size_t skip_space(size_t p) const {
    while (p < src_.size() && text::space_len_at(src_, p) > 0) p += text::space_len_at(src_, p);
    return p;
  }
  void emit_text(size_t begin, size_t end, char kind, char sign);
  size_t lex_comment(size_t open, size_t body);
  size_t lex_tag(size_t open, size_t body, bool block);
  size_t tag_end(size_t p, bool block) const;
  size_t lex_number(size_t p);
  size_t lex_string(size_t p);
  size_t lex_operator(size_t p, std::string& balance);

  const Options& opt_;
  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> out_;
  bool line_starting_ = true;  // the last tag ended a line (jinja2's line_starting)
};

std::vector<Token> Lexer::run() {
  size_t pos = 0;
  while (pos < src_.size()) {
    size_t open = pos;
    while ((open = src_.find('{', open)) != std::string::npos && open + 1 < src_.size()) {
      const char c = src_[open + 1];
      if (c == '{' || c == '%' || c == '#') break;
      ++open;
    }
    if (open == std::string::npos || open + 1 >= src_.size()) {
      emit_text(pos, src_.size(), 0, 0);
      break;
    }
    const char kind = src_[open + 1];
    size_t body = open + 2;
    char sign = 0;
    if (body < src_.size() && (src_[body] == '-' || src_[body] == '+')) sign = src_[body++];
    emit_text(pos, open, kind, sign);
    pos = kind == '#' ? lex_comment(open, body) : lex_tag(open, body, kind == '%');
  }
  emit(Tok::Eof, src_.size());
  return std::move(out_);
}

// The text before a tag of kind ('{', '%', '#'; 0: none follows) opened with sign.
void Lexer::emit_text(size_t begin, size_t end, char kind, char sign) {
  std::string_view text(src_.data() + begin, end - begin);
  if (sign == '-') {
    text = text::rstrip_space(text);
  } else if (sign != '+' && opt_.lstrip_blocks && (kind == '%' || kind == '#')) {
    const size_t nl = text.rfind('\n');
    const size_t line = nl == std::string_view::npos ? 0 : nl + 1;
    if ((line > 0 || line_starting_) && text::all_space(text.substr(line))) text = text.substr(0, line);
  }
  if (!text.empty()) emit(Tok::Text, begin, std::string(text));
}

size_t Lexer::lex_comment(size_t open, size_t body) {
  const size_t close = src_.find("#}", body);
  if (close == std::string::npos) fail(open, "the comment is not closed: '#}' is missing");
  const char sign = close > body && (src_[close - 1] == '-' || src_[close - 1] == '+') ? src_[close - 1] : 0;
  size_t end = close + 2;
  if (sign == '-') {
    end = skip_space(end);
  } else if (sign != '+' && opt_.trim_blocks && end < src_.size() && src_[end] == '\n') {
    ++end;
  }
  line_starting_ = src_[end - 1] == '\n';
  return end;
}

// Where the tag ends if its end marker starts at p, or npos.
size_t Lexer::tag_end(size_t p, bool block) const {
  const std::string_view rest = std::string_view(src_).substr(p);
  const char* close = block ? "%}" : "}}";
  if (block && rest.starts_with("+%}")) return p + 3;
  if (rest.size() >= 3 && rest[0] == '-' && rest.substr(1, 2) == close) return skip_space(p + 3);
  if (rest.starts_with(close)) {
    const size_t end = p + 2;
    return block && opt_.trim_blocks && end < src_.size() && src_[end] == '\n' ? end + 1 : end;
  }
  return std::string::npos;
}

size_t Lexer::lex_tag(size_t open, size_t body, bool block) {
  emit(block ? Tok::BlockBegin : Tok::VarBegin, open);
  std::string balance;  // the closing brackets expected, innermost last
  size_t p = body;
  while (true) {
    if (p >= src_.size()) fail(open, block ? "the tag is not closed: '%}' is missing" : "'}}' is missing");
    if (balance.empty()) {
      const size_t end = tag_end(p, block);
      if (end != std::string::npos) {
        emit(block ? Tok::BlockEnd : Tok::VarEnd, p);
        line_starting_ = src_[end - 1] == '\n';
        return end;
      }
    }
    const char c = src_[p];
    if (const size_t space = text::space_len_at(src_, p); space > 0) {
      p += space;
    } else if (is_digit(c)) {
      p = lex_number(p);
    } else if (is_name_start(c)) {
      size_t e = p;
      while (e < src_.size() && is_name_char(src_[e])) ++e;
      emit(Tok::Name, p, src_.substr(p, e - p));
      p = e;
    } else if (c == '\'' || c == '"') {
      p = lex_string(p);
    } else {
      p = lex_operator(p, balance);
    }
  }
}

size_t Lexer::lex_operator(size_t p, std::string& balance) {
  static constexpr const char* kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
  const std::string_view rest = std::string_view(src_).substr(p);
  for (const char* op : kTwo) {
    if (rest.starts_with(op)) {
      emit(Tok::Op, p, op);
      return p + 2;
    }
  }
  const char c = src_[p];
  if (std::strchr("+-/*%~[](){}><=.:|,;", c) == nullptr || c == '\0')
    fail(p, concat("unexpected character ", text::repr(src_.substr(p, text::decode(src_, p).second))));
  if (c == '(' || c == '[' || c == '{') {
    if (balance.size() >= static_cast<size_t>(kMaxDepth)) fail(p, concat("brackets nested deeper than ", kMaxDepth));
    balance += c == '(' ? ')' : c == '[' ? ']' : '}';
  } else if (c == ')' || c == ']' || c == '}') {
    if (balance.empty()) fail(p, concat("unexpected '", c, "'"));
    if (balance.back() != c) fail(p, concat("unexpected '", c, "', expected '", balance.back(), "'"));
    balance.pop_back();
  }
  emit(Tok::Op, p, std::string(1, c));
  return p + 1;
}

// (\d+_)*\d+ from p: digits, single underscores between them.
size_t digit_run(const std::string& s, size_t p) {
  while (p < s.size() && (is_digit(s[p]) || (s[p] == '_' && p + 1 < s.size() && is_digit(s[p + 1])))) ++p;
  return p;
}

int hex_value(char c) {
  if (is_digit(c)) return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Python's string escapes (jinja2 decodes literals with "unicode-escape").
std::string unescape(std::string_view raw, Pos at) {
  std::string out;
  const auto code = [&](size_t& k, int digits, int base) {
    uint32_t cp = 0;
    for (int d = 0; d < digits; ++d, ++k) {
      const int v = k < raw.size() ? hex_value(raw[k]) : -1;
      if (v < 0 || v >= base) fail_at(at, concat("truncated \\", raw[k - d - 1], " escape in a string"));
      cp = cp * static_cast<uint32_t>(base) + static_cast<uint32_t>(v);
    }
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) fail_at(at, "a string escape names an invalid code point");
    text::append_utf8(out, cp);
  };
  for (size_t k = 0; k < raw.size();) {
    const char c = raw[k++];
    if (c != '\\' || k >= raw.size()) {
      out += c;
      continue;
    }
    const char e = raw[k++];
    static constexpr char kNames[] = "\\'\"abfnrtv";
    static constexpr char kValues[] = "\\'\"\a\b\f\n\r\t\v";
    const char* simple = std::strchr(kNames, e);
    if (e == '\n') continue;  // a line continuation
    if (simple != nullptr && e != '\0') {
      out += kValues[simple - kNames];
    } else if (e == 'x' || e == 'u' || e == 'U') {
      code(k, e == 'x' ? 2 : e == 'u' ? 4 : 8, 16);
    } else if (e >= '0' && e <= '7') {
      uint32_t cp = static_cast<uint32_t>(e - '0');
      for (int d = 0; d < 2 && k < raw.size() && raw[k] >= '0' && raw[k] <= '7'; ++d)
        cp = cp * 8 + static_cast<uint32_t>(raw[k++] - '0');
      text::append_utf8(out, cp);
    } else if (e == 'N') {
      fail_at(at, "\\N{...} escapes are not supported by loom's jinja");
    } else {
      out += '\\';
      out += e;
    }
  }
  return out;
}

size_t Lexer::lex_number(size_t p) {
  const bool after_dot = p > 0 && src_[p - 1] == '.';  // x.0.1 is x[0][1], as in jinja2
  size_t end = digit_run(src_, p);
  bool is_float = false;
  if (!after_dot) {
    size_t q = end;
    if (q + 1 < src_.size() && src_[q] == '.' && is_digit(src_[q + 1])) q = digit_run(src_, q + 1), is_float = true;
    if (q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
      size_t r = q + 1;
      if (r < src_.size() && (src_[r] == '+' || src_[r] == '-')) ++r;
      if (r < src_.size() && is_digit(src_[r])) q = digit_run(src_, r), is_float = true;
    }
    if (is_float) end = q;
  }
  std::string digits;
  for (size_t i = p; i < end; ++i)
    if (src_[i] != '_') digits += src_[i];
  if (is_float) {
    emit(Tok::Float, p, digits);
    out_.back().float_value = std::strtod(digits.c_str(), nullptr);
    return end;
  }
  if (digits.size() > 1 && digits[0] == '0' && digits.find_first_not_of('0') != std::string::npos)
    fail(p, "an integer cannot start with 0");
  int64_t value = 0;
  const auto result = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (result.ec != std::errc()) fail(p, concat("the integer ", digits, " is past loom's 64-bit integers"));
  emit(Tok::Int, p, digits);
  out_.back().int_value = value;
  return end;
}

size_t Lexer::lex_string(size_t p) {
  const char quote = src_[p];
  size_t i = p + 1;
  while (i < src_.size() && src_[i] != quote) i += src_[i] == '\\' ? 2 : 1;
  if (i >= src_.size()) fail(p, "the string is not closed");
  emit(Tok::String, p, unescape(std::string_view(src_).substr(p + 1, i - p - 1), pos_of(p)));
  return i + 1;
}

}  // namespace

std::vector<Token> lex(std::string_view source, const Options& options) { return Lexer(source, options).run(); }

}  // namespace loom::serve::jinja
