// Byte-level BPE as GPT-2's tokenizer (bpe.h) and Hugging Face's
// tokenizer.json (hf_tokenizer.h) share it: strict UTF-8 decoding into the
// character classes the split patterns test, the byte-to-unicode alphabet
// token strings are written in, and the merge loop over a piece's bytes.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/unicode_class.h"

namespace loom::text {

struct Utf8Char {
  uint32_t len;  // bytes
  char32_t cp;   // kNotUtf8 for a byte that starts no valid sequence
  CharClass cls;
};
inline constexpr char32_t kNotUtf8 = 0xFFFFFFFF;

// The character at s[i] (i < s.size()). Strict UTF-8 (no overlongs,
// surrogates or values above U+10FFFF); a byte that does not start a valid
// sequence is one kOther character of length 1, so every byte string splits
// into characters.
Utf8Char utf8_char_at(std::string_view s, size_t i);

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the other
// 68 are shifted to U+0100.. in byte order, so every token is printable text.
const std::array<char32_t, 256>& byte_level_alphabet();
// A token string in that alphabet -> its bytes; false (out unspecified) if it
// is empty or holds a character outside the alphabet.
bool byte_level_to_bytes(std::string_view token, std::string& out);
// Bytes -> the token string that spells them (UTF-8).
std::string bytes_to_byte_level(std::string_view bytes);

// Ids, their bytes and the merges between them; encode_piece is the BPE of
// openai/gpt-2 encoder.py and of the `tokenizers` library: repeatedly merge
// the adjacent pair of lowest rank (of equal ranks the leftmost), until no
// pair has a rank. (encoder.py merges every occurrence of the pair in one
// pass; with merges learned in order -- a merge's parts formed by earlier
// ones -- that is the same.)
class ByteBpe {
 public:
  ByteBpe() = default;
  // token_bytes[id]: what id stands for; byte_ids[b]: the id whose token is
  // byte b alone, -1 for none (LOOM_CHECKed to be in range; encode_piece
  // needs all 256).
  ByteBpe(std::vector<std::string> token_bytes, const std::array<int32_t, 256>& byte_ids);

  // The next merge in rank order: left, right -> merged (ids in range,
  // LOOM_CHECKed). False when the pair already has a merge.
  bool add_merge(int32_t left, int32_t right, int32_t merged);
  int32_t merge_count() const { return static_cast<int32_t>(merges_.size()); }

  // A piece's ids (cached: memory stays bounded, calls may come from many threads).
  std::vector<int32_t> encode_piece(std::string_view piece) const;
  // The merges applied to a word of ids.
  std::vector<int32_t> merge(std::vector<int32_t> word) const;
  // encode(piece), through encode_piece's cache (a piece's ids made another
  // way: one tokenizer's pieces are all made one way).
  std::vector<int32_t> encode_cached(std::string_view piece,
                                     const std::function<std::vector<int32_t>(std::string_view)>& encode) const;
  const std::string& bytes(int32_t id) const { return token_bytes_[static_cast<size_t>(id)]; }
  // The id of byte b's own token, -1 for none.
  int32_t byte_id(char b) const { return byte_ids_[static_cast<uint8_t>(b)]; }
  int32_t size() const { return static_cast<int32_t>(token_bytes_.size()); }

 private:
  struct Merge {
    int32_t rank;    // lower merges first
    int32_t merged;  // id of the concatenation
  };
  struct Cache;

  std::vector<int32_t> merge_bytes(std::string_view piece) const;

  std::vector<std::string> token_bytes_;        // id -> the bytes it stands for
  std::array<int32_t, 256> byte_ids_{};         // byte -> id of its one-byte token
  std::unordered_map<uint64_t, Merge> merges_;  // (left << 32 | right) -> merge
  std::shared_ptr<Cache> cache_;
};

}  // namespace loom::text
