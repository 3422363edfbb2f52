// Training on the GPU against training on the CPU (issue 42): the tiny runs
// of tests/train/tiny_run.h through run_training, once with pools on the
// host and once on CUDA device 0 (registered by tests/gpu/main.cpp), as
// `loom train --device cuda` runs them. The kernels differ (cuBLASLt and
// loom's CUDA kernels against oneDNN and the CPU's), so the runs agree within
// rounding, not bit for bit: fp32 losses within 1e-5 relative per step over
// 20 steps (the bound); bf16 within 2e-2 (bf16 rounds the compute
// weights after every update, and the two backends round different
// intermediate sums). A GPU run repeated is bit for bit the same, and
// checkpoints move between the GPU and the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "train/device_run.h"
#include "train/tiny_run.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;

class CudaTrainTest : public TinyRunTest {
 protected:
  CudaTrainTest() : TinyRunTest("loom_test_cuda_train") {}
  static Device gpu() { return Device::cuda(0); }
  // tiny_run.h's run at lr 1e-3 (its 1e-2 learns the stream in 20 steps but
  // meets a gradient spike at step 10, grad norm 6 clipped to 1, after which
  // the two runs' rounding differences grow 10x: on an H200 the fp32 losses
  // agreed to 1e-5 up to step 9 and to 1.0e-4 after it).
  RunConfig config() const {
    RunConfig c = TinyRunTest::config();
    c.train.lr = 1e-3;
    c.train.min_lr = 1e-4;
    return c;
  }
};

void expect_close(const std::vector<double>& cpu, const std::vector<double>& gpu, double rel, const char* what) {
  ASSERT_EQ(cpu.size(), gpu.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double d = std::abs(cpu[i] - gpu[i]) / std::max(std::abs(cpu[i]), 1e-12);
    worst = std::max(worst, d);
    EXPECT_LE(d, rel) << what << " " << i << ": cpu " << cpu[i] << ", gpu " << gpu[i];
  }
  std::printf("%s: %zu values, largest relative difference %.3g (bound %.3g)\n", what, cpu.size(), worst, rel);
}

// Weights: within rel of the largest weight's size (an update moves each by
// ~lr, and the two runs' updates differ by rounding).
void expect_close_weights(const std::vector<float>& cpu, const std::vector<float>& gpu, double rel) {
  ASSERT_EQ(cpu.size(), gpu.size());
  ASSERT_FALSE(cpu.empty());
  double scale = 0, worst = 0;
  for (float w : cpu) scale = std::max(scale, static_cast<double>(std::abs(w)));
  for (size_t i = 0; i < cpu.size(); ++i) worst = std::max(worst, std::abs(static_cast<double>(cpu[i]) - gpu[i]));
  std::printf("exported weights: %zu, largest difference %.3g of the largest weight %.3g\n", cpu.size(), worst, scale);
  EXPECT_LE(worst, rel * scale);
}

// An fp32 run of cfg on the CPU and on the GPU (out dirs name_cpu,
// name_gpu): losses within 1e-5, grad norms 1e-4, the exported weights 1e-4
// of the largest.
void expect_gpu_matches_cpu(const RunConfig& cfg, const std::filesystem::path& dir, const std::string& name) {
  const DeviceRun cpu = run_on(cfg, Device::cpu(), dir / (name + "_cpu"));
  const DeviceRun dev = run_on(cfg, Device::cuda(0), dir / (name + "_gpu"));
  ASSERT_EQ(cpu.losses.size(), static_cast<size_t>(cfg.train.steps));
  expect_close(cpu.losses, dev.losses, 1e-5, (name + " fp32 losses").c_str());
  expect_close(cpu.val_losses, dev.val_losses, 1e-5, (name + " fp32 val losses").c_str());
  expect_close(cpu.grad_norms, dev.grad_norms, 1e-4, (name + " fp32 grad norms").c_str());
  expect_close_weights(cpu.model, dev.model, 1e-4);
}

TEST_F(CudaTrainTest, Gpt2Fp32TwentyStepsMatchTheCpu) {
  ASSERT_EQ(config().train.steps, 20);
  expect_gpu_matches_cpu(config(), dir_, "gpt2");
}

