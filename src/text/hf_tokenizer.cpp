#include "text/hf_tokenizer.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <string>
#include <utility>

#include "core/error.h"
#include "text/bpe.h"
#include "text/sentencepiece.h"

namespace loom::text {
namespace {

// id -> token string, from model.vocab and added_tokens together: every id
// from 0 to the largest has exactly one string.
std::vector<std::string> token_table(const HfBpeSpec& spec, const std::string& where) {
  LOOM_REQUIRE(!spec.vocab.empty(), where, ": model.vocab is empty");
  const size_t count = spec.vocab.size() + spec.added_tokens.size();
  int32_t max_id = -1;
  for (const auto& [token, id] : spec.vocab) {
    LOOM_REQUIRE(id >= 0 && static_cast<size_t>(id) < count, where, ": model.vocab: token '", token, "' has id ", id,
                 "; with ", count, " tokens (model.vocab and added_tokens) the ids must lie in [0, ", count, ")");
    max_id = std::max(max_id, id);
  }
  for (const HfAddedToken& t : spec.added_tokens) {
    LOOM_REQUIRE(t.id >= 0 && static_cast<size_t>(t.id) < count, where, ": added_tokens: '", t.content, "' has id ",
                 t.id, "; with ", count, " tokens (model.vocab and added_tokens) the ids must lie in [0, ", count, ")");
    LOOM_REQUIRE(!t.content.empty(), where, ": added_tokens: the token of id ", t.id, " has an empty content");
    max_id = std::max(max_id, t.id);
  }
  std::vector<std::string> table(static_cast<size_t>(max_id) + 1);
  std::vector<bool> taken(table.size(), false);
  for (const auto& [token, id] : spec.vocab) {
    LOOM_REQUIRE(!taken[id], where, ": model.vocab: id ", id, " is given to both '", table[id], "' and '", token, "'");
    table[id] = token, taken[id] = true;
  }
  for (const HfAddedToken& t : spec.added_tokens) {
    LOOM_REQUIRE(!taken[t.id] || table[t.id] == t.content, where, ": added_tokens: '", t.content, "' has id ", t.id,
                 ", which is already the id of '", table[t.id], "'");
    table[t.id] = t.content, taken[t.id] = true;
  }
  const auto gap = std::find(taken.begin(), taken.end(), false);
  LOOM_REQUIRE(gap == taken.end(), where, ": no token has id ", gap - taken.begin(),
               " (the ids of model.vocab and added_tokens must run from 0 without gaps)");
  return table;
}

std::string byte_name(int b) {
  char hex[8];
  std::snprintf(hex, sizeof hex, "0x%02X", b);
  return hex;
}

// The SentencePiece form's token for byte b: <0xXX>.
std::string spm_byte_token(int b) {
  char token[8];
  std::snprintf(token, sizeof token, "<0x%02X>", b);
  return token;
}

// What a token of the SentencePiece form decodes to: its ▁ spaces (the
// Metaspace decoder's too: it drops only the first token's, in decode), a
// byte token its byte when the decoder has ByteFallback.
bool is_spm_byte_token(const HfSpmForm& form, const std::string& token) {
  return form.decode_bytes && token.size() == 6 && token.starts_with("<0x") && token.back() == '>' &&
         std::isxdigit(static_cast<unsigned char>(token[3])) && std::isxdigit(static_cast<unsigned char>(token[4]));
}

std::string spm_token_bytes(const HfSpmForm& form, const std::string& token) {
  if (is_spm_byte_token(form, token))
    return std::string(1, static_cast<char>(std::stoi(token.substr(3, 2), nullptr, 16)));
  std::string out;
  for (size_t pos = 0;;) {
    const size_t at = token.find(kMetaspace, pos);
    out.append(token, pos, at == std::string::npos ? std::string::npos : at - pos);
    if (at == std::string::npos) return out;
    out += ' ';
    pos = at + kMetaspace.size();
  }
}

// ByteFallback's end of a run of byte tokens (decoders/byte_fallback.rs):
// the bytes when they are valid UTF-8, else one U+FFFD per byte of the run.
// (The JS port's TextDecoder replaces each invalid part instead; Rust's
// tokenizers, which transformers runs, is the reference.)
void flush_byte_run(std::string& run, std::string& text) {
  bool valid = true;
  for (size_t i = 0; i < run.size() && valid; i += utf8_char_at(run, i).len)
    valid = utf8_char_at(run, i).cp != kNotUtf8;
  if (valid) text += run;
  else
    for (size_t i = 0; i < run.size(); ++i) text += "\xEF\xBF\xBD";  // U+FFFD
  run.clear();
}

// prefix, then text with each space a ▁ (normalizer Replace, Metaspace).
std::string escape_spaces(std::string prefix, std::string_view text) {
  for (const char c : text) {
    if (c == ' ') prefix += kMetaspace;
    else prefix += c;
  }
  return prefix;
}

// No token of the SentencePiece form has a ▁ right after another
// character: no merge joins across such a ▁ (encode_spm_text may cut there).
bool no_space_inside(const HfBpeSpec& spec) {
  return std::none_of(spec.vocab.begin(), spec.vocab.end(), [](const auto& entry) {
    const std::string& t = entry.first;
    for (size_t at = t.find(kMetaspace, 1); at != std::string::npos; at = t.find(kMetaspace, at + 1))
      if (!t.substr(0, at).ends_with(kMetaspace)) return true;
    return false;
  });
}

// The byte-level vocabulary's token of each byte (all 256 required).
std::array<int32_t, 256> byte_level_ids(const std::unordered_map<std::string, int32_t>& vocab_ids,
                                        const std::string& where) {
  std::array<int32_t, 256> byte_ids{};
  for (int b = 0; b < 256; ++b) {
    const std::string token = bytes_to_byte_level(std::string(1, static_cast<char>(b)));
    const auto it = vocab_ids.find(token);
    LOOM_REQUIRE(it != vocab_ids.end(), where, ": model.vocab has no token for byte ", byte_name(b), " ('", token,
                 "'): a byte-level vocabulary has one for each of the 256 bytes");
    byte_ids[b] = it->second;
  }
  return byte_ids;
}

// tokenizers' single_word test is regex's \w (added_vocabulary.rs:
// Regex::new(r"\w$") and r"^\w", Rust's regex crate, Unicode-aware).
bool is_word_char(const Utf8Char& c) { return text::is_word_char(c.cp); }

// The character that ends at s[pos - 1] (pos > 0).
Utf8Char char_before(std::string_view s, size_t pos) {
  size_t start = pos - 1;
  for (int k = 0; k < 3 && start > 0 && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80; ++k) --start;
  const Utf8Char c = utf8_char_at(s, start);
  return start + c.len == pos ? c : Utf8Char{1, kNotUtf8, CharClass::kOther};
}

// Where the whitespace that ends s[lo, pos) begins (pos when none does).
size_t trailing_space_start(std::string_view s, size_t lo, size_t pos) {
  const std::string_view head = s.substr(0, pos);
  size_t start = pos;
  for (size_t k = lo; k < pos;) {
    const Utf8Char c = utf8_char_at(head, k);
    if (c.cls != CharClass::kSpace) start = pos;
    else if (start == pos) start = k;
    k += c.len;
  }
  return start;
}

size_t leading_space_end(std::string_view s, size_t pos) {
  while (pos < s.size()) {
    const Utf8Char c = utf8_char_at(s, pos);
    if (c.cls != CharClass::kSpace) break;
    pos += c.len;
  }
  return pos;
}

}  // namespace

struct HfTokenizer::Part {
  size_t begin, end;
  int32_t id;  // an added token's; -1: text to pre-tokenise
};

HfBpeSpec hf_spec_of_gpt2(const Gpt2Tokenizer& tok) {
  HfBpeSpec spec;
  const std::vector<std::string>& tokens = tok.token_strings();
  spec.vocab.reserve(tokens.size());
  for (size_t id = 0; id < tokens.size(); ++id) spec.vocab.emplace_back(tokens[id], static_cast<int32_t>(id));
  for (const std::string& m : tok.merge_strings()) {
    const size_t space = m.find(' ');  // from_strings checked: exactly one, inside
    spec.merges.emplace_back(m.substr(0, space), m.substr(space + 1));
  }
  spec.added_tokens.push_back({.id = tok.eot_id(), .content = tokens[tok.eot_id()], .special = true});
  spec.split = SplitPattern::gpt2;
  spec.bos_id = spec.eos_id = tok.eot_id();
  return spec;
}

SpmVocab spm_vocab_of(const HfTokenizer& tok) {
  const HfBpeSpec& spec = tok.spec();
  LOOM_CHECK(spec.spm.has_value(), "spm_vocab_of: a byte-level tokenizer.json has no SentencePiece vocabulary");
  SpmVocab v;
  v.tokens = tok.token_strings();
  const auto n = v.tokens.size();
  std::unordered_map<std::string, int32_t> ids;
  for (size_t id = 0; id < n; ++id) ids.emplace(v.tokens[id], static_cast<int32_t>(id));
  // Each merged piece's first and last merge rank.
  std::vector<int64_t> first(n, -1), last(n, -1);
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const size_t id = static_cast<size_t>(ids.at(spec.merges[rank].first + spec.merges[rank].second));
    if (first[id] < 0) first[id] = static_cast<int64_t>(rank);
    last[id] = static_cast<int64_t>(rank);
  }
  std::vector<size_t> merged;
  for (size_t id = 0; id < n; ++id)
    if (first[id] >= 0) merged.push_back(id);
  std::sort(merged.begin(), merged.end(), [&](size_t a, size_t b) { return first[a] < first[b]; });
  v.scores.assign(n, 0.f);
  float score = 0.f;
  int64_t block_end = -1;
  for (const size_t id : merged) {
    if (first[id] > block_end) score -= 1.f;  // a new score unless its merges interleave with the block's
    block_end = std::max(block_end, last[id]);
    v.scores[id] = score;
  }
  for (size_t id = 0; id < n; ++id)
    if (first[id] < 0) v.scores[id] = (score -= 1.f);
  v.token_types.assign(n, static_cast<int32_t>(SpmPieceType::kNormal));
  if (spec.spm->byte_fallback)
    for (int b = 0; b < 256; ++b)
      if (const auto it = ids.find(spm_byte_token(b)); it != ids.end())
        v.token_types[it->second] = static_cast<int32_t>(SpmPieceType::kByte);
  for (const HfAddedToken& t : spec.added_tokens)
    v.token_types[t.id] = static_cast<int32_t>(t.special ? SpmPieceType::kControl : SpmPieceType::kUserDefined);
  if (!spec.spm->unk_token.empty()) {
    v.unk_id = ids.at(spec.spm->unk_token);
    v.token_types[v.unk_id] = static_cast<int32_t>(SpmPieceType::kUnknown);
  }
  v.bos_id = tok.bos_id();
  v.eos_id = tok.eos_id();
  v.add_bos = tok.add_bos();
  v.add_dummy_prefix = spec.spm->prepend != HfSpmForm::Prepend::none;
  return v;
}

