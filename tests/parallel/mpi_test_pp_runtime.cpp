// The pipeline runtime (parallel/pp_runtime.h) on a world of N ranks, pp = N:
// every schedule (afab, 1f1b, interleaved over 2 chunks per rank) run for
// one step over m micro-batches gives the loss and the gradients of the
// whole model running the same micro-batches one after the other — GPT-2
// with tied embeddings (the first and last stage's wte gradients summed) and
// Llama untied. pp = 1 with two chunks sends to itself (local copies).
// With a TraceRecorder the run's forwards and backwards are spans in the
// schedule's order, and every receive is posted one compute ahead.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/mpi_env.h"
#include "common/tensors.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/threads.h"
#include "core/trace.h"
#include "model/model.h"
#include "parallel/pp_messages.h"
#include "parallel/pp_runtime.h"
#include "parallel/pp_schedule.h"

namespace loom::parallel {
namespace {

using model::Family;
using model::Model;
using model::ModelConfig;
using model::ParamSpec;
using model::StageOptions;
using test::expect_error;
using test::world;

constexpr int64_t B = 2, T = 8;
constexpr uint64_t kSeed = 11;
constexpr double kTolerance = 1e-6;

// Enough layers for pp x 2 stages (interleaved) at every world size.
ModelConfig test_model(Family family, int pp) {
  ModelConfig c = model::model_preset(family == Family::gpt2 ? "gpt2-tiny" : "llama-tiny");
  c.n_layer = std::max(8, 2 * pp);
  c.tie_embeddings = family == Family::gpt2;
  return c;
}

// Deterministic ids below V.
std::vector<int32_t> ids(int64_t n, int64_t V, uint32_t seed) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t& x : v) seed = seed * 1664525u + 1013904223u, x = static_cast<int32_t>((seed >> 8) % V);
  return v;
}

// m micro-batches of (B, T) tokens and targets, the same on every rank.
struct Batches {
  std::vector<std::vector<int32_t>> data;
  std::vector<Tensor> tokens, targets;
  Batches(int m, int64_t V) {
    data.reserve(static_cast<size_t>(2 * m));
    for (int k = 0; k < m; ++k) {
      data.push_back(ids(B * T, V, 100 + 2 * k));
      tokens.emplace_back(data.back().data(), DType::i32, Shape{B, T});
      data.push_back(ids(B * T, V, 101 + 2 * k));
      targets.emplace_back(data.back().data(), DType::i32, Shape{B, T});
    }
  }
};

std::vector<float> floats(const Tensor& t) {
  const float* p = t.data_as<float>();
  return std::vector<float>(p, p + t.numel());
}

struct Whole {
  double loss = 0;  // mean over the micro-batches
  std::map<std::string, std::vector<float>> grads;
};

// The whole model, the micro-batches one after the other (gradient accumulation).
Whole run_whole(const ModelConfig& cfg, const Batches& b) {
  Pools pools;
  Model whole(cfg, B, T, pools);
  whole.init_params(kSeed);
  whole.zero_grads();
  const int m = static_cast<int>(b.tokens.size());
  Whole w;
  for (int k = 0; k < m; ++k) {
    w.loss += whole.forward(b.tokens[static_cast<size_t>(k)], b.targets[static_cast<size_t>(k)]);
    whole.backward(1.f / static_cast<float>(m));
  }
  w.loss /= m;
  for (const ParamSpec& spec : whole.param_specs()) w.grads[spec.name] = floats(whole.grad(spec.name));
  return w;
}

// max |a - b| <= kTolerance * max |b|
void expect_close(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  float worst = 0, largest = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i])), largest = std::max(largest, std::abs(b[i]));
  EXPECT_LE(worst, kTolerance * largest) << what << ": max |difference| " << worst << ", max |g| " << largest;
}

// This rank's chunk models: stage s = c pp + r holds layers
// [s L / S, (s + 1) L / S) of S = pp v stages, with the slots the schedule needs.
std::vector<std::unique_ptr<Model>> build_chunks(const ModelConfig& cfg, const PpSchedule& s, Pools& pools) {
  const int r = world().rank(), stages = s.pp * s.virtual_stages;
  const int64_t L = cfg.n_layer;
  std::vector<std::unique_ptr<Model>> chunks;
  for (int c = 0; c < s.virtual_stages; ++c) {
    const int64_t stage = c * s.pp + r, first = stage * L / stages, end = (stage + 1) * L / stages;
    const StageOptions opts{{first, end - first}, PipelineRuntime::slots_needed(s, r, c)};
    chunks.push_back(std::make_unique<Model>(cfg, B, T, pools, model::ModelOptions{.stage = opts}));
  }
  return chunks;
}