TEST_F(CudaTrainTest, LlamaBf16WithRecomputeMatchesTheCpu) {
  RunConfig cfg = config();
  cfg.model = model::model_preset("llama-tiny");
  cfg.train.dtype = "bf16";
  cfg.train.recompute = "selective";
  const DeviceRun dev = run_on(cfg, gpu(), dir_ / "gpu");
  ASSERT_EQ(dev.losses.size(), 20u);
  EXPECT_LT(dev.losses.back(), dev.losses.front());  // it learns the counting stream
  if (const std::string why = kernels::bf16_matmul_unsupported_reason(); !why.empty())
    GTEST_SKIP() << "no bf16 CPU run to compare with: " << why;
  const DeviceRun cpu = run_on(cfg, Device::cpu(), dir_ / "cpu");
  expect_close(cpu.losses, dev.losses, 2e-2, "bf16 losses");
}

// A Mixtral-style model: routing (scores, top-k, capacity drops, the
// dispatch plan, the balancing statistics and the router's backward) in the
// CUDA backend's moe_* kernels. A score a rounding away from a tie could
// choose another expert on the GPU than on the CPU; the bound leaves room
// for no such flip, so a failure here names one (or a real difference).
TEST_F(CudaTrainTest, MixtureOfExpertsFp32MatchesTheCpuAndRepeatsBitForBit) {
  RunConfig cfg = config();
  cfg.model = model::model_preset("llama-tiny");
  cfg.model.n_expert = 4, cfg.model.top_k = 2, cfg.model.capacity_factor = 1.f;
  cfg.model.z_loss_coef = 1e-3f, cfg.model.aux_free_rate = 1e-3f;
  expect_gpu_matches_cpu(cfg, dir_, "moe");
  cfg.train.steps = 6;
  const DeviceRun a = run_on(cfg, gpu(), dir_ / "moe_a"), b = run_on(cfg, gpu(), dir_ / "moe_b");
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.model, b.model);
}

// ZeRO-Offload: the model on the GPU, AdamW's state and update on the host
// (the gradients copied down, the rounded weights up each step): the CPU's
// update on the GPU's gradients, so within the fp32 bound of the CPU run.
TEST_F(CudaTrainTest, OptimizerOffloadedToTheHostMatchesTheCpu) {
  RunConfig cfg = config();
  cfg.parallel.offload_optimizer = true;
  cfg.train.steps = 10;
  expect_gpu_matches_cpu(cfg, dir_, "offload");
}

TEST_F(CudaTrainTest, AGpuRunRepeatedIsBitForBitTheSame) {
  RunConfig cfg = config();
  cfg.train.steps = 8;
  const DeviceRun a = run_on(cfg, gpu(), dir_ / "a"), b = run_on(cfg, gpu(), dir_ / "b");
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.grad_norms, b.grad_norms);
  EXPECT_EQ(a.model, b.model);
}

// A GPU run's checkpoint resumes on the CPU and a CPU run's on the GPU: 10
// steps saved, then resumed to 20, each pair within the fp32 bound of the
// same pair on the CPU alone.
TEST_F(CudaTrainTest, CheckpointsMoveBetweenTheGpuAndTheCpu) {
  const DeviceRun cpu = checkpoint_chain(config(), dir_, "cpu", Device::cpu(), Device::cpu());
  ASSERT_EQ(cpu.losses.size(), 20u);
  for (const bool gpu_first : {true, false}) {
    SCOPED_TRACE(gpu_first ? "gpu, then cpu" : "cpu, then gpu");
    const DeviceRun mixed = gpu_first ? checkpoint_chain(config(), dir_, "gpu_cpu", gpu(), Device::cpu())
                                      : checkpoint_chain(config(), dir_, "cpu_gpu", Device::cpu(), gpu());
    expect_close(cpu.losses, mixed.losses, 1e-5, "resumed losses");
    expect_close_weights(cpu.model, mixed.model, 1e-4);
  }
}

}  // namespace
}  // namespace loom::train
