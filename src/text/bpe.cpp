#include "text/bpe.h"

#include <fstream>
#include <limits>
#include <mutex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/unicode_class.h"

namespace loom::text {
namespace {

struct Char {
  uint32_t len;  // bytes
  char32_t cp;
  CharClass cls;
};

// Strict UTF-8 decoding (no overlongs, surrogates or values above U+10FFFF);
// a byte that does not start a valid sequence is one kOther character of
// length 1, so every byte string splits into characters.
Char char_at(std::string_view s, size_t i) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) return {1, b0, char_class(b0)};
  const Char invalid{1, 0xFFFFFFFF, CharClass::kOther};
  uint32_t len;
  char32_t cp, min;
  if ((b0 & 0xE0) == 0xC0) len = 2, cp = b0 & 0x1F, min = 0x80;
  else if ((b0 & 0xF0) == 0xE0) len = 3, cp = b0 & 0x0F, min = 0x800;
  else if ((b0 & 0xF8) == 0xF0) len = 4, cp = b0 & 0x07, min = 0x10000;
  else return invalid;
  if (i + len > s.size()) return invalid;
  for (uint32_t k = 1; k < len; ++k) {
    const auto b = static_cast<uint8_t>(s[i + k]);
    if ((b & 0xC0) != 0x80) return invalid;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return invalid;
  return {len, cp, char_class(cp)};
}

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the other
// 68 are shifted to U+0100.. in byte order, so every token is printable text.
std::array<char32_t, 256> bytes_to_unicode() {
  std::array<char32_t, 256> table{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    table[b] = printable ? static_cast<char32_t>(b) : next++;
  }
  return table;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  LOOM_REQUIRE(in, path, ": cannot open (run scripts/fetch-data.sh for GPT-2's files)");
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// A token string of encoder.json back to its bytes; false if it holds a
// character outside bytes_to_unicode's image.
bool token_to_bytes(std::string_view token, const std::array<int, 324>& byte_of_cp, std::string& out) {
  out.clear();
  for (size_t i = 0; i < token.size();) {
    const Char c = char_at(token, i);
    if (c.cp >= byte_of_cp.size() || byte_of_cp[c.cp] < 0) return false;
    out.push_back(static_cast<char>(byte_of_cp[c.cp]));
    i += c.len;
  }
  return !out.empty();
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace

struct Gpt2Tokenizer::Cache {
  static constexpr size_t kMaxEntries = 1 << 20;  // cleared when full: memory stays bounded
  std::mutex mu;
  std::unordered_map<std::string, std::vector<int32_t>> map;
};

size_t gpt2_pretoken_end(std::string_view s, size_t i) {
  const size_t n = s.size();
  if (s[i] == '\'' && i + 1 < n) {
    const std::string_view rest = s.substr(i + 1, 2);
    if (rest.starts_with("re") || rest.starts_with("ve") || rest.starts_with("ll")) return i + 3;
    const char c = s[i + 1];
    if (c == 's' || c == 't' || c == 'm' || c == 'd') return i + 2;
  }
  const Char first = char_at(s, i);
  // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: an optional space, then a
  // run of one class.
  size_t start = i;
  CharClass run = first.cls;
  if (s[i] == ' ' && i + 1 < n) {
    const CharClass next = char_at(s, i + 1).cls;
    if (next != CharClass::kSpace) start = i + 1, run = next;
  }
  size_t end = start;
  if (run != CharClass::kSpace) {
    while (end < n) {
      const Char c = char_at(s, end);
      if (c.cls != run) break;
      end += c.len;
    }
    return end;
  }
  // `\s+(?!\S)` backtracks off the last whitespace character when a
  // non-space follows (it then joins that word as its ` ?`); for a single
  // whitespace character that fails and `\s+` takes it.
  size_t last = i;
  while (end < n) {
    const Char c = char_at(s, end);
    if (c.cls != CharClass::kSpace) break;
    last = end;
    end += c.len;
  }
  return (end < n && last > i) ? last : end;
}

Gpt2Tokenizer Gpt2Tokenizer::load(const std::string& dir) {
  const std::string encoder_path = dir + "/encoder.json";
  const std::string vocab_path = dir + "/vocab.bpe";
  std::vector<std::string> tokens;
  {
    nlohmann::json json;
    try {
      json = nlohmann::json::parse(read_file(encoder_path));
    } catch (const nlohmann::json::exception& e) {
      fail(encoder_path, ": malformed JSON: ", e.what());
    }
    LOOM_REQUIRE(json.is_object() && !json.empty(), encoder_path,
                 ": expected a non-empty JSON object mapping token strings to ids");
    const size_t n = json.size();
    LOOM_REQUIRE(n < std::numeric_limits<int32_t>::max(), encoder_path, ": too many tokens (", n, ")");
    tokens.assign(n, std::string());
    std::vector<bool> used(n, false);
    for (const auto& [key, value] : json.items()) {
      LOOM_REQUIRE(value.is_number_integer() && value.get<int64_t>() >= 0 && value.get<int64_t>() < int64_t(n),
                   encoder_path, ": token '", key, "' has id ", value.dump(), "; ids must be integers in [0, ", n, ")");
      const auto id = value.get<int32_t>();
      LOOM_REQUIRE(!used[id], encoder_path, ": id ", id, " is used twice");
      used[id] = true;
      tokens[id] = key;
    }
  }
  // vocab.bpe: "#version: ..." then one merge "left right" a line, by rank
  // (encoder.py reads lines [1:-1]; a missing final newline is accepted).
  std::vector<std::string> merges;
  std::istringstream lines(read_file(vocab_path));
  std::string line;
  for (int64_t line_no = 1; std::getline(lines, line); ++line_no) {
    if (line_no == 1 && line.starts_with("#version")) {
      merges.emplace_back();  // keeps merges[i] on line i + 1 for messages
      continue;
    }
    merges.push_back(line);
  }
  return from_strings(std::move(tokens), std::move(merges), {encoder_path, vocab_path});
}

Gpt2Tokenizer Gpt2Tokenizer::from_strings(std::vector<std::string> tokens, std::vector<std::string> merges,
                                          const Sources& where) {
  const std::array<char32_t, 256> unicode_of_byte = bytes_to_unicode();
  std::array<int, 324> byte_of_cp;
  byte_of_cp.fill(-1);
  for (int b = 0; b < 256; ++b) byte_of_cp[unicode_of_byte[b]] = b;

  Gpt2Tokenizer tok;
  LOOM_REQUIRE(!tokens.empty() && tokens.size() < size_t{std::numeric_limits<int32_t>::max()}, where.tokens,
               ": ", tokens.size(), " tokens; expected 1 to 2^31 - 1");
  std::unordered_map<std::string, int32_t> id_of;  // token string (as in the files) -> id
  tok.token_bytes_.assign(tokens.size(), std::string());
  std::string bytes;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto id = static_cast<int32_t>(i);
    const std::string& key = tokens[i];
    LOOM_REQUIRE(token_to_bytes(key, byte_of_cp, bytes), where.tokens, ": token '", key, "' (id ", id,
                 ") is not a byte-level token: it is empty or has a character outside GPT-2's byte alphabet");
    LOOM_REQUIRE(id_of.emplace(key, id).second, where.tokens, ": token '", key, "' appears twice");
    tok.token_bytes_[id] = bytes;
  }
  std::string utf8;
  for (int b = 0; b < 256; ++b) {
    const char32_t cp = unicode_of_byte[b];  // < 0x800: one or two UTF-8 bytes
    utf8 = cp < 0x80 ? std::string(1, char(cp)) : std::string{char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
    const auto it = id_of.find(utf8);
    LOOM_REQUIRE(it != id_of.end(), where.tokens, ": no token for byte ", b, " ('", utf8, "')");
    tok.byte_token_[b] = it->second;
  }
  const auto eot = id_of.find("<|endoftext|>");
  LOOM_REQUIRE(eot != id_of.end(), where.tokens, ": no '<|endoftext|>' token");
  tok.eot_id_ = eot->second;

  int32_t rank = 0;
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string& m = merges[i];
    if (i == 0 && m.empty()) continue;  // load()'s #version line
    const size_t space = m.find(' ');
    LOOM_REQUIRE(space != std::string::npos && space > 0 && space + 1 < m.size() &&
                     m.find(' ', space + 1) == std::string::npos,
                 where.merges, ":", i + 1, ": expected two tokens separated by one space, got '", m, "'");
    const std::string left = m.substr(0, space), right = m.substr(space + 1);
    const auto l = id_of.find(left), r = id_of.find(right), merged = id_of.find(left + right);
    LOOM_REQUIRE(l != id_of.end() && r != id_of.end() && merged != id_of.end(), where.merges, ":", i + 1, ": merge '",
                 m, "' uses a token that is not in ", where.tokens);
    const bool added = tok.merges_.emplace(pair_key(l->second, r->second), Merge{rank++, merged->second}).second;
    LOOM_REQUIRE(added, where.merges, ":", i + 1, ": merge '", m, "' is listed twice");
    tok.merge_strings_.push_back(m);
  }
  LOOM_REQUIRE(rank > 0, where.merges, ": no merges");
  tok.token_strings_ = std::move(tokens);
  tok.cache_ = std::make_shared<Cache>();
  return tok;
}

std::string Gpt2Tokenizer::token_bytes(int32_t id) const { return decode(std::span<const int32_t>(&id, 1)); }

// encoder.py's bpe(): repeatedly take the adjacent pair of lowest rank and
// merge every occurrence of it, left to right, until no pair has a rank.
std::vector<int32_t> Gpt2Tokenizer::bpe(std::string_view piece) const {
  std::vector<int32_t> word(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) word[i] = byte_token_[static_cast<uint8_t>(piece[i])];
  while (word.size() > 1) {
    int32_t best_rank = std::numeric_limits<int32_t>::max(), left = -1, right = -1, merged = -1;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      const auto it = merges_.find(pair_key(word[i], word[i + 1]));
      if (it != merges_.end() && it->second.rank < best_rank)
        best_rank = it->second.rank, left = word[i], right = word[i + 1], merged = it->second.merged;
    }
    if (merged < 0) break;
    size_t out = 0;
    for (size_t i = 0; i < word.size(); ++out) {
      if (i + 1 < word.size() && word[i] == left && word[i + 1] == right) {
        word[out] = merged;
        i += 2;
      } else {
        word[out] = word[i++];
      }
    }
    word.resize(out);
  }
  return word;
}

std::vector<int32_t> Gpt2Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);
  std::string piece;
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = gpt2_pretoken_end(text, pos);
    piece.assign(text.substr(pos, end - pos));
    pos = end;
    {
      std::lock_guard lock(cache_->mu);
      const auto it = cache_->map.find(piece);
      if (it != cache_->map.end()) {
        ids.insert(ids.end(), it->second.begin(), it->second.end());
        continue;
      }
    }
    std::vector<int32_t> piece_ids = bpe(piece);
    ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
    std::lock_guard lock(cache_->mu);
    if (cache_->map.size() >= Cache::kMaxEntries) cache_->map.clear();
    cache_->map.emplace(std::move(piece), std::move(piece_ids));
  }
  return ids;
}

std::string Gpt2Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  for (const int32_t id : ids) {
    LOOM_REQUIRE(id >= 0 && id < vocab_size(), "decode: token id ", id, " is outside the vocabulary [0, ",
                 vocab_size(), ")");
    text += token_bytes_[id];
  }
  return text;
}

}  // namespace loom::text
