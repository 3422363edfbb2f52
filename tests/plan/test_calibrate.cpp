// loom plan --calibrate's measurements on one process (a world of one: the
// link is estimated, not measured; tests/plan/mpi_test_calibrate.cpp
// measures it between two ranks). The figures are this machine's, so the
// checks are bands every real machine falls in, not values. Small GEMM
// shapes and a short time per measure keep the file to seconds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/self_communicator.h"
#include "core/error.h"
#include "core/threads.h"
#include "kernels/ops.h"
#include "model/config.h"
#include "model/model.h"
#include "plan/calibrate.h"

namespace loom::plan {
namespace {

CalibrateOptions quick_options() {
  CalibrateOptions o;
  o.seconds_per_measure = 0.02;
  o.gemm_shapes = {{256, 768, 768}, {512, 512, 512}, {256, 1024, 512}};
  o.bandwidth_bytes = int64_t{256} << 20;
  o.max_message_bytes = int64_t{1} << 20;
  return o;
}

// One calibration shared by the tests that read its figures.
const Cluster& measured() {
  static const Cluster c = [] {
    comm::SelfCommunicator world("world");
    return calibrate(world, quick_options());
  }();
  return c;
}

bool positive_finite(double v) { return v > 0 && std::isfinite(v); }

TEST(Calibrate, EveryFigureIsPositiveAndFinite) {
  const Cluster& c = measured();
  EXPECT_EQ(c.nodes, 1);
  EXPECT_GE(c.devices_per_node, 1);
  EXPECT_TRUE(positive_finite(c.memory_bytes)) << c.memory_bytes;
  EXPECT_TRUE(positive_finite(c.memory_bandwidth)) << c.memory_bandwidth;
  for (const auto* figures : {&c.achieved_flops, &c.peak_flops})
    for (const auto& [dtype, flops] : *figures) EXPECT_TRUE(positive_finite(flops)) << dtype << " " << flops;
  for (const Link* l : {&c.intra, &c.inter}) {
    EXPECT_TRUE(positive_finite(l->bandwidth)) << l->bandwidth;
    EXPECT_TRUE(positive_finite(l->latency)) << l->latency;
  }
  EXPECT_NE(c.name.find("this machine: "), std::string::npos) << c.name;
  EXPECT_NE(c.source.find("measured by loom plan --calibrate"), std::string::npos) << c.source;
  std::printf("calibrated: %s\n  fp32 %.3g FLOP/s, bf16 %.3g FLOP/s, memory %.3g B/s, %d devices of %.3g B, "
              "link %.3g B/s + %.3g s\n  source: %s\n",
              c.name.c_str(), c.achieved_flops.at("fp32"),
              c.achieved_flops.contains("bf16") ? c.achieved_flops.at("bf16") : 0.0, c.memory_bandwidth,
              c.devices_per_node, c.memory_bytes, c.intra.bandwidth, c.intra.latency, c.source.c_str());
}

TEST(Calibrate, Fp32FlopsAndMemoryBandwidthAreInTheBandOfARealCpu) {
  const Cluster& c = measured();
  const double fp32 = c.achieved_flops.at("fp32");
  EXPECT_GT(fp32, 1e8);
  EXPECT_LT(fp32, 1e13);
  EXPECT_GT(c.memory_bandwidth, 1e8);
  EXPECT_LT(c.memory_bandwidth, 1e13);
}

TEST(Calibrate, Bf16IsListedExactlyWhenTheCpuHasANativeBf16Gemm) {
  const bool native = kernels::bf16_matmul_unsupported_reason().empty();
  EXPECT_EQ(measured().achieved_flops.contains("bf16"), native);
  EXPECT_TRUE(measured().achieved_flops.contains("fp32"));
}

TEST(Calibrate, PeakIsTheAchievedFigureOnACpu) {
  EXPECT_EQ(measured().peak_flops, measured().achieved_flops);
  EXPECT_NE(measured().source.find("peak = achieved"), std::string::npos) << measured().source;
}

TEST(Calibrate, DevicesAreTheCoresAndShareTheHostMemory) {
  const Cluster& c = measured();
  EXPECT_EQ(c.devices_per_node, default_num_threads());  // one thread per device: a device is a core
  EXPECT_DOUBLE_EQ(c.memory_bytes * c.devices_per_node, static_cast<double>(model::host_memory_bytes()));
}

TEST(Calibrate, OneRankLinkIsEstimatedFromMemoryAndSaysSo) {
  const Cluster& c = measured();
  EXPECT_NE(c.source.find("estimated, not measured"), std::string::npos) << c.source;
  EXPECT_NE(c.source.find("mpirun -np 2 loom plan --calibrate"), std::string::npos) << c.source;
  EXPECT_DOUBLE_EQ(c.intra.bandwidth, c.memory_bandwidth / 2);
  EXPECT_LT(c.intra.latency, 1e-3);  // a copy to itself
  EXPECT_EQ(c.inter.bandwidth, c.intra.bandwidth);
  EXPECT_EQ(c.inter.latency, c.intra.latency);
}

TEST(Calibrate, LeavesTheThreadCountAsItFoundIt) {
  set_num_threads(2);
  measured();
  comm::SelfCommunicator world("world");
  CalibrateOptions o = quick_options();
  o.gemm_shapes = {{64, 64, 64}};
  o.bandwidth_bytes = int64_t{1} << 20;
  calibrate(world, o);
  EXPECT_EQ(num_threads(), 2);
}

TEST(Calibrate, RejectsOptionsItCannotMeasureWith) {
  comm::SelfCommunicator world("world");
  for (auto bad : {+[](CalibrateOptions& o) { o.threads = 0; }, +[](CalibrateOptions& o) { o.seconds_per_measure = 0; },
                   +[](CalibrateOptions& o) { o.gemm_shapes.clear(); },
                   +[](CalibrateOptions& o) { o.gemm_shapes = {{0, 8, 8}}; },
                   +[](CalibrateOptions& o) { o.gemm_counts = {1}; },
                   +[](CalibrateOptions& o) { o.gemm_counts = {1, 0, 1}; },
                   +[](CalibrateOptions& o) { o.max_message_bytes = 1000; }}) {
    CalibrateOptions o = quick_options();
    bad(o);
    EXPECT_THROW(calibrate(world, o), Error);
  }
}

// A model's own GEMMs: GPT-2's four linears per layer and its tied
// embedding as the head, their FLOPs 2 tokens (12 C^2 L + V C) with d_ff =
// 4 C; a Llama MoE layer's experts see tokens x top_k / n_expert rows.
TEST(Calibrate, AModelsGemmsAreItsLinearsAndItsHead) {
  model::ModelConfig c = model::model_preset("gpt2-tiny");
  const int64_t T = 96, C = c.n_embd, L = c.n_layer, V = c.vocab_size;
  const ModelGemms g = model_gemm_shapes(c, T);
  ASSERT_EQ(g.shapes.size(), 5u);
  double flops = 0;
  for (size_t i = 0; i < g.shapes.size(); ++i) {
    EXPECT_EQ(g.shapes[i].m, T);
    flops += g.counts[i] * 2.0 * static_cast<double>(g.shapes[i].m * g.shapes[i].n * g.shapes[i].k);
  }
  EXPECT_EQ(flops, 2.0 * T * (12.0 * C * C * L + static_cast<double>(V * C)));
  model::ModelConfig m = model::model_preset("llama-tiny");
  m.n_expert = 4, m.top_k = 2, m.tie_embeddings = false;
  const ModelGemms e = model_gemm_shapes(m, 64);
  bool experts = false, head = false;
  for (const GemmShape& s : e.shapes) {
    experts = experts || (s.m == 64 * 2 / 4 && s.n == m.d_ff && s.k == m.n_embd);
    head = head || (s.m == 64 && s.n == m.vocab_size);
  }
  EXPECT_TRUE(experts);
  EXPECT_TRUE(head);  // the untied lm_head; the embedding table is a lookup
  EXPECT_THROW(model_gemm_shapes(c, 0), Error);
}

// With counts the figure is the shapes' FLOPs over their time, and the
// source says what was timed.
TEST(Calibrate, AModelsGemmsGiveTheirFlopWeightedRate) {
  comm::SelfCommunicator world("world");
  CalibrateOptions o = quick_options();
  const ModelGemms g = model_gemm_shapes(model::model_preset("gpt2-tiny"), 128);
  o.gemm_shapes = g.shapes, o.gemm_counts = g.counts, o.gemm_source = "gpt2-tiny's GEMMs";
  const Cluster c = calibrate(world, o);
  EXPECT_TRUE(positive_finite(c.achieved("fp32")));
  EXPECT_NE(c.source.find("the FLOPs over the time of gpt2-tiny's GEMMs (5 distinct shapes"), std::string::npos)
      << c.source;
}

// Times of an exact alpha-beta link, 8 B to 64 MiB.
void exact_times(double latency, double bandwidth, std::vector<double>& bytes, std::vector<double>& seconds) {
  for (double n = 8; n <= double(int64_t{64} << 20); n *= 4) {
    bytes.push_back(n);
    seconds.push_back(latency + n / bandwidth);
  }
}

TEST(Calibrate, FitRecoversTheLatencyAndBandwidthOfExactTimes) {
  std::vector<double> bytes, seconds;
  exact_times(3e-6, 12e9, bytes, seconds);
  const Link l = fit_link(bytes, seconds);
  EXPECT_NEAR(l.latency, 3e-6, 3e-6 * 1e-9);
  EXPECT_NEAR(l.bandwidth, 12e9, 12e9 * 1e-9);
}

TEST(Calibrate, FitWeighsSmallMessagesForLatencyAndLargeForBandwidth) {
  // 10% noise on every point: an unweighted fit would let the 64 MiB
  // point's absolute error (0.5 ms) swamp a 3 us latency.
  std::vector<double> bytes, seconds;
  exact_times(3e-6, 12e9, bytes, seconds);
  for (size_t i = 0; i < seconds.size(); ++i) seconds[i] *= i % 2 == 0 ? 1.1 : 0.9;
  const Link l = fit_link(bytes, seconds);
  EXPECT_NEAR(l.latency, 3e-6, 0.5e-6);
  EXPECT_NEAR(l.bandwidth, 12e9, 2e9);
}

TEST(Calibrate, FitOfANegativeLatencyKeepsLatencyZero) {
  const std::vector<double> bytes = {1e6, 2e6, 4e6}, seconds = {0.9e-4, 2e-4, 4.1e-4};
  const Link l = fit_link(bytes, seconds);
  EXPECT_EQ(l.latency, 0);
  EXPECT_GT(l.bandwidth, 9e9);
  EXPECT_LT(l.bandwidth, 11e9);
}

TEST(Calibrate, FitNeedsTwoSizesAndGrowingTimes) {
  const std::vector<double> one = {8}, one_time = {1e-6};
  EXPECT_THROW(fit_link(one, one_time), Error);
  const std::vector<double> same = {8, 8}, same_times = {1e-6, 2e-6};
  EXPECT_THROW(fit_link(same, same_times), Error);
  const std::vector<double> bytes = {8, 1e6}, shrinking = {2e-6, 1e-6};
  EXPECT_THROW(fit_link(bytes, shrinking), Error);
}

}  // namespace
}  // namespace loom::plan
