// GPT-2's byte-level BPE tokenizer (openai/gpt-2 src/encoder.py), loaded from
// the encoder.json + vocab.bpe pair. Encoding is byte-level, so any byte
// string, invalid UTF-8 included, round-trips: decode(encode(s)) == s.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "text/byte_bpe.h"
#include "text/split_patterns.h"
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
  // A prompt's text: "<|endoftext|>" written in it is eot_id() (llama.cpp's
  // parse_special, transformers' GPT-2 tokenizer), the rest as encode().
  std::vector<int32_t> encode_special(std::string_view text) const override;
  // Throws loom::Error for an id outside [0, vocab_size()).
  std::string decode(std::span<const int32_t> ids) const override;
  // The bytes token id stands for (loom::Error outside the vocabulary).
  std::string token_bytes(int32_t id) const override;

  std::string_view kind() const override { return "gpt2"; }
  int32_t vocab_size() const override { return bpe_.size(); }
  int32_t eot_id() const { return eot_id_; }
  int32_t eos_id() const override { return eot_id_; }
  // The vocabulary as from_strings takes it (written to GGUF files).
  const std::vector<std::string>& token_strings() const { return token_strings_; }
  const std::vector<std::string>& merge_strings() const { return merge_strings_; }

 private:
  ByteBpe bpe_;
  std::vector<std::string> token_strings_, merge_strings_;
  int32_t eot_id_ = -1;
};

}  // namespace loom::text
