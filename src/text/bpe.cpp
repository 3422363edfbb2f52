#include "text/bpe.h"

#include <array>
#include <fstream>
#include <limits>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace loom::text {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  LOOM_REQUIRE(in, path, ": cannot open (run scripts/fetch-data.sh for GPT-2's files)");
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

}  // namespace

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
  LOOM_REQUIRE(!tokens.empty() && tokens.size() < size_t{std::numeric_limits<int32_t>::max()}, where.tokens,
               ": ", tokens.size(), " tokens; expected 1 to 2^31 - 1");
  std::unordered_map<std::string, int32_t> id_of;  // token string (as in the files) -> id
  std::vector<std::string> token_bytes(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto id = static_cast<int32_t>(i);
    const std::string& key = tokens[i];
    LOOM_REQUIRE(byte_level_to_bytes(key, token_bytes[i]), where.tokens, ": token '", key, "' (id ", id,
                 ") is not a byte-level token: it is empty or has a character outside GPT-2's byte alphabet");
    LOOM_REQUIRE(id_of.emplace(key, id).second, where.tokens, ": token '", key, "' appears twice");
  }
  std::array<int32_t, 256> byte_ids{};
  for (int b = 0; b < 256; ++b) {
    const std::string utf8 = bytes_to_byte_level(std::string(1, static_cast<char>(b)));
    const auto it = id_of.find(utf8);
    LOOM_REQUIRE(it != id_of.end(), where.tokens, ": no token for byte ", b, " ('", utf8, "')");
    byte_ids[b] = it->second;
  }
  Gpt2Tokenizer tok;
  tok.bpe_ = ByteBpe(std::move(token_bytes), byte_ids);
  const auto eot = id_of.find("<|endoftext|>");
  LOOM_REQUIRE(eot != id_of.end(), where.tokens, ": no '<|endoftext|>' token");
  tok.eot_id_ = eot->second;

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
    LOOM_REQUIRE(tok.bpe_.add_merge(l->second, r->second, merged->second), where.merges, ":", i + 1, ": merge '", m,
                 "' is listed twice");
    tok.merge_strings_.push_back(m);
  }
  LOOM_REQUIRE(tok.bpe_.merge_count() > 0, where.merges, ": no merges");
  tok.token_strings_ = std::move(tokens);
  return tok;
}

std::string Gpt2Tokenizer::token_bytes(int32_t id) const { return decode(std::span<const int32_t>(&id, 1)); }

std::vector<int32_t> Gpt2Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = gpt2_pretoken_end(text, pos);
    const std::vector<int32_t> piece_ids = bpe_.encode_piece(text.substr(pos, end - pos));
    ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
    pos = end;
  }
  return ids;
}

std::vector<int32_t> Gpt2Tokenizer::encode_special(std::string_view text) const {
  static constexpr std::string_view kEot = "<|endoftext|>";
  std::vector<int32_t> ids;
  for (size_t pos = 0;;) {
    const size_t at = text.find(kEot, pos);
    const std::vector<int32_t> piece = encode(text.substr(pos, at == std::string_view::npos ? at : at - pos));
    ids.insert(ids.end(), piece.begin(), piece.end());
    if (at == std::string_view::npos) return ids;
    ids.push_back(eot_id_);
    pos = at + kEot.size();
  }
}

std::string Gpt2Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  for (const int32_t id : ids) {
    LOOM_REQUIRE(id >= 0 && id < vocab_size(), "decode: token id ", id, " is outside the vocabulary [0, ",
                 vocab_size(), ")");
    text += bpe_.bytes(id);
  }
  return text;
}

}  // namespace loom::text
