#include "plan/time_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

#include "core/error.h"
#include "mesh/layout.h"
#include "model/params.h"
#include "parallel/pp_schedule.h"
#include "parallel/dp_layout.h"
#include "train/rank_chunks.h"

namespace loom::plan {
namespace {

// The weights a token's forward multiplies by, split as the model is: one
// layer's (its active experts only) and the rest (embeddings, final norm,
// LM head), from the counts of a one- and a two-layer copy of the model.
struct Weights {
  double layer = 0;   // active parameters per layer
  double head = 0;    // the LM head's matmul: V x C
};
Weights weights_of(const model::ModelConfig& cfg) {
  model::ModelConfig one = cfg, two = cfg;
  one.n_layer = 1, two.n_layer = 2;
  const auto p1 = static_cast<double>(model::param_count(one)), p2 = static_cast<double>(model::param_count(two));
  const double layer_all = p2 - p1, outside = p1 - layer_all;
  const double active = static_cast<double>(model::active_param_count(cfg));
  return {.layer = (active - outside) / static_cast<double>(cfg.n_layer),
          .head = static_cast<double>(cfg.vocab_size * cfg.n_embd)};
}

// The link a group of ranks talks over: intra-node when every member is on
// the first member's node.
Link link_of(const std::vector<int>& ranks, const Cluster& c) {
  for (int r : ranks)
    if (r / c.devices_per_node != ranks.front() / c.devices_per_node) return c.inter;
  return c.intra;
}

// A ring collective moving `bytes` (the whole buffer) over n ranks in `steps`
// passes (all-reduce 2, reduce-scatter or all-gather 1), each of n - 1 ring
// steps of bytes / n (Patarasuk and Yuan 2009) over the link's ring step.
double ring(double bytes, int n, int steps, const Link& link) {
  if (n <= 1) return 0;
  const Link l = link.ring_step();
  return steps * (n - 1) * (l.latency + bytes / (static_cast<double>(n) * l.bandwidth));
}


// One chunk's forward and backward seconds per micro-batch, and their parts.
struct ChunkTime {
  double forward = 0, backward = 0;  // with tp, cp and ep's exposed transfers
  double compute = 0, tp = 0, cp = 0, ep = 0;
};

struct Setup {
  const train::RunConfig& cfg;
  const Cluster& cluster;
  mesh::Layout layout;
  double rate = 0;       // FLOP/s of one rank
  double bandwidth = 0;  // memory bytes/s of one rank
  double elem = 4;       // bytes per element of the compute dtype
  double tokens = 0;     // a rank's tokens per micro-batch: B T / cp
  Weights w;
};

// The part of `transfer` seconds that `compute` seconds beside it do not
// hide. On a CPU whose cores the ranks share nothing is hidden: the
// communicator's progress thread copies and sums on the cores the compute
// runs on, so the transfer's work adds to the step.
double exposed(const Setup& s, double transfer, double compute) {
  return s.cluster.shared_cores ? transfer : std::max(0.0, transfer - compute);
}

// The MoE layers among layers [first, first + n).
double moe_layers(const model::ModelConfig& cfg, int64_t first, int64_t n) {
  double count = 0;
  for (int64_t i = first; i < first + n; ++i) count += cfg.is_moe_layer(i) ? 1 : 0;
  return count;
}

// A MoE layer's exchange of its tokens' rows with the other ep ranks
// (parallel/ep.h): a count exchange, then an all-to-all in which each rank
// keeps 1 / ep of its B T k rows (top-k copies of each token) and sends the
// rest, ep - 1 messages of B T k C / ep elements.
double ep_exchange(const Setup& s) {
  const train::ParallelConfig& p = s.cfg.parallel;
  if (p.ep == 1) return 0;
  const Link l = link_of(s.layout.group_ranks(mesh::Group::ep, 0), s.cluster);
  const auto n = static_cast<double>(p.ep);
  const double rows = s.tokens * static_cast<double>(s.cfg.model.top_k);
  // Per peer: the count message's latency, then the rows' message.
  return (n - 1) * (l.latency + l.seconds(rows * static_cast<double>(s.cfg.model.n_embd) * s.elem / n));
}

ChunkTime chunk_time(const Setup& s, int64_t first_layer, int64_t layers, bool head) {
  const train::RunConfig& cfg = s.cfg;
  const model::ModelConfig& m = cfg.model;
  const train::ParallelConfig& p = cfg.parallel;
  const double tp = static_cast<double>(p.tp), L = static_cast<double>(layers), C = static_cast<double>(m.n_embd);
  const double T = static_cast<double>(cfg.train.seq_len);
  const double attention = 4 * T * C * L / tp * s.tokens;  // QK^T and AV, every head, per token and layer
  const double layers_matmul = 2 * L * s.w.layer / tp * s.tokens, head_matmul = head ? 2 * s.w.head / tp * s.tokens : 0;
  const double forward = layers_matmul + head_matmul + attention;
  // Recompute repeats the blocks' forward (full) or their attention core
  // (selective) in the backward; the head is never recomputed.
  double recompute = 0;
  if (cfg.train.recompute == "full") recompute = layers_matmul + attention;
  if (cfg.train.recompute == "selective") recompute = attention;
  // The loss reads and writes every logit (f32): the softmax reads them,
  // its gradient is written (both in the forward, which training gives the
  // backward's dloss) and read back by the head's backward — memory traffic
  // a GEMM rate does not count, large for a small model's big vocabulary.
  const double logits = head ? 3 * 4 * static_cast<double>(m.vocab_size) / tp * s.tokens / s.bandwidth : 0;
  ChunkTime t;
  t.compute = (3 * forward + recompute) / s.rate + logits;
  // tp: 2 collectives of the residual stream forward and 2 backward per layer (more when full recompute repeats the forward).
  const Link tp_link = link_of(s.layout.group_ranks(mesh::Group::tp, 0), s.cluster);
  const double stream = static_cast<double>(cfg.train.micro_batch) * T / static_cast<double>(p.cp) * C * s.elem;
  const double one = ring(stream, static_cast<int>(p.tp), 2, tp_link);
  const double tp_forward = 2 * L * one, tp_backward = (cfg.train.recompute == "full" ? 4 : 2) * L * one;
  // cp: each ring step passes a K and a V block; backward also returns dK and dV.
  double cp_forward = 0, cp_backward = 0;
  if (p.cp > 1) {
    const Link cp_link = link_of(s.layout.group_ranks(mesh::Group::cp, 0), s.cluster);
    const double kv = 2 * s.tokens * static_cast<double>(m.n_kv_head / p.tp * m.head_size()) * s.elem;
    const double ring_f = L * static_cast<double>(p.cp - 1) * cp_link.seconds(kv);
    const double attn_f = attention / s.rate;
    cp_forward = exposed(s, ring_f, attn_f), cp_backward = exposed(s, 2 * ring_f, 2 * attn_f);
  }
  // ep: each MoE layer dispatches its rows and combines them back forward,
  // and returns both gradients backward (again the forward's under full
  // recompute); loom waits for each before the layer goes on, so none is
  // hidden.
  const double moe = moe_layers(m, first_layer, layers), exchange = ep_exchange(s);
  const double ep_forward = 2 * moe * exchange;
  const double ep_backward = (cfg.train.recompute == "full" ? 4 : 2) * moe * exchange;
  t.tp = tp_forward + tp_backward, t.cp = cp_forward + cp_backward, t.ep = ep_forward + ep_backward;
  t.forward = forward / s.rate + 2 * logits / 3 + tp_forward + cp_forward + ep_forward;
  t.backward = (2 * forward + recompute) / s.rate + logits / 3 + tp_backward + cp_backward + ep_backward;
  return t;
}

// The parameters of a rank: those averaged over dp x cp, and under expert
// parallelism its experts, averaged over expert-dp x cp
// (train::gradient_groups).
struct RankParams {
  double dense = 0, experts = 0;
};

// The rank's data-parallel seconds not hidden behind compute, and its
// optimizer's, for its parameters (its chunks' together). The groups'
// collectives share the link and the compute that hides them.
std::pair<double, double> dp_and_optimizer(const Setup& s, RankParams P, double last_backward, double forward_all,
                                           double backward_all) {
  const train::ParallelConfig& p = s.cfg.parallel;
  const model::ModelConfig& cfg = s.cfg.model;
  const double m = static_cast<double>(s.cfg.train.grad_accum);
  // ZeRO 3's units per group (model.h Unit; ZeRO 3 runs without
  // pipelining): the embeddings, each layer, the head, and a MoE layer's
  // experts — in the dense group unless ep gives them their own.
  const double moe = moe_layers(cfg, 0, cfg.n_layer);
  const double dense_units = static_cast<double>(cfg.n_layer + 2) + (p.ep == 1 ? moe : 0);
  double reduce = 0, gather = 0, zero3_latency = 0, zero3_bytes = 0, optimizer = 0;
  const std::vector<mesh::Group> groups = train::gradient_groups(static_cast<int>(p.ep));
  for (size_t g = 0; g < groups.size(); ++g) {
    const double params_g = g == 0 ? P.dense : P.experts, units = g == 0 ? dense_units : moe;
    const std::vector<int> ranks = s.layout.group_ranks(groups[g], 0);
    const int n = static_cast<int>(ranks.size());
    const Link l = link_of(ranks, s.cluster);
    const double grads = 4 * params_g, params = s.elem * params_g;
    // ZeRO 0 and 1 reduce the last micro-batch's gradients; 2 and 3
    // reduce-scatter every micro-batch's (parallel/dp_grads.cpp).
    if (p.zero_stage == 0) reduce += ring(grads, n, 2, l);
    else reduce += (p.zero_stage >= 2 ? m : 1) * ring(grads, n, 1, l);
    if (p.zero_stage == 1 || p.zero_stage == 2) gather += ring(params, n, 1, l);
    if (p.zero_stage == 3 && n > 1) {
      // Every micro-batch gathers each unit's parameters for its forward and
      // again for its backward, one unit ahead: the bytes may hide behind
      // the compute, the latency of each unit's gather does not.
      const Link step = l.ring_step();
      zero3_bytes += ring(params, n, 1, {.bandwidth = step.bandwidth, .latency = 0});
      zero3_latency += 2 * m * units * (n - 1) * step.latency;
    }
    optimizer += (p.zero_stage == 0 ? params_g : params_g / n) * (28 + s.elem) / s.bandwidth;
  }
  const double dp = exposed(s, reduce, p.zero_stage >= 2 ? backward_all : last_backward) + gather + zero3_latency +
                    exposed(s, m * zero3_bytes, forward_all) + exposed(s, m * zero3_bytes, backward_all);
  return {dp, optimizer};
}

double elem_size(const std::string& dtype) { return dtype == "fp32" ? 4 : 2; }

// The pipeline rank whose chunks take longest per micro-batch (it sets the
// pace; the whole model without pipelining), and the parameters of the
// pipeline rank that holds most.
std::pair<ChunkTime, RankParams> slowest_rank(const Setup& s, const train::ChunkOptions& co,
                                              const parallel::PpSchedule& schedule) {
  const model::ModelConfig& m = s.cfg.model;
  const train::ParallelConfig& p = s.cfg.parallel;
  const int pp = schedule.pp;
  double slowest = -1;
  ChunkTime worst;
  RankParams most;
  for (int r = 0; r < pp; ++r) {
    ChunkTime sum;
    RankParams P;
    for (const model::StageOptions& so :
         pp > 1 ? train::rank_stages(co, schedule, pp, r) : std::vector<model::StageOptions>(1)) {
      const ChunkTime t =
          chunk_time(s, so.layers.first_layer, so.layers.layer_count(m.n_layer), so.layers.holds_head(m.n_layer));
      sum.forward += t.forward, sum.backward += t.backward, sum.compute += t.compute;
      sum.tp += t.tp, sum.cp += t.cp, sum.ep += t.ep;
      for (const model::ParamSpec& spec : model::param_specs(m, {static_cast<int>(p.tp), 0}, so.layers,
                                                             {static_cast<int>(p.ep), 0}))
        (parallel::in_expert_group(spec.name, static_cast<int>(p.ep)) ? P.experts : P.dense) +=
            static_cast<double>(spec.numel());
    }
    if (sum.forward + sum.backward > slowest) slowest = sum.forward + sum.backward, worst = sum;
    if (P.dense + P.experts > most.dense + most.experts) most = P;
  }
  return {worst, most};
}

}  // namespace

StepTime predict_step_time(const train::RunConfig& cfg, const Cluster& cluster) {
  const train::ParallelConfig& p = cfg.parallel;
  LOOM_REQUIRE(p.mode == "collective", "loom plan does not predict parameter-server training (parallel.mode = ps) ",
               "yet: it predicts collective data, context, tensor, pipeline and expert parallelism");
  LOOM_REQUIRE(!cfg.lora.adapters.enabled(), "loom plan does not predict LoRA fine-tuning ([lora]) yet: it ",
               "predicts training every parameter");
  const int world = static_cast<int>(p.dp * p.tp * p.pp * p.cp);
  LOOM_REQUIRE(cluster.shared_cores || world <= cluster.devices(), "the layout needs ", world, " devices (dp ", p.dp,
               " x tp ", p.tp, " x pp ", p.pp, " x cp ", p.cp, ") but cluster '", cluster.name, "' has ",
               cluster.devices());
  // A CPU's ranks split its cores (and their memory bandwidth) between
  // them: fewer ranks than cores each run on several (threads); more ranks
  // than cores take turns, and while one waits the others run (below).
  const double per_node = std::ceil(static_cast<double>(world) / cluster.nodes);
  const double cores_per_rank = cluster.shared_cores ? std::max(1.0, cluster.devices_per_node / per_node) : 1.0;
  const double turns = cluster.shared_cores ? std::max(1.0, per_node / cluster.devices_per_node) : 1.0;
  const Setup s{.cfg = cfg,
                .cluster = cluster,
                .layout = mesh::Layout(train::mesh_shape(p), world),
                .rate = cluster.achieved(cfg.train.dtype) * cores_per_rank,
                .bandwidth = cluster.memory_bandwidth * cores_per_rank,
                .elem = elem_size(cfg.train.dtype),
                .tokens = static_cast<double>(cfg.train.micro_batch * cfg.train.seq_len / p.cp),
                .w = weights_of(cfg.model)};
  const train::ChunkOptions co = train::chunk_options(cfg);
  const int pp = static_cast<int>(p.pp), m = static_cast<int>(cfg.train.grad_accum);
  const parallel::PpSchedule schedule = parallel::make_pp_schedule(
      parallel::pp_schedule_from_name(pp > 1 ? co.pp_schedule : "1f1b"), pp, m, static_cast<int>(co.virtual_stages));
  StepTime out;
  const auto [worst, params] = slowest_rank(s, co, schedule);
  const int v = static_cast<int>(co.virtual_stages);
  const parallel::PpSimulation sim = parallel::simulate_pp_schedule(schedule, worst.forward / v, worst.backward / v);
  // Ranks taking turns on a core (more ranks than cores) fill each other's
  // waits: the step is their work over the cores, or the schedule's
  // critical path if that is longer.
  const double busy = turns * m * (worst.forward + worst.backward), pipeline = std::max(sim.makespan, busy);
  out.compute = turns * m * worst.compute, out.tp = turns * m * worst.tp, out.cp = turns * m * worst.cp;
  out.ep = turns * m * worst.ep;
  out.bubble = pipeline - busy;
  if (out.bubble < 1e-9 * pipeline) out.bubble = 0;  // no pipeline: the sum's rounding, not idle time
  if (pp > 1) {  // the first micro-batch's activations and the last one's gradients cross every boundary
    const Link l = link_of(s.layout.group_ranks(mesh::Group::pp, 0), cluster);
    const double stream = s.tokens * static_cast<double>(cfg.model.n_embd) / (p.sequence_parallel ? p.tp : 1);
    out.pp = static_cast<double>(pp * v - 1) * (l.seconds(stream * s.elem) + l.seconds(stream * 4));
  }
  const auto [dp, opt] = dp_and_optimizer(s, params, worst.backward, m * worst.forward, m * worst.backward);
  out.dp = dp, out.optimizer = turns * opt;
  out.total = pipeline + out.pp + out.dp + out.optimizer;
  const double tokens = static_cast<double>(cfg.train.micro_batch * m * p.dp * cfg.train.seq_len);
  out.tokens_per_second = tokens / out.total;
  const double N = static_cast<double>(model::active_param_count(cfg.model));
  out.model_flops = tokens * (6 * N + 12.0 * static_cast<double>(cfg.model.n_layer * cfg.train.seq_len * cfg.model.n_embd));
  const double devices = cluster.shared_cores ? cluster.devices() : world;
  out.mfu = out.model_flops / (out.total * cluster.peak(cfg.train.dtype) * devices);
  return out;
}

std::string step_time_line(const StepTime& t) {
  char line[320];
  std::snprintf(line, sizeof line,
                "step %.4g s (compute %.3g, tp %.3g, cp %.3g, ep %.3g, bubble %.3g, pp %.3g, dp %.3g, optimizer "
                "%.3g), %.4g tokens/s, MFU %.1f %%",
                t.total, t.compute, t.tp, t.cp, t.ep, t.bubble, t.pp, t.dp, t.optimizer, t.tokens_per_second,
                100 * t.mfu);
  return line;
}

}  // namespace loom::plan
