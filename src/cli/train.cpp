// loom train: a run config (train/config.h) -> the fp32 training loop
// (train/trainer.h). loom eval: a saved model's loss over token shards.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <algorithm>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "core/stop_signal.h"
#include "core/threads.h"
#include "io/safetensors.h"
#include "comm/mpi_backend.h"
#include "mesh/context.h"
#include "model/config_json.h"
#include "plan/cluster.h"
#include "plan/memory_plan.h"
#include "plan/time_plan.h"
#include "train/config.h"
#include "train/config_agree.h"
#include "train/evaluate.h"
#include "train/trainer.h"
#include "train/ps_server.h"
#if LOOM_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif
#if LOOM_HAVE_NCCL
#include "comm/nccl/nccl_backend.h"
#endif

namespace loom::cli {

namespace {

struct TrainArgs {
  std::string config;
  std::vector<std::string> overrides;
  train::TrainOptions options;
  int threads = 1;  // --threads; add_*_command sets main()'s default
  bool check_collectives = false;
  bool plan = false;   // --plan
  std::string plan_cluster;  // --plan-cluster
  std::string device;  // --device: train.device
  double memory_budget_mb = 0;  // --memory-budget-mb; 0: none
};

struct EvalArgs {
  std::string model;
  std::string lora;  // --lora: a PEFT adapter directory, applied unmerged
  std::vector<std::string> data;
  int64_t seq_len = 0;  // 0: the model's max_seq_len
  int64_t batch = 4;
  bool json = false;
  int threads = 1;  // --threads; add_*_command sets main()'s default
};

// A loom or Hugging Face model directory, a model.safetensors file inside
// one, or a .gguf file.
model::ModelDir open_model(const std::string& path) {
  namespace fs = std::filesystem;
  LOOM_REQUIRE(fs::exists(path), "--model '", path, "' does not exist");
  if (fs::is_directory(path) || model::is_gguf_path(path)) return model::load_model_dir(path);
  const fs::path parent = fs::path(path).parent_path();
  const std::string name = fs::path(path).filename().string();
  const bool config_file = name == model::kLoomConfigFile || name == model::kHfConfigFile;
  LOOM_REQUIRE(fs::is_regular_file(path) && fs::path(path).extension() == ".safetensors", "--model '", path,
               "' is ", fs::is_regular_file(path) ? "a file but not a .safetensors file" : "not a file or directory",
               ": give ", config_file ? "the model directory that holds it, '" : "a model directory",
               config_file ? (parent.empty() ? "." : parent.string()) + "'," : "", " or the ", model::kWeightsFile,
               " file in one");
  model::ModelDir m = model::load_model_dir(parent.empty() ? "." : parent.string());
  m.weights = path;
  return m;
}

void run_eval(const EvalArgs& a) {
  set_num_threads(a.threads);
  const model::ModelDir dir = open_model(a.model);
  const int64_t T = a.seq_len > 0 ? a.seq_len : dir.config.max_seq_len;
  LOOM_REQUIRE(T <= dir.config.max_seq_len, "--seq-len ", T, " is invalid: allowed values are 1 to the model's ",
               "max_seq_len = ", dir.config.max_seq_len);
  Pools pools;
  std::unique_ptr<model::FrozenWeights> base;
  model::ModelOptions options;
  if (!a.lora.empty()) {
    options.lora.config = model::read_peft_config(a.lora, dir.config);
    base = model::load_frozen_base(dir, DType::f32, pools);
    options.lora.base = base.get();
  }
  model::Model m(dir.config, a.batch, T, pools, options);
  LOOM_REQUIRE(m.master_params().defined(), "eval: the model does not own its master weights");
  if (base) model::load_peft_adapter(a.lora, dir.config, options.lora.config, m.master_params());
  else model::load_model_params(dir, m.master_params());
  m.sync_params();
  const train::EvalResult r = train::evaluate_shards(m, a.data);
  if (a.json) {
    const nlohmann::ordered_json j = {{"loss", r.loss}, {"perplexity", r.perplexity}, {"tokens", r.tokens},
                                      {"seq_len", T},   {"model", a.model}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("eval: loss %.4f, perplexity %.2f over %lld tokens (%lld windows of %lld)\n", r.loss, r.perplexity,
                static_cast<long long>(r.tokens), static_cast<long long>(r.windows), static_cast<long long>(T));
  }
}

// The pools' device for train.device (GPU `gpu` of this host); its backend
// is registered here, before anything allocates on it.
Device run_device(const train::RunConfig& cfg, bool progress, int gpu = 0) {
  if (cfg.train.device == "cpu") return Device::cpu();
#if LOOM_HAVE_CUDA
  kernels::register_cuda_backend(gpu);
  if (progress) log_info("train: on ", kernels::cuda_device_description(gpu));
  return Device::cuda(gpu);
#else
  (void)progress, (void)gpu;
  fail("train.device = ", cfg.train.device, ": this loom was built without CUDA (cmake found no CUDA toolkit with ",
       "nvcc; configure with -DLOOM_CUDA=ON where one is installed), so it trains on the CPU only (train.device = cpu)");
#endif
}

// This process's rank among the job's processes on its host, as the
// launcher says (Open MPI, MPICH's Hydra, Slurm's srun); the world rank when
// none does (one host).
int host_local_rank(int world_rank) {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* v = std::getenv(name); v != nullptr && *v != '\0') return std::atoi(v);
  return world_rank;
}

// A job of several processes on GPUs: one GPU per process (its rank on the
// host), the mesh's collectives over NCCL, bootstrapped through `world`
// (MPI). Null for a job on CPUs, whose mesh is `world` itself.
std::unique_ptr<comm::Communicator> gpu_world(const train::RunConfig& cfg, comm::Communicator& world,
                                              const comm::Options& options, bool progress, Device& device) {
  if (cfg.train.device == "cpu") {
    device = Device::cpu();
    return nullptr;
  }
#if LOOM_HAVE_NCCL
  std::string why;
  const int gpus = comm::cuda_device_count(&why);
  const int local = host_local_rank(world.rank());
  const bool share = comm::nccl_shares_gpus();  // ranks beyond the GPUs take them in turn
  // Agreed before any rank refuses, so that none waits in NCCL's set-up for one that left.
  float missing = gpus > 0 && (local < gpus || share) ? 0.0f : 1.0f;
  world.all_reduce(Tensor(&missing, DType::f32, {1}), comm::ReduceOp::max)->wait();
  LOOM_REQUIRE(gpus > 0, "train.device = ", cfg.train.device, ": rank ", world.rank(), " finds no GPU: ", why);
  LOOM_REQUIRE(local < gpus || share, "train.device = ", cfg.train.device, ": rank ", world.rank(), " is process ",
               local, " of its host, which has ", gpus, " GPU(s): start at most one process per GPU on each host ",
               "(NCCL cannot place two ranks of one communicator on the same GPU; to test the NCCL paths on fewer ",
               "GPUs, set LOOM_NCCL_SHARE_GPU=1: slow)");
  LOOM_REQUIRE(missing == 0.0f, "train.device = ", cfg.train.device, ": another rank of this job has no GPU of its ",
               "own (its error says why)");
  device = run_device(cfg, progress, local % gpus);
  return comm::nccl_world(world, local % gpus, options, device_stream(device));  // collectives wait for the ops
#else
  (void)world, (void)options, (void)progress, (void)device;
  fail("train.device = ", cfg.train.device, " under mpirun: this loom was built without NCCL (cmake found no CUDA ",
       "toolkit with nvcc and NCCL), which the collectives of a multi-GPU run need; train on one process, or on the ",
       "CPU (train.device = cpu)");
#endif
}

// --plan: loom plan's prediction for every rank (the step's own figures:
// the final model's gather comes later), printed by world rank 0 before
// training, and kept for each rank to print beside what it measures. A
// layout loom plan does not predict yet is a warning: the run goes on.
// With --plan-cluster, also the predicted step time on that cluster.
void plan_run(const train::RunConfig& cfg, int world_rank, const std::string& cluster,
              train::TrainOptions& options) {
  try {
    for (const plan::RankMemory& r : plan::plan_memory(cfg)) {
      if (world_rank == 0) std::printf("plan: %s", plan::memory_plan_table(r).c_str());
      options.planned_memory.push_back(r.bytes);
    }
    std::fflush(stdout);
  } catch (const loom::Error& e) {
    if (world_rank == 0) log_warn("--plan: ", e.what(), "; training without the prediction");
  }
  if (cluster.empty()) return;
  const plan::Cluster c = plan::cluster_from(cluster);  // a bad cluster is the user's error: no training
  try {
    const plan::StepTime t = plan::predict_step_time(cfg, c);
    if (world_rank == 0) std::printf("plan: on %s: %s\n", c.name.c_str(), plan::step_time_line(t).c_str());
    std::fflush(stdout);
    options.planned_step_s = t.total;
  } catch (const loom::Error& e) {
    if (world_rank == 0) log_warn("--plan-cluster: ", e.what(), "; training without the step-time prediction");
  }
}

double mib(double bytes) { return bytes / (1 << 20); }

// The peak of a rank's buffers from loom plan's peaks per tag: every tag
// that holds its bytes through the run at its peak, plus the larger of the
// passing ones (comm's bucket buffers and gathers, the workspace's start-up
// init), which do not meet.
double predicted_total(const MemoryReport& r) {
  double total = 0, passing = 0;
  for (int t = 0; t < kNumMemTags; ++t) {
    const auto peak = static_cast<double>(r.tags[static_cast<size_t>(t)].peak);
    const auto tag = static_cast<MemTag>(t);
    if (tag == MemTag::comm || tag == MemTag::workspace) passing = std::max(passing, peak);
    else total += peak;
  }
  return total + passing;
}

// "480.1 MiB (params 100.0, ...)": the predicted peak and each tag's.
std::string predicted_peak(const MemoryReport& r) {
  std::string parts;
  for (int t = 0; t < kNumMemTags; ++t)
    if (r.tags[static_cast<size_t>(t)].peak > 0)
      parts += concat(parts.empty() ? "" : ", ", mem_tag_name(static_cast<MemTag>(t)), " ",
                      mib(static_cast<double>(r.tags[static_cast<size_t>(t)].peak)));
  return concat(mib(predicted_total(r)), " MiB (", parts, ")");
}

// --memory-budget-mb, before anything is built: loom plan's peak for this
// rank's buffers plus what the process holds already (VmRSS) must fit, or
// the run is refused with the numbers, and with what offloading the
// optimizer to disk would need when it is not on yet. During the run,
// run_training holds the OS's count (VmHWM) to it after each step.
void check_memory_budget(const train::RunConfig& cfg, int world_rank, const TrainArgs& a) {
  if (a.memory_budget_mb <= 0) return;
  LOOM_REQUIRE(cfg.parallel.mode != "ps", "--memory-budget-mb: loom plan does not predict parameter-server runs; ",
               "train without a budget");
  const plan::MemoryPlanOptions o{.writes_model = !a.options.out_dir.empty() || !cfg.checkpoint.dir.empty()};
  const MemoryReport need = plan::plan_memory_rank(cfg, world_rank, o).bytes;
  const auto held = static_cast<double>(process_resident_bytes());
  const double budget = a.memory_budget_mb * (1 << 20);
  if (predicted_total(need) + held <= budget) return;
  std::string instead = "; shard the state over more ranks (parallel.zero_stage, dp, tp, pp) or lower the "
                        "micro-batch";
  // What the disk tiers this run does not use yet would need (params:
  // with ZeRO-3's shards).
  std::string tiers;
  for (const char* tier : {"optimizer", "params"}) {
    if (cfg.parallel.offload == tier || (cfg.parallel.offload == "params" && tier == std::string("optimizer")))
      continue;
    train::RunConfig off = cfg;
    off.parallel.offload = tier, off.parallel.offload_dir = "(offload_dir)";
    if (tier == std::string("params")) off.parallel.zero_stage = 3;
    const MemoryReport with = plan::plan_memory_rank(off, world_rank, o).bytes;
    tiers += tier == std::string("optimizer")
                 ? concat("; with parallel.offload = optimizer (AdamW's state and the master weights on disk) its ",
                          "buffers would peak at ", predicted_peak(with))
                 : concat("; with parallel.offload = params", cfg.parallel.zero_stage == 3 ? "" : " and zero_stage = 3",
                          " (the parameter and gradient shards on disk too) at ", predicted_peak(with));
  }
  instead = tiers + instead;
  fail("--memory-budget-mb = ", a.memory_budget_mb, ": rank ", world_rank, " needs ",
       mib(predicted_total(need) + held), " MiB: its buffers peak at ", predicted_peak(need),
       " (loom plan) beside the ", mib(held), " MiB the process holds before them", instead);
}

// A parameter-server job (parallel.mode = ps): world ranks 0..ps_servers-1
// serve (train/ps_server.h), the rest train as the workers' mesh.
template <typename Finish>
void run_ps_job(const train::RunConfig& cfg, const train::TrainOptions& options, comm::Communicator& world,
                const Finish& finish) {
  const int servers = static_cast<int>(cfg.parallel.ps_servers);
  const bool serving = world.rank() < servers;
  const std::unique_ptr<comm::Communicator> side =
      world.split(serving ? 0 : 1, world.rank(), serving ? "ps servers" : "ps workers");
  if (serving) {
    Pools pools;
    train::run_ps_server(cfg, world, *side, pools);
    if (options.memory_report)  // the server's shards (the workers print theirs)
      std::printf("%s", concat("[server ", side->rank(), "/", side->size(), "]\n", pools.report().table()).c_str());
    return;
  }
  mesh::Mesh mesh(train::mesh_shape(cfg.parallel), *side);
  Pools pools(run_device(cfg, options.progress && side->rank() == 0));
  Context ctx{mesh, pools, &world};
  finish(train::run_training(cfg, options, ctx));
}

// Every process of the job trains: the run's layout (the mesh, or PS
// servers + workers) must cover them all; loom::Error saying how to start
// the right number under this launcher otherwise.
void check_world_covers_run(const train::ParallelConfig& p, const mesh::MeshShape& shape, int world_size,
                            const comm::Launcher& launcher) {
  if (p.mode == "ps") {  // ps_servers servers, then dp workers
    LOOM_REQUIRE(world_size == p.ps_servers + p.dp, "parallel.mode = ps with parallel.ps_servers = ", p.ps_servers,
                 " and parallel.dp = ", p.dp, " workers needs ", p.ps_servers + p.dp, " processes; this job has ",
                 world_size, ": ", comm::world_hint(launcher, world_size, p.ps_servers + p.dp));
    return;
  }
  try {
    mesh::validate_shape(shape, world_size);
  } catch (const Error& e) {
    const int64_t needed = int64_t{shape.pp} * shape.dp * shape.cp * shape.tp;
    const std::string hint =
        needed > 0 && needed <= 1 << 20 ? comm::world_hint(launcher, world_size, static_cast<int>(needed)) : "";
    if (hint.empty()) throw;  // not the world's size (ep not dividing dp, say)
    fail(e.what(), ": ", hint);
  }
}

// loom train's work once its flags are parsed.
void run_train(TrainArgs& a, int world_size, const comm::Launcher& launcher, int& exit_code) {
  // First: a signal during start-up then stops the run cleanly too.
  const StopSignals stop("finishing the current step, then checkpointing (if checkpoint.every > 0) and stopping");
  a.options.stop = &stop;
  set_num_threads(a.threads);
  std::vector<std::string> overrides = a.overrides;
  if (!a.device.empty()) overrides.push_back("train.device=" + a.device);
  const train::RunConfig cfg = train::load_run_config(a.config, overrides);
  if (world_size > 1) {
    // Every rank reads its own flags: they must have resolved the same run,
    // checked before anything depends on it, on a communicator with default
    // options (comm_algo and timeout_s may be what differs).
    nlohmann::ordered_json run = train::agreed_run_config(cfg);
    run["--check-collectives"] = a.check_collectives;  // adds collectives on the ranks that check
    train::require_same_run_config(*comm::mpi_world(), run);
  }
  const train::ParallelConfig& p = cfg.parallel;
  const mesh::MeshShape shape = train::mesh_shape(p);
  const bool ps = p.mode == "ps";
  check_world_covers_run(p, shape, world_size, launcher);
  // Stopped by SIGTERM / SIGINT (after a checkpoint): the shell's status
  // for that signal, as if it had killed the process.
  const auto finish = [&exit_code](const train::TrainSummary& s) {
    if (s.stop_signal != 0) exit_code = 128 + s.stop_signal;
  };
  // The job's communicators carry the run's [parallel] settings.
  comm::Options options;
  options.timeout_s = p.timeout_s;
  options.algo = comm::algo_from_name(p.comm_algo);
  options.check_collectives = a.check_collectives;
  a.options.memory_budget_bytes = static_cast<int64_t>(a.memory_budget_mb * (1 << 20));
  if (world_size == 1) {  // a plain process: a mesh of one, no MPI
    check_memory_budget(cfg, 0, a);
    if (a.plan) plan_run(cfg, 0, a.plan_cluster, a.options);
    mesh::LocalContext local(options, run_device(cfg, a.options.progress));
    finish(train::run_training(cfg, a.options, local.ctx()));
    return;
  }
  const std::unique_ptr<comm::Communicator> world = comm::mpi_world(options);
  if (ps) {
    if (a.plan && world->rank() == 0)
      log_warn("--plan: loom plan does not predict parameter-server training yet; training without the prediction");
    return run_ps_job(cfg, a.options, *world, finish);
  }
  check_memory_budget(cfg, world->rank(), a);
  if (a.plan) plan_run(cfg, world->rank(), a.plan_cluster, a.options);
  Device device;
  const std::unique_ptr<comm::Communicator> on_gpus =
      gpu_world(cfg, *world, options, a.options.progress && world->rank() == 0, device);
  mesh::Mesh mesh(shape, on_gpus ? *on_gpus : *world);
  Pools pools(device);
  Context ctx{mesh, pools};
  finish(train::run_training(cfg, a.options, ctx));
}

}  // namespace

void add_train_command(CLI::App& app, int world_size, const comm::Launcher& launcher, int default_threads,
                       int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "train",
      "Train a model from a TOML run config (configs/*.toml; keys in DESIGN.md §7). Data parallel under mpirun -np "
      "<parallel.dp> (parallel.zero_stage 0-3, bucket_mb, offload_optimizer), or parameter-server training under "
      "mpirun -np <ps_servers + dp> (parallel.mode = ps, ps_server = sum | optimizer, staleness); under Slurm "
      "srun -n <processes> --mpi=pmix starts the same jobs (README: \"Slurm\"); train.dtype = "
      "fp32, bf16 or fp16 (dynamic loss scaling); train.recompute = none, selective or full; train.device = cpu or "
      "cuda (--device: one NVIDIA GPU per process, dense models, in builds with CUDA; under mpirun dp/ZeRO and tp over "
      "NCCL). At the "
      "end the model is written to --out or checkpoint.dir as model.safetensors + loom_config.json, which loom eval "
      "and loom generate read; with a [lora] section (rank, alpha, targets, base) only low-rank adapters train on "
      "the frozen base (a .gguf base keeps its quantized blocks: QLoRA), and the adapter is written in PEFT's "
      "format (loom lora merge, eval --lora; README: \"Fine-tuning\"). With checkpoint.every > 0, checkpoints go to checkpoint.dir/step_NNNNNN every that "
      "many steps and at the end; checkpoint.resume = auto (the default) resumes from the newest complete step dir "
      "of checkpoint.dir, never starts fresh, a step dir resumes from it. SIGTERM, SIGINT or SIGUSR1: the "
      "current step finishes and is checkpointed (with checkpoint.every = 0 nothing is saved), then loom exits with "
      "143, 130 or 138 (a second signal exits at once). README: \"Long runs\".");
  auto a = std::make_shared<TrainArgs>();
  a->threads = default_threads;
  cmd->add_option("--config", a->config, "TOML run config")->required();
  cmd->add_option("--set", a->overrides, "override a config key: section.key=value (repeatable)");
  cmd->add_option("--metrics", a->options.metrics_path, "JSON Lines file, one object per step (overrides log.metrics)");
  cmd->add_option("--out", a->options.out_dir, "directory for the final model (overrides checkpoint.dir)");
  cmd->add_option("--device", a->device, "cpu or cuda: where to train (overrides train.device; cuda: one NVIDIA GPU "
                                         "per process, in builds with CUDA)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_flag("--memory-report", a->options.memory_report,
                "print current and peak bytes per memory tag at the end (every rank: under ZeRO each holds a shard)");
  cmd->add_flag("--memory-json", a->options.memory_json,
                "print every rank's current and peak bytes per memory tag at the end as JSON lines: {\"world_rank\", "
                "\"pp_rank\", \"dp_rank\", \"cp_rank\", \"tp_rank\", \"ep_rank\", \"tag\", \"current_bytes\", "
                "\"peak_bytes\"}");
  cmd->add_flag("--plan", a->plan,
                "print loom plan's prediction of every rank's bytes per memory tag before training, and after each "
                "rank's first step its measured bytes beside them");
  cmd->add_option("--plan-cluster", a->plan_cluster,
                  "with --plan: also predict the step time on this cluster (a loom plan --calibrate file for this "
                  "machine, or a preset) and print the measured median step beside it at the end");
  cmd->add_option("--memory-budget-mb", a->memory_budget_mb,
                  "the memory each process may use, in MiB: a run whose predicted peak (loom plan, plus what the "
                  "process holds at start) is over it is refused with the numbers; during the run the OS's count "
                  "(VmHWM) is checked after every step")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--check-collectives", a->check_collectives,
                "debug: ranks verify they issue the same collective (op, size, dtype) in the same order and report "
                "the first mismatch instead of hanging");
  cmd->add_option("--threads", a->threads, "OpenMP threads (default: the cores this process may use)")
      ->check(CLI::Range(1, 1024));
  cmd->callback([a, world_size, launcher, &exit_code] { run_train(*a, world_size, launcher, exit_code); });
}

