// The device plumbing of training, proven without a GPU: the CPU's own
// kernels registered a second time as the backend of Device::cuda, with
// memory from the host's allocator. A run whose pools live on that "device"
// then goes through every path a GPU run takes (parameters drawn on the host
// and moved over, batches copied in, one-rank collectives as device copies,
// values read back, checkpoints and the exported model staged through the
// host), and any op that mixes a host tensor with a device tensor is an
// error (kernels/dispatch.h). The kernels being the same, the run must equal
// the host's bit for bit. What this cannot see is host code reading device
// memory directly (the memory is the host's here): tests/gpu/cuda_train.cpp
// runs the same scenarios on a real GPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/memory.h"
#include "kernels/backend.h"
#include "kernels/ops.h"
#include "device_run.h"
#include "emulated_device.h"
#include "tiny_run.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;

class EmulatedDeviceTest : public TinyRunTest {
 protected:
  EmulatedDeviceTest() : TinyRunTest("loom_test_device_emulated") {}
  static void SetUpTestSuite() { test::register_emulated_device(); }
  static Device device() { return Device::cuda(0); }
};

void expect_same(const DeviceRun& host, const DeviceRun& dev) {
  ASSERT_FALSE(host.losses.empty());
  EXPECT_EQ(host.losses, dev.losses);
  EXPECT_EQ(host.grad_norms, dev.grad_norms);
  EXPECT_EQ(host.val_losses, dev.val_losses);
  EXPECT_EQ(host.model, dev.model);
}

TEST_F(EmulatedDeviceTest, TrainingOnTheDeviceEqualsTheHostBitForBit) {
  const RunConfig cfg = config();
  const DeviceRun host = run_on(cfg, Device::cpu(), dir_ / "host");
  const DeviceRun dev = run_on(cfg, device(), dir_ / "dev");
  EXPECT_EQ(host.losses.size(), 20u);
  EXPECT_EQ(host.val_losses.size(), 2u);
  expect_same(host, dev);
}

TEST_F(EmulatedDeviceTest, LlamaInBf16WithRecomputeOnTheDeviceEqualsTheHost) {
  if (!kernels::bf16_matmul_unsupported_reason().empty()) GTEST_SKIP() << kernels::bf16_matmul_unsupported_reason();
  RunConfig cfg = config();
  cfg.model = model::model_preset("llama-tiny");
  cfg.train.dtype = "bf16";
  cfg.train.recompute = "selective";
  cfg.train.steps = 8;
  cfg.train.eval_every = 4;
  expect_same(run_on(cfg, Device::cpu(), dir_ / "host"), run_on(cfg, device(), dir_ / "dev"));
}

// log.trace_ops on a device: each op is also a span on the device track
// (tid 1, named "device") from the device's clock, the emulation's being the
// host's, so each device span lies within its op's host span (shifted by
// where the two clocks were set together); the run's bits are the host's.
TEST_F(EmulatedDeviceTest, TraceOpsTimesEachOpOnTheDeviceTrack) {
  RunConfig cfg = config();
  cfg.train.steps = 2;
  cfg.train.eval_every = 0;
  cfg.log.trace = (dir_ / "trace.json").string();
  cfg.log.trace_ops = true;
  RunConfig plain = cfg;
  plain.log.trace.clear();
  plain.log.trace_ops = false;
  const DeviceRun host = run_on(plain, Device::cpu(), dir_ / "host");
  const DeviceRun dev = run_on(cfg, device(), dir_ / "dev");
  EXPECT_EQ(host.losses, dev.losses);
  EXPECT_EQ(host.model, dev.model);

  const nlohmann::json doc = nlohmann::json::parse(std::ifstream(cfg.log.trace));
  std::vector<nlohmann::json> host_ops, device_ops;
  int named = 0;  // the device track's name, once however many steps
  for (const nlohmann::json& e : doc.at("traceEvents")) {
    if (e.at("ph") == "M") {
      named += e.at("name") == "thread_name" && e.at("tid") == 1 && e.at("args").at("name") == "device";
      continue;
    }
    if (e.at("tid") == 1) device_ops.push_back(e);
    else if (e.at("name") == "attention_forward" || e.at("name") == "linear_backward") host_ops.push_back(e);
  }
  EXPECT_EQ(named, 1);
  std::vector<nlohmann::json> device_matching;
  for (const nlohmann::json& e : device_ops)
    if (e.at("name") == "attention_forward" || e.at("name") == "linear_backward") device_matching.push_back(e);
  ASSERT_EQ(device_matching.size(), host_ops.size());
  ASSERT_FALSE(host_ops.empty());
  for (size_t i = 0; i < host_ops.size(); ++i) {
    const nlohmann::json& h = host_ops[i];
    const nlohmann::json& d = device_matching[i];
    EXPECT_EQ(d.at("name"), h.at("name"));
    // Within the host span, give or take the trace's rounding (1 ns) and,
    // at the end, where the clocks were set together (the device's time of
    // its first mark read on the host just after: microseconds late).
    EXPECT_GE(d.at("ts").get<double>(), h.at("ts").get<double>() - 2e-3);
    EXPECT_LE(d.at("dur").get<double>(), h.at("dur").get<double>() + 2e-3);
    EXPECT_LE(d.at("ts").get<double>() + d.at("dur").get<double>(),
              h.at("ts").get<double>() + h.at("dur").get<double>() + 20);
  }
}