std::vector<Model*> pointers(const std::vector<std::unique_ptr<Model>>& chunks) {
  std::vector<Model*> out;
  for (const auto& c : chunks) out.push_back(c.get());
  return out;
}

struct Case {
  PpScheduleKind kind;
  int m, v;
  std::string name() const {
    return concat(pp_schedule_name(kind), " m=", m, " v=", v, " pp=", world().size());
  }
};

// m in {1, pp, 2 pp}; interleaved (v = 2) only where pp divides m.
std::vector<Case> cases(int pp) {
  std::set<int> ms = {1, pp, 2 * pp};
  std::vector<Case> out;
  for (PpScheduleKind kind : {PpScheduleKind::afab, PpScheduleKind::one_f_one_b})
    for (int m : ms) out.push_back({kind, m, 1});
  for (int m : ms)
    if (m % pp == 0) out.push_back({PpScheduleKind::interleaved, m, 2});
  return out;
}

// One step of the case through the runtime, checked against the whole model.
void expect_matches_whole(Family family, const Case& k) {
  SCOPED_TRACE(k.name());
  const int pp = world().size(), r = world().rank();
  const ModelConfig cfg = test_model(family, pp);
  const PpSchedule schedule = make_pp_schedule(k.kind, pp, k.m, k.v);
  const Batches batches(k.m, cfg.vocab_size);
  const Whole whole = run_whole(cfg, batches);

  Pools pools;
  std::vector<std::unique_ptr<Model>> chunks = build_chunks(cfg, schedule, pools);
  for (auto& c : chunks) c->init_params(kSeed);
  PipelineRuntime rt(schedule, world(), pointers(chunks), pools);
  // Two steps: the second reuses the first's slots and message buffers.
  double losses[2] = {0, 0};
  for (double& loss : losses) {
    for (auto& c : chunks) c->zero_grads();
    loss = rt.run(batches.tokens, batches.targets, 1.f / static_cast<float>(k.m));
    EXPECT_GE(rt.wait_seconds(), 0);
    EXPECT_GT(rt.compute_seconds(), 0);
  }
  EXPECT_EQ(losses[0], losses[1]);
  // The message buffers the runtime holds are the schedule's (pp_messages.h),
  // whatever the timing: an f32 run's activations and gradients share a
  // shape and dtype, so the cache lends either kind's buffer to the other.
  const TagUsage comm = pools.report()[MemTag::comm];
  const auto message = static_cast<size_t>(B * T * cfg.n_embd) * sizeof(float);
  EXPECT_EQ(comm.peak, static_cast<size_t>(pp_message_buffers(schedule, r).either) * message);
  EXPECT_EQ(comm.current, comm.peak);  // kept for the next step
  if (r == pp - 1) {  // the last stage's rank
    EXPECT_LE(std::abs(losses[1] - whole.loss), kTolerance * std::abs(whole.loss))
        << "pipeline " << losses[1] << " vs whole " << whole.loss;
  } else {
    EXPECT_EQ(losses[1], 0.0);
  }

  // A tied wte lives on the first and the last stage: their sum over the
  // world is the whole model's gradient.
  std::vector<float> wte(static_cast<size_t>(cfg.vocab_size * cfg.n_embd), 0.f);
  for (const auto& c : chunks)
    for (const ParamSpec& spec : c->param_specs()) {
      ASSERT_TRUE(whole.grads.contains(spec.name)) << spec.name;
      const std::vector<float> g = floats(c->grad(spec.name));
      if (cfg.tie_embeddings && spec.name == "wte.weight") {
        ASSERT_EQ(g.size(), wte.size());
        for (size_t i = 0; i < g.size(); ++i) wte[i] += g[i];
      } else {
        expect_close(g, whole.grads.at(spec.name), spec.name);
      }
    }
  if (cfg.tie_embeddings) {
    world().all_reduce(Tensor(wte.data(), DType::f32, {static_cast<int64_t>(wte.size())}), comm::ReduceOp::sum)->wait();
    expect_close(wte, whole.grads.at("wte.weight"), "wte.weight (first + last stage)");
  }
}

class PipelineRuntimeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { set_num_threads(1); }
};

