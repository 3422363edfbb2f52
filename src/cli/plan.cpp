// loom plan: what a training run will hold per rank and memory tag and how
// long its step takes, before it runs (plan/memory_plan.h, time_plan.h);
// the best layouts of a model on a cluster (plan/search.h); and this
// machine measured as a cluster (plan/calibrate.h).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "comm/mpi_backend.h"
#include "comm/self_communicator.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/threads.h"
#include "model/config.h"
#include "plan/calibrate.h"
#include "plan/cluster.h"
#include "plan/memory_plan.h"
#include "plan/search.h"
#include "plan/serve_plan.h"
#include "plan/time_plan.h"
#include "train/config.h"
#include "train/reports.h"

namespace loom::cli {
namespace {

struct PlanArgs {
  std::string config, model;
  std::vector<std::string> overrides;
  std::vector<int> ranks;  // --rank: these world ranks only (default every rank)
  std::string out;
  bool json = false;
  std::string cluster;
  int nodes = 0;
  int64_t global_batch = 0, seq = 0;
  std::string dtype;
  int top = 10;
  int max_zero = 3;
  bool calibrate = false;
  int threads = 1;
  bool serve = false;  // --serve: KV-cache capacity and decode bound
  std::string kv_dtype = "bf16";
  int64_t input_len = 512, output_len = 256, block_size = 16;
  double memory_gib = 0;
};

// The run config of --config, or of --model PRESET with the search's
// sequence length (the data keys a plan never reads are filled in).
train::RunConfig run_config(const PlanArgs& a) {
  std::vector<std::string> overrides = a.overrides;
  if (a.seq > 0) overrides.push_back(concat("train.seq_len=", a.seq));
  if (!a.dtype.empty()) overrides.push_back("train.dtype=" + a.dtype);
  if (!a.config.empty()) return train::load_run_config(a.config, overrides);
  LOOM_REQUIRE(!a.model.empty(), "loom plan: give --config RUN.toml (a run's layout), or --model PRESET with ",
               "--cluster and --global-batch (a search), or --calibrate");
  // Without --seq, the preset's context length.
  const int64_t seq = a.seq > 0 ? a.seq : model::model_preset(a.model).max_seq_len;
  overrides.insert(overrides.begin(), {concat("model.max_seq_len=", seq), concat("train.seq_len=", seq)});
  const std::string text = concat("[model]\npreset = \"", a.model, "\"\n[data]\ntrain = \"(loom plan)\"\n",
                                  "[train]\neval_every = 0\n");
  return train::parse_run_config(text, "--model " + a.model, overrides);
}

void calibrate(const PlanArgs& a, int world_size) {
  set_num_threads(a.threads);
  std::unique_ptr<comm::Communicator> world;
  if (world_size > 1) world = comm::mpi_world();
  else world = std::make_unique<comm::SelfCommunicator>("world");
  plan::CalibrateOptions o;
  o.threads = a.threads;
  if (!a.config.empty() || !a.model.empty()) {  // that model's own GEMMs, one micro-batch of a rank
    const train::RunConfig cfg = run_config(a);
    const int64_t tokens = cfg.train.micro_batch * cfg.train.seq_len / cfg.parallel.cp;
    const plan::ModelGemms g = plan::model_gemm_shapes(cfg.model, tokens);
    o.gemm_shapes = g.shapes, o.gemm_counts = g.counts;
    o.gemm_source = concat("the forward GEMMs of ", a.config.empty() ? a.model : a.config, "'s model at ", tokens,
                           " tokens");
  }
  const plan::Cluster c = plan::calibrate(*world, o);
  if (world->rank() != 0) return;
  const std::string toml = plan::cluster_toml(c);
  if (a.out.empty()) return (void)std::printf("%s", toml.c_str());
  write_file_atomic(a.out, toml);
  std::printf("loom plan: this machine's cluster description written to %s (use it as --cluster %s)\n",
              a.out.c_str(), a.out.c_str());
}

void search(const PlanArgs& a) {
  LOOM_REQUIRE(!a.cluster.empty(), "loom plan --global-batch: which cluster? give --cluster with a preset (",
               "h100, a100) or a cluster TOML file (loom plan --calibrate writes one for this machine)");
  const train::RunConfig cfg = run_config(a);
  plan::SearchRequest r{.model = cfg.model,
                        .seq_len = cfg.train.seq_len,
                        .global_batch = a.global_batch,
                        .dtype = cfg.train.dtype,
                        .cluster = plan::cluster_from(a.cluster, a.nodes),
                        .top = a.top,
                        .max_zero_stage = a.max_zero};
  const plan::SearchResult s = plan::search_layouts(r);
  std::printf("%s", (a.json ? plan::search_json(s) : plan::search_table(s, r)).c_str());
}

void serve(const PlanArgs& a) {
  LOOM_REQUIRE(!a.cluster.empty(), "loom plan --serve: which device? give --cluster with a preset (h100, a100) or ",
               "a cluster TOML file (loom plan --calibrate writes one for this machine)");
  PlanArgs model_args = a;
  model_args.dtype.clear();  // --dtype is the served weights' dtype here, not train.dtype
  const train::RunConfig cfg = run_config(model_args);
  plan::ServeRequest r{.model = cfg.model,
                       .weights = precision_dtype(a.dtype.empty() ? "bf16" : a.dtype, "--dtype"),
                       .kv = precision_dtype(a.kv_dtype, "--kv-dtype"),
                       .input_len = a.input_len,
                       .output_len = a.output_len,
                       .block_size = a.block_size,
                       .cluster = plan::cluster_from(a.cluster, a.nodes)};
  if (a.memory_gib > 0) r.cluster.memory_bytes = a.memory_gib * 1024.0 * 1024.0 * 1024.0;
  const plan::ServePlan p = plan::plan_serving(r);
  std::printf("%s", (a.json ? plan::serve_plan_json(p) : plan::serve_plan_table(p, r)).c_str());
}

void run_plan(const PlanArgs& a, int world_size) {
  LOOM_REQUIRE(a.ranks.empty() || (!a.calibrate && !a.serve && a.global_batch == 0),
               "loom plan --rank lays out ranks of a run's own layout (--config, or --model with --set): it does "
               "not apply to --calibrate, --serve or a search (--global-batch)");
  if (a.calibrate) return calibrate(a, world_size);
  if (a.serve) return serve(a);
  if (a.global_batch > 0) return search(a);
  const train::RunConfig cfg = run_config(a);  // --config, or --model with --set for a layout of a preset
  // As loom train: the final model goes to --out, else checkpoint.dir.
  const plan::MemoryPlanOptions o{.writes_model = !a.out.empty() || !cfg.checkpoint.dir.empty()};
  // One rank of a big layout is laid out alone, without the others (or any
  // communicator): the same counting code, rank by rank.
  std::vector<plan::RankMemory> ranks;
  if (a.ranks.empty()) ranks = plan::plan_memory(cfg, o);
  const int64_t world = cfg.parallel.dp * cfg.parallel.tp * cfg.parallel.pp * cfg.parallel.cp;
  for (int r : a.ranks) {
    LOOM_REQUIRE(r < world, "--rank ", r, " is outside the layout's ", world, " ranks (dp ", cfg.parallel.dp, " x tp ",
                 cfg.parallel.tp, " x pp ", cfg.parallel.pp, " x cp ", cfg.parallel.cp, "): allowed 0 to ", world - 1);
    ranks.push_back(plan::plan_memory_rank(cfg, r, o));
  }
  for (const plan::RankMemory& r : ranks)
    std::printf("%s", (a.json ? train::memory_json_lines(r.at, r.bytes) : plan::memory_plan_table(r)).c_str());
  if (a.cluster.empty()) return;
  const plan::Cluster c = plan::cluster_from(a.cluster, a.nodes);
  const plan::StepTime t = plan::predict_step_time(cfg, c);
  if (a.json) {
    std::printf("{\"step_s\":%.9g,\"compute_s\":%.9g,\"tp_s\":%.9g,\"cp_s\":%.9g,\"ep_s\":%.9g,\"bubble_s\":%.9g,"
                "\"pp_s\":%.9g,\"dp_s\":%.9g,\"optimizer_s\":%.9g,\"tokens_per_s\":%.9g,\"mfu\":%.9g}\n",
                t.total, t.compute, t.tp, t.cp, t.ep, t.bubble, t.pp, t.dp, t.optimizer, t.tokens_per_second, t.mfu);
  } else {
    std::printf("on %s: %s\n", c.name.c_str(), plan::step_time_line(t).c_str());
  }
}

}  // namespace

void add_plan_command(CLI::App& app, int world_size) {
  CLI::App* cmd = app.add_subcommand(
      "plan", "predict a training run before it runs: the bytes every rank holds per memory tag (the same figures "
              "`loom train --memory-json` measures; data parallelism with ZeRO 0 to 3, context, tensor, pipeline and "
              "expert parallelism, and LoRA runs, on the CPU) and, with --cluster, its step time; with --global-batch, "
              "search the best layouts of a model on a cluster; with --calibrate, measure this machine as a cluster");
  auto a = std::make_shared<PlanArgs>();
  cmd->add_option("--config", a->config, "TOML run config, as loom train takes it");
  cmd->add_option("--model", a->model, "a model preset to search layouts for (with --set model.KEY=VALUE)");
  cmd->add_option("--set", a->overrides, "override a config key: section.key=value (repeatable)");
  cmd->add_option("--rank", a->ranks, "lay out only this world rank (repeatable; default every rank): one rank of a "
                  "layout of any size, without the others")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--out", a->out, "the run writes its final model here (as loom train --out): counts the gather it "
                                   "takes; with --calibrate, the cluster file to write");
  cmd->add_flag("--json", a->json, "JSON lines: per rank and tag as loom train --memory-json prints them, the step "
                                   "time, or the search's layouts and rejected families");
  cmd->add_option("--cluster", a->cluster, "a cluster preset (h100, a100: nodes of 8 GPUs) or a cluster TOML file");
  cmd->add_option("--nodes", a->nodes, "nodes of the cluster (a preset's default: 1)")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--global-batch", a->global_batch, "search: sequences per step (dp x micro-batch x grad_accum)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--seq", a->seq, "search: sequence length (train.seq_len)")->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_option("--dtype", a->dtype, "compute dtype (train.dtype): fp32, bf16, fp16");
  cmd->add_option("--top", a->top, "search: layouts to print")->check(CLI::Range(1, 1000));
  cmd->add_option("--max-zero", a->max_zero, "search: the highest ZeRO stage to consider (default 3)")
      ->check(CLI::Range(0, 3));
  cmd->add_flag("--calibrate", a->calibrate, "measure this machine (GEMM FLOP/s — with --config or --model at that "
                "model's own GEMMs —, memory bandwidth; under mpirun -np 2 "
                                             "the link between ranks) and print it as a cluster TOML (or --out)");
  cmd->add_option("--threads", a->threads, "--calibrate: threads per rank")->check(CLI::Range(1, 4096));
  cmd->add_flag("--serve", a->serve, "serving on one device of --cluster: how many sequences the KV cache holds and "
                                     "the decode tokens/s its memory bandwidth allows (--dtype: the weights')");
  cmd->add_option("--kv-dtype", a->kv_dtype, "--serve: the KV cache's dtype (fp32, bf16, fp16; default bf16)");
  cmd->add_option("--input-len", a->input_len, "--serve: prompt tokens per sequence (default 512)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_option("--output-len", a->output_len, "--serve: generated tokens per sequence (default 256)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_option("--block-size", a->block_size, "--serve: tokens per KV block (default 16, the engine's)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  cmd->add_option("--memory-gib", a->memory_gib, "--serve: the device's memory budget (default: the cluster's)")
      ->check(CLI::PositiveNumber);
  cmd->callback([a, world_size] { run_plan(*a, world_size); });
}

}  // namespace loom::cli
