// checkpoint.dir as a whole (train/checkpoint_dir.h): auto-resume falls back
// to the newest complete step dir whatever `latest` says, other timelines are
// set aside rather than overwritten, pruning spares the resumed-from dir.
#include "train/checkpoint_dir.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "train/checkpoint.h"
#include "tiny_run.h"
#include "common/run_context.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;

class CheckpointDirTest : public TinyRunTest {
 protected:
  CheckpointDirTest() : TinyRunTest("loom_test_checkpoint_dir") {}

  // run_training without eval, saving every `every` steps into dir_/ckpt.
  RunConfig run_config(int64_t steps, int64_t every = 2, int64_t keep = 0) const {
    RunConfig c = config();
    c.train.steps = steps;
    c.train.eval_every = 0;
    c.checkpoint.dir = (dir_ / "ckpt").string();
    c.checkpoint.every = every;
    c.checkpoint.keep = keep;
    return c;
  }
  static TrainSummary run(const RunConfig& c) {
    TrainOptions quiet;
    quiet.progress = false;
    return run_training(c, quiet, mesh::LocalContext().ctx());
  }
  fs::path ckpt() const { return dir_ / "ckpt"; }
};

TEST(CheckpointDir, LatestIsReadWithoutSurroundingWhitespaceOrCarriageReturn) {
  const fs::path root = fs::temp_directory_path() / ("loom_latest_" + std::to_string(::getpid()));
  fs::create_directories(root);
  std::ofstream(root / "latest") << "  step_000012\r\n";
  EXPECT_EQ(read_latest(root), "step_000012");
  fs::remove_all(root);
  EXPECT_EQ(read_latest(root), "");
}

TEST(CheckpointDir, OnlyStepAndUpToEighteenDigitsNameAStepDir) {
  EXPECT_EQ(step_dir_step("step_000012"), 12);
  EXPECT_EQ(step_dir_step("step_7"), 7);
  EXPECT_EQ(step_dir_step("step_000012.tmp"), -1);
  EXPECT_EQ(step_dir_step("step_"), -1);
  EXPECT_EQ(step_dir_step("step_+1"), -1);
  EXPECT_EQ(step_dir_step("step_1234567890123456789"), -1);
}

// Defect 1: losing `latest` made resume = auto start from step 0 and
// overwrite the checkpoints.
TEST_F(CheckpointDirTest, LosingLatestResumesFromTheNewestCompleteStepDir) {
  run(run_config(4));
  fs::remove(ckpt() / "latest");
  const TrainSummary resumed = run(run_config(6));
  ASSERT_EQ(resumed.steps.size(), 2u);
  EXPECT_EQ(resumed.steps[0].step, 5);
  EXPECT_EQ(step_names(ckpt()), (std::vector<std::string>{"step_000002", "step_000004", "step_000006"}));
}

TEST_F(CheckpointDirTest, LatestNamingAMissingDirResumesFromTheNewestCompleteOne) {
  run(run_config(4));
  std::ofstream(ckpt() / "latest", std::ios::trunc) << "step_000099\n";
  test::TestContext one;
  Trainer t(run_config(6), one.ctx());
  EXPECT_EQ(resume_checkpoint(t, run_config(6).checkpoint), (ckpt() / "step_000004").string());
  EXPECT_EQ(t.steps_done(), 4);
}

// Defect 3's root cause: an incomplete or corrupt newest step dir strands
// auto-resume no more; it goes back to the newest complete one.
TEST_F(CheckpointDirTest, ACorruptNewestStepDirFallsBackToTheOlderCompleteOne) {
  run(run_config(4));
  const fs::path file = ckpt() / "step_000004" / "rank_00000.safetensors";
  std::string bytes = read_text(file);
  bytes[bytes.size() / 2] ^= 0x10;
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  fs::create_directories(ckpt() / "step_000006");  // a step dir without a manifest
  test::TestContext one;
  Trainer t(run_config(6), one.ctx());
  EXPECT_EQ(resume_checkpoint(t, run_config(6).checkpoint), (ckpt() / "step_000002").string());
  EXPECT_EQ(t.steps_done(), 2);
}

