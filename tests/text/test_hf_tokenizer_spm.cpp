// Hugging Face tokenizer.json in SentencePiece's form (hf_tokenizer.h): the
// Llama 2 file (normalizer Prepend + Replace, no pre-tokenizer) and the
// newer one (Metaspace, prepend_scheme "first"), on a small vocabulary whose
// ids are worked out by hand here: characters and byte fallback, fused
// unknowns, added tokens, the leading ▁ of each form, decoding, writing and
// reading back, and the errors for what loom does not read.
// tests/interop/hf_tokenizer_check.mjs compares the forms with Hugging
// Face's own tokenizers on LLaMA's vocabulary.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/hf_tokenizer.h"
#include "text/hf_tokenizer_json.h"
#include "text/sentencepiece.h"

using json = nlohmann::json;
using loom::text::HfTokenizer;
using Ids = std::vector<int32_t>;

namespace {

const std::string kSp = "\xE2\x96\x81";  // ▁
// Ids: <unk> 0, <s> 1, </s> 2, <0x00>..<0xFF> 3..258, then these pieces.
const std::vector<std::string> kPieces = {"▁", "h", "e", "l", "o", "w", "r", "d", "é"};
const std::vector<std::pair<std::string, std::string>> kMerges = {
    {"h", "e"}, {"l", "l"}, {"▁", "he"}, {"ll", "o"}, {"▁he", "llo"}, {"▁", "w"},
    {"o", "r"}, {"▁w", "or"}, {"l", "d"}, {"▁wor", "ld"}, {"▁", "▁"}};
constexpr int32_t kBytes = 3;

int32_t byte(int b) { return kBytes + b; }

struct Vocab {
  json vocab = json::object();
  int32_t id(const std::string& piece) const { return vocab.at(piece).get<int32_t>(); }
};

Vocab vocab() {
  Vocab v;
  int32_t id = 0;
  for (const char* s : {"<unk>", "<s>", "</s>"}) v.vocab[s] = id++;
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    v.vocab[name] = id++;
  }
  for (const std::string& p : kPieces) v.vocab[p] = id++;
  for (const auto& [a, b] : kMerges)
    if (!v.vocab.contains(a + b)) v.vocab[a + b] = id++;
  return v;
}

json added(int32_t id, const char* content) {
  return {{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
          {"normalized", false}, {"special", true}};
}

// legacy: Llama 2's file; else the Metaspace one (prepend_scheme first).
json spm_json(bool legacy, bool byte_fallback = true, bool fuse_unk = true) {
  json merges = json::array();
  for (const auto& [a, b] : kMerges) merges.push_back(a + " " + b);
  const json replace_sp = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSp}};
  json doc = {
      {"version", "1.0"},
      {"added_tokens", {added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")}},
      {"normalizer", legacy ? json{{"type", "Sequence"},
                                   {"normalizers", {{{"type", "Prepend"}, {"prepend", kSp}}, replace_sp}}}
                            : json(nullptr)},
      {"pre_tokenizer", legacy ? json(nullptr)
                               : json{{"type", "Metaspace"}, {"replacement", kSp}, {"prepend_scheme", "first"},
                                      {"split", false}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", kSp}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", "<unk>"}, {"fuse_unk", fuse_unk},
        {"byte_fallback", byte_fallback}, {"vocab", vocab().vocab}, {"merges", merges}}}};
  return doc;
}

HfTokenizer spm(const json& doc) {
  return HfTokenizer::from_spec(loom::text::parse_tokenizer_json(doc.dump(), "tokenizer.json"), "tokenizer.json");
}

