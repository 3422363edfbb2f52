#include "train/checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/memory.h"
#include "kernels/ops.h"
#include "text/shards.h"
#include "train/checkpoint_dir.h"
#include "train/trainer.h"
#include "tiny_run.h"
#include "common/run_context.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;

std::vector<float> copy_of(const Tensor& t) {
  const float* p = t.data_as<float>();
  return {p, p + t.numel()};
}

std::vector<unsigned char> to_bytes(const Tensor& t) {
  const auto* p = static_cast<const unsigned char*>(t.data());
  return {p, p + t.nbytes()};
}

// Every file under dir with its bytes.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    out[e.path().string()] = e.is_regular_file() ? read_text(e.path()) : "<dir>";
  return out;
}

class CheckpointTest : public TinyRunTest {
 protected:
  CheckpointTest() : TinyRunTest("loom_test_checkpoint") {}

  // Steps t to `until`, appending each loss and each eval_every val loss.
  static void train_until(Trainer& t, int64_t until, std::vector<double>& losses) {
    while (t.steps_done() < until) {
      const StepStats s = t.step();
      losses.push_back(s.loss);
      if (s.step % t.config().train.eval_every == 0) losses.push_back(t.evaluate());
    }
  }

  // A 20-step run vs 10 steps, save, resume in a new trainer, 10 more: the
  // same losses, parameters, moments and data position, bitwise.
  static void expect_resume_is_bitwise(const RunConfig& c, const fs::path& root);

  // run_training for `steps` steps without eval, saving every 2 steps into
  // dir_/ckpt and keeping the last `keep`.
  void run_checkpointing(int64_t steps, int64_t keep) const {
    RunConfig c = config();
    c.train.steps = steps;
    c.train.eval_every = 0;
    c.checkpoint.dir = (dir_ / "ckpt").string();
    c.checkpoint.every = 2;
    c.checkpoint.keep = keep;
    TrainOptions quiet;
    quiet.progress = false;
    run_training(c, quiet, mesh::LocalContext().ctx());
  }
};

TEST_F(CheckpointTest, TwentyStepsEqualTenPlusResumePlusTenBitwise) {
  expect_resume_is_bitwise(config(), dir_ / "ckpt");
}

// Under bf16 the checkpoint holds the f32 master weights; the bf16 compute
// weights are their rounding, restored on load.
TEST_F(CheckpointTest, Bf16TwentyStepsEqualTenPlusResumePlusTenBitwise) {
  RunConfig c = config();
  c.train.dtype = "bf16";
  if (!kernels::bf16_matmul_unsupported_reason().empty()) GTEST_SKIP() << "this CPU has no bf16 GEMM";
  expect_resume_is_bitwise(c, dir_ / "ckpt_bf16");
}

// fp16 also restores the loss scaler: a window of 3 makes the scale change
// inside both halves of the run.
TEST_F(CheckpointTest, Fp16TwentyStepsEqualTenPlusResumePlusTenBitwise) {
  RunConfig c = config();
  c.train.dtype = "fp16";
  c.train.loss_scale_window = 3;
  expect_resume_is_bitwise(c, dir_ / "ckpt_fp16");
}

void CheckpointTest::expect_resume_is_bitwise(const RunConfig& c, const fs::path& root) {
  std::vector<double> straight, resumed;
  test::TestContext p1;
  Trainer full(c, p1.ctx());
  train_until(full, 20, straight);

  {
    test::TestContext p2;
    Trainer first(c, p2.ctx());
    train_until(first, 10, resumed);
    EXPECT_EQ(save_checkpoint(first, root.string(), 0), (root / "step_000010").string());
  }
  RunConfig rc = c;
  rc.checkpoint.dir = root.string();
  test::TestContext p3;
  Trainer second(rc, p3.ctx());
  ASSERT_EQ(resume_checkpoint(second, rc.checkpoint), (root / "step_000010").string());
  EXPECT_EQ(second.steps_done(), 10);
  train_until(second, 20, resumed);

  ASSERT_EQ(straight.size(), resumed.size());
  EXPECT_EQ(std::memcmp(straight.data(), resumed.data(), straight.size() * sizeof(double)), 0);
  EXPECT_EQ(master_of(full), master_of(second));
  EXPECT_EQ(to_bytes(full.model().params()), to_bytes(second.model().params()));
  EXPECT_EQ(copy_of(full.optimizer().m()), copy_of(second.optimizer().m()));
  EXPECT_EQ(copy_of(full.optimizer().v()), copy_of(second.optimizer().v()));
  EXPECT_EQ(full.train_data().position(), second.train_data().position());
}

