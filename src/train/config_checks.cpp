// validate_run_config (train/config.h): the rules across a run config's
// keys, checked once every key is set.
#include "core/error.h"
#include "model/lora.h"
#include "model/params.h"
#include "parallel/cp.h"
#include "parallel/offload.h"
#include "parallel/pp_partition.h"
#include "parallel/pp_schedule.h"
#include "train/config.h"

namespace loom::train {
namespace {

// Context parallelism: 2 x cp zig-zag chunks of every sequence (parallel/cp.h says what divides what).
void check_cp_split(const RunConfig& c, const std::string& source) {
  if (c.parallel.cp == 1) return;
  try {
    (void)parallel::cp_split(c.train.seq_len, static_cast<int>(c.parallel.cp), true);
  } catch (const Error& e) {
    fail(source, ": train.", e.what());
  }
}

// Tensor parallelism: the heads and d_ff must split evenly (the model's
// message says what divides what); SP splits every sequence (a cp rank's share).
void check_tp_split(const RunConfig& c, const std::string& source) {
  if (c.parallel.tp > 1) {
    try {
      (void)model::param_specs(c.model, {static_cast<int>(c.parallel.tp), 0});
    } catch (const Error& e) {
      fail(source, ": ", e.what());
    }
    const int64_t split = c.parallel.tp * c.parallel.cp;  // SP splits a cp rank's tokens further
    LOOM_REQUIRE(!c.parallel.sequence_parallel || c.train.seq_len % split == 0, source,
                 ": train.seq_len = ", c.train.seq_len, " is not divisible by parallel.tp = ", c.parallel.tp,
                 c.parallel.cp > 1 ? concat(" x parallel.cp = ", c.parallel.cp) : "",
                 ": sequence parallelism splits each sequence's tokens across the tp ranks (set seq_len to a ",
                 "multiple of ", c.parallel.cp > 1 ? "tp x cp" : "tp", ", or parallel.sequence_parallel = false)");
  }
}

// Expert parallelism splits the dp ranks (mesh/layout.h) and the experts;
// capacity is counted per group of whole sequences of a rank's micro-batch.
void check_moe(const RunConfig& c, const std::string& source) {
  const ParallelConfig& p = c.parallel;
  LOOM_REQUIRE(p.ep == 1 || c.model.is_moe(), source, ": parallel.ep = ", p.ep,
               " needs a mixture-of-experts model (model.n_expert > 0): a dense model has no experts to split");
  LOOM_REQUIRE(p.dp % p.ep == 0, source, ": parallel.ep = ", p.ep, " does not divide parallel.dp = ", p.dp,
               ": expert parallelism splits the dp ranks into groups of ep");
  if (!c.model.is_moe()) return;
  LOOM_REQUIRE(c.model.n_expert % p.ep == 0, source, ": parallel.ep = ", p.ep, " does not divide model.n_expert = ",
               c.model.n_expert, ": each ep rank holds n_expert / ep experts");
  LOOM_REQUIRE(c.train.micro_batch % c.model.routing_group == 0, source, ": train.micro_batch = ",
               c.train.micro_batch, " is not a multiple of model.routing_group = ", c.model.routing_group,
               ": capacity is counted per group of whole sequences, so a rank's micro-batch holds whole groups");
}

// Parameter-server mode (train/config.h, train/ps_server.h): workers are whole replicas (data
// parallel only, no ZeRO: the servers shard the state), and optimizer-on-
// server trains fp32 (its update writes f32 weights the workers use as is).
void check_ps(const RunConfig& c, const std::string& source) {
  const ParallelConfig& p = c.parallel;
  if (p.mode != "ps") {
    LOOM_REQUIRE(p.staleness == 0, source, ": parallel.staleness = ", p.staleness,
                 " needs parallel.mode = ps (collective data parallelism is synchronous)");
    return;
  }
  LOOM_REQUIRE(p.tp == 1 && p.pp == 1 && p.cp == 1 && p.ep == 1, source, ": parallel.mode = ps trains data-parallel ",
               "workers (parallel.dp of them): parallel.tp, pp, cp and ep must be 1 (tp = ", p.tp, ", pp = ", p.pp,
               ", cp = ", p.cp, ", ep = ", p.ep, "); model-parallel worker groups are not available");
  LOOM_REQUIRE(p.zero_stage == 0, source, ": parallel.zero_stage = ", p.zero_stage, " with parallel.mode = ps: the ",
               "servers hold the sharded state and every worker a whole replica; allowed 0");
  LOOM_REQUIRE(!p.offload_optimizer, source, ": parallel.offload_optimizer with parallel.mode = ps: the optimizer ",
               "runs on the ", p.ps_server == "sum" ? "workers" : "servers", " in host memory already; set it to false");
  LOOM_REQUIRE(p.ps_server == "sum" || c.train.dtype == "fp32", source, ": parallel.ps_server = optimizer trains ",
               "fp32 (train.dtype = ", c.train.dtype, "): the servers send f32 weights; use ps_server = sum for ",
               "mixed precision");
  LOOM_REQUIRE(p.staleness == 0 || p.ps_server == "optimizer", source, ": parallel.staleness = ", p.staleness,
               " with parallel.ps_server = sum: summation servers hold no weights to apply an asynchronous push ",
               "to; use ps_server = optimizer, or staleness = 0");
  LOOM_REQUIRE(!c.model.is_moe(), source, ": parallel.mode = ps trains dense models (this one has ",
               c.model.n_expert, " experts per layer)");
}

// [lora]: a rank and a base together, adapters the model can have, and the
// layouts adapters support so far (model/lora.h).
void check_lora(const RunConfig& c, const std::string& source) {
  const LoraRunConfig& l = c.lora;
  if (!l.adapters.enabled() && l.base.empty() && l.init.empty()) return;
  LOOM_REQUIRE(l.adapters.enabled(), source, ": ", l.base.empty() ? "lora.init" : "lora.base", " is set but ",
               "lora.rank is missing: [lora] needs rank and base (the model directory the adapters train on)");
  LOOM_REQUIRE(!l.base.empty(), source, ": lora.rank is set but lora.base is missing: set it to the model directory ",
               "the adapters train on");
  try {
    (void)model::lora_param_specs(c.model, l.adapters, {static_cast<int>(c.parallel.tp), 0});
  } catch (const Error& e) {
    fail(source, ": ", e.what());
  }
  const ParallelConfig& p = c.parallel;
  LOOM_REQUIRE(c.train.device == "cpu", source, ": lora with train.device = ", c.train.device,
               " is not supported yet: adapters train on the CPU");
  LOOM_REQUIRE(p.cp == 1 && p.mode == "collective", source, ": lora with ",
               p.cp > 1 ? "parallel.cp > 1" : "parallel.mode = ps",
               " is not supported yet: adapters train under dp (any ZeRO stage), tp (with or without SP) and pp");
}

// parallel.offload (ZeRO-Infinity's disk tier, parallel/offload.h): a
// directory for the files, one way of offloading at a time, the
// parameters' tier over ZeRO-3's shards only.
void check_offload(const RunConfig& c, const std::string& source) {
  const ParallelConfig& p = c.parallel;
  if (p.offload == "none") return;
  LOOM_REQUIRE(p.offload != "params" || p.zero_stage == 3, source, ": parallel.offload = params puts ZeRO-3's ",
               "parameter and gradient shards on disk: it needs parallel.zero_stage = 3 (this run has ", p.zero_stage,
               "); with stages 0-2 the parameters stay whole on every rank: use parallel.offload = optimizer");
  LOOM_REQUIRE(!p.offload_dir.empty(), source, ": parallel.offload = ", p.offload, " needs parallel.offload_dir: a ",
               "directory on the disk the state goes to (each rank writes a file there)");
  LOOM_REQUIRE(!p.offload_optimizer, source, ": parallel.offload = ", p.offload, " with parallel.offload_optimizer: ",
               "the state goes to disk or stays in host memory, not both; set offload_optimizer = false");
  LOOM_REQUIRE(p.mode != "ps", source, ": parallel.offload = ", p.offload, " with parallel.mode = ps: the workers ",
               "keep no sharded state to offload; set parallel.offload = none");
  LOOM_REQUIRE(c.train.device == "cpu", source, ": parallel.offload = ", p.offload, " with train.device = ",
               c.train.device, ": offloading from a GPU is not available yet; set parallel.offload = none");
  const int arrays = 2 + (c.train.dtype == "fp32" ? 0 : 1);  // AdamW's moments, and the master weights apart
  try {
    (void)parallel::OffloadedState::chunk_elements(static_cast<int64_t>(p.offload_budget_mb * (1 << 20)), arrays);
  } catch (const Error& e) {
    fail(source, ": parallel.offload_budget_mb = ", p.offload_budget_mb, ": ", e.what(), "; raise it");
  }
}

}  // namespace

void validate_run_config(const RunConfig& c, const std::string& source) {
  try {
    c.model.validate();
  } catch (const Error& e) {
    fail(source, ": ", e.what());
  }
  LOOM_REQUIRE(!c.data.train.empty(), source, ": data.train is missing: set it to the training shards, e.g. ",
               "train = \"data/brown/train_*.bin\"");
  LOOM_REQUIRE(c.train.eval_every == 0 || !c.data.val.empty(), source, ": data.val is missing but train.eval_every = ",
               c.train.eval_every, ": set data.val or train.eval_every = 0");
  LOOM_REQUIRE(c.train.seq_len <= c.model.max_seq_len, source, ": train.seq_len = ", c.train.seq_len,
               " is invalid: allowed values are <= model.max_seq_len = ", c.model.max_seq_len);
  LOOM_REQUIRE(c.train.min_lr <= c.train.lr, source, ": train.min_lr = ", c.train.min_lr,
               " is invalid: allowed values are <= train.lr = ", c.train.lr);
  LOOM_REQUIRE(c.checkpoint.every == 0 || !c.checkpoint.dir.empty(), source, ": checkpoint.dir is missing but ",
               "checkpoint.every = ", c.checkpoint.every, ": set checkpoint.dir or checkpoint.every = 0");
  LOOM_REQUIRE(!c.log.trace_ops || !c.log.trace.empty(), source, ": log.trace is missing but log.trace_ops = true: ",
               "set log.trace to the trace file the ops' spans go into");
  // Pipeline parallelism: enough layers for pp x virtual_stages stages, a
  // schedule that fits the micro-batches, and ZeRO 0-1 (as Megatron).
  {
    const ParallelConfig& p = c.parallel;
    const int64_t stages = p.pp * p.virtual_stages;
    LOOM_REQUIRE(p.virtual_stages == 1 || p.pp > 1, source, ": parallel.virtual_stages = ", p.virtual_stages,
                 " needs parallel.pp > 1 (interleaving splits each pipeline rank's layers)");
    LOOM_REQUIRE(stages <= c.model.n_layer, source, ": parallel.pp x parallel.virtual_stages = ", stages,
                 " stages for model.n_layer = ", c.model.n_layer, " layers: every stage needs at least one layer");
    if (!p.pp_layers.empty()) {
      try {
        (void)parallel::explicit_pp_partition(c.model, c.train.seq_len, static_cast<int>(stages), p.pp_layers);
      } catch (const Error& e) {
        fail(source, ": ", e.what());
      }
    }
    if (p.pp > 1) {
      try {
        (void)parallel::make_pp_schedule(parallel::pp_schedule_from_name(p.pp_schedule), static_cast<int>(p.pp),
                                         static_cast<int>(c.train.grad_accum), static_cast<int>(p.virtual_stages));
      } catch (const Error& e) {
        fail(source, ": parallel.pp_schedule = ", p.pp_schedule, " with parallel.pp = ", p.pp,
             ", parallel.virtual_stages = ", p.virtual_stages, " and train.grad_accum = ", c.train.grad_accum,
             " (the pipeline's micro-batches): ", e.what());
      }
      LOOM_REQUIRE(p.zero_stage <= 1, source, ": parallel.zero_stage = ", p.zero_stage, " with parallel.pp = ", p.pp,
                   ": pipeline parallelism composes with ZeRO stages 0 and 1 (as Megatron's); allowed 0, 1");
    }
  }
  check_cp_split(c, source);
  check_tp_split(c, source);
  check_moe(c, source);
  check_ps(c, source);
  check_lora(c, source);
  check_offload(c, source);
}

}  // namespace loom::train
