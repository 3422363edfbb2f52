#include "core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace loom {

namespace {
std::string errno_text() { return std::strerror(errno); }
}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create '", tmp_, "': ", errno_text());
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void AtomicFile::write(const void* data, size_t bytes) {
  LOOM_CHECK(fd_ >= 0, "write to '", tmp_, "' after commit");
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("cannot write '", tmp_, "': ", errno_text());
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void AtomicFile::commit() {
  LOOM_CHECK(fd_ >= 0, "second commit of '", path_, "'");
  if (::fsync(fd_) != 0) fail("cannot fsync '", tmp_, "': ", errno_text());
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0 || std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const std::string why = errno_text();
    ::unlink(tmp_.c_str());
    fail("cannot move '", tmp_, "' to '", path_, "': ", why);
  }
  const std::filesystem::path dir = std::filesystem::path(path_).parent_path();
  fsync_directory(dir.empty() ? "." : dir.string());
}

void write_file_atomic(const std::string& path, std::string_view contents) {
  AtomicFile file(path);
  file.write(contents);
  file.commit();
}

bool fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return false;
  ::fsync(fd);
  ::close(fd);
  return true;
}

}  // namespace loom
