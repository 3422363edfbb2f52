#include "text/byte_bpe.h"

#include <limits>
#include <mutex>
#include <queue>

#include "core/error.h"

namespace loom::text {
namespace {

// The alphabet's largest code point is U+0143 (256 + 68 - 1).
constexpr size_t kAlphabetEnd = 324;

const std::array<int16_t, kAlphabetEnd>& byte_of_code_point() {
  static const std::array<int16_t, kAlphabetEnd> table = [] {
    std::array<int16_t, kAlphabetEnd> t;
    t.fill(-1);
    for (int b = 0; b < 256; ++b) t[byte_level_alphabet()[b]] = static_cast<int16_t>(b);
    return t;
  }();
  return table;
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

void append_utf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    LOOM_CHECK(false, "the byte-level alphabet ends at U+0143, got U+", static_cast<uint32_t>(cp));
  }
}

}  // namespace

Utf8Char utf8_char_at(std::string_view s, size_t i) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) return {1, b0, char_class(b0)};
  const Utf8Char invalid{1, kNotUtf8, CharClass::kOther};
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

const std::array<char32_t, 256>& byte_level_alphabet() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[b] = printable ? static_cast<char32_t>(b) : next++;
    }
    return t;
  }();
  return table;
}

bool byte_level_to_bytes(std::string_view token, std::string& out) {
  out.clear();
  const auto& byte_of = byte_of_code_point();
  for (size_t i = 0; i < token.size();) {
    const Utf8Char c = utf8_char_at(token, i);
    if (c.cp >= kAlphabetEnd || byte_of[c.cp] < 0) return false;
    out.push_back(static_cast<char>(byte_of[c.cp]));
    i += c.len;
  }
  return !out.empty();
}

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char b : bytes) append_utf8(byte_level_alphabet()[static_cast<uint8_t>(b)], out);
  return out;
}

struct ByteBpe::Cache {
  static constexpr size_t kMaxEntries = 1 << 20;  // cleared when full: memory stays bounded
  std::mutex mu;
  std::unordered_map<std::string, std::vector<int32_t>> map;
};

ByteBpe::ByteBpe(std::vector<std::string> token_bytes, const std::array<int32_t, 256>& byte_ids)
    : token_bytes_(std::move(token_bytes)), byte_ids_(byte_ids), cache_(std::make_shared<Cache>()) {
  for (const int32_t id : byte_ids_) LOOM_CHECK(id >= -1 && id < size(), "byte token id ", id, " of ", size());
}

bool ByteBpe::add_merge(int32_t left, int32_t right, int32_t merged) {
  for (const int32_t id : {left, right, merged}) LOOM_CHECK(id >= 0 && id < size(), "merge id ", id, " of ", size());
  LOOM_CHECK(merges_.size() < size_t{std::numeric_limits<int32_t>::max()}, "too many merges");
  const auto rank = static_cast<int32_t>(merges_.size());
  return merges_.emplace(pair_key(left, right), Merge{rank, merged}).second;
}

std::vector<int32_t> ByteBpe::merge(std::vector<int32_t> word) const {
  const size_t n = word.size();
  if (n < 2) return word;
  // The symbols as a linked list; candidate merges in a heap by (rank,
  // position): the lowest rank first, the leftmost of equal ranks first. A
  // candidate whose symbols changed since it was pushed is skipped.
  constexpr size_t kNone = std::numeric_limits<size_t>::max();
  std::vector<size_t> prev(n), next(n);
  std::vector<uint8_t> dead(n, 0);
  for (size_t i = 0; i < n; ++i) prev[i] = i == 0 ? kNone : i - 1, next[i] = i + 1 < n ? i + 1 : kNone;
  struct Candidate {
    int32_t rank, left, right, merged;
    size_t pos;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  const auto push = [&](size_t i) {
    if (next[i] == kNone) return;
    const auto it = merges_.find(pair_key(word[i], word[next[i]]));
    if (it != merges_.end()) heap.push({it->second.rank, word[i], word[next[i]], it->second.merged, i});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const size_t i = c.pos, j = next[i];
    if (dead[i] || j == kNone || word[i] != c.left || word[j] != c.right) continue;
    word[i] = c.merged;
    dead[j] = 1;
    next[i] = next[j];
    if (next[j] != kNone) prev[next[j]] = i;
    if (prev[i] != kNone) push(prev[i]);
    push(i);
  }
  std::vector<int32_t> out;
  for (size_t i = 0; i != kNone; i = next[i]) out.push_back(word[i]);
  return out;
}

std::vector<int32_t> ByteBpe::merge_bytes(std::string_view piece) const {
  std::vector<int32_t> word(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) word[i] = byte_ids_[static_cast<uint8_t>(piece[i])];
  return merge(std::move(word));
}

std::vector<int32_t> ByteBpe::encode_piece(std::string_view piece) const {
  return encode_cached(piece, [this](std::string_view p) { return merge_bytes(p); });
}

std::vector<int32_t> ByteBpe::encode_cached(std::string_view piece,
                                            const std::function<std::vector<int32_t>(std::string_view)>& encode) const {
  std::string key(piece);
  {
    std::lock_guard lock(cache_->mu);
    const auto it = cache_->map.find(key);
    if (it != cache_->map.end()) return it->second;
  }
  std::vector<int32_t> ids = encode(piece);
  std::lock_guard lock(cache_->mu);
  if (cache_->map.size() >= Cache::kMaxEntries) cache_->map.clear();
  cache_->map.emplace(std::move(key), ids);
  return ids;
}

}  // namespace loom::text
