// A Hugging Face tokenizer.json whose model is BPE, in one of two forms:
// byte-level -- GPT-2's (a ByteLevel pre-tokenizer with its regex) and
// Llama 3's (a Split with tiktoken's regex, then ByteLevel without one) --
// or SentencePiece's as `tokenizers` emulates it (transformers'
// LlamaConverter: Llama 2, Mistral, TinyLlama; HfSpmForm below), with added
// tokens split out of the text first. Reading and writing the files:
// hf_tokenizer_json.h.
//
// encode_special(text), as the `tokenizers` library's encode(text,
// add_special_tokens=False); encode(text) the same with special added tokens
// left as text (split_special_tokens=True: training data, as llm.c's
// encode_ordinary):
//   1. added tokens are split out of the text: at each position the longest
//      one that matches (those with normalized false first, then the others
//      in what is left, as `tokenizers` does; loom reads no normalizer, so
//      both match the raw text). lstrip / rstrip take the whitespace before /
//      after a match with it; a single_word token matches only between
//      characters that are not word characters (regex \w: is_word_char).
//   2. the rest is pre-tokenised: split by the pattern (split_patterns.h),
//      with a space prepended (add_prefix_space) where one is missing: to
//      the whole stretch before ByteLevel's own regex splits it, to each
//      pre-token of a Split step before ByteLevel (tokenizers' ByteLevel
//      prefixes every piece it is handed).
//   3. each pre-token's bytes are merged (byte_bpe.h); with ignore_merges a
//      pre-token that is itself in the vocabulary is that token.
// In the SentencePiece form steps 2 and 3 are instead:
//   2. each stretch of text between added tokens gets a ▁ in front (the
//      normalizer's Prepend: every stretch; Metaspace's prepend_scheme
//      "always": every stretch not starting with ▁, "first": only the one at
//      the start of the text) and its spaces become ▁ (normalizer Replace or
//      Metaspace); Metaspace with split starts a pre-token at each ▁.
//   3. each pre-token's characters are its symbols: the vocabulary's token
//      for the character, else (byte_fallback) the tokens <0xXX> of its
//      UTF-8 bytes, else the unknown token (runs of them one with fuse_unk);
//      then the same merges. A byte that is not UTF-8 (Hugging Face's
//      strings hold none) is a character of its own, so it goes to <0xXX>.
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
struct SpmVocab;

struct HfAddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false, rstrip = false, single_word = false;
  bool normalized = true;
};

// U+2581 "▁", the SentencePiece form's space.
inline constexpr std::string_view kMetaspace = "\xE2\x96\x81";

// The SentencePiece form of a tokenizer.json (above).
struct HfSpmForm {
  // How a stretch of text gets its leading ▁: the normalizer's Prepend, or
  // Metaspace's prepend_scheme.
  enum class Prepend { none, normalizer, always, first };
  Prepend prepend = Prepend::normalizer;
  bool metaspace = false;  // the pre-tokenizer is Metaspace (else none: the normalizer writes the ▁)
  bool split = false;      // Metaspace's split: a pre-token starts at each ▁
  bool byte_fallback = true;
  bool fuse_unk = false;
  std::string unk_token;  // model.unk_token; empty: none
  // The decoder: Replace(▁ -> space), ByteFallback, Fuse, then Strip of
  // strip_spaces leading spaces; or the Metaspace decoder (metaspace_decoder:
  // the ▁ of the first token are dropped, the others become spaces).
  bool decode_bytes = true;  // ByteFallback: a <0xXX> token is its byte
  int32_t strip_spaces = 1;
  bool metaspace_decoder = false;
};

// What loom reads from and writes to a tokenizer.json (+ tokenizer_config.json).
struct HfBpeSpec {
  std::vector<std::pair<std::string, int32_t>> vocab;       // model.vocab, by id
  std::vector<std::pair<std::string, std::string>> merges;  // model.merges, by rank
  bool ignore_merges = false;
  std::vector<HfAddedToken> added_tokens;
  std::optional<SplitPattern> split;  // none: ByteLevel without its regex, the whole text one pre-token
  // The split is a Split pre-tokenizer's before ByteLevel (use_regex false),
  // not ByteLevel's own regex: add_prefix_space then prefixes each of its
  // pre-tokens. Always so for Llama 3's, which ByteLevel's regex is not
  // (HfTokenizer::from_spec sets it).
  bool split_step = false;
  bool add_prefix_space = false;
  std::optional<HfSpmForm> spm;  // the SentencePiece form; none: byte-level (split, add_prefix_space)
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
  std::vector<int32_t> encode_special(std::string_view text) const override;
  // The bytes of the tokens (a token outside the byte alphabet: its UTF-8
  // text), special added tokens left out: a control token adds nothing.
  // loom::Error for an id outside [0, vocab_size()).
  std::string decode(std::span<const int32_t> ids) const override;
  std::string token_bytes(int32_t id) const override;

  // GGUF's names: "gpt2" for byte-level BPE, "llama" for the SentencePiece form.
  std::string_view kind() const override { return spec_.spm ? "llama" : "gpt2"; }
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
  std::vector<int32_t> encode_with(std::string_view text, bool specials) const;
  std::vector<Part> split_added(std::string_view text, const AddedIndex& index, bool specials) const;
  // text: a stretch between added tokens; at_start: it starts the whole text.
  void encode_text(std::string_view text, bool at_start, std::vector<int32_t>& ids) const;
  void encode_pretoken(std::string_view piece, std::vector<int32_t>& ids) const;
  // The SentencePiece form's steps 2 and 3 (top of the file).
  std::string spm_normalize(std::string_view text) const;
  void encode_spm_text(std::string_view text, bool at_start, std::vector<int32_t>& ids) const;
  std::vector<int32_t> spm_symbols(std::string_view piece) const;

  HfBpeSpec spec_;
  ByteBpe bpe_;
  std::vector<std::string> token_strings_;
  std::vector<uint8_t> special_;                        // id -> 1 for a special added token
  // ignore_merges: a vocab token's bytes -> id; the SentencePiece form: a vocab token's string -> id
  std::unordered_map<std::string, int32_t> piece_ids_;
  int32_t unk_id_ = -1;     // the SentencePiece form's unknown token
  bool spm_words_ = false;  // the SentencePiece form: no token has a ▁ after another character
  AddedIndex raw_added_, normalized_added_;
  // What each added token matches: its content, or for a normalized one of
  // the SentencePiece form the content normalized as the text is (Prepend
  // and Replace: "hello world" -> "▁hello▁world"), as tokenizers'
  // AddedVocabulary matches it.
  std::vector<std::string> added_match_;
};

// The SentencePiece form's vocabulary as SentencePiece (and a GGUF file's
// "llama" vocabulary) holds it: scores from the merges' ranks (a piece
// scores by its first merge, pieces whose merges interleave share one
// score; pieces no merge forms score below them all), types (byte tokens
// <0xXX>, the unknown token, special added tokens control, others
// user-defined), BOS/EOS, add_dummy_prefix where a ▁ is prepended.
// SentencePiece then merges as the ranks do, and differs only where its
// rules do: a leading ▁ on every stretch of text, special tokens' text is
// text. LOOM_CHECKs that tok is of the SentencePiece form.
SpmVocab spm_vocab_of(const HfTokenizer& tok);

}  // namespace loom::text