TEST_F(CheckpointDirTest, StepDirsWithoutAnyCompleteCheckpointAreAnErrorNamingTheNewestProblem) {
  fs::create_directories(ckpt() / "step_000002");
  test::TestContext one;
  Trainer t(run_config(4), one.ctx());
  try {
    resume_checkpoint(t, run_config(4).checkpoint);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("holds 1 step dir but no complete checkpoint"), std::string::npos) << msg;
    EXPECT_NE(msg.find("step_000002/manifest.json' is missing"), std::string::npos) << msg;
    EXPECT_NE(msg.find("checkpoint.resume = never"), std::string::npos) << msg;
  }
  EXPECT_EQ(t.steps_done(), 0);
}

// Defect 3: the first save after resuming from an older step used to delete
// the manifest of the newer dir `latest` still named. Now the newer dirs,
// another timeline's, are moved to abandoned/ and auto-resume follows this one.
TEST_F(CheckpointDirTest, ResumingFromAnOlderStepSetsTheNewerStepDirsAsideAtTheFirstSave) {
  run(run_config(6));
  const std::string old_six = read_text(ckpt() / "step_000006" / "rank_00000.safetensors");
  RunConfig branch = run_config(5);
  branch.train.lr = 5e-3;  // another timeline from step 2 on
  branch.checkpoint.resume = (ckpt() / "step_000002").string();
  run(branch);
  EXPECT_EQ(step_names(ckpt()), (std::vector<std::string>{"step_000002", "step_000004", "step_000005"}));
  EXPECT_EQ(read_text(ckpt() / "latest"), "step_000005\n");
  EXPECT_TRUE(fs::exists(ckpt() / "abandoned" / "step_000004"));
  EXPECT_EQ(read_text(ckpt() / "abandoned" / "step_000006" / "rank_00000.safetensors"), old_six);
  test::TestContext one;
  Trainer t(run_config(8), one.ctx());
  EXPECT_EQ(resume_checkpoint(t, run_config(8).checkpoint), (ckpt() / "step_000005").string());
}

TEST_F(CheckpointDirTest, AFreshRunWithResumeNeverSetsTheExistingStepDirsAside) {
  run(run_config(4));
  RunConfig fresh = run_config(2);
  fresh.checkpoint.resume = "never";
  run(fresh);
  EXPECT_EQ(step_names(ckpt()), (std::vector<std::string>{"step_000002"}));
  EXPECT_TRUE(fs::exists(ckpt() / "abandoned" / "step_000002" / "manifest.json"));
  EXPECT_TRUE(fs::exists(ckpt() / "abandoned" / "step_000004" / "manifest.json"));
}

TEST_F(CheckpointDirTest, KeepNeverPrunesTheStepDirTheRunResumedFrom) {
  run(run_config(2, 1, 1));
  run(run_config(5, 1, 1));
  EXPECT_EQ(step_names(ckpt()), (std::vector<std::string>{"step_000002", "step_000005"}));
}

// Defect 9: a checkpoint at or past train.steps trained nothing and exited 0.
TEST_F(CheckpointDirTest, ResumingAtOrPastTrainStepsIsAnError) {
  run(run_config(4));
  try {
    run(run_config(4));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("step_000004 is at step 4, at or past train.steps = 4"), std::string::npos) << msg;
  }
  EXPECT_THROW(run(run_config(3)), Error);
}

TEST_F(CheckpointDirTest, AManifestWhoseStepDiffersFromItsDirIsAnError) {
  run(run_config(4));
  fs::rename(ckpt() / "step_000002", ckpt() / "step_000003");
  RunConfig c = run_config(6);
  c.checkpoint.resume = (ckpt() / "step_000003").string();
  try {
    run(c);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step 2 does not match the directory name 'step_000003'"), std::string::npos)
        << e.what();
  }
}

// A save replaces a step dir of the same name only once the new one is
// complete: the leftovers of an interrupted save are not step dirs.
TEST_F(CheckpointDirTest, AnInterruptedSavesTemporaryDirIsNeverResumedAndIsCleanedUp) {
  run(run_config(2));
  fs::create_directories(ckpt() / "step_000004.tmp");
  std::ofstream(ckpt() / "step_000004.tmp" / "rank_00000.safetensors") << "half";
  const TrainSummary s = run(run_config(4));
  EXPECT_EQ(s.steps.front().step, 3);
  EXPECT_FALSE(fs::exists(ckpt() / "step_000004.tmp"));
  EXPECT_TRUE(fs::exists(ckpt() / "step_000004" / "manifest.json"));
}

}  // namespace
}  // namespace loom::train
