// loom plan's step-time model (plan/time_plan.h) and cluster descriptions
// (plan/cluster.h): the model's parts follow the formulas it cites, and a
// cluster file's mistakes are clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include "core/error.h"
#include "model/params.h"
#include "parallel/pp_schedule.h"
#include "plan/cluster.h"
#include "plan/time_plan.h"

namespace loom::plan {
namespace {

train::RunConfig run(const std::string& preset, int64_t seq, int64_t mb, int64_t ga) {
  train::RunConfig c;
  c.model = model::model_preset(preset);
  c.train.seq_len = seq, c.train.micro_batch = mb, c.train.grad_accum = ga;
  c.train.dtype = "bf16";
  return c;
}

// One device's figures with links that cost nothing: only compute remains.
Cluster ideal(int devices) {
  Cluster c = cluster_preset("h100");
  c.devices_per_node = devices;
  c.intra = c.inter = {.bandwidth = 1e30, .latency = 0};
  c.memory_bandwidth = 1e30;
  return c;
}

// One process: the step is 3 forwards' FLOPs (6 N per token and attention)
// at the achieved rate, and MFU is achieved / peak less what the LM head's
// and attention's counts differ by.
TEST(TimePlan, OneDeviceComputesThreeForwardsAtTheAchievedRate) {
  const train::RunConfig c = run("gpt2-124m", 1024, 8, 2);
  const Cluster cl = ideal(1);
  const StepTime t = predict_step_time(c, cl);
  EXPECT_EQ(t.tp, 0.0);
  EXPECT_EQ(t.bubble, 0.0);
  EXPECT_EQ(t.dp, 0.0);
  const double tokens = 8.0 * 2 * 1024;
  EXPECT_NEAR(t.total, t.compute, 1e-12);
  EXPECT_NEAR(t.tokens_per_second, tokens / t.total, 1e-6 * t.tokens_per_second);
  // 6 N per token within 20 % (the model counts the head's matmul, not the embedding lookup).
  const double six_n = 6.0 * static_cast<double>(model::param_count(c.model)) * tokens / cl.achieved("bf16");
  EXPECT_GT(t.compute, 0.8 * six_n);
  EXPECT_LT(t.compute, 1.5 * six_n);
  EXPECT_GT(t.mfu, 0.5);
  EXPECT_LE(t.mfu, 0.75);
}

// Full recompute runs the blocks' forward again (not the LM head's), selective
// only their attention core: between 3 and 4 forwards, selective cheaper.
TEST(TimePlan, RecomputeRepeatsTheBlocksForwardNotTheHead) {
  train::RunConfig c = run("gpt2-124m", 1024, 4, 1);
  const double none = predict_step_time(c, ideal(1)).compute;
  c.train.recompute = "full";
  const double full = predict_step_time(c, ideal(1)).compute;
  c.train.recompute = "selective";
  const double selective = predict_step_time(c, ideal(1)).compute;
  EXPECT_GT(full / none, 1.2);
  EXPECT_LT(full / none, 4.0 / 3.0);
  EXPECT_GT(selective, none);
  EXPECT_LT(selective, full);
}

// The pipeline's idle time is the schedule simulator's: (pp - 1) / m of the
// busy time for 1F1B with equal stages (Narayanan et al. 2021).
TEST(TimePlan, PipelineBubbleIsTheSchedulesUnitTimeBubble) {
  train::RunConfig c = run("gpt2-124m", 1024, 1, 8);
  c.model.tie_embeddings = false;
  c.parallel.pp = 4;
  const StepTime t = predict_step_time(c, ideal(4));
  EXPECT_GT(t.bubble, 0.0);
  // The slowest stage (the head's) sets the pace: (pp - 1) / m of its busy time.
  EXPECT_NEAR(t.bubble / (t.compute), 3.0 / 8.0, 1e-9);
}

// tp's collectives cost what a ring all-reduce of the residual stream does:
// 4 per layer, 2 (n - 1) (alpha + S / (n beta)) each.
TEST(TimePlan, TensorParallelismPaysFourRingAllReducesPerLayer) {
  train::RunConfig c = run("gpt2-124m", 1024, 2, 1);
  c.parallel.tp = 4;
  Cluster cl = ideal(4);
  cl.intra = {.bandwidth = 100e9, .latency = 10e-6};
  const StepTime t = predict_step_time(c, cl);
  const double S = 2.0 * 1024 * 768 * 2;  // bytes of the bf16 residual stream
  const double one = 2 * 3 * (10e-6 + S / (4 * 100e9));
  EXPECT_NEAR(t.tp, 4 * 12 * one, 1e-12);
}

// A group spread over two nodes pays the inter-node link.
TEST(TimePlan, DataParallelismAcrossNodesPaysTheInterNodeLink) {
  train::RunConfig c = run("gpt2-124m", 1024, 1, 1);
  c.parallel.dp = 16, c.parallel.zero_stage = 1;
  Cluster cl = cluster_preset("h100", 2);
  const double across = predict_step_time(c, cl).dp;
  c.parallel.dp = 8;
  const double within = predict_step_time(c, cluster_preset("h100", 1)).dp;
  EXPECT_GT(across, within);
}

// A ring step uses the link's collective figures where the cluster has
// them (as --calibrate measures them through MPI's all-reduce).
TEST(TimePlan, RingCollectivesUseTheLinksCollectiveFigures) {
  train::RunConfig c = run("gpt2-124m", 1024, 2, 1);
  c.parallel.tp = 4;
  Cluster cl = ideal(4);
  cl.intra = {.bandwidth = 100e9, .latency = 10e-6, .collective_bandwidth = 20e9, .collective_latency = 40e-6};
  const double S = 2.0 * 1024 * 768 * 2;
  EXPECT_NEAR(predict_step_time(c, cl).tp, 4 * 12 * 2 * 3 * (40e-6 + S / (4 * 20e9)), 1e-12);
}

// On a CPU whose cores the ranks share, nothing hides a transfer: data
// parallelism pays its whole all-reduce, where devices of their own hide
// it behind the last backward. ZeRO 2 reduce-scatters every micro-batch.
TEST(TimePlan, SharedCoresHideNoTransferAndZeroTwoReducesEveryMicroBatch) {
  train::RunConfig c = run("gpt2-124m", 256, 1, 4);
  c.train.dtype = "fp32";
  c.parallel.dp = 2;
  Cluster gpu = ideal(2);
  gpu.intra = {.bandwidth = 1e12, .latency = 0};  // 0.5 ms for the 0.5 GB of gradients: hidden
  Cluster cpu = gpu;
  cpu.shared_cores = true;
  const double grads = 4.0 * static_cast<double>(model::param_count(c.model));
  EXPECT_EQ(predict_step_time(c, gpu).dp, 0.0);
  EXPECT_NEAR(predict_step_time(c, cpu).dp, 2 * (grads / 2) / 1e12, 1e-12);
  c.parallel.zero_stage = 2;  // a reduce-scatter each of 4 micro-batches, then the parameters' all-gather
  EXPECT_NEAR(predict_step_time(c, cpu).dp, 4 * (grads / 2) / 1e12 + (grads / 2) / 1e12, 1e-12);
}

// Expert parallelism pays, per MoE layer and micro-batch, its rows'
// dispatch and combine forward and both gradients backward: to each of the
// ep - 1 others a count message and B T k C / ep elements.
TEST(TimePlan, ExpertParallelismPaysItsAllToAlls) {
  train::RunConfig c = run("llama-tiny", 64, 2, 3);
  c.model.n_expert = 4, c.model.top_k = 2, c.model.moe_every = 1;
  c.parallel.dp = 4, c.parallel.ep = 2;
  Cluster cl = ideal(4);
  cl.intra = {.bandwidth = 10e9, .latency = 20e-6};
  const StepTime t = predict_step_time(c, cl);
  const double rows = 2.0 * 64 * 2, bytes = rows * static_cast<double>(c.model.n_embd) * 2 / 2;
  const double exchange = 1 * (20e-6 + 20e-6 + bytes / 10e9);
  EXPECT_NEAR(t.ep, 3.0 * static_cast<double>(c.model.n_layer) * 4 * exchange, 1e-12);
  c.parallel.ep = 1;
  EXPECT_EQ(predict_step_time(c, cl).ep, 0.0);
}

TEST(TimePlan, ALayoutLargerThanTheClusterIsAClearError) {
  train::RunConfig c = run("gpt2-124m", 1024, 1, 1);
  c.parallel.dp = 16;
  try {
    (void)predict_step_time(c, cluster_preset("h100", 1));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs 16 devices"), std::string::npos) << e.what();
  }
}

std::string write(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

TEST(Cluster, ATomlFileReadsBackAsWritten) {
  const Cluster a = cluster_preset("a100", 3);
  const Cluster b = load_cluster(write("a100.toml", cluster_toml(a)));
  EXPECT_EQ(b.nodes, 3);
  EXPECT_EQ(b.devices_per_node, 8);
  EXPECT_NEAR(b.memory_bytes, a.memory_bytes, 1e-5 * a.memory_bytes);
  EXPECT_NEAR(b.achieved("bf16"), a.achieved("bf16"), 1e-5 * a.achieved("bf16"));
  EXPECT_NEAR(b.inter.bandwidth, a.inter.bandwidth, 1e-5 * a.inter.bandwidth);
  EXPECT_NEAR(b.intra.latency, a.intra.latency, 1e-12);
  EXPECT_EQ(b.shared_cores, a.shared_cores);
  EXPECT_EQ(b.intra.collective_bandwidth, 0.0);  // none given: a ring step is a message
  Cluster m = a;
  m.intra.collective_bandwidth = 3e9, m.intra.collective_latency = 25e-6;
  const Cluster n = load_cluster(write("measured.toml", cluster_toml(m)));
  EXPECT_NEAR(n.intra.collective_bandwidth, 3e9, 1e-5 * 3e9);
  EXPECT_NEAR(n.intra.collective_latency, 25e-6, 1e-12);
  EXPECT_NEAR(n.intra.ring_step().bandwidth, 3e9, 1e-5 * 3e9);
  EXPECT_EQ(n.inter.collective_bandwidth, 0.0);
}

std::string error_of(const std::string& text) {
  try {
    (void)load_cluster(write("bad.toml", text));
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Cluster, MistakesInAClusterFileAreClearErrors) {
  const std::string good = cluster_toml(cluster_preset("h100"));
  EXPECT_NE(error_of("[cluster]\nnodes = 1\n").find("devices_per_node is missing"), std::string::npos);
  std::string bad = good;
  bad.replace(bad.find("nodes = 1"), 9, "nodes = 0");
  EXPECT_NE(error_of(bad).find("nodes is missing or invalid"), std::string::npos);
  EXPECT_NE(error_of(good + "\n[cluster.extra]\n").find("unknown key extra"), std::string::npos);
  EXPECT_NE(error_of("x = [").find("not a valid TOML file"), std::string::npos);
  bad = good;
  bad.replace(bad.find("latency_us = 5"), 14, "latency_us = 5\ncollective_latency_us = 9");
  EXPECT_NE(error_of(bad).find("collective_bandwidth_gbs is missing"), std::string::npos) << error_of(bad);
  EXPECT_THROW(cluster_preset("tpu"), Error);
  EXPECT_THROW((void)cluster_preset("h100").achieved("int8"), Error);
}

}  // namespace
}  // namespace loom::plan
