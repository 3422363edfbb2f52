// Training checkpoints (DESIGN.md §7): one directory per step, with one
// safetensors file per rank and a manifest, written so that a crash at any
// point leaves the previous checkpoint usable.
//
//   checkpoint.dir/
//     latest                      "step_000010\n": the newest complete step dir
//     step_000010/
//       rank_00000.safetensors    one per dp rank: master, adam_m, adam_v, each
//       rank_00001.safetensors    the rank's packed (S) f32 shard (parallel/dp.h)
//       manifest.json             written last (by dp rank 0): format_version,
//                                 step, config, mesh (dp, zero_stage, ...),
//                                 parameters (numel; each tensor's flat offset
//                                 and shape), shards (per rank: file, numel,
//                                 segments [offset, count, shard_offset]),
//                                 files (bytes, sha256), data, optimizer, lr
//
// Resharding: a checkpoint is read by flat parameter ranges, so a run may
// resume under another dp size or ZeRO stage (saved at dp = 2 ZeRO-3, resumed
// at dp = 1 or dp = 4 ZeRO-1): each rank reads its new segments from
// whichever saved shards hold them. Every rank writes its own file and reads
// from a shared filesystem (one machine, or a shared checkpoint.dir).
//
// Every file is written to a temporary name, fsynced and renamed; the
// manifest is the last file of a step dir and `latest` is updated after it,
// so a step dir without a manifest is incomplete and `latest` always names a
// complete one. Older step dirs are deleted (checkpoint.keep) only after that.
//
// A resume restores everything the next step depends on: parameters, AdamW
// moments and update count (hence the LR, a function of it), and the train
// data position; the val batches and the init seed hold no state. N steps
// equal k steps + save + load + (N - k) steps bitwise (under the same dp
// size and stage; another layout continues with the same losses up to
// the reduction order's rounding).
//
// save_checkpoint and load_checkpoint are collective over the trainer's dp
// group.
//
//   const std::string dir = checkpoint_to_resume(cfg.checkpoint);  // "" = fresh
//   if (!dir.empty()) load_checkpoint(trainer, dir);
//   ...
//   save_checkpoint(trainer, cfg.checkpoint.dir, cfg.checkpoint.keep);
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "train/config.h"
#include "train/trainer.h"

namespace loom::train {

inline constexpr int kCheckpointFormatVersion = 2;
inline constexpr const char* kCheckpointLatestFile = "latest";
inline constexpr const char* kCheckpointManifestFile = "manifest.json";

std::string checkpoint_step_dir_name(int64_t step);  // step_000010
std::string checkpoint_rank_file_name(int rank);     // rank_00000.safetensors

// Writes root/step_NNNNNN for trainer.steps_done() (replacing one left by an
// earlier run), points root/latest at it, then deletes all but the newest
// `keep` step dirs (keep = 0: none). Returns the step dir's path.
std::string save_checkpoint(Trainer& trainer, const std::string& root, int64_t keep);

// The step dir that checkpoint.resume selects, or "" to start fresh: never;
// auto = the one root/latest names, or fresh when there is no latest; or a
// path (a step dir, or a checkpoint.dir holding latest). A latest naming a
// missing dir, or a path that does not exist, is a loom::Error.
std::string checkpoint_to_resume(const CheckpointConfig& c);

// Checks the whole checkpoint first (manifest format version, the model
// config against the trainer's, every listed file's presence, size and
// sha256, every tensor's shape), then restores the trainer's state. Any
// problem is a loom::Error naming the file and what is wrong, thrown before
// the trainer or any file is touched. Returns the restored step.
int64_t load_checkpoint(Trainer& trainer, const std::string& step_dir);

// SHA-256 (FIPS 180-4), for the manifest's file digests.
class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t bytes);
  std::array<uint8_t, 32> finish();  // once; the object is spent after

 private:
  void compress(const uint8_t* block);

  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

std::string sha256_hex(std::string_view data);
// Digest of a file's bytes; an unreadable file is a loom::Error naming it.
std::string sha256_file_hex(const std::string& path);

}  // namespace loom::train
