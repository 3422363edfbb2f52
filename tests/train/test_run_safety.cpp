// run_training keeps a run's work safe (train/run.cpp, issue 15): outputs
// probed and locked before the first step, a diverged run stopped without
// saving, SIGTERM answered with a checkpoint, metrics without repeated steps.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dir_lock.h"
#include "core/error.h"
#include "train/checkpoint.h"
#include "train/checkpoint_dir.h"
#include "tiny_run.h"
#include "mesh/context.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;

std::vector<int64_t> metric_steps(const fs::path& p) {
  std::vector<int64_t> steps;
  std::ifstream in(p);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);  // a line being written: skipped
    if (j.is_object() && j.contains("step")) steps.push_back(j["step"].get<int64_t>());
  }
  return steps;
}

class RunSafetyTest : public TinyRunTest {
 protected:
  RunSafetyTest() : TinyRunTest("loom_test_run_safety") {}

  RunConfig run_config(int64_t steps) const {
    RunConfig c = config();
    c.train.steps = steps;
    c.train.eval_every = 0;
    c.checkpoint.dir = (dir_ / "ckpt").string();
    c.checkpoint.every = 1;
    return c;
  }
  static TrainSummary run(const RunConfig& c, TrainOptions options = {}) {
    options.progress = false;
    return run_training(c, options, mesh::LocalContext().ctx());
  }
  // The message of the loom::Error run(c) throws ("" if none).
  static std::string error_of(const RunConfig& c, TrainOptions options = {}) {
    try {
      run(c, options);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  fs::path ckpt() const { return dir_ / "ckpt"; }
};

// Defect 2: lr = 1e30 trained to the end with loss nan, exit 0, NaN model.
TEST_F(RunSafetyTest, ADivergedRunStopsWithAnErrorNamingTheStepAndSavesNothingAfterIt) {
  RunConfig c = run_config(6);
  c.train.lr = 1e30;
  c.train.warmup_steps = 0;
  c.train.grad_clip = 0;
  c.checkpoint.keep = 2;
  const std::string msg = error_of(c);
  EXPECT_NE(msg.find("diverged (loss "), std::string::npos) << msg;
  EXPECT_NE(msg.find("train.max_bad_steps = 0: stopped without saving; the newest checkpoint is "), std::string::npos)
      << msg;
  // Step 1's update (finite, if huge) was saved; the diverged step 2 was not,
  // and neither was a final model.
  EXPECT_EQ(step_names(ckpt()), (std::vector<std::string>{"step_000001"}));
  EXPECT_NE(msg.find("step 2 diverged"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(ckpt() / "model.safetensors"));
}

TEST_F(RunSafetyTest, MaxBadStepsSkipsTheBadUpdatesThenStops) {
  RunConfig c = run_config(8);
  c.train.lr = 1e30;
  c.train.warmup_steps = 0;
  c.train.grad_clip = 0;
  c.train.max_bad_steps = 3;
  const std::string msg = error_of(c);
  EXPECT_NE(msg.find("step 5 diverged"), std::string::npos) << msg;
  EXPECT_NE(msg.find("4 bad steps in a row, train.max_bad_steps = 3"), std::string::npos) << msg;
  EXPECT_EQ(step_names(ckpt()), (std::vector<std::string>{"step_000001"}));
}

// Under fp16 the scaler used to halve forever and skip every update.
TEST_F(RunSafetyTest, Fp16OverflowAtTheLossScaleFloorStopsTheRun) {
  RunConfig c = run_config(30);
  c.train.dtype = "fp16";
  c.train.lr = 1e30;
  c.train.warmup_steps = 0;
  c.train.grad_clip = 0;
  c.train.loss_scale = 4;
  c.checkpoint.every = 0;
  c.checkpoint.dir.clear();
  const std::string msg = error_of(c);
  EXPECT_NE(msg.find("diverged"), std::string::npos) << msg;
}

// Defect 6: SIGTERM killed the run at once with no checkpoint. Now the step
// finishes, is saved, and the resumed run ends where an uninterrupted one does.
TEST_F(RunSafetyTest, SigtermSavesACheckpointThatResumesBitwise) {
  RunConfig straight = run_config(30);
  straight.checkpoint.every = 30;
  straight.checkpoint.dir = (dir_ / "straight").string();
  run(straight);

  RunConfig c = run_config(30);
  c.checkpoint.every = 100;  // only the final save and the one SIGTERM asks for
  TrainOptions options;
  options.metrics_path = (dir_ / "m.jsonl").string();
  std::atomic<bool> done{false};
  std::thread killer([&] {
    // After the third step's record: a real signal to this process.
    while (!done && metric_steps(options.metrics_path).size() < 3)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    if (!done) ::kill(::getpid(), SIGTERM);
  });
  const TrainSummary first = run(c, options);
  done = true;
  killer.join();
  ASSERT_EQ(first.stop_signal, SIGTERM);
  ASSERT_LT(first.steps.size(), 30u);
  const int64_t stopped = first.steps.back().step;
  EXPECT_EQ(step_names(ckpt()), (std::vector<std::string>{checkpoint_step_dir_name(stopped)}));
  EXPECT_FALSE(fs::exists(ckpt() / "model.safetensors"));

  const TrainSummary second = run(c, options);
  EXPECT_EQ(second.stop_signal, 0);
  EXPECT_EQ(second.steps.front().step, stopped + 1);
  EXPECT_EQ(read_text(ckpt() / "model.safetensors"), read_text(dir_ / "straight" / "model.safetensors"));
  EXPECT_EQ(read_text(ckpt() / "step_000030" / "rank_00000.safetensors"),
            read_text(dir_ / "straight" / "step_000030" / "rank_00000.safetensors"));
}

// Defect 11: records past the checkpoint were written again after a resume.
TEST_F(RunSafetyTest, MetricsHoldEachStepOnceAfterACrashAndResume) {
  RunConfig c = run_config(5);
  c.checkpoint.every = 2;
  c.train.eval_every = 2;
  TrainOptions options;
  options.metrics_path = (dir_ / "m.jsonl").string();
  run(c, options);
  // As if the run had died after step 5's record but before its checkpoint.
  fs::remove_all(ckpt() / "step_000005");
  std::ofstream(options.metrics_path, std::ios::app) << "{\"step\":6,\"loss\":";  // a line cut short
  run(c, options);
  EXPECT_EQ(metric_steps(options.metrics_path), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
}

// Defect 5: unwritable outputs failed after the last step (or not at all).
TEST_F(RunSafetyTest, AnUnwritableOutputFailsBeforeTheFirstStep) {
  std::ofstream(dir_ / "a_file") << "x";
  RunConfig c = run_config(3);
  TrainOptions out_under_a_file;
  out_under_a_file.out_dir = (dir_ / "a_file" / "model").string();
  std::string msg = error_of(c, out_under_a_file);
  EXPECT_NE(msg.find("--out '"), std::string::npos) << msg;
  EXPECT_TRUE(step_names(ckpt()).empty()) << "a step ran before the error";

  c.log.trace = (dir_ / "a_file" / "trace.json").string();
  msg = error_of(c);
  EXPECT_NE(msg.find("the directory of log.trace '"), std::string::npos) << msg;
  EXPECT_NE(msg.find("a_file' is a file, but a directory is expected"), std::string::npos) << msg;
  EXPECT_TRUE(step_names(ckpt()).empty());

  c = run_config(3);
  c.checkpoint.dir = (dir_ / "a_file").string();
  msg = error_of(c);
  EXPECT_NE(msg.find("checkpoint.dir '"), std::string::npos) << msg;

  c = run_config(3);
  TrainOptions metrics_dir;
  metrics_dir.metrics_path = dir_.string();
  msg = error_of(c, metrics_dir);
  EXPECT_NE(msg.find("is a directory: a file path is expected"), std::string::npos) << msg;
}

// A metrics or trace path that names a file a run did not write (the config,
// a model, a checkpoint shard) is refused and the file kept; a metrics file
// a run wrote is taken again.
TEST_F(RunSafetyTest, AMetricsOrTracePathOfAnotherFileIsRefusedAndTheFileKept) {
  const fs::path config = dir_ / "run.toml";
  std::ofstream(config) << "[train]\nsteps = 3\n";
  RunConfig c = run_config(2);
  TrainOptions to_config;
  to_config.metrics_path = config.string();
  std::string msg = error_of(c, to_config);
  EXPECT_NE(msg.find("the metrics file '" + config.string() + "' exists and is not a loom metrics file"),
            std::string::npos) << msg;
  c.log.trace = config.string();
  msg = error_of(c);
  EXPECT_NE(msg.find("log.trace '" + config.string() + "' exists and is not a trace loom wrote"), std::string::npos)
      << msg;
  std::ifstream in(config);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "[train]\nsteps = 3\n");
  EXPECT_TRUE(step_names(ckpt()).empty()) << "a step ran before the error";
  TrainOptions metrics;
  metrics.metrics_path = (dir_ / "metrics.jsonl").string();
  RunConfig fresh = run_config(2);
  fresh.checkpoint.every = 0;
  fresh.checkpoint.dir.clear();
  run(fresh, metrics);
  run(fresh, metrics);  // its own file: replaced
}

// Defect 8: two runs into one checkpoint.dir raced on the same files.
TEST_F(RunSafetyTest, ASecondRunIntoALockedCheckpointDirIsRefusedNamingTheHolder) {
  const DirLock held((dir_ / "ckpt").string(), "checkpoint.dir");
  const std::string msg = error_of(run_config(2));
  EXPECT_NE(msg.find("is in use by another loom run (pid "), std::string::npos) << msg;
  EXPECT_TRUE(step_names(ckpt()).empty());
}

TEST_F(RunSafetyTest, AStaleLockOfADeadRunIsTakenOver) {
  fs::create_directories(ckpt());
  std::ofstream(ckpt() / kDirLockFile) << "pid 999999 on some-host since 2026-01-01T00:00:00Z\n";
  const TrainSummary s = run(run_config(2));
  EXPECT_EQ(s.steps.size(), 2u);
  EXPECT_EQ(read_text(ckpt() / kDirLockFile), "");  // released on exit
}

}  // namespace
}  // namespace loom::train
