#include "train/checkpoint_dir.h"

#include <algorithm>
#include <charconv>
#include <fstream>

#include "core/atomic_file.h"
#include "core/log.h"
#include "train/checkpoint.h"

namespace loom::train {

namespace fs = std::filesystem;

int64_t step_dir_step(const std::string& name) {
  if (name.rfind("step_", 0) != 0 || name.size() <= 5 || name.size() > 5 + 18) return -1;
  int64_t step = 0;
  const char* first = name.data() + 5;
  const char* last = name.data() + name.size();
  const auto [end, err] = std::from_chars(first, last, step);
  return err == std::errc() && end == last && std::all_of(first, last, [](char c) { return c >= '0' && c <= '9'; })
             ? step
             : -1;
}

namespace {

bool lead_rank(Trainer& t) { return t.dp().rank() == 0 && t.tp_rank() == 0 && t.pp_rank() == 0; }

bool same_dir(const fs::path& a, const fs::path& b) {
  std::error_code ec;
  return fs::weakly_canonical(a, ec) == fs::weakly_canonical(b, ec);
}

// The newest complete step dir under root, loaded into the trainer; "" when
// root holds no step dir. Collective.
std::string resume_newest(Trainer& t, const fs::path& root, const std::string& what) {
  const std::vector<StepDir> dirs = list_step_dirs(root);
  if (dirs.empty()) return "";
  const bool lead = lead_rank(t);
  const std::string latest = read_latest(root);
  std::string newest_problem;
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    try {
      load_checkpoint(t, it->path.string());
    } catch (const IncompleteCheckpoint& e) {
      if (newest_problem.empty()) newest_problem = e.what();
      if (lead) log_warn("checkpoint: skipping ", it->path.string(), ", not a complete checkpoint: ", e.what());
      continue;
    }
    const std::string name = it->path.filename().string();
    if (lead && !latest.empty() && latest != name)
      log_warn("checkpoint: ", (root / kCheckpointLatestFile).string(), " names '", latest,
               "', but the newest complete checkpoint is ", name, ": resuming from ", name);
    return it->path.string();
  }
  fail(what, " '", root.string(), "' holds ", dirs.size(), " step dir", dirs.size() == 1 ? "" : "s",
       " but no complete checkpoint (the newest: ", newest_problem,
       "): set checkpoint.resume = never to start fresh (the run's first save then moves them to ", kAbandonedDir,
       "/)");
}

}  // namespace

std::vector<StepDir> list_step_dirs(const fs::path& root) {
  std::vector<StepDir> out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    const int64_t step = step_dir_step(e.path().filename().string());
    if (step >= 0 && e.is_directory(ec)) out.push_back({step, e.path()});
  }
  std::sort(out.begin(), out.end(), [](const StepDir& a, const StepDir& b) { return a.step < b.step; });
  return out;
}

std::string read_latest(const fs::path& root) {
  std::ifstream in(root / kCheckpointLatestFile);
  std::string name;
  std::getline(in, name);
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!name.empty() && space(name.back())) name.pop_back();
  name.erase(name.begin(), std::find_if_not(name.begin(), name.end(), space));
  return name;
}

void prune_step_dirs(const fs::path& root, int64_t keep, const fs::path& protect) {
  if (keep <= 0) return;
  std::vector<StepDir> dirs = list_step_dirs(root);
  if (!protect.empty())
    std::erase_if(dirs, [&](const StepDir& d) { return same_dir(d.path, protect); });
  const int64_t extra = static_cast<int64_t>(dirs.size()) - keep;
  for (int64_t i = 0; i < extra; ++i) {
    // Renamed out of the step dir names first: a kill inside remove_all
    // then leaves a leftover, not a step dir with some files gone.
    const fs::path& dir = dirs[static_cast<size_t>(i)].path;
    const fs::path doomed = dir.string() + ".old";
    std::error_code ec;
    fs::remove_all(doomed, ec);
    fs::rename(dir, doomed, ec);
    if (!ec) fs::remove_all(doomed, ec);
    LOOM_REQUIRE(!ec, "cannot delete the old checkpoint '", dir.string(), "': ", ec.message());
  }
}

