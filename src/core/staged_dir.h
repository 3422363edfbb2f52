// Writing a directory so that readers see, under its name, either the old
// directory or the complete new one, never a half-written one (DESIGN.md §7;
// AtomicFile does the same for one file). The contents go to a staging
// directory next to the target (the same file system, so that a rename can
// move it), which is fsynced and then takes the target's name:
//   - an existing target is exchanged with it in one renameat2
//     (RENAME_EXCHANGE), so the name never goes missing;
//   - an absent target is a plain rename;
//   - where the file system has no RENAME_EXCHANGE, two renames: the old
//     directory is moved aside, the new one moved in, the old one put back if
//     that fails; for a moment the name is absent.
// Then the parent is fsynced, so that the rename survives a crash, and the old
// contents are removed (a kill during that leaves a leftover, not a torn
// target).
//
//   StagedDir stage("out/shards", "prepare");  // out/.shards.prepare-PID-N
//   ... write files into stage.path() ...
//   stage.commit();                            // without it: stage removed
#pragma once

#include <string>

namespace loom {

class StagedDir {
 public:
  // Creates a fresh directory next to target: .NAME.TAG-PID-N in target's
  // parent (NAME: target's last component; "m/" is "m"), with N counted per
  // process and the directory made by mkdir, so that two writers, in one
  // process or several, never share one. The parent must exist. loom::Error
  // naming the path if it cannot be created. Staging directories of the same
  // target and tag that a killed writer left (its process gone, unchanged
  // for 10 minutes) are removed first.
  explicit StagedDir(const std::string& target, const std::string& tag = "staged");
  StagedDir(const StagedDir&) = delete;
  StagedDir& operator=(const StagedDir&) = delete;
  // Without a commit (an error on the way), the staging directory and what
  // was written into it are removed, and the target is left as it was.
  ~StagedDir();

  const std::string& path() const { return path_; }
  const std::string& target() const { return target_; }

  // Publishes the staging directory as target, replacing a directory there
  // (publish_dir). loom::Error naming the paths and why if it cannot; the
  // target is then as it was, and the destructor still removes the stage.
  void commit();
  // Publishes it as target only if nothing has that name (renameat2
  // RENAME_NOREPLACE; a plain rename where the file system lacks it, which
  // still never replaces a non-empty directory): for a directory that must be
  // new, e.g. one another writer might create meanwhile.
  void commit_new();

 private:
  std::string target_, path_;
  bool committed_ = false;
};

// Publishes the complete directory `staged` under `target`'s name as
// StagedDir::commit does, for a caller that chose the staging path itself
// (several processes writing into one known name). `aside` holds the old
// target between the two renames where RENAME_EXCHANGE is missing: a name of
// the caller's own, removed first if a crash left it. A target that exists
// but is not a directory (a file, a symbolic link) is an error, not replaced.
void publish_dir(const std::string& staged, const std::string& target, const std::string& aside);

}  // namespace loom
