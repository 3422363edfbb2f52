#include "train/data_loader.h"

#include <glob.h>

#include <algorithm>
#include <bit>

#include "core/error.h"
#include "core/rng.h"

namespace loom::train {

namespace {

// A bijection on [0, n) keyed by (seed, epoch): a balanced Feistel network on
// 2h bits (4^h >= n), cycle-walked until the value falls below n. Each
// round's function is Philox on (right half, round, epoch).
int64_t permute(int64_t x, int64_t n, uint64_t seed, int64_t epoch) {
  if (n <= 1) return x;
  int half = (std::bit_width(static_cast<uint64_t>(n - 1)) + 1) / 2;
  half = std::max(half, 1);
  const uint64_t mask = (uint64_t{1} << half) - 1;
  const std::array<uint32_t, 2> key = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  uint64_t v = static_cast<uint64_t>(x);
  do {
    uint64_t left = v >> half, right = v & mask;
    for (uint32_t round = 0; round < 4; ++round) {
      const auto r = philox4x32_10({static_cast<uint32_t>(right), static_cast<uint32_t>(right >> 32), round,
                                    static_cast<uint32_t>(epoch)},
                                   key);
      const uint64_t f = ((uint64_t{r[1]} << 32) | r[0]) & mask;
      const uint64_t next_right = left ^ f;
      left = right;
      right = next_right;
    }
    v = (left << half) | right;
  } while (v >= static_cast<uint64_t>(n));
  return static_cast<int64_t>(v);
}

}  // namespace

std::vector<std::string> expand_shard_patterns(const std::vector<std::string>& patterns) {
  LOOM_REQUIRE(!patterns.empty(), "data loader: no shard file or pattern given");
  std::vector<std::string> paths;
  for (const std::string& pattern : patterns) {
    glob_t g{};
    const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
    std::vector<std::string> found;
    if (rc == 0) found.assign(g.gl_pathv, g.gl_pathv + g.gl_pathc);
    ::globfree(&g);
    LOOM_REQUIRE(!found.empty(), "data: '", pattern, "' matches no shard file");
    std::sort(found.begin(), found.end());
    paths.insert(paths.end(), found.begin(), found.end());
  }
  return paths;
}

DataLoader::DataLoader(const DataLoaderOptions& options) : opt_(options) {
  LOOM_REQUIRE(opt_.batch >= 1, "data loader: batch must be at least 1, not ", opt_.batch);
  LOOM_REQUIRE(opt_.seq_len >= 1, "data loader: seq_len must be at least 1, not ", opt_.seq_len);
  LOOM_REQUIRE(opt_.world >= 1 && opt_.rank >= 0 && opt_.rank < opt_.world, "data loader: rank ", opt_.rank,
               " is outside world size ", opt_.world);
  paths_ = expand_shard_patterns(opt_.shards);
  const int64_t T = opt_.seq_len;
  window_begin_.push_back(0);
  for (const std::string& path : paths_) {
    text::Shard shard = text::Shard::open(path);
    LOOM_REQUIRE(shard.size() >= T + 1, "shard '", path, "' has ", shard.size(),
                 " tokens, fewer than seq_len + 1 = ", T + 1, ": not one window");
    if (opt_.vocab_size > 0) shard.check_vocab(opt_.vocab_size);
    windows_total_ += (shard.size() - 1) / T;
    window_begin_.push_back(windows_total_);
    shards_.push_back(std::move(shard));
  }
}

int64_t DataLoader::window_of_sample(int64_t k) const {
  const int64_t epoch = k / windows_total_, index = k % windows_total_;
  return opt_.shuffle ? permute(index, windows_total_, opt_.seed, epoch) : index;
}

void DataLoader::locate(int64_t window, int64_t& shard, int64_t& start) const {
  const auto it = std::upper_bound(window_begin_.begin(), window_begin_.end(), window);
  shard = (it - window_begin_.begin()) - 1;
  start = (window - window_begin_[shard]) * opt_.seq_len;
}

std::vector<int64_t> DataLoader::samples_at(int64_t position) const {
  std::vector<int64_t> out;
  for (int64_t b = 0; b < opt_.batch; ++b) out.push_back(position + opt_.rank * opt_.batch + b);
  return out;
}

void DataLoader::batch_at(int64_t position, std::span<int32_t> inputs, std::span<int32_t> targets) const {
  const int64_t B = opt_.batch, T = opt_.seq_len;
  LOOM_CHECK(static_cast<int64_t>(inputs.size()) == B * T && static_cast<int64_t>(targets.size()) == B * T,
             "inputs ", inputs.size(), " targets ", targets.size(), " want B*T = ", B * T);
  LOOM_CHECK(position >= 0, "position ", position);
  std::vector<int32_t> window(static_cast<size_t>(T + 1));
  for (int64_t b = 0; b < B; ++b) {
    int64_t shard = 0, start = 0;
    locate(window_of_sample(position + opt_.rank * B + b), shard, start);
    shards_[shard].copy(start, T + 1, window.data());
    std::copy(window.begin(), window.end() - 1, inputs.begin() + b * T);
    std::copy(window.begin() + 1, window.end(), targets.begin() + b * T);
  }
}

void DataLoader::next(std::span<int32_t> inputs, std::span<int32_t> targets) {
  batch_at(position_, inputs, targets);
  position_ += int64_t{opt_.world} * opt_.batch;
}

void DataLoader::set_position(int64_t position) {
  LOOM_REQUIRE(position >= 0, "data loader: position must be non-negative, not ", position);
  position_ = position;
}

}  // namespace loom::train