std::vector<std::string> set_aside_step_dirs(const fs::path& root, int64_t after) {
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    for (const char* suffix : {".tmp", ".old"}) {
      const std::string base = name.size() > 4 ? name.substr(0, name.size() - 4) : "";
      if (name.ends_with(suffix) && step_dir_step(base) >= 0) fs::remove_all(e.path(), ec);
    }
  }
  std::vector<std::string> moved;
  for (const StepDir& d : list_step_dirs(root)) {
    if (d.step <= after) continue;
    const fs::path aside = root / kAbandonedDir;
    fs::create_directories(aside, ec);
    LOOM_REQUIRE(!ec, "cannot create '", aside.string(), "': ", ec.message());
    fs::path to = aside / d.path.filename();
    for (int n = 1; fs::exists(to); ++n) to = aside / concat(d.path.filename().string(), ".", n);
    fs::rename(d.path, to, ec);
    LOOM_REQUIRE(!ec, "cannot move '", d.path.string(), "' to '", to.string(), "': ", ec.message());
    moved.push_back(to.string());
  }
  if (!moved.empty()) fsync_directory(root.string());
  return moved;
}

std::string resume_checkpoint(Trainer& trainer, const CheckpointConfig& c) {
  if (c.resume == "never") return "";
  if (c.resume == "auto") return c.dir.empty() ? "" : resume_newest(trainer, c.dir, "checkpoint.dir");
  const fs::path path(c.resume);
  LOOM_REQUIRE(fs::exists(path), "checkpoint.resume = '", c.resume,
               "' does not exist: allowed values are auto, never, a checkpoint step dir or a checkpoint.dir");
  LOOM_REQUIRE(fs::is_directory(path), "checkpoint.resume = '", c.resume,
               "' is a file: allowed values are auto, never, a checkpoint step dir or a checkpoint.dir");
  if (fs::exists(path / kCheckpointManifestFile) || step_dir_step(path.filename().string()) >= 0) {
    load_checkpoint(trainer, path.string());
    return path.string();
  }
  const std::string dir = resume_newest(trainer, path, "checkpoint.resume");
  LOOM_REQUIRE(!dir.empty(), "checkpoint.resume = '", c.resume, "' holds neither ", kCheckpointManifestFile,
               " nor step dirs: allowed values are auto, never, a checkpoint step dir or a checkpoint.dir");
  return dir;
}

std::string CheckpointRun::resume(Trainer& trainer) {
  resumed_ = resume_checkpoint(trainer, c_);
  newest_ = resumed_;
  // Resumed from inside checkpoint.dir: the dirs up to that step are this
  // run's past; anything else there belongs to another timeline.
  if (!resumed_.empty() && !c_.dir.empty() && same_dir(fs::path(resumed_).parent_path(), c_.dir))
    own_after_ = trainer.steps_done();
  // Parameter-server training: the servers resume from the same step dir.
  if (trainer.ps()) trainer.ps()->resume(resumed_);
  return resumed_;
}

std::string CheckpointRun::save(Trainer& trainer) {
  if (trainer.updated_by_servers()) {  // the servers hold the state and write the checkpoint
    // Asynchronous workers are not in step: worker 0's steps name the checkpoint.
    if (!trainer.asynchronous() || trainer.ps()->worker() == 0)
      trainer.ps()->save(trainer.steps_done(), trainer.train_data().position());
    saved_ = true;
    newest_ = (fs::path(c_.dir) / checkpoint_step_dir_name(trainer.steps_done())).string();
    return newest_;
  }
  if (!saved_ && lead_rank(trainer)) {
    for (const std::string& moved : set_aside_step_dirs(c_.dir, own_after_))
      log_warn("checkpoint: moved ", moved.substr(moved.rfind('/') + 1), ", of another run's timeline, to ", moved,
               " (this run continues from ", resumed_.empty() ? "step 0" : resumed_, ")");
  }
  saved_ = true;
  try {
    newest_ = save_checkpoint(trainer, c_.dir, c_.keep, resumed_);
  } catch (const Error& e) {
    // A full disk, most often: the half-written step dir goes (its space
    // back), the newest complete one stays what a rerun resumes from.
    const fs::path tmp = fs::path(c_.dir) / (checkpoint_step_dir_name(trainer.steps_done()) + ".tmp");
    std::error_code ec;
    if (lead_rank(trainer)) fs::remove_all(tmp, ec);
    fail("the checkpoint of step ", trainer.steps_done(), " was not written: ", e.what(), "; the newest complete one, ",
         newest_.empty() ? std::string("none yet") : newest_,
         ", is kept: free space on checkpoint.dir's disk and run the same command to resume from it");
  }
  return newest_;
}

}  // namespace loom::train
