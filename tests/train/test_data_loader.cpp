// The shard data loader (train/data_loader.h): deterministic batches, resume
// from a saved position, disjoint dp ranks.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "text/shards.h"
#include "train/data_loader.h"

namespace fs = std::filesystem;
using namespace loom::train;

namespace {

struct Batch {
  std::vector<int32_t> inputs, targets;
  bool operator==(const Batch&) const = default;
};

// Shards whose token at global offset i is i, so a window names its start.
class DataLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("loom_loader_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    write_counting({100, 37, 64});
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write_counting(const std::vector<int>& sizes) {
    int32_t next = 0;
    for (size_t s = 0; s < sizes.size(); ++s) {
      std::vector<int32_t> tokens(sizes[s]);
      std::iota(tokens.begin(), tokens.end(), next);
      next += sizes[s];
      loom::text::write_shard((dir_ / ("train_00000" + std::to_string(s) + ".bin")).string(), tokens, 1);
    }
  }

  DataLoaderOptions options(int64_t B, int64_t T, bool shuffle, int rank = 0, int world = 1) const {
    DataLoaderOptions o;
    o.shards = {(dir_ / "train_*.bin").string()};
    o.batch = B;
    o.seq_len = T;
    o.shuffle = shuffle;
    o.seed = 1234;
    o.rank = rank;
    o.world = world;
    return o;
  }

  static Batch next(DataLoader& loader, int64_t B, int64_t T) {
    Batch b{std::vector<int32_t>(B * T), std::vector<int32_t>(B * T)};
    loader.next(b.inputs, b.targets);
    return b;
  }

  fs::path dir_;
};

}  // namespace

TEST_F(DataLoaderTest, WindowsAreTPlusOneTokensWithShiftedTargets) {
  DataLoader loader(options(2, 8, false));
  // floor(99/8) + floor(36/8) + floor(63/8) = 12 + 4 + 7 windows
  EXPECT_EQ(loader.windows_per_epoch(), 23);
  const Batch b = next(loader, 2, 8);
  for (int t = 0; t < 8; ++t) {
    EXPECT_EQ(b.inputs[t], t);
    EXPECT_EQ(b.targets[t], t + 1);
    EXPECT_EQ(b.inputs[8 + t], 8 + t);
    EXPECT_EQ(b.targets[8 + t], 9 + t);
  }
  EXPECT_EQ(loader.position(), 2);
}

TEST_F(DataLoaderTest, SequentialWindowsNeverCrossAShardBoundary) {
  DataLoader loader(options(1, 8, false));
  for (int k = 0; k < 23; ++k) {
    const Batch b = next(loader, 1, 8);
    const int32_t start = b.inputs[0];
    const bool in_one = (start + 8 < 100) || (start >= 100 && start + 8 < 137) || (start >= 137 && start + 8 < 201);
    EXPECT_TRUE(in_one) << "window " << k << " starts at " << start;
  }
  EXPECT_EQ(loader.epoch(), 1);
  EXPECT_EQ(next(loader, 1, 8).inputs[0], 0);  // the next epoch starts over
}

TEST_F(DataLoaderTest, ShuffledEpochVisitsEveryWindowOnceAndEpochsDiffer) {
  DataLoader loader(options(1, 8, true));
  const int64_t n = loader.windows_per_epoch();
  std::vector<int64_t> epoch0, epoch1;
  for (int64_t k = 0; k < n; ++k) epoch0.push_back(loader.window_of_sample(k));
  for (int64_t k = n; k < 2 * n; ++k) epoch1.push_back(loader.window_of_sample(k));
  std::vector<int64_t> sorted = epoch0;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> all(n);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(sorted, all);
  EXPECT_NE(epoch0, all);
  EXPECT_NE(epoch0, epoch1);
}

TEST_F(DataLoaderTest, TwoLoadersWithTheSameSeedGiveTheSameBatches) {
  DataLoader a(options(3, 5, true)), b(options(3, 5, true));
  for (int step = 0; step < 20; ++step) EXPECT_EQ(next(a, 3, 5), next(b, 3, 5)) << "step " << step;
  DataLoaderOptions other = options(3, 5, true);
  other.seed = 99;
  DataLoader c(other), d(options(3, 5, true));
  bool differ = false;
  for (int step = 0; step < 5; ++step) differ |= !(next(c, 3, 5) == next(d, 3, 5));
  EXPECT_TRUE(differ);
}

TEST_F(DataLoaderTest, ResumeFromSavedPositionEqualsUninterrupted) {
  DataLoader straight(options(4, 6, true));
  std::vector<Batch> want;
  for (int step = 0; step < 30; ++step) want.push_back(next(straight, 4, 6));

  DataLoader first(options(4, 6, true));
  for (int step = 0; step < 11; ++step) next(first, 4, 6);
  const int64_t saved = first.position();
  DataLoader resumed(options(4, 6, true));
  resumed.set_position(saved);
  for (int step = 11; step < 30; ++step) EXPECT_EQ(next(resumed, 4, 6), want[step]) << "step " << step;
}

