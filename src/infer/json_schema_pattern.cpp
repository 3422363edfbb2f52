// A JSON schema "pattern" (an ECMA-262 regex; a subset) as a GBNF
// expression over the string's JSON text. The subset: literal characters,
// escapes of punctuation, \t \n \r \f \v \xHH \uHHHH, \d \w \s (ASCII digits
// and word characters; \s the white space ECMA and Python's re agree on),
// classes [...] with ranges and negation, ., groups ( ) (?: ), |, * + ?
// {m} {m,} {m,n} (lazy forms too: same language), ^ and $ at the ends of a
// top-level alternative. A pattern is a search: an end without its anchor
// may have any characters there.
#include <cstdint>

#include "core/error.h"
#include "infer/json_schema_parts.h"

namespace loom::infer::json_schema {
namespace {

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A},
                       {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}};

class PatternParser {
 public:
  PatternParser(const std::string& p, const std::string& any, const std::string& where) : p_(p), any_(any), where_(where) {}

  std::string top() {
    std::string out = "(";
    for (bool first = true;; first = false) {
      const bool start = eat('^');
      std::string seq = sequence(true);
      const bool end = eat('$');
      if (!start) seq = any_ + "* " + seq;
      if (!end) seq += " " + any_ + "*";
      out += (first ? "" : " | ") + seq;
      if (i_ == p_.size()) break;
      if (!eat('|')) bad("'^' and '$' only at the ends of the pattern or of a top-level alternative");
    }
    return out + ")";
  }

 private:
  [[noreturn]] void bad(const std::string& what) const {
    fail(where_, "pattern '", p_, "' at offset ", i_, ": ", what);
  }
  bool eat(char c) {
    if (i_ < p_.size() && p_[i_] == c) return ++i_, true;
    return false;
  }

  std::string alternation() {
    std::string out = "(" + sequence(false);
    while (eat('|')) out += " | " + sequence(false);
    return out + ")";
  }

  std::string sequence(bool top) {
    std::string out = "\"\"";
    while (i_ < p_.size() && p_[i_] != '|' && p_[i_] != ')' && !(top && p_[i_] == '$')) {
      std::string atom_text = atom();
      out += " " + quantified(atom_text);
    }
    if (!top && i_ < p_.size() && p_[i_] == '$') bad("'$' inside a group");
    return out;
  }

  std::string quantified(const std::string& a) {
    std::string q;
    if (eat('*')) q = "*";
    else if (eat('+')) q = "+";
    else if (eat('?')) q = "?";
    else if (i_ < p_.size() && p_[i_] == '{') q = braces();
    else return a;
    eat('?');  // lazy: the same language
    if (i_ < p_.size() && (p_[i_] == '*' || p_[i_] == '+' || p_[i_] == '?' || p_[i_] == '{')) bad("a quantifier after a quantifier");
    return "(" + a + ")" + q;
  }

  std::string braces() {
    const size_t start = i_++;
    std::string q = "{";
    while (i_ < p_.size() && ((p_[i_] >= '0' && p_[i_] <= '9') || p_[i_] == ',')) q += p_[i_++];
    if (!eat('}') || q.size() == 1 || q[1] == ',') i_ = start, bad("'{' that is not a quantifier {m}, {m,} or {m,n}");
    return q + "}";
  }

  std::string atom() {
    const char c = p_[i_];
    if (c == '(') {
      ++i_;
      if (eat('?') && !eat(':')) bad("only (?: ) groups: no lookaround or named groups");
      std::string inner = alternation();
      if (!eat(')')) bad("'(' is never closed");
      return inner;
    }
    if (c == '[') return json_char_set(char_class());
    if (c == '.') return ++i_, json_char_set(ranges_complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}));
    if (c == '^' || c == '$') bad("'^' and '$' only at the ends of the pattern or of a top-level alternative");
    if (c == '*' || c == '+' || c == '?' || c == '{') bad("a quantifier with nothing before it");
    if (c == ')') bad("')' without '('");
    if (c == '\\') return json_char_set(escape(false));
    const uint32_t cp = utf8();
    return json_char_set({{cp, cp}});
  }

  uint32_t utf8() {
    const auto b = static_cast<unsigned char>(p_[i_]);
    const int len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : 4;
    uint32_t cp = len == 1 ? b : b & (0xFF >> (len + 1));
    for (int k = 1; k < len && i_ + size_t(k) < p_.size(); ++k) cp = (cp << 6) | (p_[i_ + size_t(k)] & 0x3F);
    i_ += size_t(len);
    return cp;
  }

  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k, ++i_) {
      const char h = i_ < p_.size() ? p_[i_] : '\0';
      const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
      if (d < 0) bad("expected hex digits");
      v = v * 16 + uint32_t(d);
    }
    return v;
  }

  Ranges escape(bool in_class) {
    ++i_;
    if (i_ >= p_.size()) bad("'\\' at the end");
    const char e = p_[i_++];
    switch (e) {
      case 'd': return kDigit;
      case 'w': return kWord;
      case 's': return kSpace;
      case 't': return {{'\t', '\t'}};
      case 'n': return {{'\n', '\n'}};
      case 'r': return {{'\r', '\r'}};
      case 'f': return {{'\f', '\f'}};
      case 'v': return {{'\v', '\v'}};
      case 'x': { const uint32_t v = hex(2); return {{v, v}}; }
      case 'u': { const uint32_t v = hex(4); return {{v, v}}; }
      default: break;
    }
    if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9'))
      --i_, bad(concat("escape '\\", e, "' is not supported", in_class ? " in a class" : ""));
    return {{uint32_t(static_cast<unsigned char>(e)), uint32_t(static_cast<unsigned char>(e))}};
  }

  Ranges char_class() {
    const size_t start = i_++;
    const bool negated = eat('^');
    Ranges r;
    while (true) {
      if (i_ >= p_.size()) i_ = start, bad("'[' is never closed");
      if (eat(']')) break;
      Ranges item = p_[i_] == '\\' ? escape(true) : Ranges{{utf8(), 0}};
      if (item.size() == 1 && item[0].second == 0) item[0].second = item[0].first;
      if (item.size() == 1 && item[0].first == item[0].second && i_ + 1 < p_.size() && p_[i_] == '-' && p_[i_ + 1] != ']') {
        ++i_;
        Ranges to = p_[i_] == '\\' ? escape(true) : Ranges{{utf8(), 0}};
        const uint32_t hi = to[0].second == 0 ? to[0].first : to[0].second;
        if (to.size() != 1 || hi < item[0].first) bad("bad range in a class");
        item[0].second = hi;
      }
      r.insert(r.end(), item.begin(), item.end());
    }
    return negated ? ranges_complement(r) : ranges_normalize(r);
  }

  const std::string& p_;
  const std::string& any_;
  const std::string& where_;
  size_t i_ = 0;
};

}  // namespace

std::string pattern_to_gbnf(const std::string& pattern, const std::string& any_char, const std::string& where) {
  return PatternParser(pattern, any_char, where).top();
}

}  // namespace loom::infer::json_schema
