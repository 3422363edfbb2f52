#include "text/split_patterns.h"

#include <cstdint>
#include <limits>

#include "text/byte_bpe.h"

namespace loom::text {
namespace {

constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*)"
    R"(|\s*[\r\n]+|\s+(?!\S)|\s+)";

bool is_cr_lf(char c) { return c == '\r' || c == '\n'; }

// The end of the run of at most max_chars characters of class cls from pos.
size_t run_end(std::string_view s, size_t pos, CharClass cls, size_t max_chars = SIZE_MAX) {
  for (size_t k = 0; pos < s.size() && k < max_chars; ++k) {
    const Utf8Char c = utf8_char_at(s, pos);
    if (c.cls != cls) break;
    pos += c.len;
  }
  return pos;
}

// At a whitespace character s[i]: with crlf, `\s*[\r\n]+` first (up to the
// last \r or \n of the whitespace run); then `\s+(?!\S)`, which backtracks off
// the run's last character when a non-space follows (it then joins that word
// as its ` ?` or `[^\r\n\p{L}\p{N}]?`), and for a single whitespace
// character followed by a non-space fails, so that `\s+` takes it.
size_t whitespace_end(std::string_view s, size_t i, bool crlf) {
  const size_t n = s.size();
  size_t end = i, last = i, crlf_end = 0;
  while (end < n) {
    const Utf8Char c = utf8_char_at(s, end);
    if (c.cls != CharClass::kSpace) break;
    last = end;
    end += c.len;
    if (is_cr_lf(s[last])) crlf_end = end;
  }
  if (crlf && crlf_end > 0) return crlf_end;
  return (end < n && last > i) ? last : end;
}

char ascii_lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

// (?i:'s|'t|'re|'ve|'m|'ll|'d) at s[i] == '\'': the end of the match, or 0.
size_t contraction_end(std::string_view s, size_t i) {
  if (s.substr(i + 1, 2) == "\xC5\xBF") return i + 3;  // 'ſ: U+017F folds to s
  const char a = i + 1 < s.size() ? ascii_lower(s[i + 1]) : '\0';
  const char b = i + 2 < s.size() ? ascii_lower(s[i + 2]) : '\0';
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
  return 0;
}

}  // namespace

size_t gpt2_pretoken_end(std::string_view s, size_t i) {
  const size_t n = s.size();
  if (s[i] == '\'' && i + 1 < n) {
    const std::string_view rest = s.substr(i + 1, 2);
    if (rest.starts_with("re") || rest.starts_with("ve") || rest.starts_with("ll")) return i + 3;
    const char c = s[i + 1];
    if (c == 's' || c == 't' || c == 'm' || c == 'd') return i + 2;
  }
  // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: an optional space, then a
  // run of one class.
  size_t start = i;
  CharClass run = utf8_char_at(s, i).cls;
  if (s[i] == ' ' && i + 1 < n) {
    const CharClass next = utf8_char_at(s, i + 1).cls;
    if (next != CharClass::kSpace) start = i + 1, run = next;
  }
  if (run != CharClass::kSpace) return run_end(s, start, run);
  return whitespace_end(s, i, false);
}

size_t llama3_pretoken_end(std::string_view s, size_t i) {
  const size_t n = s.size();
  if (s[i] == '\'') {
    if (const size_t end = contraction_end(s, i)) return end;
  }
  const Utf8Char c0 = utf8_char_at(s, i);
  const size_t i1 = i + c0.len;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (c0.cls == CharClass::kLetter) return run_end(s, i, CharClass::kLetter);
  if (c0.cls != CharClass::kNumber && !is_cr_lf(s[i]) && i1 < n && utf8_char_at(s, i1).cls == CharClass::kLetter)
    return run_end(s, i1, CharClass::kLetter);
  // \p{N}{1,3}
  if (c0.cls == CharClass::kNumber) return run_end(s, i, CharClass::kNumber, 3);
  // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
  const size_t start = (s[i] == ' ' && i1 < n && utf8_char_at(s, i1).cls == CharClass::kOther) ? i1 : i;
  if (utf8_char_at(s, start).cls == CharClass::kOther) {
    size_t end = run_end(s, start, CharClass::kOther);
    while (end < n && is_cr_lf(s[end])) ++end;
    return end;
  }
  return whitespace_end(s, i, true);
}

size_t pretoken_end(SplitPattern pattern, std::string_view text, size_t pos) {
  return pattern == SplitPattern::llama3 ? llama3_pretoken_end(text, pos) : gpt2_pretoken_end(text, pos);
}

std::string_view split_pattern_regex(SplitPattern pattern) {
  return pattern == SplitPattern::llama3 ? kLlama3Regex : kGpt2Regex;
}

std::optional<SplitPattern> split_pattern_of_regex(std::string_view regex) {
  if (regex == kGpt2Regex) return SplitPattern::gpt2;
  if (regex == kLlama3Regex) return SplitPattern::llama3;
  return std::nullopt;
}

}  // namespace loom::text
