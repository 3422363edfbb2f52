#include "core/staged_dir.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>

#include "core/atomic_file.h"
#include "core/error.h"

namespace loom {

namespace {

namespace fs = std::filesystem;

// N of .NAME.TAG-PID-N: with the pid, unique among live writers (mkdir
// still skips a name a killed process of a recycled pid left behind).
std::atomic<uint64_t> next_stage{0};

// "m/" and "m" name the same directory; the staging name is built from the
// last component, so there must be one.
fs::path target_path(const std::string& target) {
  fs::path p = fs::path(target).lexically_normal();
  if (!p.has_filename() && p.has_parent_path()) p = p.parent_path();
  const std::string name = p.filename().string();
  LOOM_REQUIRE(!name.empty() && name != "." && name != "..", "cannot write the directory '", target,
               "' by staging: it names no directory entry of its own; give a path such as out/model");
  return p;
}

std::string parent_or_dot(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

[[noreturn]] void fail_move(const std::string& from, const std::string& to, int error) {
  fail("cannot move '", from, "' to '", to, "': ", std::strerror(error));
}

// A target of another kind would be swapped away and deleted by the
// exchange (RENAME_EXCHANGE swaps a file and a directory just as well).
void require_dir_or_absent(const std::string& target, const std::string& staged) {
  struct stat st{};
  if (::lstat(target.c_str(), &st) != 0 || S_ISDIR(st.st_mode)) return;  // absent: renamed; else rename says why
  const char* kind = S_ISLNK(st.st_mode) ? "a symbolic link" : S_ISREG(st.st_mode) ? "a file" : "not a directory";
  fail("cannot replace '", target, "' with the directory '", staged, "': '", target, "' is ", kind,
       ", not a directory; give the path of a directory (or a new one)");
}

// The fallback without RENAME_EXCHANGE: old target aside, staged in, and the
// old one put back if that fails. Returns where the old contents are.
std::string swap_by_two_renames(const std::string& staged, const std::string& target, const std::string& aside) {
  std::error_code ec;
  fs::remove_all(aside, ec);  // a crash's leftover, under the caller's own name
  if (::rename(target.c_str(), aside.c_str()) != 0) {
    fail("cannot move '", target, "' aside to '", aside, "' to make room for '", staged, "': ",
         std::strerror(errno));
  }
  if (::rename(staged.c_str(), target.c_str()) != 0) {
    const int error = errno;
    const bool restored = ::rename(aside.c_str(), target.c_str()) == 0;
    fail("cannot move '", staged, "' to '", target, "': ", std::strerror(error),
         restored ? "" : concat("; the old directory could not be put back and is left at '", aside, "'"));
  }
  return aside;
}

// Moves staged to target; returns where the replaced contents now are ("":
// there were none).
std::string exchange_or_rename(const std::string& staged, const std::string& target, const std::string& aside) {
  if (::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) return staged;
  const int error = errno;
  if (error == ENOENT) {
    if (::rename(staged.c_str(), target.c_str()) != 0) fail_move(staged, target, errno);
    return "";
  }
  if (error == EINVAL || error == ENOSYS || error == ENOTSUP) return swap_by_two_renames(staged, target, aside);
  fail_move(staged, target, error);
}

}  // namespace

namespace {

// Staging directories of the same target and tag that a killed writer left
// (SIGKILL, or a signal the command does not catch): their process is gone
// from this machine and they have not changed for 10 minutes (a writer on
// another host sharing the file system keeps its own fresh). Best effort.
void remove_abandoned_stages(const fs::path& parent, const std::string& base) {
  std::error_code ec;
  const auto old = fs::file_time_type::clock::now() - std::chrono::minutes(10);
  for (const fs::directory_entry& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with(base)) continue;
    const size_t dash = name.find('-', base.size());
    if (dash == std::string::npos || dash == base.size()) continue;
    const std::string pid_text = name.substr(base.size(), dash - base.size());
    if (pid_text.find_first_not_of("0123456789") != std::string::npos || pid_text.size() > 9) continue;
    const auto pid = static_cast<pid_t>(std::stol(pid_text));
    if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
    std::error_code time_ec;
    if (fs::last_write_time(e.path(), time_ec) > old || time_ec) continue;
    fs::remove_all(e.path(), ec);
  }
}

}  // namespace

StagedDir::StagedDir(const std::string& target, const std::string& tag) {
  const fs::path t = target_path(target);
  target_ = t.string();
  remove_abandoned_stages(t.parent_path().empty() ? fs::path(".") : t.parent_path(),
                          concat(".", t.filename().string(), ".", tag, "-"));
  const std::string prefix = concat(".", t.filename().string(), ".", tag, "-", ::getpid(), "-");
  for (;;) {
    path_ = (t.parent_path() / concat(prefix, next_stage++)).string();
    if (::mkdir(path_.c_str(), 0777) == 0) return;
    if (errno != EEXIST) {
      fail("cannot create the staging directory '", path_, "' next to '", target_, "': ", std::strerror(errno));
    }
  }
}

StagedDir::~StagedDir() {
  std::error_code ec;
  if (!committed_) fs::remove_all(path_, ec);
}

void StagedDir::commit() {
  LOOM_CHECK(!committed_, "second commit of the staging directory '", path_, "'");
  publish_dir(path_, target_, path_ + "-old");
  committed_ = true;
}

void StagedDir::commit_new() {
  LOOM_CHECK(!committed_, "second commit of the staging directory '", path_, "'");
  fsync_directory(path_);
  if (::renameat2(AT_FDCWD, path_.c_str(), AT_FDCWD, target_.c_str(), RENAME_NOREPLACE) != 0) {
    const int error = errno;
    if (error != EINVAL && error != ENOSYS && error != ENOTSUP) fail_move(path_, target_, error);
    if (::rename(path_.c_str(), target_.c_str()) != 0) fail_move(path_, target_, errno);
  }
  committed_ = true;
  fsync_directory(parent_or_dot(target_));
}

void publish_dir(const std::string& staged, const std::string& target, const std::string& aside) {
  require_dir_or_absent(target, staged);
  fsync_directory(staged);
  const std::string old = exchange_or_rename(staged, target, aside);
  fsync_directory(parent_or_dot(target));
  std::error_code ec;
  if (!old.empty()) fs::remove_all(old, ec);  // a leftover is harmless: never the target's name
}

}  // namespace loom
