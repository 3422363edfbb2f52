// One run per output directory: a lock file held for the run, and a write
// probe of every output location at start-up, so that a bad path fails before
// the first step instead of after the last (issue 15).
//
//   DirLock lock(cfg.checkpoint.dir, "checkpoint.dir");  // loom::Error if another run holds it
//   ...                                                  // released when lock goes out of scope
//
// The lock is an flock(2) on dir/loom.lock, which the kernel drops when its
// holder dies however it dies, so a lock is never stale in fact; the file
// also names its holder (pid, host, start time) for the message a second run
// prints, and a holder that ended without clearing it (SIGKILL, a crash) is
// reported when the next run takes it over. Per open file description: two
// DirLocks on one directory in one process exclude each other too.
#pragma once

#include <string>

namespace loom {

inline constexpr const char* kDirLockFile = "loom.lock";

class DirLock {
 public:
  // Creates dir if needed and locks it; `what` names it in messages (a
  // config key or flag). loom::Error when another process holds the lock
  // (naming that holder) or dir cannot be created or written.
  DirLock(const std::string& dir, const std::string& what);
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  ~DirLock();  // clears the holder's line and unlocks

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

// Creates dir (and its parents) and checks that a file can be created in it
// and removed again; loom::Error naming `what`, the path and the reason.
void probe_writable_dir(const std::string& dir, const std::string& what);

// The host name, for messages naming a process.
std::string host_name();

}  // namespace loom