TEST_F(PipelineRuntimeTest, Gpt2TiedEverySchedulesStepGivesTheWholeModelsLossAndGradients) {
  for (const Case& k : cases(world().size())) expect_matches_whole(Family::gpt2, k);
}

TEST_F(PipelineRuntimeTest, LlamaUntiedEverySchedulesStepGivesTheWholeModelsLossAndGradients) {
  for (const Case& k : cases(world().size())) expect_matches_whole(Family::llama, k);
}

// With a recorder, run() leaves one "forward m<m> c<c>" / "backward m<m>
// c<c>" span per action of this rank, in the schedule's order and each with
// a positive duration; one "send_act" / "send_grad" span per send; "recv
// wait" spans on every rank that receives (pp > 1). Without one (set back to
// null) a run records nothing.
TEST_F(PipelineRuntimeTest, TraceHasEachMicroBatchsForwardAndBackwardSpansInScheduleOrder) {
  const int pp = world().size(), r = world().rank();
  const ModelConfig cfg = test_model(Family::gpt2, pp);
  for (const Case& k : cases(pp)) {
    SCOPED_TRACE(k.name());
    const PpSchedule schedule = make_pp_schedule(k.kind, pp, k.m, k.v);
    const Batches batches(k.m, cfg.vocab_size);
    Pools pools;
    std::vector<std::unique_ptr<Model>> chunks = build_chunks(cfg, schedule, pools);
    for (auto& c : chunks) c->init_params(kSeed);
    PipelineRuntime rt(schedule, world(), pointers(chunks), pools);
    TraceRecorder rec(r, concat("rank ", r));
    rt.set_trace(&rec);
    for (auto& c : chunks) c->zero_grads();
    rt.run(batches.tokens, batches.targets, 1.f / static_cast<float>(k.m));

    std::vector<std::string> expected, computed;
    int sends_act = 0, sends_grad = 0, recvs = 0;
    for (const PpAction& a : schedule.actions[static_cast<size_t>(r)]) {
      if (a.op == PpOp::forward) expected.push_back(concat("forward m", a.micro_batch, " c", a.chunk));
      if (a.op == PpOp::backward) expected.push_back(concat("backward m", a.micro_batch, " c", a.chunk));
      sends_act += a.op == PpOp::send_act, sends_grad += a.op == PpOp::send_grad;
      recvs += a.op == PpOp::recv_act || a.op == PpOp::recv_grad;
    }
    std::map<std::string, int> others;
    for (const TraceEvent& e : rec.events()) {
      EXPECT_GE(e.dur_us, 0) << e.name;  // every span closed
      if (e.name.starts_with("forward ") || e.name.starts_with("backward ")) {
        computed.push_back(e.name);
        EXPECT_GT(e.dur_us, 0) << e.name;
      } else {
        ++others[e.name];
      }
    }
    EXPECT_EQ(computed, expected);
    EXPECT_EQ(others["send_act"], sends_act);
    EXPECT_EQ(others["send_grad"], sends_grad);
    if (pp > 1 && recvs > 0) {
      EXPECT_GT(others["recv wait"], 0);
    }
    for (const auto& [name, n] : others)
      EXPECT_TRUE(name == "send_act" || name == "send_grad" || name == "recv wait" || name.starts_with("post recv_"))
          << "unexpected span " << name;

    // Every receive from another rank is posted one compute ahead: before
    // the span of the last compute that precedes it in the list (the compute
    // its message can arrive during), or, with none before it, at its place.
    std::map<std::string, size_t> at;  // span name -> its index in begin order
    for (size_t i = 0; i < rec.events().size(); ++i) at.emplace(rec.events()[i].name, i);
    const std::vector<PpAction>& list = schedule.actions[static_cast<size_t>(r)];
    std::string previous_compute;
    int posted = 0;
    for (const PpAction& a : list) {
      if (a.op == PpOp::forward || a.op == PpOp::backward) {
        previous_compute = concat(a.op == PpOp::forward ? "forward" : "backward", " m", a.micro_batch, " c", a.chunk);
        continue;
      }
      if ((a.op != PpOp::recv_act && a.op != PpOp::recv_grad) || a.peer == r) continue;
      const std::string post = concat("post ", pp_op_name(a.op), " m", a.micro_batch, " c", a.chunk);
      ASSERT_TRUE(at.contains(post)) << post;
      ++posted;
      if (!previous_compute.empty()) {
        EXPECT_LT(at[post], at[previous_compute]) << post << " not before " << previous_compute;
      }
    }
    int remote_recvs = 0;
    for (const PpAction& a : list) remote_recvs += (a.op == PpOp::recv_act || a.op == PpOp::recv_grad) && a.peer != r;
    EXPECT_EQ(posted, remote_recvs);

    const size_t recorded = rec.events().size();
    rt.set_trace(nullptr);
    rt.run(batches.tokens, batches.targets, 1.f / static_cast<float>(k.m));
    EXPECT_EQ(rec.events().size(), recorded);
  }
}

