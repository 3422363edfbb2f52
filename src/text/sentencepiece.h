// Llama's tokenizer: SentencePiece BPE (sentencepiece's bpe_model.cc, and
// llama.cpp's llm_tokenizer_spm), built from a tokenizer.model or from the
// arrays a GGUF file carries.
//
// encode(text), as SentencePieceProcessor::Encode:
//   1. normalise: the NormalizerSpec's rules (precompiled_charsmap, empty
//      for Llama's "identity"), an invalid UTF-8 byte becoming U+FFFD, then
//      a leading U+2581 "▁" (add_dummy_prefix) and every space escaped to ▁;
//      remove_extra_whitespaces drops leading/trailing spaces and collapses
//      runs. An empty text stays empty (no dummy prefix).
//   2. split into symbols: a user-defined piece (longest match) is one
//      frozen symbol, never merged; anything else one UTF-8 character.
//   3. merge: repeatedly the adjacent pair whose concatenation is a piece
//      with the highest score (ties: leftmost), via a priority queue; an
//      UNUSED piece formed this way is split back into its two halves.
//   4. a symbol that is not a piece becomes its UTF-8 bytes as <0xXX>
//      tokens when the vocabulary has byte tokens, else the unknown token.
// Control tokens in the text ("<s>") are ordinary text, as in SentencePiece,
// unless parse_special: then control and unknown tokens written in the raw
// text are cut out first (leftmost, longest) and become their ids, and each
// stretch of text between them is encoded on its own, dummy prefix
// included — llama.cpp's tokenize(parse_special = true).
//
// decode(ids), as SentencePieceProcessor::DecodeIds: control tokens vanish,
// the unknown token is " ⁇ ", runs of byte tokens are reassembled and each
// invalid byte becomes U+FFFD, ▁ becomes a space, and the ▁ that starts the
// first visible piece is dropped when add_dummy_prefix or
// remove_extra_whitespaces is set.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/spm_model.h"
#include "text/tokenizer.h"

namespace loom::text {

// The vocabulary as plain arrays: what a GGUF file's tokenizer.ggml.* keys
// hold for tokenizer.ggml.model = "llama" (the GGUF reader fills it).
struct SpmVocab {
  std::vector<std::string> tokens;    // tokenizer.ggml.tokens; id = index
  std::vector<float> scores;          // tokenizer.ggml.scores; empty: all 0
  std::vector<int32_t> token_types;   // tokenizer.ggml.token_type (SpmPieceType); empty: all normal
  int32_t bos_id = -1;                // tokenizer.ggml.bos_token_id; -1: none
  int32_t eos_id = -1;                // tokenizer.ggml.eos_token_id; -1: none
  int32_t unk_id = -1;                // tokenizer.ggml.unknown_token_id; -1: the token of type unknown
  bool add_bos = true;                // tokenizer.ggml.add_bos_token
  bool add_eos = false;               // tokenizer.ggml.add_eos_token
  bool add_dummy_prefix = true;       // tokenizer.ggml.add_space_prefix
  // The normalizer of a tokenizer.model. A "llama" GGUF carries none of it:
  // llama.cpp's SentencePiece tokenizer reads remove_extra_whitespaces and
  // precompiled_charsmap only for "t5" (Unigram) vocabularies.
  bool remove_extra_whitespaces = false;
  bool escape_whitespaces = true;
  std::string precompiled_charsmap;   // empty: identity
  std::string normalizer_name;        // NormalizerSpec.name ("identity", "nmt_nfkc"), for messages
  std::string unk_surface = " \xE2\x81\x87 ";  // what decode writes for the unknown token
};

struct SpmEncodeOptions {
  bool add_bos = false;  // prepend bos_id(); an error if the vocabulary has none
  bool add_eos = false;
  bool parse_special = false;  // control/unknown tokens in the text become their ids
};

class SentencePieceTokenizer : public Tokenizer {
 public:
  // Validates the vocabulary (sizes agree, types 1-6, no empty or duplicate
  // token, byte tokens spelled <0xXX> and all 256 present if any is, an
  // unknown token when there is no byte fallback, ids in range); `source`
  // names it in errors.
  static SentencePieceTokenizer from_vocab(SpmVocab vocab, const std::string& source);
  // A tokenizer.model; only BPE models (model_type 2) are accepted. BOS/EOS
  // are the control pieces named by TrainerSpec.bos_piece/eos_piece, as in
  // SentencePiece; add_bos() is true when there is a BOS (Llama's rule).
  static SentencePieceTokenizer from_model(const SpmModel& model, const std::string& source);
  static SentencePieceTokenizer load(const std::string& model_path);

