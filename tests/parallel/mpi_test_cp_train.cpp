// Context parallelism end to end (parallel/cp.h through train::Trainer on
// mesh groups): every layout with a cp axis trains like one process holding
// the whole sequences and the whole global batch, 20 steps, fp32 losses
// within 1e-5.
//
// World N: cp = N for N = 2, 3, 4 (GPT-2 and Llama with GQA, ring and
// all-gather), recompute full and selective at N = 2; dp 2 x cp 2 under
// ZeRO-1 and ZeRO-3, cp 2 x tp 2 with SP and cp 2 x pp 2 (1F1B) at N = 4;
// dp 2 x cp 2 x tp 2 and cp = 8 at N = 8; bf16 and fp16 at N = 2 within
// their rounding. The single-process reference runs on rank 0 alone and is
// broadcast.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/ops.h"
#include "parallel/dp_run.h"

namespace loom::test {
namespace {

using train::RunConfig;

constexpr int64_t kSteps = 20;
constexpr double kTolerance = 1e-5;  // the bound, fp32

// Heads every tp of 2 divides; the Llama groups 24 query heads over 12
// key/value heads. max_seq_len 64 holds the 48-token sequences.
model::ModelConfig cp_model(const std::string& family, int64_t layers) {
  model::ModelConfig m = model::model_preset(family == "gpt2" ? "gpt2-tiny" : "llama-tiny");
  m.n_layer = layers, m.n_embd = 96, m.d_ff = family == "gpt2" ? 384 : 240, m.vocab_size = 512;
  m.n_head = family == "gpt2" ? 12 : 24, m.n_kv_head = 12;
  return m;
}

struct Layout {
  const char* family;
  int dp = 1, cp = 1, tp = 1, pp = 1;
  const char* algo = "ring";
  int zero_stage = 0;
  const char* recompute = "none";
  std::string name() const {
    return concat(family, " dp=", dp, " cp=", cp, " tp=", tp, " pp=", pp, " ", algo, " zero_stage=", zero_stage,
                  " recompute=", recompute);
  }
};

class ContextParallelTrainTest : public SharedDataTest<"loom_mpi_cp", 8000> {
 protected:
  // 8 sequences of 48 tokens per step over the dp ranks: 48 splits into
  // 2 x cp zig-zag chunks for cp = 2, 3, 4 and 8, and each rank's share
  // into tp = 2 for SP. Under pp: 4 micro-batches of 2 / dp sequences.
  static RunConfig config(const Layout& l) {
    const bool pipelined = l.pp > 1;
    RunConfig c = pipelined ? dp_config(dir_, l.dp, l.zero_stage, 2 / l.dp, 4)
                            : dp_config(dir_, l.dp, l.zero_stage, 8 / l.dp, 1);
    c.train.seq_len = 48;
    c.model = cp_model(l.family, pipelined ? 4 : 2);
    c.parallel.cp = l.cp, c.parallel.cp_algo = l.algo;
    c.parallel.tp = l.tp, c.parallel.sequence_parallel = l.tp > 1;
    c.parallel.pp = l.pp;
    c.train.recompute = l.recompute;
    return c;
  }
  static RunConfig alone(RunConfig c) {
    c.train.micro_batch *= c.parallel.dp;
    c.parallel.dp = 1, c.parallel.cp = 1, c.parallel.tp = 1, c.parallel.pp = 1;
    c.parallel.zero_stage = 0, c.parallel.sequence_parallel = false;
    c.train.recompute = "none";
    return c;
  }

  static void expect_matches_one_process(const Layout& l) {
    const RunConfig c = config(l);
    expect_mesh_matches_one_process("cp", l.name(), c, alone(c), kSteps, kTolerance, references_);
  }

  static std::map<std::string, std::vector<double>> references_;
};

std::map<std::string, std::vector<double>> ContextParallelTrainTest::references_;

TEST_F(ContextParallelTrainTest, CpEqualsWorldMatchesSingleProcessOver20Steps) {
  const int N = world().size();
  if (N < 2 || N > 4) GTEST_SKIP() << "cp = N runs at N = 2, 3, 4; this world has " << N << " ranks";
  for (const char* family : {"gpt2", "llama"})
    for (const char* algo : {"ring", "allgather"}) expect_matches_one_process({family, 1, N, 1, 1, algo});
}

// Recompute reruns the attention forward (selective: the core; full: the
// block) in backward, and with it the K/V ring.
TEST_F(ContextParallelTrainTest, RecomputeUnderCpMatchesSingleProcess) {
  if (world().size() != 2) GTEST_SKIP() << "runs at N = 2; this world has " << world().size() << " ranks";
  expect_matches_one_process({"gpt2", 1, 2, 1, 1, "ring", 0, "full"});
  expect_matches_one_process({"llama", 1, 2, 1, 1, "ring", 0, "selective"});
}

// dp x cp under ZeRO (gradients and shards over dp x cp), cp x tp with SP
// (SP splits a rank's cp chunks further), cp x pp (each stage's attention
// runs its own cp ring), and all of dp x cp x tp at N = 8.
TEST_F(ContextParallelTrainTest, CpComposesWithDpZeroTpAndPp) {
  const int N = world().size();
  if (N == 4) {
    expect_matches_one_process({"gpt2", 2, 2, 1, 1, "ring", 1});
    expect_matches_one_process({"llama", 2, 2, 1, 1, "allgather", 3});
    expect_matches_one_process({"gpt2", 1, 2, 2, 1, "ring"});
    expect_matches_one_process({"llama", 1, 2, 2, 1, "ring"});
    expect_matches_one_process({"gpt2", 1, 2, 1, 2, "ring"});
  } else if (N == 8) {
    expect_matches_one_process({"llama", 2, 2, 2, 1, "ring", 3});
    expect_matches_one_process({"gpt2", 1, 8, 1, 1, "ring"});
  } else {
    GTEST_SKIP() << "composed meshes run at N = 4 and 8; this world has " << N << " ranks";
  }
}

// 16-bit compute: each block's partial output is rounded to the compute
// dtype before the f32 merge, so the runs differ from one process by the
// rounding of other summation orders (the dp and tp suites' bound).
TEST_F(ContextParallelTrainTest, Bf16AndFp16UnderCpMatchSingleProcessWithinRounding) {
  if (world().size() != 2) GTEST_SKIP() << "runs at N = 2; this world has " << world().size() << " ranks";
  for (const char* dtype : {"bf16", "fp16"}) {
    if (std::string(dtype) == "bf16" && !kernels::bf16_matmul_unsupported_reason().empty()) continue;
    RunConfig c = config({"gpt2", 1, 2});
    c.train.dtype = dtype;
    const std::vector<double> cp = mesh_losses(c, kSteps);
    const std::vector<double> one = reference_losses(alone(c), kSteps, references_);
    const double diff = max_relative_difference(cp, one);
    if (world().rank() == 0) std::printf("[cp N=2] %s: max relative loss difference %.3g\n", dtype, diff);
    EXPECT_LE(diff, 2e-3) << dtype;
  }
}

}  // namespace
}  // namespace loom::test
