#include "core/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "core/error.h"
#include "core/log.h"

namespace loom {

namespace fs = std::filesystem;

namespace {

std::string errno_text(int err) { return std::strerror(err); }

void create_dir(const std::string& dir, const std::string& what) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    fail(what, " '", dir, "' is a file, but a directory is expected there");
  fs::create_directories(dir, ec);
  LOOM_REQUIRE(!ec, "cannot create ", what, " '", dir, "': ", ec.message());
}

// The holder line a lock file carries, or "" (a lock released cleanly).
std::string read_holder(int fd) {
  char buf[512];
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return "";
  std::string s(buf, static_cast<size_t>(n));
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown host";
  return buf;
}

DirLock::DirLock(const std::string& dir, const std::string& what) {
  create_dir(dir, what);
  path_ = (fs::path(dir) / kDirLockFile).string();
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create the lock file '", path_, "' of ", what, ": ", errno_text(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string holder = read_holder(fd_);
    ::close(fd_);
    fd_ = -1;
    LOOM_REQUIRE(err != EWOULDBLOCK, what, " '", dir, "' is in use by another loom run (",
                 holder.empty() ? "holder unknown" : holder, "; ", path_,
                 "): wait for it to end, or give this run another ", what);
    fail("cannot lock '", path_, "' of ", what, ": ", errno_text(err));
  }
  const std::string stale = read_holder(fd_);
  if (!stale.empty())
    log_warn(what, " '", dir, "': taking over the lock of a run that ended without releasing it (", stale, ")");
  const std::string me = concat("pid ", ::getpid(), " on ", host_name(), " since ", now_utc(), "\n");
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    fail("cannot write the lock file '", path_, "' of ", what, ": ", errno_text(err));
  }
}

DirLock::~DirLock() {
  if (fd_ < 0) return;
  // Cleared, not removed: unlinking a locked file would let a third run lock
  // a new file of the same name while a second one waits on the old.
  (void)!::ftruncate(fd_, 0);
  ::flock(fd_, LOCK_UN);
  ::close(fd_);
}

void probe_writable_dir(const std::string& dir, const std::string& what) {
  create_dir(dir, what);
  const std::string probe = (fs::path(dir) / concat(".loom-write-probe.", host_name(), ".", ::getpid())).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(what, " '", dir, "' is not writable: ", errno_text(errno));
  const bool wrote = ::write(fd, "x", 1) == 1;
  const int err = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  LOOM_REQUIRE(wrote, what, " '", dir, "' is not writable: ", errno_text(err));
}

}  // namespace loom
