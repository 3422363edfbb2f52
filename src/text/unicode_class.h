// The character classes GPT-2's pre-tokenisation regex distinguishes:
// \p{L}, \p{N}, \s, and everything else.
#pragma once

#include <cstdint>

namespace loom::text {

enum class CharClass : uint8_t { kOther, kLetter, kNumber, kSpace };

// Class of a Unicode code point. Tables: Unicode 17.0, as compiled into
// Python's `regex` module 2026.5.9 (the module GPT-2's encoder.py uses), so
// \s is Unicode White_Space (U+0009-000D, 0020, 0085, 00A0, 1680,
// 2000-200A, 2028, 2029, 202F, 205F, 3000). Unassigned code points,
// surrogates and values above U+10FFFF are kOther.
CharClass char_class(char32_t cp);

// Whether cp is a word character of a Unicode regex's \w (UTS #18 Annex C:
// Alphabetic, Mark, Decimal_Number, Connector_Punctuation, Join_Control),
// as Rust's `regex` crate and Python's `regex` module have it: 'é', U+0301
// (a combining mark) and '‿' (U+203F) are, '²' (No) and '½' are not.
bool is_word_char(char32_t cp);

}  // namespace loom::text
