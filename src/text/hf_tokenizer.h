// A Hugging Face tokenizer.json whose model is byte-level BPE: GPT-2's form
// (a ByteLevel pre-tokenizer with its regex) and Llama 3's (a Split with
// tiktoken's regex, then ByteLevel without one), with added tokens split out
// of the text first. Reading and writing the files: hf_tokenizer_json.h.
//
// encode(text), as the `tokenizers` library's encode(text,
// add_special_tokens=False):
//   1. added tokens are split out of the text: at each position the longest
//      one that matches (those with normalized false first, then the others
//      in what is left, as `tokenizers` does; loom reads no normalizer, so
//      both match the raw text). lstrip / rstrip take the whitespace before /
//      after a match with it; a single_word token matches only between
//      characters that are not letters, digits or '_'.
//   2. the rest is pre-tokenised: a space prepended (add_prefix_space) when
//      it does not start with one, then split by the pattern (split_patterns.h).
//   3. each pre-token's bytes are merged (byte_bpe.h); with ignore_merges a
//      pre-token that is itself in the vocabulary is that token.
// encode_prompt() puts the post-processor's BOS first (Llama 3: <|begin_of_text|>).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "text/byte_bpe.h"
#include "text/split_patterns.h"
#include "text/tokenizer.h"

namespace loom::text {

class Gpt2Tokenizer;

struct HfAddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false, rstrip = false, single_word = false;
  bool normalized = true;
};

// What loom reads from and writes to a tokenizer.json (+ tokenizer_config.json).
struct HfBpeSpec {
  std::vector<std::pair<std::string, int32_t>> vocab;       // model.vocab, by id
  std::vector<std::pair<std::string, std::string>> merges;  // model.merges, by rank
  bool ignore_merges = false;
  std::vector<HfAddedToken> added_tokens;
  std::optional<SplitPattern> split;  // none: ByteLevel without its regex, the whole text one pre-token
  bool add_prefix_space = false;
  int32_t bos_id = -1;   // -1: none
  bool add_bos = false;  // the post-processor puts bos_id before the text
  int32_t eos_id = -1;   // -1: none
};

// GPT-2's vocabulary as Hugging Face's gpt2 tokenizer.json holds it:
// <|endoftext|> a special added token, BOS and EOS, no BOS added.
HfBpeSpec hf_spec_of_gpt2(const Gpt2Tokenizer& tok);

class HfTokenizer : public Tokenizer {
 public:
  // Checks the spec: ids dense from 0 (vocab and added tokens together), a
  // token for every byte, merges of tokens whose concatenation is a token.
  // loom::Error naming `where` and the entry otherwise.
  static HfTokenizer from_spec(HfBpeSpec spec, const std::string& where);

  std::vector<int32_t> encode(std::string_view text) const override;
  // The bytes of the tokens (a token outside the byte alphabet: its UTF-8
  // text), special added tokens left out: a control token adds nothing.
  // loom::Error for an id outside [0, vocab_size()).
  std::string decode(std::span<const int32_t> ids) const override;
  std::string token_bytes(int32_t id) const override;

  std::string_view kind() const override { return "gpt2"; }  // GGUF's name for byte-level BPE
  int32_t vocab_size() const override { return bpe_.size(); }
  int32_t eos_id() const override { return spec_.eos_id; }
  int32_t bos_id() const override { return spec_.bos_id; }
  bool add_bos() const override { return spec_.add_bos; }

  const HfBpeSpec& spec() const { return spec_; }
  // id -> the token as the file spells it (an added token: its content).
  const std::vector<std::string>& token_strings() const { return token_strings_; }
  bool is_special(int32_t id) const { return special_[static_cast<size_t>(id)] != 0; }

 private:
  // Indices into spec_.added_tokens by first byte, longest first (one index
  // per value of `normalized`).
  using AddedIndex = std::vector<std::vector<size_t>>;
  struct Part;

  void build_added_index();
  std::vector<Part> split_added(std::string_view text, const AddedIndex& index) const;
  void encode_text(std::string_view text, std::vector<int32_t>& ids) const;
  void encode_pretoken(std::string_view piece, std::vector<int32_t>& ids) const;

  HfBpeSpec spec_;
  ByteBpe bpe_;
  std::vector<std::string> token_strings_;
  std::vector<uint8_t> special_;                        // id -> 1 for a special added token
  std::unordered_map<std::string, int32_t> piece_ids_;  // ignore_merges: a vocab token's bytes -> id
  AddedIndex raw_added_, normalized_added_;
};

}  // namespace loom::text