HfTokenizer HfTokenizer::from_spec(HfBpeSpec spec, const std::string& where) {
  HfTokenizer tok;
  tok.token_strings_ = token_table(spec, where);
  const auto n = static_cast<int32_t>(tok.token_strings_.size());
  std::unordered_map<std::string, int32_t> vocab_ids;  // model.vocab only: merges and bytes refer to it
  for (const auto& [token, id] : spec.vocab) vocab_ids.emplace(token, id);

  std::vector<std::string> bytes(tok.token_strings_.size());
  std::array<int32_t, 256> byte_ids{};
  if (spec.spm) {
    for (int32_t id = 0; id < n; ++id) bytes[id] = spm_token_bytes(*spec.spm, tok.token_strings_[id]);
    for (int b = 0; b < 256; ++b) {
      const auto it = vocab_ids.find(spm_byte_token(b));
      byte_ids[b] = it == vocab_ids.end() ? -1 : it->second;
    }
    if (!spec.spm->unk_token.empty()) {
      const auto it = vocab_ids.find(spec.spm->unk_token);
      LOOM_REQUIRE(it != vocab_ids.end(), where, ": model.unk_token '", spec.spm->unk_token,
                   "' is not in model.vocab");
      tok.unk_id_ = it->second;
    }
    tok.piece_ids_ = vocab_ids;
    tok.spm_words_ = no_space_inside(spec);
  } else {
    for (int32_t id = 0; id < n; ++id)
      if (!byte_level_to_bytes(tok.token_strings_[id], bytes[id])) bytes[id] = tok.token_strings_[id];
    byte_ids = byte_level_ids(vocab_ids, where);
  }
  tok.bpe_ = ByteBpe(std::move(bytes), byte_ids);
  for (size_t i = 0; i < spec.merges.size(); ++i) {
    const auto& [left, right] = spec.merges[i];
    const auto l = vocab_ids.find(left), r = vocab_ids.find(right), m = vocab_ids.find(left + right);
    LOOM_REQUIRE(l != vocab_ids.end() && r != vocab_ids.end(), where, ": model.merges[", i, "]: merge '", left, " ",
                 right, "' uses a token that is not in model.vocab");
    LOOM_REQUIRE(m != vocab_ids.end(), where, ": model.merges[", i, "]: the merge of '", left, "' and '", right,
                 "' gives '", left + right, "', which is not in model.vocab");
    LOOM_REQUIRE(tok.bpe_.add_merge(l->second, r->second, m->second), where, ": model.merges[", i, "]: merge '", left,
                 " ", right, "' is listed twice");
  }
  if (spec.ignore_merges && !spec.spm)
    for (const auto& [token, id] : spec.vocab)
      if (std::string b; byte_level_to_bytes(token, b)) tok.piece_ids_.emplace(std::move(b), id);
  tok.special_.assign(tok.token_strings_.size(), 0);
  for (const HfAddedToken& t : spec.added_tokens) tok.special_[t.id] = t.special ? 1 : 0;
  for (const auto& [name, id] : {std::pair{"BOS", spec.bos_id}, {"EOS", spec.eos_id}})
    LOOM_REQUIRE(id >= -1 && id < n, where, ": the ", name, " token id ", id, " is outside the vocabulary [0, ", n,
                 ")");
  if (spec.split == SplitPattern::llama3) spec.split_step = true;  // ByteLevel's own regex is GPT-2's only
  tok.spec_ = std::move(spec);
  tok.build_added_index();
  return tok;
}