std::string load_error(const json& doc) {
  try {
    spm(doc);
  } catch (const loom::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(HfTokenizerSpm, Llama2FileEncodesWithTheNormalizersPrefixOnEveryStretch) {
  const HfTokenizer tok = spm(spm_json(true));
  const Vocab v = vocab();
  EXPECT_EQ(tok.kind(), "llama");
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_TRUE(tok.add_bos());
  EXPECT_EQ(tok.encode("hello world"), (Ids{v.id("▁hello"), v.id("▁world")}));
  EXPECT_EQ(tok.encode_prompt("hello"), (Ids{1, v.id("▁hello")}));
  // A leading space is a second ▁ (the normalizer prepends regardless).
  EXPECT_EQ(tok.encode(" hello"), (Ids{v.id("▁"), v.id("▁hello")}));
  EXPECT_EQ(tok.encode("  world"), (Ids{v.id("▁▁"), v.id("▁world")}));
  // A character in the vocabulary, one that is not (ü: C3 BC), one not merged (i).
  EXPECT_EQ(tok.encode("é"), (Ids{v.id("▁"), v.id("é")}));
  EXPECT_EQ(tok.encode("ü"), (Ids{v.id("▁"), byte(0xC3), byte(0xBC)}));
  EXPECT_EQ(tok.encode("hi"), (Ids{v.id("▁"), v.id("h"), byte('i')}));
  // Special tokens are cut out first; each stretch after one gets its own ▁.
  EXPECT_EQ(tok.encode_special("hi</s>hello"), (Ids{v.id("▁"), v.id("h"), byte('i'), 2, v.id("▁hello")}));
  EXPECT_EQ(tok.encode(""), Ids{});
  // A byte that is not UTF-8 is its own byte token.
  EXPECT_EQ(tok.encode(std::string("\xff")), (Ids{v.id("▁"), byte(0xFF)}));
}

TEST(HfTokenizerSpm, MetaspaceFilePrependsOnlyAtTheStartAndNotTwice) {
  const HfTokenizer tok = spm(spm_json(false));
  const Vocab v = vocab();
  EXPECT_EQ(tok.encode("hello world"), (Ids{v.id("▁hello"), v.id("▁world")}));
  EXPECT_EQ(tok.encode(" hello"), (Ids{v.id("▁hello")}));  // already starts with ▁
  EXPECT_EQ(tok.encode_special("hi</s>hello"), (Ids{v.id("▁"), v.id("h"), byte('i'), 2, v.id("he"), v.id("llo")}));
  EXPECT_EQ(tok.encode_special("</s>hello"), (Ids{2, v.id("he"), v.id("llo")}));
}

TEST(HfTokenizerSpm, UnknownCharactersFuseOrGoToBytesAsTheModelSays) {
  const Vocab v = vocab();
  EXPECT_EQ(spm(spm_json(true, false, true)).encode("üüe"), (Ids{v.id("▁"), 0, v.id("e")}));
  EXPECT_EQ(spm(spm_json(true, false, false)).encode("üüe"), (Ids{v.id("▁"), 0, 0, v.id("e")}));
  json no_unk = spm_json(true, false);
  no_unk["model"]["unk_token"] = nullptr;
  EXPECT_THROW(spm(no_unk).encode("ü"), loom::Error);
}

TEST(HfTokenizerSpm, DecodeTurnsMetaspaceAndBytesBackAndStripsOneLeadingSpace) {
  const HfTokenizer tok = spm(spm_json(true));
  for (const std::string s : {"hello world", "hi there é ü", "  two spaces", "tab\tand\nline", ""})
    EXPECT_EQ(tok.decode(tok.encode(s)), s) << s;
  const Vocab v = vocab();
  EXPECT_EQ(tok.decode(Ids{1, v.id("▁hello"), 2}), "hello");  // special tokens vanish
  EXPECT_EQ(tok.token_bytes(v.id("▁hello")), " hello");      // a continuation keeps its space
  EXPECT_EQ(tok.token_bytes(byte(0x41)), "A");
  EXPECT_EQ(tok.token_bytes(1), "");
  json metaspace_decoder = spm_json(false);
  metaspace_decoder["decoder"] = {{"type", "Metaspace"}, {"replacement", kSp}, {"prepend_scheme", "first"}};
  const HfTokenizer m = spm(metaspace_decoder);
  EXPECT_EQ(m.decode(Ids{v.id("▁hello"), v.id("▁world")}), "hello world");
  EXPECT_EQ(m.token_bytes(v.id("▁world")), " world");
}

// tokenizers' ByteFallback decoder (Rust, decoders/byte_fallback.rs): a run
// of byte tokens is its text when it is valid UTF-8, else one U+FFFD for each
// byte of the run, the valid ones included; special tokens are gone first, so
// the bytes around one are one run.
TEST(HfTokenizerSpm, DecodeGivesOneReplacementCharacterPerByteOfAnInvalidRun) {
  const HfTokenizer tok = spm(spm_json(true));
  const Vocab v = vocab();
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(tok.decode(Ids{byte(0xE4), byte(0xB8), byte(0xAD)}), "中");
  EXPECT_EQ(tok.decode(Ids{byte(0xE4), 2, byte(0xB8), byte(0xAD)}), "中");
  EXPECT_EQ(tok.decode(Ids{byte(0xE4), byte(0xB8)}), fffd + fffd);
  EXPECT_EQ(tok.decode(Ids{byte(0x41), byte(0xFF), v.id("▁hello"), byte(0x42)}), fffd + fffd + " helloB");
  EXPECT_EQ(tok.decode(Ids{v.id("h"), byte(0xC3), byte(0xA9), byte(0xE4), v.id("o")}), "h" + fffd + fffd + fffd + "o");
}

TEST(HfTokenizerSpm, WrittenFilesReadBackAndEncodeTheSame) {
  for (const bool legacy : {true, false}) {
    const HfTokenizer tok = spm(spm_json(legacy));
    const json written = json::parse(loom::text::tokenizer_json_text(tok));
    const HfTokenizer back = spm(written);
    EXPECT_EQ(back.spec().vocab, tok.spec().vocab);
    EXPECT_EQ(back.spec().merges, tok.spec().merges);
    ASSERT_TRUE(back.spec().spm.has_value());
    EXPECT_EQ(back.spec().spm->prepend, tok.spec().spm->prepend);
    EXPECT_EQ(back.spec().spm->metaspace, !legacy);
    EXPECT_EQ(back.spec().spm->unk_token, "<unk>");
    EXPECT_TRUE(back.add_bos());
    for (const std::string s : {"hello world", " hello", "hi</s>hello ü", "\xff x"}) {
      EXPECT_EQ(back.encode(s), tok.encode(s)) << s;
      EXPECT_EQ(back.decode(back.encode(s)), tok.decode(tok.encode(s))) << s;
    }
  }
}

TEST(HfTokenizerSpm, LongTextsEncodeInLinearTime) {
  std::string text;
  for (int i = 0; i < 20000; ++i) text += i % 7 == 0 ? "hello  world " : "hello world ";
  for (const bool legacy : {true, false}) {
    const HfTokenizer tok = spm(spm_json(legacy));
    const auto start = std::chrono::steady_clock::now();
    const Ids ids = tok.encode(text);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(tok.decode(ids), text);
    EXPECT_LT(seconds, 2.0) << "a 250 KB text took " << seconds << " s";
  }
}

TEST(HfTokenizerSpm, WhatLoomDoesNotReadIsAnErrorNamingTheField) {
  json nfc = spm_json(true);
  nfc["normalizer"] = {{"type", "NFC"}};
  json other_replace = spm_json(true);
  other_replace["normalizer"]["normalizers"][1]["content"] = "_";
  json underscore = spm_json(false);
  underscore["pre_tokenizer"]["replacement"] = "_";
  json bad_scheme = spm_json(false);
  bad_scheme["pre_tokenizer"]["prepend_scheme"] = "sometimes";
  json both = spm_json(true);
  both["pre_tokenizer"] = spm_json(false)["pre_tokenizer"];
  json no_space = spm_json(true);
  no_space["decoder"]["decoders"].erase(0);
  json strip_first = spm_json(true);
  strip_first["decoder"]["decoders"].erase(2);
  json no_start = spm_json(true);
  no_start["decoder"]["decoders"][3].erase("start");
  json unk = spm_json(true);
  unk["model"]["unk_token"] = "<nope>";
  json bare = spm_json(true);
  bare["normalizer"] = nullptr;
  const std::pair<json, std::string> cases[] = {
      {nfc, "normalizer: {\"type\":\"NFC\"} (a normalizer other than [Prepend(\"▁\"),] Replace(\" \", \"▁\")) is "
            "not supported"},
      {other_replace, "normalizer.normalizers[1]: "},
      {underscore, "pre_tokenizer.replacement: \"_\" (a replacement other than ▁)"},
      {bad_scheme, "pre_tokenizer.prepend_scheme: expected \"always\", \"first\" or \"never\", got \"sometimes\""},
      {both, "normalizer: "},
      {no_space, "(a decoder that does not turn ▁ into spaces)"},
      {strip_first, "decoder.decoders[2]: "},
      {no_start, "decoder.decoders[3]: "},
      {unk, "model.unk_token '<nope>' is not in model.vocab"},
      {bare, "pre_tokenizer: none, with no normalizer"},
  };
  for (const auto& [doc, expected] : cases) {
    const std::string error = load_error(doc);
    EXPECT_NE(error.find(expected), std::string::npos) << "expected: " << expected << "\ngot: " << error;
    EXPECT_NE(error.find("tokenizer.json"), std::string::npos) << error;
  }
}

// The vocabulary as SentencePiece holds it (what a GGUF file of the model
// carries): its scores make SentencePiece merge as the ranks do, so Llama 2's
// file and SentencePiece encode every text without special tokens alike.
TEST(HfTokenizerSpm, SentencePieceVocabularyOfTheFileEncodesAlike) {
  const HfTokenizer tok = spm(spm_json(true));
  const loom::text::SpmVocab v = loom::text::spm_vocab_of(tok);
  const Vocab ids = vocab();
  EXPECT_EQ(v.unk_id, 0);
  EXPECT_EQ(v.bos_id, 1);
  EXPECT_EQ(v.token_types[0], static_cast<int32_t>(loom::text::SpmPieceType::kUnknown));
  EXPECT_EQ(v.token_types[1], static_cast<int32_t>(loom::text::SpmPieceType::kControl));
  EXPECT_EQ(v.token_types[byte(0x41)], static_cast<int32_t>(loom::text::SpmPieceType::kByte));
  EXPECT_GT(v.scores[ids.id("he")], v.scores[ids.id("ll")]);  // merged first, scored higher
  EXPECT_GT(v.scores[ids.id("▁▁")], v.scores[ids.id("h")]);   // merged pieces above single characters
  const auto sp = loom::text::SentencePieceTokenizer::from_vocab(v, "test");
  const std::vector<std::string> parts = {"hello", "world", " ", "  ", "he", "llo", "wor", "ld", "é", "ü", "x", "\n",
                                          "o", "r", "d", "\xe2\x96\x81"};
  std::mt19937 rng(5);
  for (int i = 0; i < 2000; ++i) {
    std::string s;
    for (int k = static_cast<int>(rng() % 10); k > 0; --k) s += parts[rng() % parts.size()];
    ASSERT_EQ(sp.encode(s), tok.encode(s)) << s;
    ASSERT_EQ(sp.decode(sp.encode(s)), tok.decode(tok.encode(s))) << s;
  }
}

// An added token with normalized true matches the text as the normalizer
// left it: its own content normalized too ("hello world" -> "▁hello▁world"),
// as tokenizers' AddedVocabulary does; without that a token with a space
// could never match.
TEST(HfTokenizerSpm, NormalizedAddedTokensMatchTheirNormalizedContent) {
  json doc = spm_json(true);
  const auto id = static_cast<int32_t>(vocab().vocab.size());
  json token = added(id, "hello world");
  token["normalized"] = true;
  token["special"] = false;
  doc["added_tokens"].push_back(token);
  const HfTokenizer tok = spm(doc);
  const Vocab v = vocab();
  EXPECT_EQ(tok.encode("hello world"), (Ids{id}));
  const Ids longer = tok.encode("hello worldhello");
  ASSERT_GT(longer.size(), 1u);
  EXPECT_EQ(longer[0], id);
  const Ids two_spaces = tok.encode("hello  world");  // "▁hello▁▁world": not the token's text
  EXPECT_EQ(std::count(two_spaces.begin(), two_spaces.end(), id), 0);
  EXPECT_EQ(two_spaces[0], v.id("▁hello"));
}
