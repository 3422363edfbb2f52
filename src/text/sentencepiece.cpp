#include "text/sentencepiece.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>

#include "core/error.h"

namespace loom::text {
namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";        // U+2581, SentencePiece's escaped space
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the valid UTF-8 character that starts s, or 0 when s does not
// start with one: SentencePiece's DecodeUTF8 (no overlong forms, surrogates
// or values above U+10FFFF).
size_t utf8_char_len(std::string_view s) {
  const auto b0 = static_cast<uint8_t>(s[0]);
  if (b0 < 0x80) return 1;
  size_t len;
  char32_t cp, min;
  if ((b0 & 0xE0) == 0xC0) len = 2, cp = b0 & 0x1F, min = 0x80;
  else if ((b0 & 0xF0) == 0xE0) len = 3, cp = b0 & 0x0F, min = 0x800;
  else if ((b0 & 0xF8) == 0xF0) len = 4, cp = b0 & 0x07, min = 0x10000;
  else return 0;
  if (s.size() < len) return 0;
  for (size_t k = 1; k < len; ++k) {
    const auto b = static_cast<uint8_t>(s[k]);
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

// SentencePiece's OneCharLen: the length the lead byte announces, capped
// by what is left (the normalised text it splits is valid UTF-8).
size_t lead_byte_len(std::string_view s) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return std::min<size_t>(s.size(), kLen[static_cast<uint8_t>(s[0]) >> 4]);
}

// "<0x41>" -> 0x41 (upper-case hex, as SentencePiece writes them); -1 for
// anything else.
int byte_of_piece(std::string_view p) {
  if (p.size() != 6 || !p.starts_with("<0x") || p[5] != '>') return -1;
  auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; };
  const int hi = hex(p[3]), lo = hex(p[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// Whether a ▁ follows some other character in piece ("a▁b", not "▁▁b").
bool space_after_char(std::string_view piece) {
  for (size_t pos = piece.find(kSpace, 1); pos != std::string_view::npos; pos = piece.find(kSpace, pos + kSpace.size()))
    if (!piece.substr(0, pos).ends_with(kSpace)) return true;
  return false;
}

// Appends bytes as text: each valid UTF-8 character as is, each other byte
// as U+FFFD (SentencePiece's decoding of a run of byte tokens).
void append_bytes(std::string_view bytes, std::string* text) {
  for (size_t pos = 0; pos < bytes.size();) {
    const size_t n = utf8_char_len(bytes.substr(pos));
    text->append(n ? bytes.substr(pos, n) : kReplacement);
    pos += n ? n : 1;
  }
}

}  // namespace

struct SentencePieceTokenizer::Symbol {
  int32_t prev;  // -1: first
  int32_t next;  // -1: last
  uint32_t begin;
  uint32_t size;  // 0: merged into its left neighbour
  bool frozen;    // a user-defined piece: never merged
};

void SentencePieceTokenizer::Matcher::add(const SpmVocab& vocab, int32_t id) {
  by_first_byte[static_cast<uint8_t>(vocab.tokens[id][0])].push_back(id);
}

void SentencePieceTokenizer::Matcher::sort(const SpmVocab& vocab) {
  for (auto& ids : by_first_byte)
    std::stable_sort(ids.begin(), ids.end(),
                     [&](int32_t a, int32_t b) { return vocab.tokens[a].size() > vocab.tokens[b].size(); });
}

size_t SentencePieceTokenizer::Matcher::match(const SpmVocab& vocab, std::string_view text, int32_t* id) const {
  if (text.empty()) return 0;
  for (const int32_t t : by_first_byte[static_cast<uint8_t>(text[0])]) {
    if (text.starts_with(vocab.tokens[t])) {
      *id = t;
      return vocab.tokens[t].size();
    }
  }
  return 0;
}

SentencePieceTokenizer SentencePieceTokenizer::from_vocab(SpmVocab vocab, const std::string& source) {
  SentencePieceTokenizer tok;
  tok.vocab_ = std::move(vocab);
  tok.source_ = source;
  tok.index_tokens();
  return tok;
}

// SentencePiece's ModelInterface::InitializePieces, for GGUF arrays too.
void SentencePieceTokenizer::index_tokens() {
  SpmVocab& v = vocab_;
  const size_t n = v.tokens.size();
  LOOM_REQUIRE(n > 0, source_, ": the vocabulary is empty");
  LOOM_REQUIRE(n <= static_cast<size_t>(std::numeric_limits<int32_t>::max()), source_, ": ", n, " tokens is too many");
  LOOM_REQUIRE(v.scores.empty() || v.scores.size() == n, source_, ": ", v.scores.size(), " scores for ", n, " tokens");
  LOOM_REQUIRE(v.token_types.empty() || v.token_types.size() == n, source_, ": ", v.token_types.size(),
               " token types for ", n, " tokens");
  if (v.scores.empty()) v.scores.assign(n, 0.0f);
  if (v.token_types.empty()) v.token_types.assign(n, static_cast<int32_t>(SpmPieceType::kNormal));
  byte_token_.fill(-1);
  int32_t first_unknown = -1;
  int n_bytes = 0;
  for (int32_t id = 0; id < static_cast<int32_t>(n); ++id) {
    const std::string& t = v.tokens[id];
    const int32_t raw_type = v.token_types[id];
    LOOM_REQUIRE(raw_type >= 1 && raw_type <= 6, source_, ": token ", id, " has type ", raw_type,
                 "; SentencePiece token types are 1 (normal) to 6 (byte)");
    LOOM_REQUIRE(!t.empty(), source_, ": token ", id, " is the empty string");
    LOOM_REQUIRE(!std::isnan(v.scores[id]), source_, ": token ", id, " has score NaN");
    const auto type = static_cast<SpmPieceType>(raw_type);
    types_.push_back(type);
    const bool mergeable = type == SpmPieceType::kNormal || type == SpmPieceType::kUserDefined ||
                           type == SpmPieceType::kUnused;
    PieceMap& map = mergeable ? pieces_ : reserved_;
    const auto [it, fresh] = map.emplace(t, id);
    LOOM_REQUIRE(fresh, source_, ": token ", id, " \"", t, "\" repeats token ", it->second);
    if (type == SpmPieceType::kUserDefined) user_defined_.add(v, id);
    if (type == SpmPieceType::kControl || type == SpmPieceType::kUnknown) special_.add(v, id);
    if (type == SpmPieceType::kUnknown) {
      LOOM_REQUIRE(first_unknown < 0, source_, ": tokens ", first_unknown, " and ", id, " are both of type unknown");
      first_unknown = id;
    }
    if (type == SpmPieceType::kByte) {
      const int b = byte_of_piece(t);
      LOOM_REQUIRE(b >= 0, source_, ": token ", id, " has type byte but is \"", t, "\", not <0xXX>");
      byte_token_[b] = id;
      ++n_bytes;
    }
  }
  LOOM_REQUIRE(n_bytes == 0 || n_bytes == 256, source_, ": ", n_bytes,
               " byte tokens <0xXX>; byte fallback needs all 256");
  byte_fallback_ = n_bytes == 256;
  words_independent_ =
      std::none_of(pieces_.begin(), pieces_.end(), [](const auto& e) { return space_after_char(e.first); });
  if (v.unk_id < 0) v.unk_id = first_unknown;
  for (const auto& [name, id] : {std::pair{"unknown", v.unk_id}, {"BOS", v.bos_id}, {"EOS", v.eos_id}})
    LOOM_REQUIRE(id >= -1 && id < static_cast<int32_t>(n), source_, ": the ", name, " token id ", id,
                 " is outside the vocabulary of ", n);
  LOOM_REQUIRE(byte_fallback_ || v.unk_id >= 0, source_,
               ": neither an unknown token nor byte tokens: text outside the vocabulary could not be encoded");
  user_defined_.sort(v);
  special_.sort(v);
  charsmap_ = SpmCharsMap(v.precompiled_charsmap, source_);
}

SentencePieceTokenizer SentencePieceTokenizer::from_model(const SpmModel& m, const std::string& source) {
  using ModelType = SpmTrainerSpec::ModelType;
  const SpmTrainerSpec& t = m.trainer;
  LOOM_REQUIRE(t.model_type == ModelType::kBpe, source, ": TrainerSpec.model_type is ",
               static_cast<int>(t.model_type), "; loom reads SentencePiece BPE models (model_type 2) only");
  LOOM_REQUIRE(!t.treat_whitespace_as_suffix, source, ": TrainerSpec.treat_whitespace_as_suffix is not supported");
  LOOM_REQUIRE(!m.has_denormalizer || m.denormalizer.precompiled_charsmap.empty(), source,
               ": denormalization rules (ModelProto.denormalizer_spec) are not supported");
  SpmVocab v;
  bool has_unknown = false, has_byte = false;
  for (const SpmPiece& p : m.pieces) {
    v.tokens.push_back(p.piece);
    v.scores.push_back(p.score);
    v.token_types.push_back(static_cast<int32_t>(p.type));
    has_unknown |= p.type == SpmPieceType::kUnknown;
    has_byte |= p.type == SpmPieceType::kByte;
  }
  // SentencePiece's own checks (InitializePieces) for a model file.
  LOOM_REQUIRE(has_unknown, source, ": no piece of type UNKNOWN (SentencePiece requires one)");
  LOOM_REQUIRE(!has_byte || t.byte_fallback, source, ": byte pieces although TrainerSpec.byte_fallback is false");
  LOOM_REQUIRE(has_byte || !t.byte_fallback, source,
               ": TrainerSpec.byte_fallback is true but there are no byte pieces");
  // BOS/EOS are the control pieces so named (SentencePieceProcessor::bos_id).
  auto control_id = [&](const std::string& piece) {
    for (size_t i = 0; i < m.pieces.size(); ++i)
      if (m.pieces[i].type == SpmPieceType::kControl && m.pieces[i].piece == piece) return static_cast<int32_t>(i);
    return -1;
  };
  v.bos_id = control_id(t.bos_piece);
  v.eos_id = control_id(t.eos_piece);
  v.add_bos = v.bos_id >= 0;
  v.add_dummy_prefix = m.normalizer.add_dummy_prefix;
  v.remove_extra_whitespaces = m.normalizer.remove_extra_whitespaces;
  v.escape_whitespaces = m.normalizer.escape_whitespaces;
  v.precompiled_charsmap = m.normalizer.precompiled_charsmap;
  v.normalizer_name = m.normalizer.name;
  v.unk_surface = t.unk_surface;
  return from_vocab(std::move(v), source);
}

SentencePieceTokenizer SentencePieceTokenizer::load(const std::string& model_path) {
  return from_model(spm_model_read(model_path), model_path);
}

// Normalizer::NormalizePrefix: a user-defined piece is kept as is, else the
// longest charsmap rule applies, else one character is copied (an invalid
// UTF-8 byte becomes U+FFFD). Returns the replacement and the bytes consumed.
std::pair<std::string_view, size_t> SentencePieceTokenizer::normalize_prefix(std::string_view input) const {
  int32_t id;
  if (const size_t n = user_defined_.match(vocab_, input, &id)) return {input.substr(0, n), n};
  std::string_view replacement;
  if (const size_t n = charsmap_.longest_prefix(input, &replacement)) return {replacement, n};
  if (const size_t n = utf8_char_len(input)) return {input.substr(0, n), n};
  return {kReplacement, 1};
}

// Normalizer::Normalize, without the alignment it also tracks.
std::string SentencePieceTokenizer::normalize(std::string_view input) const {
  std::string out;
  const bool trim = vocab_.remove_extra_whitespaces;
  while (trim && !input.empty()) {
    const auto [piece, consumed] = normalize_prefix(input);
    if (piece != " ") break;
    input.remove_prefix(consumed);
  }
  if (input.empty()) return out;
  const std::string_view space = vocab_.escape_whitespaces ? kSpace : " ";
  if (vocab_.add_dummy_prefix) out += space;
  bool prev_space = trim;
  while (!input.empty()) {
    auto [piece, consumed] = normalize_prefix(input);
    while (prev_space && piece.starts_with(' ')) piece.remove_prefix(1);
    if (!piece.empty()) {
      for (const char c : piece) {
        if (c == ' ') out += space;
        else out += c;
      }
      prev_space = piece.back() == ' ';
    }
    input.remove_prefix(consumed);
    if (!trim) prev_space = false;
  }
  while (trim && out.ends_with(space)) out.resize(out.size() - space.size());
  return out;
}

int32_t SentencePieceTokenizer::piece_id(std::string_view piece) const {
  if (const auto it = reserved_.find(piece); it != reserved_.end()) return it->second;
  if (const auto it = pieces_.find(piece); it != pieces_.end()) return it->second;
  return -1;
}

std::vector<int32_t> SentencePieceTokenizer::encode(std::string_view text, const SpmEncodeOptions& options) const {
  std::vector<int32_t> out;
  if (options.add_bos) {
    LOOM_REQUIRE(vocab_.bos_id >= 0, source_, ": BOS requested but the vocabulary has no BOS token");
    out.push_back(vocab_.bos_id);
  }
  if (!options.parse_special) {
    encode_text(text, &out);
  } else {
    size_t start = 0;
    for (size_t pos = 0; pos < text.size();) {
      int32_t id;
      if (const size_t n = special_.match(vocab_, text.substr(pos), &id)) {
        encode_text(text.substr(start, pos - start), &out);
        out.push_back(id);
        start = pos += n;
      } else {
        ++pos;
      }
    }
    encode_text(text.substr(start), &out);
  }
  if (options.add_eos) {
    LOOM_REQUIRE(vocab_.eos_id >= 0, source_, ": EOS requested but the vocabulary has no EOS token");
    out.push_back(vocab_.eos_id);
  }
  return out;
}

void SentencePieceTokenizer::encode_text(std::string_view raw, std::vector<int32_t>* out) const {
  const std::string normalized = normalize(raw);
  const std::string_view text = normalized;
  bool prev_unknown = false;
  size_t start = 0;
  for (size_t pos = words_independent_ ? text.find(kSpace, 1) : std::string_view::npos; pos != std::string_view::npos;
       pos = text.find(kSpace, pos + kSpace.size())) {
    if (text.substr(0, pos).ends_with(kSpace)) continue;
    encode_segment(text.substr(start, pos - start), &prev_unknown, out);
    start = pos;
  }
  encode_segment(text.substr(start), &prev_unknown, out);
}

void SentencePieceTokenizer::encode_segment(std::string_view text, bool* prev_unknown,
                                            std::vector<int32_t>* out) const {
  LOOM_REQUIRE(text.size() < std::numeric_limits<uint32_t>::max(), source_, ": text of ", text.size(),
               " bytes is too long to encode at once");
  std::vector<Symbol> symbols;
  for (size_t pos = 0; pos < text.size();) {
    int32_t id;
    size_t n = user_defined_.match(vocab_, text.substr(pos), &id);
    const bool frozen = n > 0;
    if (!frozen) n = lead_byte_len(text.substr(pos));
    const auto index = static_cast<int32_t>(symbols.size());
    const bool last = pos + n == text.size();
    symbols.push_back({index - 1, last ? -1 : index + 1, static_cast<uint32_t>(pos), static_cast<uint32_t>(n), frozen});
    pos += n;
  }
  if (symbols.empty()) return;
  Unmerge unmerge;
  merge(text, &symbols, &unmerge);
  for (int32_t i = 0; i >= 0; i = symbols[i].next)
    emit(text.substr(symbols[i].begin, symbols[i].size), unmerge, prev_unknown, out);
}

// bpe_model.cc's Model::Encode: merge the best-scoring adjacent pair until
// no adjacent pair forms a piece. Entries left in the queue by an earlier
// merge are recognised by their size: both sides only ever grow.
void SentencePieceTokenizer::merge(std::string_view text, std::vector<Symbol>* symbols, Unmerge* unmerge) const {
  struct Pair {
    float score;
    int32_t left, right;
    uint32_t size;  // bytes of the merged piece
  };
  auto worse = [](const Pair& a, const Pair& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Pair, std::vector<Pair>, decltype(worse)> queue(worse);
  std::vector<Symbol>& s = *symbols;
  auto consider = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0 || s[left].frozen || s[right].frozen) return;
    const std::string_view joined = text.substr(s[left].begin, s[left].size + s[right].size);
    const auto it = pieces_.find(joined);
    if (it == pieces_.end()) return;
    queue.push({vocab_.scores[it->second], left, right, static_cast<uint32_t>(joined.size())});
    if (types_[it->second] == SpmPieceType::kUnused)
      (*unmerge)[joined] = {text.substr(s[left].begin, s[left].size), text.substr(s[right].begin, s[right].size)};
  };
  for (size_t i = 1; i < s.size(); ++i) consider(static_cast<int32_t>(i - 1), static_cast<int32_t>(i));
  while (!queue.empty()) {
    const Pair top = queue.top();
    queue.pop();
    Symbol& left = s[top.left];
    Symbol& right = s[top.right];
    if (left.size == 0 || right.size == 0 || left.size + right.size != top.size) continue;
    left.size += right.size;
    left.next = right.next;
    if (right.next >= 0) s[right.next].prev = top.left;
    right.size = 0;
    consider(left.prev, top.left);
    consider(top.left, left.next);
  }
}

// Emits a merged symbol: an unused piece split back into the pieces it was
// formed from (bpe_model.cc's resegment), a piece as its id, anything else
// as its bytes (byte fallback) or the unknown token — one for a whole run
// of unknown symbols, as SentencePieceProcessor::PopulateSentencePieceText
// merges them.
void SentencePieceTokenizer::emit(std::string_view piece, const Unmerge& unmerge, bool* prev_unknown,
                                  std::vector<int32_t>* out) const {
  std::vector<std::string_view> stack{piece};
  while (!stack.empty()) {
    const std::string_view w = stack.back();
    stack.pop_back();
    const int32_t id = piece_id(w);
    if (id >= 0 && types_[id] == SpmPieceType::kUnused) {
      if (const auto it = unmerge.find(w); it != unmerge.end()) {
        stack.push_back(it->second.second);
        stack.push_back(it->second.first);
        continue;
      }
    }
    const bool unknown = id < 0 || types_[id] == SpmPieceType::kUnknown;
    if (!unknown) {
      out->push_back(id);
    } else if (byte_fallback_) {
      for (const char c : w) out->push_back(byte_token_[static_cast<uint8_t>(c)]);
    } else if (!*prev_unknown) {
      out->push_back(vocab_.unk_id);
    }
    *prev_unknown = unknown;
  }
}

std::string SentencePieceTokenizer::decode(std::span<const int32_t> ids) const {
  std::string text, bytes;  // bytes: the pending run of byte tokens
  bool is_bos_ws = true;    // the next visible piece may drop a leading ▁
  bool bos_ws_seen = false;
  for (const int32_t id : ids) {
    LOOM_REQUIRE(id >= 0 && id < vocab_size(), source_, ": token id ", id, " is outside the vocabulary of ",
                 vocab_size());
    if (types_[id] == SpmPieceType::kByte) {
      bytes += static_cast<char>(byte_of_piece(vocab_.tokens[id]));
      continue;
    }
    append_bytes(bytes, &text);
    bytes.clear();
    if (bos_ws_seen || !text.empty()) is_bos_ws = false;
    bos_ws_seen = append_decoded(id, is_bos_ws, &text);
  }
  append_bytes(bytes, &text);
  return text;
}

std::string SentencePieceTokenizer::token_bytes(int32_t id) const {
  LOOM_REQUIRE(id >= 0 && id < vocab_size(), source_, ": token id ", id, " is outside the vocabulary of ",
               vocab_size());
  if (types_[id] == SpmPieceType::kByte) return std::string(1, static_cast<char>(byte_of_piece(vocab_.tokens[id])));
  std::string text;
  append_decoded(id, false, &text);  // a stream keeps every ▁ as a space
  return text;
}

// Appends one non-byte token's text; returns whether it dropped a leading ▁.
bool SentencePieceTokenizer::append_decoded(int32_t id, bool is_bos_ws, std::string* text) const {
  const SpmPieceType type = types_[id];
  if (type == SpmPieceType::kControl) return false;
  if (type == SpmPieceType::kUnknown) {
    *text += vocab_.unk_surface;
    return false;
  }
  std::string_view piece = vocab_.tokens[id];
  bool dropped = false;
  if (is_bos_ws && (vocab_.add_dummy_prefix || vocab_.remove_extra_whitespaces) && piece.starts_with(kSpace)) {
    piece.remove_prefix(kSpace.size());
    dropped = !vocab_.remove_extra_whitespaces;  // then every leading ▁ goes
  }
  for (size_t pos = 0; pos < piece.size();) {
    if (piece.substr(pos).starts_with(kSpace)) {
      *text += ' ';
      pos += kSpace.size();
    } else {
      *text += piece[pos++];
    }
  }
  return dropped;
}

}  // namespace loom::text
