#include "cli/model_tokenizer.h"

#include <filesystem>
#include <vector>

#include "core/error.h"
#include "text/bpe.h"
#include "text/hf_tokenizer.h"
#include "text/sentencepiece.h"
#include "text/tokenizer_files.h"

namespace loom::cli {
namespace {

std::vector<std::string> strings(const io::GgufFile& f, const char* key) {
  std::vector<std::string> out;
  for (std::string_view s : f.get_string_array(key)) out.emplace_back(s);
  return out;
}

// llama.cpp's defaults for a "llama" vocabulary where a key is absent.
text::SpmVocab spm_vocab(const io::GgufFile& f) {
  text::SpmVocab v;
  v.tokens = strings(f, "tokenizer.ggml.tokens");
  if (f.has("tokenizer.ggml.scores"))
    for (double s : f.get_float_array("tokenizer.ggml.scores")) v.scores.push_back(static_cast<float>(s));
  if (f.has("tokenizer.ggml.token_type"))
    for (int64_t t : f.get_int_array("tokenizer.ggml.token_type")) v.token_types.push_back(static_cast<int32_t>(t));
  const auto id = [&f](const char* key, int32_t fallback) {
    return f.has(key) ? f.get_int<int32_t>(key) : fallback;
  };
  v.bos_id = id("tokenizer.ggml.bos_token_id", 1);
  v.eos_id = id("tokenizer.ggml.eos_token_id", 2);
  v.unk_id = id("tokenizer.ggml.unknown_token_id", 0);
  const auto flag = [&f](const char* key, bool fallback) { return f.has(key) ? f.get_bool(key) : fallback; };
  v.add_bos = flag("tokenizer.ggml.add_bos_token", true);
  v.add_eos = flag("tokenizer.ggml.add_eos_token", false);
  v.add_dummy_prefix = flag("tokenizer.ggml.add_space_prefix", true);
  // tokenizer.ggml.remove_extra_whitespaces and precompiled_charsmap are not
  // read: llama.cpp's "llama" tokenizer (llm_tokenizer_spm) ignores both
  // (they are its "t5" tokenizer's), so the text keeps its runs of spaces.
  return v;
}

// A "gpt2" vocabulary with Llama 3's pre-tokenizer (llama.cpp's "llama-bpe"):
// control (3) and user-defined (4) tokens are its added tokens, the others
// model.vocab; merges are ignored for a pre-token in the vocabulary, as
// llama.cpp does for it.
// A byte-level BPE vocabulary of a GGUF file as a tokenizer.json one:
// control (3) and user-defined (4) tokens are added tokens, split out of the
// text first, as llama.cpp's parse_special does. Llama 3's ("llama-bpe")
// ignores the merges for whole-word tokens and adds its BOS unless told
// not to; GPT-2's ("gpt-2") adds a BOS only when add_bos_token says so.
text::HfTokenizer bpe_tokenizer(const io::GgufFile& f, const std::string& where, text::SplitPattern split) {
  text::HfBpeSpec spec;
  const std::vector<std::string> tokens = strings(f, "tokenizer.ggml.tokens");
  std::vector<int64_t> types;
  if (f.has("tokenizer.ggml.token_type")) types = f.get_int_array("tokenizer.ggml.token_type");
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto id = static_cast<int32_t>(i);
    const int64_t type = i < types.size() ? types[i] : 1;
    if (type == 3 || type == 4) spec.added_tokens.push_back({.id = id, .content = tokens[i], .special = type == 3});
    else spec.vocab.emplace_back(tokens[i], id);
  }
  for (const std::string& m : strings(f, "tokenizer.ggml.merges")) {
    const size_t space = m.find(' ');
    LOOM_REQUIRE(space != std::string::npos && space > 0 && space + 1 < m.size(), where,
                 ": tokenizer.ggml.merges: expected two tokens separated by a space, got '", m, "'");
    spec.merges.emplace_back(m.substr(0, space), m.substr(space + 1));
  }
  const bool llama3 = split == text::SplitPattern::llama3;
  spec.ignore_merges = llama3;
  spec.split = split;
  const auto id = [&f](const char* key) { return f.has(key) ? f.get_int<int32_t>(key) : -1; };
  spec.bos_id = id("tokenizer.ggml.bos_token_id");
  spec.eos_id = id("tokenizer.ggml.eos_token_id");
  const char* add_bos = "tokenizer.ggml.add_bos_token";
  spec.add_bos = spec.bos_id >= 0 && (f.has(add_bos) ? f.get_bool(add_bos) : llama3);
  return text::HfTokenizer::from_spec(std::move(spec), where + ": tokenizer.ggml.*");
}

// Whether a "gpt2" vocabulary is GPT-2's own as add_gpt2 writes it: no
// control or user-defined token but <|endoftext|>, which is also the EOS if
// one is named. Gpt2Tokenizer reads only that; any other added token
// (ChatML's <|im_start|>) or EOS needs bpe_tokenizer, as llama.cpp reads them.
bool gpt2_own(const io::GgufFile& f, const std::vector<std::string>& tokens) {
  constexpr std::string_view kEot = "<|endoftext|>";
  if (f.has("tokenizer.ggml.token_type")) {
    const std::vector<int64_t> types = f.get_int_array("tokenizer.ggml.token_type");
    for (size_t i = 0; i < types.size() && i < tokens.size(); ++i)
      if ((types[i] == 3 || types[i] == 4) && tokens[i] != kEot) return false;
  }
  if (!f.has("tokenizer.ggml.eos_token_id")) return true;
  const auto eos = f.get_int<int64_t>("tokenizer.ggml.eos_token_id");
  return eos >= 0 && eos < static_cast<int64_t>(tokens.size()) && tokens[static_cast<size_t>(eos)] == kEot;
}

// tokens padded to vocab_size with "[PAD<id>]", types with 5 (unused).
void pad(std::vector<std::string>& tokens, std::vector<int32_t>& types, int64_t vocab_size) {
  LOOM_REQUIRE(vocab_size >= static_cast<int64_t>(tokens.size()), "the model's vocab_size ", vocab_size,
               " is smaller than the tokenizer's ", tokens.size(), " tokens");
  for (auto id = static_cast<int64_t>(tokens.size()); id < vocab_size; ++id) {
    tokens.push_back(concat("[PAD", id, "]"));
    types.push_back(5);
  }
}

void add_gpt2(io::GgufWriter& w, const text::Gpt2Tokenizer& tok, int64_t vocab_size) {
  std::vector<std::string> tokens = tok.token_strings();
  std::vector<int32_t> types(tokens.size(), 1);  // llama.cpp's token types: 1 normal, 3 control, 5 unused
  types[static_cast<size_t>(tok.eot_id())] = 3;
  pad(tokens, types, vocab_size);
  const auto eot = static_cast<uint32_t>(tok.eot_id());
  w.add("tokenizer.ggml.model", io::GgufValue::string("gpt2"));
  w.add("tokenizer.ggml.pre", io::GgufValue::string("gpt-2"));
  w.add("tokenizer.ggml.tokens", io::GgufValue::string_array(tokens));
  w.add("tokenizer.ggml.token_type", io::GgufValue::array<int32_t>(types));
  w.add("tokenizer.ggml.merges", io::GgufValue::string_array(tok.merge_strings()));
  w.add("tokenizer.ggml.bos_token_id", io::GgufValue::u32(eot));
  w.add("tokenizer.ggml.eos_token_id", io::GgufValue::u32(eot));
  w.add("tokenizer.ggml.add_bos_token", io::GgufValue::boolean(false));
}

// A tokenizer.json's BPE as llama.cpp names it: pre "gpt-2" or "llama-bpe";
// special added tokens control (3), the others user-defined (4). One in
// SentencePiece's form is written as its SentencePiece vocabulary
// (text::spm_vocab_of).
void add_spm(io::GgufWriter& w, const text::SentencePieceTokenizer& tok, int64_t vocab_size);

void add_hf(io::GgufWriter& w, const text::HfTokenizer& tok, int64_t vocab_size) {
  const text::HfBpeSpec& spec = tok.spec();
  if (spec.spm)  // SentencePiece's form: a "llama" vocabulary, scored by the merges' ranks
    return add_spm(w, text::SentencePieceTokenizer::from_vocab(text::spm_vocab_of(tok), "tokenizer.json"),
                   vocab_size);
  LOOM_REQUIRE(spec.split.has_value() && !spec.add_prefix_space, "a tokenizer.json without a split pattern, or with "
               "add_prefix_space, has no GGUF form (llama.cpp's gpt2 vocabularies split by a pattern, with no prefix)");
  std::vector<std::string> tokens = tok.token_strings();
  std::vector<int32_t> types(tokens.size(), 1);
  for (const text::HfAddedToken& t : spec.added_tokens) types[static_cast<size_t>(t.id)] = t.special ? 3 : 4;
  pad(tokens, types, vocab_size);
  std::vector<std::string> merges;
  for (const auto& [left, right] : spec.merges) merges.push_back(left + " " + right);
  w.add("tokenizer.ggml.model", io::GgufValue::string("gpt2"));
  w.add("tokenizer.ggml.pre", io::GgufValue::string(spec.split == text::SplitPattern::llama3 ? "llama-bpe" : "gpt-2"));
  w.add("tokenizer.ggml.tokens", io::GgufValue::string_array(tokens));
  w.add("tokenizer.ggml.token_type", io::GgufValue::array<int32_t>(types));
  w.add("tokenizer.ggml.merges", io::GgufValue::string_array(merges));
  if (tok.bos_id() >= 0) w.add("tokenizer.ggml.bos_token_id", io::GgufValue::u32(static_cast<uint32_t>(tok.bos_id())));
  if (tok.eos_id() >= 0) w.add("tokenizer.ggml.eos_token_id", io::GgufValue::u32(static_cast<uint32_t>(tok.eos_id())));
  w.add("tokenizer.ggml.add_bos_token", io::GgufValue::boolean(tok.add_bos()));
}

// llama.cpp's "llama" tokenizer only escapes spaces to ▁ and adds the dummy
// prefix: a tokenizer.model that normalizes text otherwise (spm_train's
// default nmt_nfkc rules, remove_extra_whitespaces) would tokenize text
// differently from a GGUF file, so it has no GGUF form.
void require_llama_normalizer(const text::SentencePieceTokenizer& tok) {
  const text::SpmVocab& v = tok.vocab();
  std::string rules;
  const auto add = [&rules](const std::string& rule) { rules += (rules.empty() ? "" : "; ") + rule; };
  if (!v.precompiled_charsmap.empty())
    add(concat("a precompiled_charsmap of ", v.precompiled_charsmap.size(), " bytes (character rules such as ",
               "NFKC's, which folds 'ＡＢＣ' to 'ABC')"));
  if (v.remove_extra_whitespaces) add("remove_extra_whitespaces (runs of spaces collapsed, outer spaces dropped)");
  if (!v.escape_whitespaces) add("escape_whitespaces false (spaces not written as ▁)");
  LOOM_REQUIRE(rules.empty(), tok.source(), ": the SentencePiece normalizer '", v.normalizer_name, "' has ", rules,
               ": llama.cpp's 'llama' GGUF tokenizer applies none of this, so the .gguf file would tokenize text ",
               "differently from the tokenizer.model; only SentencePiece models normalized as Llama's ",
               "('identity', remove_extra_whitespaces false) have a GGUF form");
}

void add_spm(io::GgufWriter& w, const text::SentencePieceTokenizer& tok, int64_t vocab_size) {
  require_llama_normalizer(tok);
  const text::SpmVocab& v = tok.vocab();
  std::vector<std::string> tokens = v.tokens;
  std::vector<int32_t> types = v.token_types;
  if (types.empty()) types.assign(tokens.size(), 1);
  std::vector<float> scores = v.scores;
  if (scores.empty()) scores.assign(tokens.size(), 0.f);
  pad(tokens, types, vocab_size);
  scores.resize(tokens.size(), 0.f);
  w.add("tokenizer.ggml.model", io::GgufValue::string("llama"));
  w.add("tokenizer.ggml.tokens", io::GgufValue::string_array(tokens));
  w.add("tokenizer.ggml.scores", io::GgufValue::array<float>(scores));
  w.add("tokenizer.ggml.token_type", io::GgufValue::array<int32_t>(types));
  for (auto [key, id] : {std::pair{"tokenizer.ggml.bos_token_id", v.bos_id}, {"tokenizer.ggml.eos_token_id", v.eos_id},
                         {"tokenizer.ggml.unknown_token_id", v.unk_id}})
    if (id >= 0) w.add(key, io::GgufValue::u32(static_cast<uint32_t>(id)));
  w.add("tokenizer.ggml.add_bos_token", io::GgufValue::boolean(v.add_bos));
  w.add("tokenizer.ggml.add_eos_token", io::GgufValue::boolean(v.add_eos));
  w.add("tokenizer.ggml.add_space_prefix", io::GgufValue::boolean(v.add_dummy_prefix));
}

}  // namespace

