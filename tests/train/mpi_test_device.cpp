// Multi-process training on a device, proven without a GPU: every rank's
// pools on the emulated device (the CPU's kernels as Device::cuda's, host
// memory: tests/train/emulated_device.h) and the mesh over a communicator
// that takes device tensors only (MPI underneath, as NCCL is under `loom
// train --device cuda`). dp over every ZeRO stage, tp (with and without
// sequence parallelism, and beside dp), cp and MoE models (with ep) must
// give bit for bit the losses, gradient norms and final model of the same
// layout on the host, and no collective may be handed a host tensor. What runs on a GPU (NCCL's own
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
#include "model/config.h"
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

// ZeRO-Offload: the optimizer's state and update on the host beside a model
// on the device, under ZeRO-1 (the reduced gradients' shard copied down) and
// ZeRO-3 (the sharded parameters written back up, then gathered).
TEST_F(DeviceMeshTest, OptimizerOffloadedToTheHostEqualsTheHostUnderZero1And3) {
  for (const int64_t stage : {1, 3}) {
    RunConfig c = dp_config(dir_, world().size(), stage, 2, 2);
    c.parallel.offload_optimizer = true;
    c.train.steps = 4;
    expect_device_equals_host(c, "offload_dp" + std::to_string(world().size()) + "_zero" + std::to_string(stage));
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

// A Mixtral-style model (8 experts of 2 layers, top-2, capacity 1 so that
// choices drop, the z-loss and the balancing bias): its routing runs in the
// kernels' moe_* ops on the device, the rows per expert and the statistics
// read back, and under ep (every rank's tokens to the experts' ranks over
// the device's communicator) as on the host.
TEST_F(DeviceMeshTest, MixtureOfExpertsOnTheDeviceEqualsTheHostWithAndWithoutExpertParallelism) {
  const int n = world().size();
  for (const int64_t stage : {0, 3}) {
    RunConfig c = dp_config(dir_, n, stage, 2, 1);
    c.model = model::model_preset("llama-tiny");
    c.model.n_layer = 2, c.model.vocab_size = 512, c.model.d_ff = 64;
    c.model.n_expert = 8, c.model.top_k = 2, c.model.capacity_factor = 1.f;
    c.model.z_loss_coef = 1e-3f, c.model.aux_free_rate = 1e-3f;
    c.parallel.ep = 8 % n == 0 ? n : 1;
    c.train.steps = 5;
    expect_device_equals_host(c, "moe_dp" + std::to_string(n) + "_ep" + std::to_string(c.parallel.ep) + "_zero" +
                                     std::to_string(stage));
  }
}

// Context parallelism: ring (K, V and their gradients around the ring over
// the device's communicator, which pairs messages in issue order as NCCL
// does, not by tag: emulated_device.h) and all-gather, on zig-zag chunks,
// beside dp; and a MoE model's routing groups spread over the cp ranks.
TEST_F(DeviceMeshTest, ContextParallelismOnTheDeviceEqualsTheHost) {
  const int n = world().size();
  if (n % 2 != 0) GTEST_SKIP() << "cp needs an even number of ranks; this job has " << n;
  // cp 4 where the job allows: a ring of 2 pairs its messages alike in either order.
  const int cp = n % 4 == 0 ? 4 : 2;
  for (const char* algo : {"ring", "allgather"}) {
    RunConfig c = dp_config(dir_, n / cp, 1, 2, 1);
    c.parallel.cp = cp, c.parallel.cp_algo = algo;
    c.train.steps = 4;
    expect_device_equals_host(c, "cp" + std::to_string(cp) + "_" + algo + "_dp" + std::to_string(n / cp));
  }
  RunConfig c = dp_config(dir_, n / 2, 0, 2, 1);
  c.model = model::model_preset("llama-tiny");
  c.model.n_layer = 2, c.model.vocab_size = 512, c.model.d_ff = 64;
  c.model.n_expert = 4, c.model.top_k = 2, c.model.capacity_factor = 1.f, c.model.z_loss_coef = 1e-3f;
  c.parallel.cp = 2;
  c.train.steps = 4;
  expect_device_equals_host(c, "moe_cp2_dp" + std::to_string(n / 2));
}

// The emulated communicator queues messages as the NCCL backend does (per
// neighbour pair and direction), so the wave of mpi_test_nccl's
// NeighbourMessagesQueuePerPair... completes here too: ranks 1 .. n-2
// receive from the previous rank while sending to the next, ranks n-1 and 0
// send only once their message is here.
TEST_F(DeviceMeshTest, EmulatedNeighbourMessagesQueuePerPairLikeNccl) {
  const int n = world().size(), r = world().rank();
  if (n < 3) GTEST_SKIP() << "a ring of 3 ranks or more; have " << n;
  OnDeviceCommunicator device_comm(world().split(0, r, "wave"));
  comm::Communicator& c = device_comm;
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  std::vector<int32_t> out(4099, r), in(4099, -1);
  const Tensor out_t(out.data(), DType::i32, {4099}, Device::cuda(0));
  const Tensor in_t(in.data(), DType::i32, {4099}, Device::cuda(0));
  if (r == 0 || r == n - 1) {
    c.recv(in_t, prev)->wait();
    c.send(out_t, next)->wait();
  } else {
    comm::WorkPtr got = c.recv(in_t, prev), sent = c.send(out_t, next);
    got->wait(), sent->wait();
  }
  EXPECT_EQ(in, std::vector<int32_t>(4099, prev));
}

// Pipelines: every schedule over the device's communicator, whose messages
// queue per stream and pair in issue order as NCCL's do (emulated_p2p.h),
// on GPT-2 (its tied embedding's two copies summed over the first and last
// stage) and on Llama with GQA; pp = N at 2, 3 and 4 ranks; at 8, pp 4
// interleaved beside dp 2 (ZeRO-1), and pp 2 with tp 2 + SP and dp 2.
TEST_F(DeviceMeshTest, PipelinesOnTheDeviceEqualTheHostUnderEverySchedule) {
  const int n = world().size();
  if (n < 2) GTEST_SKIP() << "pp needs 2 ranks or more; this job has " << n;
  struct Run {
    const char* family;
    const char* schedule;
    int pp, virtual_stages, tp;
  };
  std::vector<Run> runs;
  if (n <= 4) runs = {{"gpt2", "afab", n, 1, 1}, {"gpt2", "1f1b", n, 1, 1}, {"llama", "1f1b", n, 1, 1}};
  if (n == 2 || n == 4) runs.push_back({"gpt2", "interleaved", n, 2, 1});
  if (n == 8) runs = {{"gpt2", "interleaved", 4, 2, 1}, {"llama", "1f1b", 2, 1, 2}};
  for (const Run& r : runs) {
    const int dp = n / (r.pp * r.tp);
    RunConfig c = dp_config(dir_, dp, dp > 1 ? 1 : 0, 2 / dp, 4);
    c.model = eight_layer_model(r.family);
    c.parallel.pp = r.pp, c.parallel.pp_schedule = r.schedule, c.parallel.virtual_stages = r.virtual_stages;
    c.parallel.tp = r.tp, c.parallel.sequence_parallel = r.tp > 1;
    c.train.steps = 4;
    expect_device_equals_host(c, concat(r.family, "_", r.schedule, "_pp", r.pp, "_v", r.virtual_stages, "_tp",
                                        r.tp, "_dp", dp));
  }
}

}  // namespace
}  // namespace loom::test
