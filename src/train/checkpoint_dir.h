// The policy of a checkpoint.dir as a whole (DESIGN.md §7, issue 15): which
// step dir a run resumes from, which ones its saves may replace, set aside or
// prune. train/checkpoint.h writes and reads one step dir.
//
// Invariants, whatever kills the process when:
//   - a step dir (step_NNNNNN) is complete: it is written as step_NNNNNN.tmp
//     and renamed into place only after its manifest (save_checkpoint);
//   - resume = auto continues from the newest step dir whose manifest and
//     files verify (sizes and sha256), whatever `latest` says: `latest` is
//     written after each save for people and tools, and only named in a
//     warning when it disagrees;
//   - nothing a run did not write itself is deleted: the step dirs of
//     another timeline (a run started with resume = never, or resumed from an
//     older step or from another directory) are moved to abandoned/ at the
//     run's first save, and pruning (keep) counts only this timeline's dirs
//     and never removes the one the run resumed from.
//
//   CheckpointRun ckpt(cfg.checkpoint);
//   ckpt.resume(trainer);            // collective; "" = a fresh start
//   ... ckpt.save(trainer) ...       // collective
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "train/config.h"
#include "train/trainer.h"

namespace loom::train {

inline constexpr const char* kAbandonedDir = "abandoned";

// A step dir that is not a usable checkpoint (no manifest, a file missing,
// truncated or failing its sha256): auto-resume falls back to an older one.
// Other load errors (another model, an unsupported format) stop the run.
class IncompleteCheckpoint : public Error {
 public:
  explicit IncompleteCheckpoint(const std::string& what) : Error(what) {}
};

struct StepDir {
  int64_t step = 0;
  std::filesystem::path path;
};

// The step of a step dir's name (step_ and 1 to 18 digits, as loom writes
// them), or -1 for any other name.
int64_t step_dir_step(const std::string& name);

// The step dirs under root (names step_ and 1 to 18 digits), oldest first;
// none when root does not exist.
std::vector<StepDir> list_step_dirs(const std::filesystem::path& root);

// The step dir name root/latest holds, surrounding whitespace (a CR from an
// editor) trimmed; "" without one.
std::string read_latest(const std::filesystem::path& root);

// Deletes the oldest step dirs until `keep` are left (keep = 0: none
// deleted), never `protect` (the step dir a run resumed from).
void prune_step_dirs(const std::filesystem::path& root, int64_t keep, const std::filesystem::path& protect);

// Moves the step dirs with a step above `after` (all: after = -1) to
// root/abandoned/ (a numbered suffix where a name is taken), and deletes the
// leftovers of interrupted saves (step_*.tmp, step_*.old). Returns the new
// paths of the moved dirs.
std::vector<std::string> set_aside_step_dirs(const std::filesystem::path& root, int64_t after);

// Resumes `trainer` as checkpoint.resume says and returns the step dir it
// loaded, or "" to start fresh. never: fresh. auto: the newest complete step
// dir of checkpoint.dir (none there: fresh; some, but none complete: a
// loom::Error naming why the newest is not). A path: that step dir, or the
// newest complete step dir of the checkpoint.dir it names. Collective over
// the trainer's grid.
std::string resume_checkpoint(Trainer& trainer, const CheckpointConfig& c);

// One run's checkpoints: resume, then every save, with the set-aside and
// pruning rules above.
class CheckpointRun {
 public:
  explicit CheckpointRun(CheckpointConfig c) : c_(std::move(c)) {}

  // resume_checkpoint; remembers where this run's timeline comes from.
  std::string resume(Trainer& trainer);
  // save_checkpoint into checkpoint.dir; the first call sets aside the step
  // dirs of other timelines (the lead logs them). Returns the step dir.
  std::string save(Trainer& trainer);
  // The newest complete checkpoint of this run (saved or resumed from), or "".
  const std::string& newest() const { return newest_; }

 private:
  CheckpointConfig c_;
  std::string resumed_, newest_;
  int64_t own_after_ = -1;  // step dirs above this step are not this run's timeline (-1: all)
  bool saved_ = false;
};

}  // namespace loom::train