// The same claim through run_training: a run resumed from the step-10
// checkpoint of a 20-step run writes the same step-20 checkpoint, byte for byte.
TEST_F(CheckpointTest, RunTrainingResumedAtStepTenWritesTheSameStepTwentyCheckpoint) {
  TrainOptions quiet;
  quiet.progress = false;
  RunConfig c = config();
  c.checkpoint.dir = (dir_ / "a").string();
  c.checkpoint.every = 10;
  const TrainSummary straight = run_training(c, quiet, mesh::LocalContext().ctx());
  ASSERT_EQ(straight.steps.size(), 20u);

  c.checkpoint.dir = (dir_ / "b").string();
  c.checkpoint.resume = (dir_ / "a" / "step_000010").string();
  const TrainSummary resumed = run_training(c, quiet, mesh::LocalContext().ctx());
  ASSERT_EQ(resumed.steps.size(), 10u);
  EXPECT_FALSE(resumed.initial_val_loss.has_value());
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(resumed.steps[i].step, straight.steps[10 + i].step);
    EXPECT_EQ(resumed.steps[i].loss, straight.steps[10 + i].loss) << "step " << resumed.steps[i].step;
    EXPECT_EQ(resumed.steps[i].lr, straight.steps[10 + i].lr);
  }
  EXPECT_EQ(resumed.final_val_loss, straight.final_val_loss);
  EXPECT_EQ(read_text(dir_ / "a" / "step_000020" / "rank_00000.safetensors"),
            read_text(dir_ / "b" / "step_000020" / "rank_00000.safetensors"));
  EXPECT_EQ(read_text(dir_ / "a" / "model.safetensors"), read_text(dir_ / "b" / "model.safetensors"));
}

TEST_F(CheckpointTest, KeepLeavesTheNewestStepDirsAndLatestNamesTheLast) {
  run_checkpointing(7, 2);
  std::vector<std::string> steps;
  for (const auto& e : fs::directory_iterator(dir_ / "ckpt"))
    if (e.is_directory()) steps.push_back(e.path().filename().string());
  std::sort(steps.begin(), steps.end());
  EXPECT_EQ(steps, (std::vector<std::string>{"step_000006", "step_000007"}));
  EXPECT_EQ(read_text(dir_ / "ckpt" / "latest"), "step_000007\n");
  EXPECT_FALSE(fs::exists(dir_ / "ckpt" / "latest.tmp"));
}

// Directories that are not loom's step dirs (a name too long for a step
// number, a user's own folder) are neither parsed as steps nor pruned.
TEST_F(CheckpointTest, KeepIgnoresDirectoriesThatAreNotStepDirs) {
  fs::create_directories(dir_ / "ckpt" / "step_99999999999999999999999");
  fs::create_directories(dir_ / "ckpt" / "step_notes");
  run_checkpointing(4, 1);
  EXPECT_TRUE(fs::exists(dir_ / "ckpt" / "step_99999999999999999999999"));
  EXPECT_TRUE(fs::exists(dir_ / "ckpt" / "step_notes"));
  EXPECT_TRUE(fs::exists(dir_ / "ckpt" / "step_000004"));
  EXPECT_FALSE(fs::exists(dir_ / "ckpt" / "step_000002"));
}

TEST_F(CheckpointTest, ManifestRecordsStepConfigMeshShapesAndDigests) {
  test::TestContext one;
  Trainer t(config(), one.ctx());
  t.step();
  const fs::path step_dir = save_checkpoint(t, (dir_ / "ckpt").string(), 0);
  const nlohmann::json m = nlohmann::json::parse(read_text(step_dir / "manifest.json"));
  EXPECT_EQ(m["format_version"], kCheckpointFormatVersion);
  EXPECT_EQ(m["step"], 1);
  EXPECT_EQ(m["data"]["position"], 2 * 2);  // micro_batch x grad_accum samples
  EXPECT_EQ(m["mesh"]["tp"], 1);
  EXPECT_EQ(m["config"]["model"]["n_layer"], t.config().model.n_layer);
  EXPECT_EQ(m["config"]["train"]["grad_accum"], 2);
  EXPECT_EQ(m["parameters"]["tensors"]["wte.weight"]["shape"],
            nlohmann::json::array({t.config().model.vocab_size, t.config().model.n_embd}));
  EXPECT_EQ(m["parameters"]["tensors"]["wte.weight"]["offset"], 0);
  EXPECT_EQ(m["shards"][0]["file"], "rank_00000.safetensors");
  EXPECT_EQ(m["shards"][0]["numel"], m["parameters"]["numel"]);
  EXPECT_EQ(m["mesh"]["zero_stage"], 0);
  EXPECT_EQ(m["files"][0]["sha256"], sha256_hex(read_text(step_dir / "rank_00000.safetensors")));
}

// A checkpoint after 2 steps, damaged by `damage`; resuming from it must
// throw a loom::Error containing every part, and change neither a file nor
// the trainer.
class CheckpointErrorTest : public CheckpointTest {
 protected:
  void expect_resume_error(const std::function<void(const fs::path& step_dir)>& damage,
                           std::initializer_list<std::string> parts, RunConfig run = RunConfig()) {
    const RunConfig c = config();
    const fs::path root = dir_ / "ckpt";
    {
      test::TestContext one;
      Trainer t(c, one.ctx());
      t.step(), t.step();
      save_checkpoint(t, root.string(), 0);
    }
    damage(root / "step_000002");
    const auto before = snapshot(root);
    if (run.data.train.empty()) run = c;
    run.checkpoint.dir = root.string();
    test::TestContext one;
    Trainer fresh(run, one.ctx());
    const std::vector<float> params = copy_of(fresh.model().params());
    try {
      resume_checkpoint(fresh, run.checkpoint);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      for (const std::string& part : parts) EXPECT_NE(msg.find(part), std::string::npos) << msg << "\nmissing: " << part;
    }
    EXPECT_EQ(snapshot(root), before);
    EXPECT_EQ(copy_of(fresh.model().params()), params);
    EXPECT_EQ(fresh.steps_done(), 0);
  }
};

