// Batches of token windows from .bin shards (text/shards.h), each window one
// pread of T + 1 tokens, so a shard truncated under a run is an error, not SIGBUS.
//
// Each shard of n tokens holds floor((n - 1) / T) windows of T + 1 tokens;
// window w starts at token w * T, so neighbours share one token and the
// windows of a shard, read in order, are llm.c's sequential stream. All
// windows of all shards, in shard order, form one epoch of N windows.
//
// The loader reads an endless stream of windows: sample k is window
// perm_e(k mod N) of epoch e = k / N, where perm_e is the identity
// (shuffle = false) or a bijection on [0, N) keyed by (seed, e): a 4-round
// Feistel network with Philox as round function, cycle-walked into [0, N).
//
// A step takes world * B consecutive samples; rank r gets samples
// [pos + r B, pos + (r + 1) B), so ranks are disjoint and, concatenated in
// rank order, equal one rank's batch of world * B. The state is `position`,
// the number of samples every rank together has consumed: the same on every
// rank, saved in checkpoints, valid under another world size.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "text/shards.h"

namespace loom::train {

struct DataLoaderOptions {
  std::vector<std::string> shards;  // paths or glob patterns, e.g. "data/brown/train_*.bin"
  int64_t batch = 1;                // B: sequences per rank per step
  int64_t seq_len = 1;              // T
  int rank = 0;
  int world = 1;
  bool shuffle = false;
  uint64_t seed = 0;
  int64_t vocab_size = 0;  // > 0: every token is checked to be below it when the shards open
};

class DataLoader {
 public:
  // Throws loom::Error for a pattern that matches nothing, a directory or
  // malformed shard, a shard shorter than T + 1 tokens, a token outside the
  // vocabulary, or bad B, T, rank, world.
  explicit DataLoader(const DataLoaderOptions& options);

  // inputs, targets: (B, T) row-major; targets[b][t] = inputs[b][t + 1] of
  // the same window. Reads this rank's samples at position() and advances it
  // by world * B. Throws loom::Error (position unchanged) when a shard has
  // shrunk since it was opened.
  void next(std::span<int32_t> inputs, std::span<int32_t> targets);
  // The batch next() would read at `position`, without moving.
  void batch_at(int64_t position, std::span<int32_t> inputs, std::span<int32_t> targets) const;

  int64_t position() const { return position_; }
  void set_position(int64_t position);
  int64_t windows_per_epoch() const { return windows_total_; }
  int64_t epoch() const { return position_ / windows_total_; }
  const std::vector<std::string>& shard_paths() const { return paths_; }

  // The global indices of the B samples this rank's batch at `position`
  // reads: position + rank B + b (what keys per-sample randomness, the
  // same under any number of ranks).
  std::vector<int64_t> samples_at(int64_t position) const;

  // The window sample k reads (exposed for tests).
  int64_t window_of_sample(int64_t k) const;

 private:
  // window -> (shard, first token)
  void locate(int64_t window, int64_t& shard, int64_t& start) const;

  DataLoaderOptions opt_;
  std::vector<std::string> paths_;
  std::vector<text::Shard> shards_;
  std::vector<int64_t> window_begin_;  // first global window of each shard, plus N at the end
  int64_t windows_total_ = 0;
  int64_t position_ = 0;
};

// Sorted matches of each pattern (a plain path matches itself), in pattern
// order; throws loom::Error naming a pattern that matches no file.
std::vector<std::string> expand_shard_patterns(const std::vector<std::string>& patterns);

}  // namespace loom::train
