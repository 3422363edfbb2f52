// Writing a file so that readers see either the old file or the complete new
// one, never a torn one (DESIGN.md §7): the bytes go to path + ".tmp", which
// is fsynced, renamed over path, and the directory fsynced so that the rename
// itself survives a crash.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace loom {

class AtomicFile {
 public:
  // Creates path + ".tmp"; loom::Error if it cannot.
  explicit AtomicFile(std::string path);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  // Without commit() (an error on the way), the temporary file is removed and
  // path is left as it was.
  ~AtomicFile();

  void write(const void* data, size_t bytes);
  void write(std::string_view text) { write(text.data(), text.size()); }
  // fsync, rename over path, fsync the directory; loom::Error on failure.
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
};

// The whole file in one call.
void write_file_atomic(const std::string& path, std::string_view contents);

// fsync of a directory, so that the renames and creations inside it survive
// a crash. False if it cannot be opened (no read permission): the entries
// are then only as durable as the file system makes them by itself.
bool fsync_directory(const std::string& dir);

}  // namespace loom
