// log.trace: a tiny run writes a Chrome trace event file of its steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tiny_run.h"
#include "train/trainer.h"
#include "mesh/context.h"

namespace loom::train {
namespace {

class TrainerTraceTest : public TinyRunTest {
 protected:
  TrainerTraceTest() : TinyRunTest("loom_test_trainer_trace") {}
};

struct Span {
  std::string name;
  double ts, dur;
};

TEST_F(TrainerTraceTest, TwoStepRunWritesForwardBackwardAndOptimizerSpansInOrder) {
  RunConfig cfg = config();
  cfg.train.steps = 2;
  cfg.train.eval_every = 1;
  cfg.log.trace = (dir_ / "trace.json").string();
  TrainOptions options;
  options.progress = false;
  run_training(cfg, options, mesh::LocalContext().ctx());

  std::ifstream in(cfg.log.trace);
  ASSERT_TRUE(in.good());
  const nlohmann::json doc = nlohmann::json::parse(in);
  EXPECT_EQ(doc.at("displayTimeUnit"), "ms");
  std::vector<Span> spans;
  bool named = false;
  for (const nlohmann::json& e : doc.at("traceEvents")) {
    EXPECT_EQ(e.at("pid"), 0);
    if (e.at("ph") == "M") {
      named = e.at("name") == "process_name" && e.at("args").at("name") == "rank 0";
      continue;
    }
    ASSERT_EQ(e.at("ph"), "X");
    spans.push_back({e.at("name"), e.at("ts"), e.at("dur")});
    EXPECT_GT(spans.back().dur, 0.0) << e;
    EXPECT_GE(spans.back().ts, 0.0) << e;
  }
  EXPECT_TRUE(named);
  auto count = [&](const std::string& name) {
    return std::count_if(spans.begin(), spans.end(), [&](const Span& s) { return s.name == name; });
  };
  const int64_t micro_batches = cfg.train.steps * cfg.train.grad_accum;
  EXPECT_EQ(count("forward"), micro_batches);
  EXPECT_EQ(count("backward"), micro_batches);
  EXPECT_EQ(count("grad sync wait"), cfg.train.steps);
  EXPECT_EQ(count("optimizer"), cfg.train.steps);
  EXPECT_EQ(count("evaluate"), 1 + cfg.train.steps);  // before the first step and after each
  EXPECT_EQ(count("checkpoint"), 0);

  // Events come in begin order: each micro-batch's forward ends before its
  // backward begins, and a step's optimizer follows its last backward.
  std::vector<std::string> order;
  const Span* forward = nullptr;
  const Span* backward = nullptr;
  for (const Span& s : spans) {
    if (s.name == "forward") forward = &s;
    if (s.name == "backward") {
      ASSERT_NE(forward, nullptr);
      EXPECT_LE(forward->ts + forward->dur, s.ts);
      backward = &s;
    }
    if (s.name == "optimizer") {
      ASSERT_NE(backward, nullptr);
      EXPECT_LE(backward->ts + backward->dur, s.ts);
    }
    if (s.name != "evaluate") order.push_back(s.name);
  }
  std::vector<std::string> expected;
  for (int64_t i = 0; i < cfg.train.steps; ++i) {
    for (int64_t k = 0; k < cfg.train.grad_accum; ++k) expected.insert(expected.end(), {"forward", "backward"});
    expected.insert(expected.end(), {"grad sync wait", "optimizer"});
  }
  EXPECT_EQ(order, expected);
  EXPECT_FALSE(std::filesystem::exists(cfg.log.trace + ".rank0"));
}

TEST_F(TrainerTraceTest, CheckpointsAppearAsSpans) {
  RunConfig cfg = config();
  cfg.train.steps = 2;
  cfg.train.eval_every = 0;
  cfg.checkpoint.dir = (dir_ / "ckpt").string();
  cfg.checkpoint.every = 1;
  cfg.log.trace = (dir_ / "trace.json").string();
  TrainOptions options;
  options.progress = false;
  run_training(cfg, options, mesh::LocalContext().ctx());
  const nlohmann::json doc = nlohmann::json::parse(std::ifstream(cfg.log.trace));
  int checkpoints = 0;
  for (const nlohmann::json& e : doc.at("traceEvents"))
    if (e.at("name") == "checkpoint") {
      ++checkpoints;
      EXPECT_GT(e.at("dur").get<double>(), 0.0);
    }
  EXPECT_EQ(checkpoints, cfg.train.steps);
}

// log.trace_ops: every kernel op is a span inside the phase that called it
// (a layer's attention inside each forward and backward, AdamW inside the
// optimizer), with no device track on the CPU, and the run's bits are the
// untraced run's.
TEST_F(TrainerTraceTest, TraceOpsPutsEachKernelOpInsideThePhaseThatCalledIt) {
  RunConfig cfg = config();
  cfg.train.steps = 2;
  cfg.train.eval_every = 0;
  TrainOptions options;
  options.progress = false;
  const TrainSummary plain = run_training(cfg, options, mesh::LocalContext().ctx());
  cfg.log.trace = (dir_ / "trace.json").string();
  cfg.log.trace_ops = true;
  const TrainSummary traced = run_training(cfg, options, mesh::LocalContext().ctx());
  ASSERT_EQ(traced.steps.size(), plain.steps.size());
  for (size_t i = 0; i < plain.steps.size(); ++i) {
    EXPECT_EQ(traced.steps[i].loss, plain.steps[i].loss);
    EXPECT_EQ(traced.steps[i].grad_norm, plain.steps[i].grad_norm);
  }

  const nlohmann::json doc = nlohmann::json::parse(std::ifstream(cfg.log.trace));
  std::vector<Span> phases, ops;
  for (const nlohmann::json& e : doc.at("traceEvents")) {
    if (e.at("ph") == "M") continue;
    EXPECT_EQ(e.at("tid"), 0) << e;  // no device track
    const Span s{e.at("name"), e.at("ts"), e.at("dur")};
    const bool phase = s.name == "forward" || s.name == "backward" || s.name == "optimizer" ||
                       s.name == "grad sync wait";
    (phase ? phases : ops).push_back(s);
  }
  // Which phase holds an op span (its interval within the phase's).
  auto phase_of = [&](const Span& op) -> std::string {
    for (const Span& p : phases)
      if (op.ts >= p.ts && op.ts + op.dur <= p.ts + p.dur + 2e-3) return p.name;
    return "";
  };
  std::map<std::string, std::map<std::string, int64_t>> in;  // op -> phase -> spans
  for (const Span& op : ops) ++in[op.name][phase_of(op)];
  const int64_t micro_batches = cfg.train.steps * cfg.train.grad_accum;
  const int64_t layers = cfg.model.n_layer;
  EXPECT_EQ(in["attention_forward"]["forward"], layers * micro_batches);
  EXPECT_EQ(in["attention_backward"]["backward"], layers * micro_batches);
  EXPECT_EQ(in["layernorm_forward"]["forward"], (layers + 1) * micro_batches);  // ln_1 and ln_f
  EXPECT_EQ(in["add_layernorm_forward"]["forward"], layers * micro_batches);      // ln_2 with its residual
  EXPECT_EQ(in["linear_gelu_forward"]["forward"], layers * micro_batches);  // c_fc with its GELU
  // The loss and its gradient in one pass, in forward (the trainer gives it
  // the backward's dloss).
  EXPECT_EQ(in["cross_entropy_forward_backward"]["forward"], micro_batches);
  EXPECT_EQ(in["cross_entropy_forward_backward"].size(), 1u);
  EXPECT_GE(in["adamw_step"]["optimizer"], cfg.train.steps);
  EXPECT_EQ(in["adamw_step"].size(), 1u);  // only in the optimizer
  EXPECT_EQ(in["attention_forward"].size(), 1u);
}

// Under selective recompute the backward rebuilds GELU's output from the
// saved c_fc output with gelu_forward, so the forward takes the same two ops
// rather than the fused one (whose GPU epilogue reads the unrounded sum).
TEST_F(TrainerTraceTest, SelectiveRecomputeKeepsTheGeluOutOfTheGemm) {
  RunConfig cfg = config();
  cfg.train.steps = 2;
  cfg.train.eval_every = 0;
  cfg.train.recompute = "selective";
  cfg.log.trace = (dir_ / "trace.json").string();
  cfg.log.trace_ops = true;
  TrainOptions options;
  options.progress = false;
  run_training(cfg, options, mesh::LocalContext().ctx());
  const nlohmann::json doc = nlohmann::json::parse(std::ifstream(cfg.log.trace));
  std::map<std::string, int64_t> calls;
  for (const nlohmann::json& e : doc.at("traceEvents"))
    if (e.at("ph") != "M") ++calls[e.at("name").get<std::string>()];
  const int64_t layers = cfg.model.n_layer, micro_batches = cfg.train.steps * cfg.train.grad_accum;
  EXPECT_EQ(calls["linear_gelu_forward"], 0);
  EXPECT_EQ(calls["gelu_forward"], 2 * layers * micro_batches);  // the forward's, and the backward's again
}

}  // namespace
}  // namespace loom::train