TEST_F(CheckpointErrorTest, TruncatedFileIsNamed) {
  expect_resume_error([](const fs::path& d) { fs::resize_file(d / "rank_00000.safetensors", 1000); },
                      {"step_000002/rank_00000.safetensors' is truncated: 1000 bytes", "manifest.json"});
}

TEST_F(CheckpointErrorTest, CorruptedByteIsASha256Mismatch) {
  expect_resume_error(
      [](const fs::path& d) {
        const fs::path f = d / "rank_00000.safetensors";
        std::string bytes = read_text(f);
        bytes[bytes.size() / 2] ^= 0x01;
        std::ofstream(f, std::ios::binary | std::ios::trunc) << bytes;
      },
      {"step_000002/rank_00000.safetensors' is corrupted: its sha256 is", "manifest.json says"});
}

TEST_F(CheckpointErrorTest, WrongFormatVersionIsNamed) {
  expect_resume_error(
      [](const fs::path& d) {
        nlohmann::ordered_json m = nlohmann::ordered_json::parse(read_text(d / "manifest.json"));
        m["format_version"] = 99;
        std::ofstream(d / "manifest.json", std::ios::trunc) << m.dump(2);
      },
      {"step_000002/manifest.json: format_version 99 is not supported", "reads format_version 2"});
}

TEST_F(CheckpointErrorTest, AnotherModelNamesTheDifferingKey) {
  RunConfig run = config();
  run.model.n_layer += 1;
  expect_resume_error([](const fs::path&) {},
                      {"step_000002/manifest.json", "another model: model.n_layer is " +
                                                        std::to_string(run.model.n_layer - 1) + " in the checkpoint but " +
                                                        std::to_string(run.model.n_layer)},
                      run);
}

TEST_F(CheckpointErrorTest, MissingListedFileIsNamed) {
  expect_resume_error([](const fs::path& d) { fs::remove(d / "rank_00000.safetensors"); },
                      {"step_000002/rank_00000.safetensors' is missing", "manifest.json"});
}

TEST_F(CheckpointTest, ResumeAutoWithoutStepDirsStartsFreshAndNeverIgnoresThem) {
  RunConfig c = config();
  test::TestContext one;
  Trainer t(c, one.ctx());
  c.checkpoint.dir = (dir_ / "none").string();
  EXPECT_EQ(resume_checkpoint(t, c.checkpoint), "");
  t.step();
  save_checkpoint(t, (dir_ / "ckpt").string(), 0);
  c.checkpoint.dir = (dir_ / "ckpt").string();
  c.checkpoint.resume = "never";
  EXPECT_EQ(resume_checkpoint(t, c.checkpoint), "");
  c.checkpoint.resume = "auto";
  EXPECT_EQ(resume_checkpoint(t, c.checkpoint), (dir_ / "ckpt" / "step_000001").string());
  c.checkpoint.resume = (dir_ / "no_such_dir").string();
  EXPECT_THROW(resume_checkpoint(t, c.checkpoint), Error);
}

// Resuming on another data set (another data.train with another window
// count) says so; the same data set under another spelling does not.
TEST_F(CheckpointTest, ResumeOnAnotherDataSetWarnsNamingBothWindowCounts) {
  RunConfig c = config();
  test::TestContext one;
  Trainer saved(c, one.ctx());
  saved.step();
  save_checkpoint(saved, (dir_ / "ckpt").string(), 0);
  const std::string step_dir = (dir_ / "ckpt" / "step_000001").string();
  c.data.train = {(dir_ / "." / "train_000000.bin").string()};
  Trainer same(c, one.ctx());
  ::testing::internal::CaptureStderr();
  load_checkpoint(same, step_dir);
  EXPECT_EQ(::testing::internal::GetCapturedStderr().find("windows an epoch"), std::string::npos);
  fs::create_directories(dir_ / "other");
  text::write_shard((dir_ / "other" / "train_000000.bin").string(), counting_tokens(2500), 1);
  c.data.train = {(dir_ / "other" / "train_*.bin").string()};
  Trainer other(c, one.ctx());
  ::testing::internal::CaptureStderr();
  load_checkpoint(other, step_dir);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find(concat("resuming on training data of ", other.train_data().windows_per_epoch(),
                            " windows an epoch, but ", step_dir, "/manifest.json was written reading ",
                            saved.train_data().windows_per_epoch())),
            std::string::npos)
      << log;
}

}  // namespace
}  // namespace loom::train