TEST_F(DataLoaderTest, RanksAreDisjointAndTogetherEqualTheSingleRankBatch) {
  const int world = 3, B = 2, T = 4;
  DataLoader single(options(world * B, T, true));
  std::vector<DataLoader> ranks;
  for (int r = 0; r < world; ++r) ranks.emplace_back(options(B, T, true, r, world));
  for (int step = 0; step < 25; ++step) {
    const Batch all = next(single, world * B, T);
    std::set<int32_t> starts;
    for (int r = 0; r < world; ++r) {
      const Batch part = next(ranks[r], B, T);
      EXPECT_TRUE(std::equal(part.inputs.begin(), part.inputs.end(), all.inputs.begin() + r * B * T));
      EXPECT_TRUE(std::equal(part.targets.begin(), part.targets.end(), all.targets.begin() + r * B * T));
      for (int b = 0; b < B; ++b) starts.insert(part.inputs[b * T]);
    }
    // Within an epoch's span of samples no window repeats across ranks.
    if ((step + 1) * world * B <= single.windows_per_epoch()) {
      EXPECT_EQ(starts.size(), size_t(world * B));
    }
    EXPECT_EQ(ranks[0].position(), single.position());
  }
}

TEST_F(DataLoaderTest, ShardShorterThanSeqLenPlusOneIsAnError) {
  try {
    DataLoader loader(options(1, 40, false));  // shard 1 holds 37 tokens
    FAIL() << "no error";
  } catch (const loom::Error& e) {
    EXPECT_NE(std::string(e.what()).find("train_000001.bin' has 37 tokens, fewer than seq_len + 1 = 41"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(DataLoaderTest, PatternMatchingNothingIsAnError) {
  DataLoaderOptions o = options(1, 4, false);
  o.shards = {(dir_ / "val_*.bin").string()};
  EXPECT_THROW(DataLoader{o}, loom::Error);
}

TEST_F(DataLoaderTest, TokensOutsideTheVocabularyAreReportedAtOpen) {
  DataLoaderOptions o = options(1, 4, false);
  o.vocab_size = 150;  // tokens run to 200
  EXPECT_THROW(DataLoader{o}, loom::Error);
  o.vocab_size = 201;
  EXPECT_NO_THROW(DataLoader{o});
}

TEST_F(DataLoaderTest, RankOutsideWorldIsAnError) {
  EXPECT_THROW(DataLoader(options(1, 4, false, 2, 2)), loom::Error);
}

TEST_F(DataLoaderTest, ShardTruncatedBetweenReadsIsAnErrorNamingTheShardAndSizes) {
  DataLoader loader(options(1, 8, false));
  next(loader, 1, 8);  // window 0 of train_000000.bin (100 tokens)
  const fs::path shard = dir_ / "train_000000.bin";
  const int64_t opened_bytes = static_cast<int64_t>(fs::file_size(shard));
  fs::resize_file(shard, 1024 + 2 * 20);  // 20 tokens left: window 1 (tokens 8..16) still reads
  EXPECT_EQ(next(loader, 1, 8).inputs[0], 8);
  try {
    next(loader, 1, 8);  // window 2: tokens 16..24
    FAIL() << "no error";
  } catch (const loom::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("shard '" + shard.string() + "' was truncated while being read"), std::string::npos) << what;
    EXPECT_NE(what.find(std::to_string(1024 + 2 * 20) + " bytes now"), std::string::npos) << what;
    EXPECT_NE(what.find(std::to_string(opened_bytes) + " bytes when it was opened"), std::string::npos) << what;
  }
  EXPECT_EQ(loader.position(), 2);  // the failed batch did not advance
}

TEST_F(DataLoaderTest, DirectoryGivenAsAShardIsAnErrorSayingSo) {
  DataLoaderOptions o = options(1, 4, false);
  o.shards = {dir_.string()};
  try {
    DataLoader loader(o);
    FAIL() << "no error";
  } catch (const loom::Error& e) {
    EXPECT_NE(std::string(e.what()).find("shard '" + dir_.string() + "' is a directory: a .bin token shard or a glob"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(DataLoaderTest, ShardReplacedByRenameKeepsReadingTheOpenedFile) {
  DataLoader loader(options(1, 8, false));
  const Batch first = next(loader, 1, 8);
  // A new `data prepare` renames fresh shards over the old names.
  loom::text::write_shard((dir_ / "train_000000.bin").string(), std::vector<int32_t>(20, 5), 1);
  const Batch second = next(loader, 1, 8);
  EXPECT_EQ(first.inputs[0], 0);
  EXPECT_EQ(second.inputs[0], 8);
}