void HfTokenizer::build_added_index() {
  raw_added_.assign(256, {});
  normalized_added_.assign(256, {});
  added_match_.clear();
  for (size_t i = 0; i < spec_.added_tokens.size(); ++i) {
    const HfAddedToken& t = spec_.added_tokens[i];
    added_match_.push_back(t.normalized && spec_.spm ? spm_normalize(t.content) : t.content);
    (t.normalized ? normalized_added_ : raw_added_)[static_cast<uint8_t>(added_match_.back()[0])].push_back(i);
  }
  for (AddedIndex* index : {&raw_added_, &normalized_added_})
    for (std::vector<size_t>& list : *index)
      std::stable_sort(list.begin(), list.end(),
                       [this](size_t a, size_t b) { return added_match_[a].size() > added_match_[b].size(); });
}

// Leftmost-longest matches of the index's tokens (special ones only when
// `specials`); a single_word token whose match touches a word character is
// no match there.
std::vector<HfTokenizer::Part> HfTokenizer::split_added(std::string_view text, const AddedIndex& index,
                                                        bool specials) const {
  std::vector<Part> parts;
  size_t text_begin = 0;
  for (size_t i = 0; i < text.size();) {
    const HfAddedToken* match = nullptr;
    size_t match_size = 0;
    for (const size_t k : index[static_cast<uint8_t>(text[i])]) {
      const HfAddedToken& t = spec_.added_tokens[k];
      if ((t.special && !specials) || !text.substr(i).starts_with(added_match_[k])) continue;
      const size_t end = i + added_match_[k].size();
      const bool alone = !t.single_word || ((i == 0 || !is_word_char(char_before(text, i))) &&
                                            (end == text.size() || !is_word_char(utf8_char_at(text, end))));
      if (alone) match = &t, match_size = added_match_[k].size();
      break;
    }
    if (match == nullptr) {
      ++i;
      continue;
    }
    const size_t begin = match->lstrip ? trailing_space_start(text, text_begin, i) : i;
    const size_t end = match->rstrip ? leading_space_end(text, i + match_size) : i + match_size;
    if (begin > text_begin) parts.push_back({text_begin, begin, -1});
    parts.push_back({begin, end, match->id});
    i = text_begin = end;
  }
  if (text_begin < text.size()) parts.push_back({text_begin, text.size(), -1});
  return parts;
}