void add_eval_command(CLI::App& app, int default_threads) {
  CLI::App* cmd = app.add_subcommand(
      "eval",
      "Mean next-token loss and perplexity of a model over every window of token shards, in order. --model is a "
      "directory written by loom train (loom_config.json + model.safetensors), a Hugging Face directory as loom "
      "convert writes it (config.json + model.safetensors), a model.safetensors file inside either, or a .gguf file "
      "(quantized weights are dequantized to f32).");
  auto a = std::make_shared<EvalArgs>();
  a->threads = default_threads;
  cmd->add_option("--model", a->model, "model directory, model.safetensors file or .gguf file")->required();
  cmd->add_option("--data", a->data, "token shards (.bin paths or globs), e.g. data/brown/val_000000.bin")->required();
  cmd->add_option("--seq-len", a->seq_len, "window length T (default: the model's max_seq_len)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  cmd->add_option("--batch", a->batch, "windows per forward pass")->check(CLI::Range(int64_t{1}, int64_t{4096}))
      ->capture_default_str();
  cmd->add_flag("--json", a->json, "print one JSON object: loss, perplexity, tokens");
  cmd->add_option("--lora", a->lora,
                  "a LoRA adapter (PEFT directory, as loom train writes with [lora]) applied to --model unmerged");
  cmd->add_option("--threads", a->threads, "OpenMP threads (default: the cores this process may use)")
      ->check(CLI::Range(1, 1024));
  cmd->callback([a] { run_eval(*a); });
}

}  // namespace loom::cli
