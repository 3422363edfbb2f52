// ZeRO-Infinity's disk tier (parallel/offload.h): the run with AdamW's
// moments (and bf16's f32 master weights) in offload files, streamed
// through a budget small enough to cut the shard into many records
// (parallel.offload = optimizer), and with ZeRO-3's parameter and gradient
// shards there too (= params), gives bitwise the losses and the final model
// of the same run without offload: the optimizer's tier under every ZeRO
// stage, the parameters' under stage 3, over the world's dp, in fp32, bf16
// (where the CPU has its GEMM) and fp16, with two micro-batches a step (the
// gradient records read back and added to); a checkpoint of an offloaded
// run resumes without offload, and one without resumes offloaded, bitwise;
// the files are gone when the run ends; and a byte flipped in one stops the
// run by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/ops.h"
#include "parallel/dp_run.h"
#include "train/checkpoint.h"

namespace loom::test {
namespace {

namespace fs = std::filesystem;
using train::RunConfig;

constexpr int64_t kSteps = 8;

// Whether dtype is bf16 on a CPU without its GEMM: then said so (rank 0) and skipped.
bool skips_bf16(const std::string& dtype) {
  const std::string why = dtype == "bf16" ? kernels::bf16_matmul_unsupported_reason() : "";
  if (!why.empty() && world().rank() == 0) std::printf("[offload] bf16 skipped: %s\n", why.c_str());
  return !why.empty();
}

class OffloadTest : public SharedDataTest<"loom_mpi_offload", 4000> {
 protected:
  // offload: none, optimizer or params.
  static RunConfig config(int64_t stage, const std::string& dtype, const std::string& offload) {
    RunConfig c = dp_config(dir_, world().size(), stage, std::max(1, 8 / world().size()), 2);
    c.train.dtype = dtype;
    c.train.steps = kSteps;
    if (offload != "none") {
      c.parallel.offload = offload;
      c.parallel.offload_dir = (dir_ / "offload").string();
      c.parallel.offload_budget_mb = 0.25;  // records of 4096 elements: many per rank
    }
    return c;
  }
  struct Run {
    std::vector<double> losses;
    std::vector<float> model;  // the final f32 master weights, whole
  };
  static Run run(const RunConfig& c) {
    TrainerOn on(c, &world());
    Run r{losses_of(train_until(on.t, c.train.steps)), {}};
    r.model.resize(static_cast<size_t>(model::param_count(c.model)));
    on.t.chunk_dp(0).gather_master(Tensor(r.model.data(), DType::f32, {static_cast<int64_t>(r.model.size())}));
    return r;
  }
  static bool offload_dir_is_empty() {
    const fs::path d = dir_ / "offload";
    return !fs::exists(d) || fs::is_empty(d);
  }
};

TEST_F(OffloadTest, OptimizerOnDiskGivesBitwiseTheLossesAndModelUnderEveryZeroStage) {
  for (const char* dtype : {"fp32", "bf16", "fp16"}) {
    if (skips_bf16(dtype)) continue;
    for (int stage = 0; stage <= 3; ++stage) {
      const Run plain = run(config(stage, dtype, "none")), offloaded = run(config(stage, dtype, "optimizer"));
      EXPECT_EQ(offloaded.losses, plain.losses) << dtype << " zero_stage " << stage;
      EXPECT_TRUE(offloaded.model == plain.model) << dtype << " zero_stage " << stage << ": the final models differ";
      EXPECT_LT(plain.losses.back(), plain.losses.front()) << "the run should learn";
      if (world().rank() == 0)
        std::printf("[offload optimizer, dp %d] %s zero_stage %d: %zu losses and %zu weights bitwise equal\n",
                    world().size(), dtype, stage, plain.losses.size(), plain.model.size());
      world().barrier()->wait();
      EXPECT_TRUE(offload_dir_is_empty()) << "an offload file outlived its run";
    }
  }
}

TEST_F(OffloadTest, ParamsOnDiskGivesBitwiseTheLossesAndModelUnderZero3) {
  for (const char* dtype : {"fp32", "bf16", "fp16"}) {
    if (skips_bf16(dtype)) continue;
    const Run plain = run(config(3, dtype, "none")), offloaded = run(config(3, dtype, "params"));
    EXPECT_EQ(offloaded.losses, plain.losses) << dtype;
    EXPECT_TRUE(offloaded.model == plain.model) << dtype << ": the final models differ";
    EXPECT_LT(plain.losses.back(), plain.losses.front()) << "the run should learn";
    if (world().rank() == 0)
      std::printf("[offload params, dp %d] %s zero_stage 3: %zu losses and %zu weights bitwise equal\n",
                  world().size(), dtype, plain.losses.size(), plain.model.size());
    world().barrier()->wait();
    EXPECT_TRUE(offload_dir_is_empty()) << "an offload file outlived its run";
  }
}

TEST_F(OffloadTest, CheckpointsResumeAcrossOffloadBitwise) {
  const SubMesh all = sub_mesh(1, world().size(), 1);
  for (const char* tier : {"optimizer", "params"}) {
    const int stage = world().size() > 1 || tier == std::string("params") ? 3 : 0;
    for (const char* dtype : {"fp32", "bf16", "fp16"}) {
      if (skips_bf16(dtype)) continue;
      const std::vector<double> straight = run(config(stage, dtype, "none")).losses;
      for (bool saved_offloaded : {true, false}) {
        const fs::path root = dir_ / concat("ckpt_", tier, "_", dtype, saved_offloaded ? "_from_disk" : "_to_disk");
        save_after_steps(all, config(stage, dtype, saved_offloaded ? tier : "none"), 3, root);
        const std::vector<double> after = run_resumable(all, config(stage, dtype, saved_offloaded ? "none" : tier), 3,
                                                        kSteps, (root / "step_000003").string(), {}, "resumed");
        ASSERT_EQ(after.size(), static_cast<size_t>(kSteps - 3));
        for (size_t i = 0; i < after.size(); ++i)
          EXPECT_EQ(after[i], straight[3 + i]) << tier << " " << dtype
                                               << (saved_offloaded ? " saved offloaded" : " resumed offloaded")
                                               << ", step " << 4 + i;
      }
    }
  }
}

// A byte of an offload file flipped between two steps (by rank 0 alone,
// one process): the optimizer's state file, read by the next update, or the
// parameter shards' file (its first record: the embeddings' parameters,
// read by the next forward). The read stops the run with an error naming
// the file and the record, instead of training on it.
TEST_F(OffloadTest, AFlippedByteInTheFileStopsTheRunNamingFileAndRecord) {
  if (world().rank() == 0) {
    for (const char* tier : {"optimizer", "params"}) {
      const bool params = tier == std::string("params");
      RunConfig c = config(params ? 3 : 0, "fp32", tier);
      c.parallel.dp = 1, c.train.micro_batch = 8;
      c.parallel.offload_dir = (dir_ / concat("offload_flip_", tier)).string();
      TrainerOn on(c, nullptr);
      train_until(on.t, 1);
      std::vector<fs::path> files;
      for (const fs::directory_entry& e : fs::directory_iterator(c.parallel.offload_dir))
        if (e.path().string().ends_with(".params") == params) files.push_back(e.path());
      ASSERT_EQ(files.size(), 1u) << tier;
      {
        std::fstream f(files[0], std::ios::in | std::ios::out | std::ios::binary);
        const int at = params ? 100 : 5000;
        f.seekg(at);
        const char byte = static_cast<char>(f.get() ^ 0x40);
        f.seekp(at);
        f.put(byte);
      }
      try {
        train_until(on.t, 2);
        ADD_FAILURE() << "a corrupted offload file was trained on (" << tier << ")";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("offload file '" + files[0].string() + "': record 0 ("),
                  std::string::npos)
            << e.what();
        EXPECT_NE(std::string(e.what()).find("is corrupted"), std::string::npos) << e.what();
      }
    }
  }
  world().barrier()->wait();
}

TEST_F(OffloadTest, ABudgetBelowTheStreamsLeastIsRefusedWithTheNumbers) {
  RunConfig c = config(world().size() > 1 ? 1 : 0, "fp32", "optimizer");
  c.parallel.offload_budget_mb = 0.01;
  try {
    TrainerOn on(c, &world());
    ADD_FAILURE() << "a budget of 10 KiB was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a budget of 10485 bytes is below the "
                                         "least the offloaded state streams through: 4 buffers of 4096 elements x 2 "
                                         "f32 arrays (and 4 KiB to align them) = 135168 bytes"),
              std::string::npos)
        << e.what();
  }
  world().barrier()->wait();
}

}  // namespace
}  // namespace loom::test
