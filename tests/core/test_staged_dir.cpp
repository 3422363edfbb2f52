// core/staged_dir.h: a directory written next to its target appears under
// the target's name whole, replaces an old one as a whole, and leaves nothing
// behind when it is not committed.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/tensors.h"
#include "core/error.h"
#include "core/staged_dir.h"

using namespace loom;
using loom::test::expect_error;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const char* name) {
  const fs::path dir = fs::temp_directory_path() / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void write_text(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Names in `dir`, sorted.
std::vector<std::string> names(const fs::path& dir) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(dir)) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace

TEST(StagedDir, NewTargetAppearsWholeAtCommit) {
  const fs::path root = fresh_dir("loom_staged_new");
  StagedDir stage((root / "out").string(), "test");
  EXPECT_EQ(fs::path(stage.path()).parent_path(), root);  // a sibling: the same file system
  write_text(fs::path(stage.path()) / "a.txt", "a");
  write_text(fs::path(stage.path()) / "b.txt", "b");
  EXPECT_FALSE(fs::exists(root / "out"));  // nothing under the name before the commit
  stage.commit();
  EXPECT_EQ(names(root / "out"), (std::vector<std::string>{"a.txt", "b.txt"}));
  EXPECT_EQ(read_text(root / "out" / "b.txt"), "b");
  EXPECT_EQ(names(root), std::vector<std::string>{"out"});  // no staging directory left
}

TEST(StagedDir, CommitReplacesAnExistingTargetAsAWhole) {
  const fs::path root = fresh_dir("loom_staged_replace");
  fs::create_directories(root / "out");
  write_text(root / "out" / "old_1.txt", "old");
  write_text(root / "out" / "shared.txt", "old");
  StagedDir stage((root / "out/").string());  // "out/" is "out"
  write_text(fs::path(stage.path()) / "shared.txt", "new");
  EXPECT_EQ(read_text(root / "out" / "shared.txt"), "old");  // readers see the old set until the commit
  stage.commit();
  EXPECT_EQ(names(root / "out"), std::vector<std::string>{"shared.txt"});  // old_1.txt gone with the old set
  EXPECT_EQ(read_text(root / "out" / "shared.txt"), "new");
  EXPECT_EQ(names(root), std::vector<std::string>{"out"});  // neither stage nor old set left
}

TEST(StagedDir, WithoutCommitTheStageIsRemovedAndTheTargetUntouched) {
  const fs::path root = fresh_dir("loom_staged_abort");
  fs::create_directories(root / "out");
  write_text(root / "out" / "kept.txt", "old");
  {
    StagedDir stage((root / "out").string());
    write_text(fs::path(stage.path()) / "half.txt", "half of a new set");
    EXPECT_TRUE(fs::is_directory(stage.path()));
  }
  EXPECT_EQ(names(root), std::vector<std::string>{"out"});
  EXPECT_EQ(names(root / "out"), std::vector<std::string>{"kept.txt"});
  EXPECT_EQ(read_text(root / "out" / "kept.txt"), "old");
}

TEST(StagedDir, TwoStagesForOneTargetGetDifferentDirectories) {
  const fs::path root = fresh_dir("loom_staged_two");
  StagedDir first((root / "out").string(), "test"), second((root / "out").string(), "test");
  EXPECT_NE(first.path(), second.path());
  EXPECT_TRUE(fs::is_directory(first.path()));
  EXPECT_TRUE(fs::is_directory(second.path()));
  write_text(fs::path(first.path()) / "who.txt", "first");
  write_text(fs::path(second.path()) / "who.txt", "second");
  first.commit();
  second.commit();  // the later writer's set wins, whole
  EXPECT_EQ(read_text(root / "out" / "who.txt"), "second");
  EXPECT_EQ(names(root), std::vector<std::string>{"out"});
}

TEST(StagedDir, TargetThatIsAFileIsAnErrorNamingItAndStaysAFile) {
  const fs::path root = fresh_dir("loom_staged_file");
  write_text(root / "out", "a file");
  {
    StagedDir stage((root / "out").string());
    write_text(fs::path(stage.path()) / "a.txt", "a");
    expect_error([&] { stage.commit(); }, {concat("'", (root / "out").string(), "' is a file, not a directory")});
  }
  EXPECT_EQ(read_text(root / "out"), "a file");
  EXPECT_EQ(names(root), std::vector<std::string>{"out"});  // the stage is removed after the failed commit
}

TEST(StagedDir, CommitNewNeverReplacesADirectoryCreatedMeanwhile) {
  const fs::path root = fresh_dir("loom_staged_commit_new");
  StagedDir stage((root / "out").string(), "save");
  write_text(fs::path(stage.path()) / "a.txt", "new");
  fs::create_directories(root / "out");  // another writer, after the caller checked
  write_text(root / "out" / "theirs.txt", "theirs");
  expect_error([&] { stage.commit_new(); }, {concat("cannot move '", stage.path(), "' to '", (root / "out").string())});
  EXPECT_EQ(names(root / "out"), std::vector<std::string>{"theirs.txt"});
}

TEST(StagedDir, StagingNextToAMissingParentIsAnErrorNamingThePath) {
  const fs::path root = fresh_dir("loom_staged_no_parent");
  expect_error([&] { StagedDir stage((root / "missing" / "out").string()); },
               {concat("cannot create the staging directory '", (root / "missing").string(), "/.out.staged-"),
                "No such file or directory"});
}

// A killed writer's stage (its process gone, unchanged for 10 minutes) is
// removed by the next writer of that target; a fresh one, a live process's
// and another target's stay.
TEST(StagedDir, AKilledWritersOldStageIsRemovedByTheNext) {
  const fs::path root = fresh_dir("loom_staged_abandoned");
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);  // a pid no process has now
  const auto hour_ago = fs::file_time_type::clock::now() - std::chrono::hours(1);
  const auto stage = [&](const std::string& name, bool old) {
    fs::create_directories(root / name);
    write_text(root / name / "val_000000.bin.tmp", "x");
    if (old) fs::last_write_time(root / name, hour_ago);
  };
  stage(concat(".out.prepare-", child, "-0"), true);
  stage(concat(".out.prepare-", child, "-1"), false);
  stage(concat(".out.prepare-", ::getppid(), "-0"), true);
  stage(concat(".other.prepare-", child, "-0"), true);
  {
    StagedDir next((root / "out").string(), "prepare");
    EXPECT_FALSE(fs::exists(root / concat(".out.prepare-", child, "-0")));
    EXPECT_TRUE(fs::exists(root / concat(".out.prepare-", child, "-1")));
    EXPECT_TRUE(fs::exists(root / concat(".out.prepare-", ::getppid(), "-0")));
    EXPECT_TRUE(fs::exists(root / concat(".other.prepare-", child, "-0")));
  }
}

TEST(PublishDir, GivenStagingPathReplacesTheTargetAndLeavesNeitherNameBehind) {
  const fs::path root = fresh_dir("loom_publish_dir");
  fs::create_directories(root / "step_000002");
  write_text(root / "step_000002" / "old.txt", "old");
  fs::create_directories(root / "step_000002.tmp");
  write_text(root / "step_000002.tmp" / "new.txt", "new");
  publish_dir((root / "step_000002.tmp").string(), (root / "step_000002").string(),
              (root / "step_000002.old").string());
  EXPECT_EQ(names(root / "step_000002"), std::vector<std::string>{"new.txt"});
  EXPECT_EQ(names(root), std::vector<std::string>{"step_000002"});
}
