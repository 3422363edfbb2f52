// GPT-2's byte-level BPE tokenizer (openai/gpt-2 src/encoder.py), loaded from
// the encoder.json + vocab.bpe pair. Encoding is byte-level, so any byte
// string, invalid UTF-8 included, round-trips: decode(encode(s)) == s.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/tokenizer.h"

namespace loom::text {

class Gpt2Tokenizer : public Tokenizer {
 public:
  // dir holds encoder.json (token string -> id) and vocab.bpe (merges, by
  // rank). Throws loom::Error naming the file and what is wrong with it.
  static Gpt2Tokenizer load(const std::string& dir);
  // Where a vocabulary came from, for messages ("m.gguf: tokenizer.ggml.tokens").
  struct Sources {
    std::string tokens, merges;
  };
  // The same from the strings of the files: tokens[id] as encoder.json
  // spells it (GPT-2's byte-to-unicode alphabet), merges "left right" by
  // rank (a GGUF file's tokenizer.ggml.tokens and .merges). Throws
  // loom::Error naming `where` and the entry that is wrong.
  static Gpt2Tokenizer from_strings(std::vector<std::string> tokens, std::vector<std::string> merges,
                                    const Sources& where);

  // Pre-tokenises with GPT-2's regex, then applies the merges to each piece.
  // "<|endoftext|>" in the text is ordinary text, as in encoder.py; append
  // eot_id() to mark a document end.
  std::vector<int32_t> encode(std::string_view text) const override;
  // Throws loom::Error for an id outside [0, vocab_size()).
  std::string decode(std::span<const int32_t> ids) const override;
  // The bytes token id stands for (loom::Error outside the vocabulary).
  std::string token_bytes(int32_t id) const override;

  std::string_view kind() const override { return "gpt2"; }
  int32_t vocab_size() const override { return static_cast<int32_t>(token_bytes_.size()); }
  int32_t eot_id() const { return eot_id_; }
  int32_t eos_id() const override { return eot_id_; }
  // The vocabulary as from_strings takes it (written to GGUF files).
  const std::vector<std::string>& token_strings() const { return token_strings_; }
  const std::vector<std::string>& merge_strings() const { return merge_strings_; }

 private:
  struct Merge {
    int32_t rank;    // line order in vocab.bpe: lower merges first
    int32_t merged;  // id of the concatenation
  };
  struct Cache;  // piece -> ids, shared by const encode calls

  std::vector<int32_t> bpe(std::string_view piece) const;

  std::vector<std::string> token_bytes_;          // id -> the bytes it stands for
  std::array<int32_t, 256> byte_token_{};         // byte -> id of its one-byte token
  std::unordered_map<uint64_t, Merge> merges_;    // (left << 32 | right) -> merge
  std::vector<std::string> token_strings_, merge_strings_;
  int32_t eot_id_ = -1;
  std::shared_ptr<Cache> cache_;
};

// The end of the pre-token of GPT-2's pattern that starts at text[pos]:
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// Each byte that is not part of valid UTF-8 counts as one non-letter,
// non-number, non-space character. Exposed for tests.
size_t gpt2_pretoken_end(std::string_view text, size_t pos);

}  // namespace loom::text
