// Multi-process training on a device, proven without a GPU: every rank's
// pools on the emulated device (the CPU's kernels as Device::cuda's, host
// memory: tests/train/emulated_device.h) and the mesh over a communicator
// that takes device tensors only (MPI underneath, as NCCL is under `loom
// train --device cuda`). dp over every ZeRO stage and tp (with and without
// sequence parallelism, and beside dp) must give bit for bit the losses,
// gradient norms and final model of the same layout on the host, and no
// collective may be handed a host tensor. What runs on a GPU (NCCL's own
// reductions, device memory) is tests/gpu's and tests/comm/mpi_test_nccl's.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "device_run.h"
#include "emulated_device.h"
#include "mesh/context.h"
#include "parallel/dp_run.h"
#include "train/trainer.h"

namespace loom::test {
namespace {

namespace fs = std::filesystem;
using train::RunConfig;

struct DeviceMeshRun {
  std::vector<double> losses, grad_norms;
  std::vector<float> model;  // rank 0: the exported model's weights
};

class DeviceMeshTest : public SharedDataTest<"loom_mpi_device", 4000> {
 protected:
  static void SetUpTestSuite() {
    SharedDataTest::SetUpTestSuite();
    register_emulated_device();
  }
  // cfg over the whole world, its pools on `device`; the mesh over MPI (the
  // host) or over the device's communicator.
  static DeviceMeshRun train_on(RunConfig cfg, Device device, const std::string& name) {
    const fs::path out = dir_ / name;
    std::unique_ptr<comm::Communicator> ranks = world().split(0, world().rank(), "world");
    if (!device.is_cpu()) ranks = std::make_unique<OnDeviceCommunicator>(std::move(ranks));
    mesh::Mesh mesh(train::mesh_shape(cfg.parallel), *ranks);
    Pools pools(device);
    Context ctx{mesh, pools};
    train::TrainOptions options;
    options.progress = false;
    options.out_dir = out.string();
    const train::TrainSummary s = train::run_training(cfg, options, ctx);
    DeviceMeshRun r;
    for (const train::StepStats& st : s.steps) r.losses.push_back(st.loss), r.grad_norms.push_back(st.grad_norm);
    world().barrier()->wait();
    if (world().rank() == 0) r.model = train::model_weights(out);
    return r;
  }
  static void expect_device_equals_host(const RunConfig& cfg, const std::string& name) {
    SCOPED_TRACE(name);
    const DeviceMeshRun host = train_on(cfg, Device::cpu(), name + "_host");
    const DeviceMeshRun dev = train_on(cfg, Device::cuda(0), name + "_dev");
    ASSERT_EQ(host.losses.size(), static_cast<size_t>(cfg.train.steps));
    EXPECT_EQ(host.losses, dev.losses);
    EXPECT_EQ(host.grad_norms, dev.grad_norms);
    EXPECT_EQ(host.model, dev.model);
    if (world().rank() == 0) {
      EXPECT_FALSE(host.model.empty());
      std::printf("[device N=%d] %s: losses %.4f -> %.4f, equal on the device\n", world().size(), name.c_str(),
                  host.losses.front(), host.losses.back());
      std::fflush(stdout);
    }
  }
};

TEST_F(DeviceMeshTest, DataParallelOnTheDeviceEqualsTheHostUnderEveryZeroStage) {
  for (const int64_t stage : {0, 1, 2, 3}) {
    RunConfig c = dp_config(dir_, world().size(), stage, 2, 2);
    c.train.steps = 6;
    expect_device_equals_host(c, "dp" + std::to_string(world().size()) + "_zero" + std::to_string(stage));
  }
}

TEST_F(DeviceMeshTest, TensorParallelOnTheDeviceEqualsTheHostWithAndWithoutSequenceParallelism) {
  const int n = world().size();
  if (n % 2 != 0) GTEST_SKIP() << "tp 2 needs an even number of ranks; this job has " << n;
  for (const bool sp : {false, true}) {
    RunConfig c = dp_config(dir_, n / 2, n > 2 ? 2 : 0, 2, 1);
    c.parallel.tp = 2;
    c.parallel.sequence_parallel = sp;
    c.train.steps = 6;
    expect_device_equals_host(c, "tp2" + std::string(sp ? "_sp" : "") + "_dp" + std::to_string(n / 2));
  }
}

TEST_F(DeviceMeshTest, PipelinesAndContextParallelismOnTheDeviceAreRefusedClearly) {
  if (world().size() != 2) GTEST_SKIP() << "checked at 2 ranks (pp 2, cp 2)";
  for (const char* axis : {"pp", "cp"}) {
    RunConfig c = dp_config(dir_, 1, 0, 2, 1);
    (std::string(axis) == "pp" ? c.parallel.pp : c.parallel.cp) = 2;
    try {
      train_on(c, Device::cuda(0), std::string("refused_") + axis);
      ADD_FAILURE() << axis << " 2 on the device: no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("must be 1 (pipeline and context parallelism on GPUs"), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace loom::test
