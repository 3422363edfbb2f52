// loom plan --calibrate over MPI (tests/mpi.cmake runs it at 1, 2, 3, 4 and
// 8 ranks): every rank returns rank 0's figures, and with two or more ranks
// the link is a ping-pong between ranks 0 and 1 and a ring all-reduce's
// step, measured, in the band of a real machine. Small GEMM shapes and messages keep it to seconds.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/mpi_env.h"
#include "core/tensor.h"
#include "plan/calibrate.h"

namespace loom::plan {
namespace {

using test::world;

const Cluster& measured() {
  static const Cluster c = [] {
    CalibrateOptions o;
    o.seconds_per_measure = 0.02;
    o.gemm_shapes = {{256, 768, 768}, {512, 512, 512}};
    o.bandwidth_bytes = int64_t{64} << 20;
    o.max_message_bytes = int64_t{4} << 20;
    return calibrate(world(), o);
  }();
  return c;
}

// Every figure's bits, and a hash of each string.
std::vector<int64_t> fingerprint(const Cluster& c) {
  std::vector<double> figures = {double(c.nodes), double(c.devices_per_node), c.memory_bytes, c.memory_bandwidth,
                                 c.intra.bandwidth, c.intra.latency, c.inter.bandwidth, c.inter.latency,
                                 c.intra.collective_bandwidth, c.intra.collective_latency};
  for (const auto* m : {&c.achieved_flops, &c.peak_flops})
    for (const auto& [dtype, flops] : *m) figures.push_back(flops);
  std::vector<int64_t> words;
  for (double f : figures) words.push_back(std::bit_cast<int64_t>(f));
  for (const std::string* s : {&c.name, &c.source})
    words.push_back(static_cast<int64_t>(std::hash<std::string>{}(*s)));
  return words;
}

TEST(CalibrateMpi, EveryRankReturnsRank0sFigures) {
  std::vector<int64_t> mine = fingerprint(measured());
  const auto n = static_cast<int64_t>(mine.size());
  std::vector<int64_t> all(static_cast<size_t>(n * world().size()));
  world().all_gather(Tensor(all.data(), DType::i64, {n * world().size()}), Tensor(mine.data(), DType::i64, {n}))
      ->wait();
  for (int r = 1; r < world().size(); ++r)
    EXPECT_EQ(std::vector<int64_t>(all.begin() + r * n, all.begin() + (r + 1) * n),
              std::vector<int64_t>(all.begin(), all.begin() + n))
        << "rank " << r;
}

TEST(CalibrateMpi, LinkIsMeasuredBetweenTwoRanksAndPlausible) {
  const Cluster& c = measured();
  EXPECT_GT(c.intra.latency, 0);
  EXPECT_LT(c.intra.latency, 1.0);
  EXPECT_GT(c.intra.bandwidth, 1e6);
  EXPECT_LT(c.intra.bandwidth, 1e13);
  EXPECT_EQ(c.inter.bandwidth, c.intra.bandwidth);
  EXPECT_EQ(c.inter.latency, c.intra.latency);
  // With a peer, a ring all-reduce's step is measured too (none alone).
  if (world().size() >= 2) {
    EXPECT_GT(c.intra.collective_bandwidth, 1e6);
    EXPECT_LT(c.intra.collective_bandwidth, 1e13);
    EXPECT_GE(c.intra.collective_latency, 0);
    EXPECT_LT(c.intra.collective_latency, 1.0);
    EXPECT_NE(c.source.find("one step of a ring all-reduce"), std::string::npos) << c.source;
  } else {
    EXPECT_EQ(c.intra.collective_bandwidth, 0);
  }
  EXPECT_EQ(c.inter.collective_bandwidth, c.intra.collective_bandwidth);
  const bool measured_link = c.source.find("ping-pong between ranks 0 and 1") != std::string::npos;
  const bool estimated = c.source.find("estimated, not measured") != std::string::npos;
  EXPECT_EQ(measured_link, world().size() >= 2) << c.source;
  EXPECT_EQ(estimated, world().size() == 1) << c.source;
  if (world().rank() == 0)
    std::printf("%d rank(s): link %.3g B/s + %.3g s, ring step %.3g B/s + %.3g s, fp32 %.3g FLOP/s, memory %.3g B/s\n",
                world().size(), c.intra.bandwidth, c.intra.latency, c.intra.collective_bandwidth,
                c.intra.collective_latency, c.achieved_flops.at("fp32"), c.memory_bandwidth);
}

}  // namespace
}  // namespace loom::plan
