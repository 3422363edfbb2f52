#include "core/dir_lock.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

class DirLockTest : public ::testing::Test {
 protected:
  void SetUp() override { fs::remove_all(dir_); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string lock_text() const {
    std::ifstream in(dir_ / kDirLockFile);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  const fs::path dir_ = fs::temp_directory_path() / ("loom_test_dir_lock_" + std::to_string(::getpid()));
};

TEST_F(DirLockTest, ASecondLockOfTheDirectoryIsRefusedNamingTheHolder) {
  const DirLock first(dir_.string(), "checkpoint.dir");
  EXPECT_NE(lock_text().find("pid " + std::to_string(::getpid()) + " on " + host_name()), std::string::npos);
  try {
    DirLock second(dir_.string(), "checkpoint.dir");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("checkpoint.dir '" + dir_.string() + "' is in use by another loom run (pid " +
                       std::to_string(::getpid())),
              std::string::npos)
        << msg;
  }
}

TEST_F(DirLockTest, ALockIsReleasedWhenItsHolderEndsAndClearedWhenReleased) {
  { const DirLock lock(dir_.string(), "--out"); }
  EXPECT_EQ(lock_text(), "");
  const DirLock again(dir_.string(), "--out");
  EXPECT_NE(lock_text().find("pid "), std::string::npos);
}

// A holder killed with SIGKILL leaves its line; the kernel dropped its flock,
// so the next run takes the lock over.
TEST_F(DirLockTest, TheLockOfAKilledProcessIsTakenOver) {
  fs::create_directories(dir_);
  const pid_t child = ::fork();
  if (child == 0) {
    DirLock lock(dir_.string(), "checkpoint.dir");
    ::_exit(0);  // no destructor: as if killed
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_NE(lock_text().find("pid " + std::to_string(child)), std::string::npos);
  const DirLock taken(dir_.string(), "checkpoint.dir");
  EXPECT_NE(lock_text().find("pid " + std::to_string(::getpid())), std::string::npos);
}

TEST_F(DirLockTest, AFileWhereTheDirectoryShouldBeIsNamed) {
  fs::create_directories(dir_);
  std::ofstream(dir_ / "file") << "x";
  try {
    probe_writable_dir((dir_ / "file").string(), "--out");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--out '" + (dir_ / "file").string() +
                                         "' is a file, but a directory is expected there"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(probe_writable_dir((dir_ / "file" / "sub").string(), "--out"), Error);
  probe_writable_dir((dir_ / "new" / "deeper").string(), "--out");  // created
  EXPECT_TRUE(fs::is_directory(dir_ / "new" / "deeper"));
  EXPECT_TRUE(fs::is_empty(dir_ / "new" / "deeper"));
}

}  // namespace
}  // namespace loom
