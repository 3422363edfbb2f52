// Shared by the trainer and checkpoint tests: a learnable token stream
// written as train/val shards into a fresh temporary directory, and a tiny
// run config (gpt2-tiny, T = 16, 2 x 2 sequences a step, 20 steps) over it.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "model/config.h"
#include "text/shards.h"
#include "train/checkpoint_dir.h"
#include "train/config.h"
#include "train/trainer.h"

namespace loom::train {

// Token i is i mod 37: the next token is always this one + 1 (mod 37).
inline std::vector<int32_t> counting_tokens(int64_t n) {
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>(i % 37);
  return t;
}

// A file's bytes ("" when it cannot be read).
inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The names of the step dirs under root, oldest first (train/checkpoint_dir.h).
inline std::vector<std::string> step_names(const std::filesystem::path& root) {
  std::vector<std::string> out;
  for (const StepDir& d : list_step_dirs(root)) out.push_back(d.path.filename().string());
  return out;
}

// The f32 master weights of a single-rank trainer (its whole shard).
inline std::vector<float> master_of(Trainer& t) {
  std::vector<float> out(static_cast<size_t>(t.dp().shard_numel()));
  t.dp().pack_master(Tensor(out.data(), DType::f32, {static_cast<int64_t>(out.size())}));
  return out;
}

class TinyRunTest : public ::testing::Test {
 protected:
  explicit TinyRunTest(const std::string& name)
      : dir_(std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()))) {}

  void SetUp() override {
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    text::write_shard((dir_ / "train_000000.bin").string(), counting_tokens(4000), 1);
    text::write_shard((dir_ / "val_000000.bin").string(), counting_tokens(500), 1);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // peak_tflops is fixed so that no test spends time measuring a GEMM peak.
  RunConfig config() const {
    RunConfig c;
    c.model = model::model_preset("gpt2-tiny");
    c.data.train = {(dir_ / "train_*.bin").string()};
    c.data.val = {(dir_ / "val_*.bin").string()};
    c.train.seq_len = 16;
    c.train.micro_batch = 2;
    c.train.grad_accum = 2;
    c.train.steps = 20;
    c.train.lr = 1e-2;
    c.train.min_lr = 1e-3;
    c.train.warmup_steps = 2;
    c.train.eval_every = 10;
    c.train.eval_steps = 2;
    c.log.peak_tflops = 1.0;
    return c;
  }

  std::filesystem::path dir_;
};

}  // namespace loom::train