std::vector<int32_t> HfTokenizer::encode(std::string_view text) const { return encode_with(text, false); }

std::vector<int32_t> HfTokenizer::encode_special(std::string_view text) const { return encode_with(text, true); }

std::vector<int32_t> HfTokenizer::encode_with(std::string_view text, bool specials) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);
  for (const Part& p : split_added(text, raw_added_, specials)) {
    if (p.id >= 0) {
      ids.push_back(p.id);
      continue;
    }
    // The normalizer sees each stretch between the raw added tokens (only
    // the SentencePiece form has one).
    std::string normalized;
    std::string_view sub = text.substr(p.begin, p.end - p.begin);
    if (spec_.spm) sub = normalized = spm_normalize(sub);
    for (const Part& q : split_added(sub, normalized_added_, specials)) {
      if (q.id >= 0) ids.push_back(q.id);
      else encode_text(sub.substr(q.begin, q.end - q.begin), p.begin == 0 && q.begin == 0, ids);
    }
  }
  return ids;
}

std::string HfTokenizer::spm_normalize(std::string_view text) const {
  if (spec_.spm->metaspace) return std::string(text);
  // Prepend("▁") (when set) and Replace(" ", "▁").
  return escape_spaces(std::string(spec_.spm->prepend == HfSpmForm::Prepend::normalizer ? kMetaspace : ""), text);
}

