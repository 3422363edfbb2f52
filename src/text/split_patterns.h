// The pre-tokenisation regexes of byte-level BPE tokenizers, written out by
// hand (no std::regex: it has no \p{L}). Each function gives the end of the
// pre-token that starts at text[pos], as the regex's leftmost match there
// does. Classes: \p{L}, \p{N} and \s from unicode_class.h (\s is Unicode
// White_Space, as in Python's `regex` and Oniguruma); each byte that is not
// part of valid UTF-8 counts as one character of none of them.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace loom::text {

enum class SplitPattern {
  // GPT-2 (encoder.py; tokenizer.json's ByteLevel pre-tokenizer with use_regex):
  //   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  gpt2,
  // Llama 3 (tiktoken's cl100k_base pattern; a Split pre-tokenizer):
  //   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
  //   ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  llama3,
};

size_t gpt2_pretoken_end(std::string_view text, size_t pos);
// (?i:) folds as Unicode simple case folding does (Oniguruma, Rust's regex):
// 'S matches 's, and so does 'ſ (U+017F LATIN SMALL LETTER LONG S).
size_t llama3_pretoken_end(std::string_view text, size_t pos);
size_t pretoken_end(SplitPattern pattern, std::string_view text, size_t pos);

// The regex as a tokenizer.json spells it, and back (nullopt: another regex).
std::string_view split_pattern_regex(SplitPattern pattern);
std::optional<SplitPattern> split_pattern_of_regex(std::string_view regex);

}  // namespace loom::text