// slots_needed is the schedule's peak of micro-batches in flight per chunk:
// the simulator's per-rank peak with one chunk (m for afab, at most pp - r
// for 1f1b); with two chunks each chunk's peak is at most the rank's and
// together they reach it.
TEST(PipelineRuntime, SlotsNeededIsTheSchedulesPeakInFlight) {
  for (int pp : {1, 2, 3, 4, 8})
    for (int m : {1, pp, 2 * pp, 3 * pp}) {
      for (PpScheduleKind kind : {PpScheduleKind::afab, PpScheduleKind::one_f_one_b}) {
        const PpSchedule s = make_pp_schedule(kind, pp, m);
        const PpSimulation sim = simulate_pp_schedule(s);
        for (int r = 0; r < pp; ++r) {
          const int need = PipelineRuntime::slots_needed(s, r, 0);
          EXPECT_EQ(need, sim.peak_in_flight[static_cast<size_t>(r)]) << pp_schedule_name(kind) << " pp=" << pp;
          EXPECT_EQ(need, kind == PpScheduleKind::afab ? m : std::min(pp - r, m)) << pp_schedule_name(kind);
        }
      }
      if (m % pp != 0) continue;
      const PpSchedule s = make_pp_schedule(PpScheduleKind::interleaved, pp, m, 2);
      const PpSimulation sim = simulate_pp_schedule(s);
      for (int r = 0; r < pp; ++r) {
        const int peak = sim.peak_in_flight[static_cast<size_t>(r)];
        const int a = PipelineRuntime::slots_needed(s, r, 0), b = PipelineRuntime::slots_needed(s, r, 1);
        EXPECT_TRUE(a >= 1 && b >= 1 && a <= peak && b <= peak && a + b >= peak)
            << "interleaved pp=" << pp << " m=" << m << " r=" << r << ": " << a << " + " << b << " vs " << peak;
      }
    }
  expect_error([] { PipelineRuntime::slots_needed(make_pp_schedule(PpScheduleKind::afab, 2, 2), 2, 0); },
               {"rank 2 is invalid", "0 to 1"});
}

// Models with too few slots, stages the schedule does not give this rank, and
// more micro-batches than MPI's tags can name are clear errors at construction.
TEST(PipelineRuntime, MisfitModelsAndTooManyMicroBatchesAreClearErrors) {
  const int pp = world().size();
  const ModelConfig cfg = test_model(Family::llama, pp);
  Pools pools;
  const PpSchedule afab = make_pp_schedule(PpScheduleKind::afab, pp, 2);
  const int r = world().rank();
  const int64_t L = cfg.n_layer, first = r * L / pp, end = (r + 1) * L / pp;
  Model one_slot(cfg, B, T, pools, {.stage = {{first, end - first}, 1}});
  expect_error([&] { PipelineRuntime(afab, world(), {&one_slot}, pools); },
               {"has 1 activation slots", "afab schedule keeps 2 micro-batches in flight"});
  Model whole(cfg, B, T, pools);
  if (pp > 1)
    expect_error([&] { PipelineRuntime(afab, world(), {&whole}, pools); },
                 {"is stage", "its model (layers 0 to"});
  expect_error([&] { PipelineRuntime(afab, world(), {&whole, &whole}, pools); },
               {"2 chunk models given for a schedule of 1 chunks per rank"});
  if (pp > 1) {
    const PpSchedule many = make_pp_schedule(PpScheduleKind::one_f_one_b, pp, 20000);
    Model stage(cfg, B, T, pools, {.stage = {{first, end - first}, PipelineRuntime::slots_needed(many, r, 0)}});
    expect_error([&] { PipelineRuntime(many, world(), {&stage}, pools); },
                 {"20000 micro-batches x 1 chunks need message tags up to 39999", "32767"});
  }
}

}  // namespace
}  // namespace loom::parallel