void HfTokenizer::encode_spm_text(std::string_view text, bool at_start, std::vector<int32_t>& ids) const {
  const HfSpmForm& form = *spec_.spm;
  std::string spaced;
  if (form.metaspace) {  // spaces to ▁, then a ▁ in front unless one is there
    const bool prepend = form.prepend == HfSpmForm::Prepend::always || (form.prepend == HfSpmForm::Prepend::first && at_start);
    spaced = escape_spaces(std::string(prepend && !text.starts_with(' ') && !text.starts_with(kMetaspace) ? kMetaspace : ""),
                           text);
    text = spaced;
  }
  // Pre-tokens start at each ▁ with split; without it, where no merge can
  // join across (spm_words_): before a ▁ that follows another character.
  // The ids are the same as of the whole.
  const bool at_every = form.split;
  if (!at_every && !spm_words_) return encode_pretoken(text, ids);
  size_t begin = 0;
  for (size_t at = text.find(kMetaspace, 1); at != std::string_view::npos; at = text.find(kMetaspace, at + 1)) {
    if (!at_every && text.substr(0, at).ends_with(kMetaspace)) continue;
    encode_pretoken(text.substr(begin, at - begin), ids);
    begin = at;
  }
  encode_pretoken(text.substr(begin), ids);
}