// A checkpoint written by a device run resumes on the host and the other way
// round, each pair of runs ending as the same pair on the host alone: 10
// steps saved, then resumed to 20.
TEST_F(EmulatedDeviceTest, CheckpointsMoveBetweenTheDeviceAndTheHost) {
  const DeviceRun host = checkpoint_chain(config(), dir_, "host", Device::cpu(), Device::cpu());
  ASSERT_EQ(host.losses.size(), 20u);
  for (const bool device_first : {true, false}) {
    SCOPED_TRACE(device_first ? "device, then host" : "host, then device");
    const DeviceRun mixed = device_first ? checkpoint_chain(config(), dir_, "dev_host", device(), Device::cpu())
                                         : checkpoint_chain(config(), dir_, "host_dev", Device::cpu(), device());
    EXPECT_EQ(mixed.losses, host.losses);
    EXPECT_EQ(mixed.model, host.model);
  }
}

// run() is a loom::Error whose message holds `says`.
template <typename F>
void expect_refused(F run, const std::string& says) {
  try {
    run();
    ADD_FAILURE() << "no error; expected one saying '" << says << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
}

// A Mixtral-style model's routing on the device (the moe_* kernels, the
// rows per expert and the statistics read back), with and without full
// recompute (whose second forward routes again without counting).
TEST_F(EmulatedDeviceTest, MixtureOfExpertsOnTheDeviceEqualsTheHostWithAndWithoutRecompute) {
  for (const char* recompute : {"none", "full"}) {
    RunConfig cfg = config();
    cfg.model = model::model_preset("llama-tiny");
    cfg.model.n_expert = 4, cfg.model.top_k = 2, cfg.model.capacity_factor = 1.f;
    cfg.model.z_loss_coef = 1e-3f, cfg.model.aux_free_rate = 1e-3f;
    cfg.train.recompute = recompute;
    cfg.train.steps = 8;
    const DeviceRun host = run_on(cfg, Device::cpu(), dir_ / (std::string("moe_host_") + recompute));
    const DeviceRun dev = run_on(cfg, device(), dir_ / (std::string("moe_dev_") + recompute));
    ASSERT_EQ(host.losses.size(), 8u);
    EXPECT_EQ(host.losses, dev.losses) << recompute;
    EXPECT_EQ(host.grad_norms, dev.grad_norms) << recompute;
    EXPECT_EQ(host.model, dev.model) << recompute;
  }
}

// ZeRO-Offload: the model on the device, its master weights, AdamW's
// moments and the gradients' copy on the host (DpOptions::host_state), the
// update there and the rounded weights copied up: the same bits as the run
// on the host (with the optimizer offloaded or not), for a dense model, a
// MoE model whose balancing biases move in the update (the deltas), and
// through a checkpoint that moves between the two.
TEST_F(EmulatedDeviceTest, OptimizerOffloadedToTheHostEqualsTheHost) {
  RunConfig cfg = config();
  cfg.parallel.offload_optimizer = true;
  const DeviceRun host = run_on(cfg, Device::cpu(), dir_ / "offload_host");
  expect_same(host, run_on(cfg, device(), dir_ / "offload_dev"));
  RunConfig kept = cfg;
  kept.parallel.offload_optimizer = false;
  expect_same(host, run_on(kept, Device::cpu(), dir_ / "kept_host"));
  RunConfig moe = cfg;
  moe.model = model::model_preset("llama-tiny");
  moe.model.n_expert = 4, moe.model.top_k = 2, moe.model.capacity_factor = 1.f, moe.model.aux_free_rate = 1e-3f;
  moe.train.steps = 8;
  moe.train.eval_every = 4;
  expect_same(run_on(moe, Device::cpu(), dir_ / "offload_moe_host"), run_on(moe, device(), dir_ / "offload_moe_dev"));
  const DeviceRun chain_host = checkpoint_chain(cfg, dir_, "offload_chain_host", Device::cpu(), Device::cpu());
  const DeviceRun chain_mixed = checkpoint_chain(cfg, dir_, "offload_chain_mixed", device(), Device::cpu());
  EXPECT_EQ(chain_mixed.losses, chain_host.losses);
  EXPECT_EQ(chain_mixed.model, chain_host.model);
}

// A host pool pinned for the device page-locks each buffer in whole pages
// (2 MiB ones from 2 MiB) and unlocks them before they go; other pools do not.
TEST_F(EmulatedDeviceTest, HostPoolsPinnedForTheDevicePageLockTheirLargeBuffers) {
  test::EmulatedPins& pins = test::emulated_pins();
  Pools host(Device::cpu(), device());
  EXPECT_EQ(host[MemTag::master].pin_for(), device());
  {
    OwnedTensor big = host[MemTag::master].zeros(DType::f32, {(3 << 20) / 4});  // 3 MiB
    OwnedTensor small = host[MemTag::master].zeros(DType::f32, {1000});
    Pools unpinned(Device::cpu());
    OwnedTensor plain = unpinned[MemTag::master].zeros(DType::f32, {1000});
    std::lock_guard lock(pins.mutex);
    ASSERT_EQ(pins.pinned.count(big.data()), 1u);
    EXPECT_EQ(pins.pinned.at(big.data()), size_t{4} << 20);  // whole 2 MiB pages
    ASSERT_EQ(pins.pinned.count(small.data()), 1u);
    EXPECT_EQ(pins.pinned.at(small.data()), 4096u);
    EXPECT_EQ(pins.pinned.count(plain.data()), 0u);
  }
  std::lock_guard lock(pins.mutex);
  EXPECT_TRUE(pins.pinned.empty());
  expect_refused([] { Pools p(Device::cuda(0), Device::cuda(0)); }, "only host memory is page-locked");
}

// ZeRO-Offload beside a device's model pins its host state once: a longer
// run pins no more often (the rounded weights' staging is reused, not
// allocated per piece and step), and nothing stays pinned after the run.
TEST_F(EmulatedDeviceTest, OffloadedStateIsPinnedOnceNotPerStep) {
  test::EmulatedPins& pins = test::emulated_pins();
  auto pin_calls = [&](int steps) {
    RunConfig cfg = config();
    cfg.parallel.offload_optimizer = true;
    cfg.train.steps = steps;
    cfg.train.eval_every = 0;
    const int64_t before = [&] {
      std::lock_guard lock(pins.mutex);
      return pins.calls;
    }();
    run_on(cfg, device(), dir_ / ("pinned_" + std::to_string(steps)));
    std::lock_guard lock(pins.mutex);
    EXPECT_TRUE(pins.pinned.empty()) << steps << " steps";
    return pins.calls - before;
  };
  const int64_t two = pin_calls(2);
  EXPECT_GT(two, 0);
  EXPECT_EQ(pin_calls(6), two);
}

// DESIGN.md §3: the Context carries the stream of its pools' device, the
// one the device's backend names; the host's is a stream without a queue.
TEST_F(EmulatedDeviceTest, TheContextCarriesItsDevicesStream) {
  mesh::LocalContext on_device({}, device()), on_host;
  EXPECT_EQ(on_device.ctx().stream, (Stream{device(), test::emulated_stream(0)}));
  EXPECT_NE(on_device.ctx().stream.handle, nullptr);
  EXPECT_EQ(on_device.ctx().stream, device_stream(device()));
  EXPECT_EQ(on_host.ctx().stream, Stream{Device::cpu()});
  EXPECT_EQ(on_host.ctx().stream.handle, nullptr);
}

TEST_F(EmulatedDeviceTest, ATrainerRefusesAStreamOfAnotherDevice) {
  mesh::LocalContext host;
  Context mixed{host.mesh(), host.pools(), nullptr, device_stream(device())};
  expect_refused([&] { Trainer t(config(), mixed); },
                 "trainer: the Context's stream (on cuda:0) is not the stream of its pools' device cpu");
  mesh::LocalContext on_device({}, device());
  static char other_queue;
  Context other{on_device.mesh(), on_device.pools(), nullptr, Stream{device(), &other_queue}};
  expect_refused([&] { Trainer t(config(), other); },
                 "trainer: the Context's stream (another stream of cuda:0) is not the stream of its pools' device "
                 "cuda:0");
}

TEST_F(EmulatedDeviceTest, WhatADeviceRunDoesNotDoYetIsRefusedClearly) {
  RunConfig ps = config();
  ps.parallel.mode = "ps";
  expect_refused([&] { run_on(ps, device(), dir_ / "ps"); }, "parameter-server training");
  RunConfig fp16_tp = config();
  fp16_tp.train.dtype = "fp16";
  fp16_tp.parallel.tp = 2;
  expect_refused([&] { run_on(fp16_tp, device(), dir_ / "fp16_tp"); },
                 "train.dtype = fp16 with parallel.tp = 2 runs on CPUs only for now");
}

}  // namespace
}  // namespace loom::train
