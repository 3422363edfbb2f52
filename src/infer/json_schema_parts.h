// The pieces of json_schema_grammar.cpp that are text, not schema walking:
// GBNF literals and classes, the JSON text of a set of characters, integer
// ranges, the pattern (regex subset) translation and the string formats.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom::infer::json_schema {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // sorted, disjoint code point ranges

Ranges ranges_normalize(const Ranges& a);   // sorted, merged
Ranges ranges_complement(const Ranges& a);  // over U+0000..U+10FFFF

// A GBNF literal "..." matching exactly these bytes.
std::string gbnf_literal(const std::string& bytes);
// A GBNF class [...] of these ranges (complemented if negated).
std::string gbnf_class(const Ranges& ranges, bool negated = false);
// A GBNF expression matching the JSON string text of any one character in
// ranges: raw where JSON allows it, else its json.dumps escape.
std::string json_char_set(const Ranges& ranges);

// A GBNF expression for the integers in [lo, hi] written without sign for
// non-negative, "-" for negative; bounds clamp to 16 digits. Empty: error.
std::string integer_range(std::optional<int64_t> lo, std::optional<int64_t> hi);

// A pattern's GBNF expression over the string's JSON text (between the
// quotes); any_char is the rule of one unconstrained JSON string character
// (for the unanchored ends). Throws loom::Error with `where` for what it
// cannot translate.
std::string pattern_to_gbnf(const std::string& pattern, const std::string& any_char, const std::string& where);

// The GBNF expression of a format's text (between the quotes); nullopt for
// a format not supported.
std::optional<std::string> format_to_gbnf(const std::string& format);

}  // namespace loom::infer::json_schema
