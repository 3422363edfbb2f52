// Python's str operations on UTF-8 std::strings, as Jinja2 templates see
// them: lengths and indices count code points, whitespace is str.isspace()'s,
// repr() quotes like Python. Invalid UTF-8 never fails: a byte that does not
// start a valid sequence is one character (U+FFFD where a character is
// re-encoded).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::serve::jinja::text {

// The code point starting at s[i] and its length in bytes (i < s.size()).
std::pair<uint32_t, size_t> decode(std::string_view s, size_t i);
void append_utf8(std::string& out, uint32_t cp);

// Byte offset of each code point of s, then s.size().
std::vector<size_t> char_starts(std::string_view s);
size_t char_count(std::string_view s);

// str.isspace() for one code point.
bool is_space(uint32_t cp);
// Bytes of whitespace starting at s[i] (0 if none).
size_t space_len_at(std::string_view s, size_t i);
// True if s is non-empty and all whitespace.
bool all_space(std::string_view s);
// s without its trailing whitespace (str.rstrip()).
std::string_view rstrip_space(std::string_view s);

// str.strip / lstrip / rstrip: chars null strips whitespace.
std::string strip(std::string_view s, const std::string* chars, bool left, bool right);
// str.split: sep null splits on runs of whitespace; sep must not be empty.
// maxsplit < 0: no limit.
std::vector<std::string> split(std::string_view s, const std::string* sep, int64_t maxsplit);
// str.splitlines(): lines without their ends (\n, \r, \r\n, \v, \f,
// \x1c-\x1e, U+0085, U+2028, U+2029); no empty line after a last end.
std::vector<std::string> splitlines(std::string_view s);
// str.replace; count < 0: all.
std::string replace(std::string_view s, std::string_view old, std::string_view with, int64_t count);

// str.upper / lower / capitalize / title, and jinja2's title filter (a word
// starts after '-', '(', '{', '[', '<' or whitespace). Case maps cover ASCII,
// Latin-1, Greek and Cyrillic.
std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string capitalize(std::string_view s);
std::string str_title(std::string_view s);
std::string filter_title(std::string_view s);

// markupsafe.escape: & < > " ' as &amp; &lt; &gt; &#34; &#39;.
std::string html_escape(std::string_view s);

// Python's repr() of a str: 'it' or "it's", with escapes.
std::string repr(std::string_view s);

}  // namespace loom::serve::jinja::text