  std::vector<int32_t> encode(std::string_view text, const SpmEncodeOptions& options) const;
  std::vector<int32_t> encode(std::string_view text) const override { return encode(text, SpmEncodeOptions{}); }
  std::vector<int32_t> encode_special(std::string_view text) const override {
    return encode(text, SpmEncodeOptions{.parse_special = true});
  }
  // Throws loom::Error for an id outside [0, vocab_size()).
  std::string decode(std::span<const int32_t> ids) const override;
  // The piece with ▁ as a space, a byte token's byte, nothing for a control
  // token, the unknown surface for the unknown token (Tokenizer::token_bytes).
  std::string token_bytes(int32_t id) const override;
  std::string_view kind() const override { return "llama"; }

  int32_t vocab_size() const override { return static_cast<int32_t>(vocab_.tokens.size()); }
  int32_t bos_id() const override { return vocab_.bos_id; }
  int32_t eos_id() const override { return vocab_.eos_id; }
  int32_t unk_id() const { return vocab_.unk_id; }
  bool add_bos() const override { return vocab_.add_bos; }
  bool add_eos() const { return vocab_.add_eos; }
  // The validated vocabulary, for writing it out (GGUF, tokenizer.json).
  const SpmVocab& vocab() const { return vocab_; }
  // What the vocabulary was built from (a tokenizer.model's path), for messages.
  const std::string& source() const { return source_; }
  SpmPieceType type(int32_t id) const { return types_.at(static_cast<size_t>(id)); }

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using PieceMap = std::unordered_map<std::string, int32_t, Hash, std::equal_to<>>;
  // Tokens matched as wholes in text, longest first per leading byte.
  struct Matcher {
    std::array<std::vector<int32_t>, 256> by_first_byte;
    void add(const SpmVocab& vocab, int32_t id);
    void sort(const SpmVocab& vocab);
    // Length of the longest token at text[0..], 0 if none; sets *id.
    size_t match(const SpmVocab& vocab, std::string_view text, int32_t* id) const;
  };
  struct Symbol;
  // An unused piece formed by a merge -> the two symbols it was formed from.
  using Unmerge = std::unordered_map<std::string_view, std::pair<std::string_view, std::string_view>>;

  SentencePieceTokenizer() = default;
  void index_tokens();
  std::pair<std::string_view, size_t> normalize_prefix(std::string_view input) const;
  std::string normalize(std::string_view text) const;
  int32_t piece_id(std::string_view piece) const;  // -1: not a token
  void encode_text(std::string_view text, std::vector<int32_t>* out) const;
  void encode_segment(std::string_view text, bool* prev_unknown, std::vector<int32_t>* out) const;
  void merge(std::string_view text, std::vector<Symbol>* symbols, Unmerge* unmerge) const;
  void emit(std::string_view piece, const Unmerge& unmerge, bool* prev_unknown, std::vector<int32_t>* out) const;
  bool append_decoded(int32_t id, bool is_bos_ws, std::string* text) const;

  std::string source_;  // names the vocabulary in errors
  SpmVocab vocab_;
  std::vector<SpmPieceType> types_;
  PieceMap pieces_;    // normal, user-defined and unused tokens: what merges may form
  PieceMap reserved_;  // unknown, control and byte tokens
  Matcher user_defined_;
  Matcher special_;    // control and unknown tokens, for parse_special
  std::array<int32_t, 256> byte_token_{};  // byte -> its <0xXX> token; -1 without byte fallback
  bool byte_fallback_ = false;
  // No piece has a ▁ right after another character: BPE may then run on
  // each word (a ▁ after a non-▁ starts one) on its own, same result.
  bool words_independent_ = false;
  SpmCharsMap charsmap_;
};

}  // namespace loom::text
