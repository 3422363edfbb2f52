#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "core/atomic_file.h"
#include "core/error.h"

using namespace loom;
namespace fs = std::filesystem;

namespace {
std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

fs::path fresh_dir(const char* name) {
  const fs::path dir = fs::temp_directory_path() / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}
}  // namespace

TEST(AtomicFile, CommitReplacesTheFileAndLeavesNoTemporary) {
  const fs::path dir = fresh_dir("loom_atomic_commit");
  write_file_atomic(dir / "a.txt", "old");
  AtomicFile f(dir / "a.txt");
  f.write("new ");
  f.write("contents");
  EXPECT_EQ(slurp(dir / "a.txt"), "old");  // readers see the old file until commit
  f.commit();
  EXPECT_EQ(slurp(dir / "a.txt"), "new contents");
  EXPECT_FALSE(fs::exists(dir / "a.txt.tmp"));
}

TEST(AtomicFile, WithoutCommitTheOldFileStaysAndTheTemporaryIsRemoved) {
  const fs::path dir = fresh_dir("loom_atomic_abort");
  write_file_atomic(dir / "a.txt", "old");
  {
    AtomicFile f(dir / "a.txt");
    f.write("half of a new file");
  }
  EXPECT_EQ(slurp(dir / "a.txt"), "old");
  EXPECT_FALSE(fs::exists(dir / "a.txt.tmp"));
}

TEST(AtomicFile, UnwritableDirectoryIsAnError) {
  EXPECT_THROW(write_file_atomic("/nonexistent-loom-dir/a.txt", "x"), Error);
}