std::unique_ptr<text::Tokenizer> model_tokenizer(const model::ModelDir& dir, const std::string& flag,
                                                 std::string* used) {
  if (!flag.empty() || !dir.gguf) {
    std::string from = flag;
    if (from.empty()) from = text::tokenizer_in(std::filesystem::path(dir.weights).parent_path().string());
    if (from.empty()) from = kDefaultTokenizerDir;
    if (used) *used = from;
    return text::load_tokenizer(from);
  }
  const io::GgufFile f = io::GgufFile::open(dir.weights);
  LOOM_REQUIRE(f.has("tokenizer.ggml.model"), dir.weights, " carries no tokenizer (no tokenizer.ggml.model): give ",
               "--tokenizer");
  const std::string_view kind = f.get_string("tokenizer.ggml.model");
  if (used) *used = dir.weights;
  if (kind == "llama")
    return std::make_unique<text::SentencePieceTokenizer>(
        text::SentencePieceTokenizer::from_vocab(spm_vocab(f), dir.weights + ": tokenizer.ggml.*"));
  LOOM_REQUIRE(kind == "gpt2", dir.weights, ": tokenizer.ggml.model is '", kind,
               "'; loom reads GGUF tokenizers of kinds 'gpt2' (byte-level BPE) and 'llama' (SentencePiece BPE)");
  // The pre-tokenizer splits the text before the merges: another split gives
  // other tokens than llama.cpp's, so only the two loom has are read.
  const std::string pre = f.has("tokenizer.ggml.pre") ? std::string(f.get_string("tokenizer.ggml.pre")) : "";
  LOOM_REQUIRE(pre == "gpt-2" || pre == "llama-bpe", dir.weights, ": tokenizer.ggml.pre is ",
               pre.empty() ? std::string("missing (llama.cpp's 'default' split)") : "'" + pre + "'",
               "; loom splits text as 'gpt-2' and 'llama-bpe' do, not otherwise (the tokens would not be the ",
               "model's): give the model's tokenizer with --tokenizer");
  if (pre == "llama-bpe")
    return std::make_unique<text::HfTokenizer>(bpe_tokenizer(f, dir.weights, text::SplitPattern::llama3));
  std::vector<std::string> tokens = strings(f, "tokenizer.ggml.tokens");
  const bool add_bos = f.has("tokenizer.ggml.add_bos_token") && f.get_bool("tokenizer.ggml.add_bos_token");
  if (add_bos || !gpt2_own(f, tokens))
    return std::make_unique<text::HfTokenizer>(bpe_tokenizer(f, dir.weights, text::SplitPattern::gpt2));
  return std::make_unique<text::Gpt2Tokenizer>(text::Gpt2Tokenizer::from_strings(
      std::move(tokens), strings(f, "tokenizer.ggml.merges"),
      {dir.weights + ": tokenizer.ggml.tokens", dir.weights + ": tokenizer.ggml.merges"}));
}

void gguf_add_tokenizer(io::GgufWriter& w, const text::Tokenizer& tok, int64_t vocab_size) {
  if (const auto* g = dynamic_cast<const text::Gpt2Tokenizer*>(&tok)) return add_gpt2(w, *g, vocab_size);
  if (const auto* s = dynamic_cast<const text::SentencePieceTokenizer*>(&tok)) return add_spm(w, *s, vocab_size);
  if (const auto* h = dynamic_cast<const text::HfTokenizer*>(&tok)) return add_hf(w, *h, vocab_size);
  LOOM_CHECK(false, "a tokenizer of kind ", tok.kind(), " has no GGUF form");
}

}  // namespace loom::cli