std::vector<int32_t> HfTokenizer::spm_symbols(std::string_view piece) const {
  const HfSpmForm& form = *spec_.spm;
  std::vector<int32_t> word;
  bool last_unknown = false;
  for (size_t i = 0; i < piece.size();) {
    const Utf8Char c = utf8_char_at(piece, i);
    const std::string ch(piece.substr(i, c.len));
    i += c.len;
    if (const auto it = piece_ids_.find(ch); it != piece_ids_.end() && c.cp != kNotUtf8) {
      word.push_back(it->second);
      last_unknown = false;
      continue;
    }
    if (form.byte_fallback && std::all_of(ch.begin(), ch.end(), [this](char b) { return bpe_.byte_id(b) >= 0; })) {
      for (const char b : ch) word.push_back(bpe_.byte_id(b));
      last_unknown = false;
      continue;
    }
    LOOM_REQUIRE(unk_id_ >= 0, "tokenizer: the character ", c.cp == kNotUtf8 ? "(a byte that is not UTF-8)" : ch,
                 " has no token, and the tokenizer.json has no model.unk_token");
    if (!(form.fuse_unk && last_unknown)) word.push_back(unk_id_);
    last_unknown = true;
  }
  return word;
}

void HfTokenizer::encode_text(std::string_view text, bool at_start, std::vector<int32_t>& ids) const {
  if (spec_.spm) return encode_spm_text(text, at_start, ids);
  // tokenizers' ByteLevel prepends the space to each piece it is handed
  // (byte_level.rs: inside pretokenized.split, `if self.add_prefix_space &&
  // !normalized.get().starts_with(' ')`): the whole stretch before its own
  // regex splits it, or each pre-token a Split step before it made.
  const auto encode_prefixed = [this, &ids](std::string_view piece) {
    if (!spec_.add_prefix_space || piece.starts_with(' ')) return encode_pretoken(piece, ids);
    encode_pretoken(" " + std::string(piece), ids);
  };
  if (!spec_.split) return encode_prefixed(text);
  std::string prefixed;
  if (spec_.add_prefix_space && !spec_.split_step && !text.starts_with(' ')) {
    prefixed = " ";
    prefixed += text;
    text = prefixed;
  }
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = pretoken_end(*spec_.split, text, pos);
    if (spec_.split_step) encode_prefixed(text.substr(pos, end - pos));
    else encode_pretoken(text.substr(pos, end - pos), ids);
    pos = end;
  }
}

void HfTokenizer::encode_pretoken(std::string_view piece, std::vector<int32_t>& ids) const {
  if (spec_.ignore_merges) {
    const auto it = piece_ids_.find(std::string(piece));
    if (it != piece_ids_.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  const std::vector<int32_t> piece_ids =
      spec_.spm ? bpe_.encode_cached(piece, [this](std::string_view p) { return bpe_.merge(spm_symbols(p)); })
                : bpe_.encode_piece(piece);
  ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
}

std::string HfTokenizer::decode(std::span<const int32_t> ids) const {
  std::string text, byte_run;
  bool first = true;
  for (const int32_t id : ids) {
    LOOM_REQUIRE(id >= 0 && id < vocab_size(), "decode: token id ", id, " is outside the vocabulary [0, ",
                 vocab_size(), ")");
    if (special_[id]) continue;
    const bool is_first = std::exchange(first, false);
    if (spec_.spm && is_spm_byte_token(*spec_.spm, token_strings_[id])) {
      byte_run += bpe_.bytes(id);
      continue;
    }
    flush_byte_run(byte_run, text);
    if (spec_.spm && spec_.spm->metaspace_decoder && is_first) {
      // The Metaspace decoder drops the first token's ▁ instead of making them spaces.
      std::string token = token_strings_[id];
      for (size_t at; (at = token.find(kMetaspace)) != std::string::npos;) token.erase(at, kMetaspace.size());
      text += spm_token_bytes(*spec_.spm, token);
    } else {
      text += bpe_.bytes(id);
    }
  }
  flush_byte_run(byte_run, text);
  if (spec_.spm) {  // Strip: at most strip_spaces leading spaces of the whole
    size_t cut = 0;
    while (cut < text.size() && cut < static_cast<size_t>(spec_.spm->strip_spaces) && text[cut] == ' ') ++cut;
    text.erase(0, cut);
  }
  return text;
}

std::string HfTokenizer::token_bytes(int32_t id) const {
  LOOM_REQUIRE(id >= 0 && id < vocab_size(), "decode: token id ", id, " is outside the vocabulary [0, ", vocab_size(),
               ")");
  return special_[id] ? std::string() : bpe_.bytes(id);
}

}  // namespace loom::text
