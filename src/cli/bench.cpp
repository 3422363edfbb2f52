#include "bench/comm_bench.h"
#include "bench/offload_bench.h"
#include "bench/ps_transport.h"
#include "comm/mpi_runtime.h"
#include "bench/kernels_bench.h"
#include "bench/serve_bench.h"
#include "bench/train_bench.h"
#include "cli/commands.h"
#include "cli/engine_setup.h"
#include "core/dtype.h"
#include "core/threads.h"

namespace loom::cli {
namespace {

void add_bench_kernels(CLI::App& bench, int& exit_code, const std::string& command_line, int default_threads) {
  CLI::App* kernels = bench.add_subcommand(
      "kernels", "GFLOP/s of matmul, tokens/s of attention and GB/s of the memory-bound ops on the CPU");
  auto opts = std::make_shared<bench::KernelBenchOptions>();
  opts->command = command_line;
  auto threads = std::make_shared<int>(default_threads);
  kernels->add_flag("--json", opts->json, "print JSON Lines, one object per measurement");
  kernels->add_option("--threads", *threads, "OpenMP threads (default: the cores this process may use)")
      ->check(CLI::Range(1, 1024));
  kernels->add_option("--filter", opts->filter,
                      "only measurements whose op, dtype or case name contains this text (e.g. bf16, lm_head)");
  kernels->add_flag("--openblas", opts->openblas, "also time OpenBLAS sgemm at the f32 matmul cases");
  kernels->add_option("--seconds", opts->min_seconds, "minimum measuring time per case")
      ->check(CLI::Range(0.001, 3600.0));
  kernels->callback([opts, threads, &exit_code] {
    set_num_threads(*threads);
    opts->threads = *threads;
    exit_code = bench::run_kernel_bench(*opts);
  });
}

// Runs on every rank of an mpirun job: data parallel over the world (with
// --tp / --pp: tensor / pipeline groups, the rest data parallel).
// `loom bench train`'s parallel layouts under mpirun: dp with ZeRO, tp, pp, cp.
void add_train_parallel_options(CLI::App& train, bench::TrainBenchOptions& o) {
  train.add_option("--zero-stage", o.zero_stage,
                    "ZeRO stage 0 (DDP) to 3 (FSDP); under mpirun the ranks train data parallel")
      ->capture_default_str()
      ->check(CLI::Range(0, 3));
  train.add_option("--bucket-mb", o.bucket_mb, "stages 0-2: f32 gradient MiB per bucket")
      ->capture_default_str()
      ->check(CLI::Range(1e-6, 1e6));
  train.add_option("--comm-algo", o.comm_algo, "under mpirun: mpi (MPI's collectives) or ring (loom's)")
      ->capture_default_str()
      ->check(CLI::IsMember({"mpi", "ring"}));
  train.add_option("--tp", o.tp,
                    "under mpirun: tensor-parallel group size (neighbouring ranks; the rest data parallel)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  train.add_flag("--sequence-parallel", o.sequence_parallel, "with --tp: shard norms and residuals along tokens");
  train.add_option("--pp", o.pp,
                    "under mpirun: pipeline stages (pp x dp x tp = ranks); prints each rank's bubble and peak "
                    "activation memory next to the schedule's theory")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  train.add_option("--schedule", o.schedule, "with --pp: afab | 1f1b | interleaved")
      ->capture_default_str()
      ->check(CLI::IsMember({"afab", "1f1b", "interleaved"}));
  train.add_option("--virtual-stages", o.virtual_stages, "with --schedule interleaved: model chunks per rank")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  train.add_option("--micro-batches", o.micro_batches, "with --pp: micro-batches of B x T per step")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  train.add_option("--pp-layers", o.pp_layers,
                    "with --pp: layers per stage, pp x virtual-stages of them (default: the balanced partition)")
      ->delimiter(',');
  train.add_option("--cp", o.cp,
                   "under mpirun: context-parallel group size (dp x cp = ranks); prints tokens/s, the cp "
                   "communication hidden behind attention, the balance of attention work and peak memory per rank")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  train.add_option("--cp-algo", o.cp_algo, "with --cp: ring (K/V around the ring) | allgather")
      ->capture_default_str()
      ->check(CLI::IsMember({"ring", "allgather"}));
  train.add_flag("--cp-contiguous", o.cp_contiguous, "with --cp: contiguous chunks instead of zig-zag");
  train.get_option("--cp")->each([&o](const std::string&) { o.cp_bench = true; });
  train.add_option("--activation-budget-mb", o.activation_budget_mb,
                   "with --cp: refuse a run whose predicted activations and cp buffers per rank exceed this")
      ->check(CLI::Range(0.0, 1e9));
  train.add_option("--moe", o.moe,
                   "experts per MoE layer (a Llama preset's MLPs); prints tokens/s next to the dense model of the "
                   "same active parameters, the share of a step in all-to-all and the dropped fraction")
      ->check(CLI::Range(1, 4096));
  train.add_option("--top-k", o.top_k, "with --moe: experts per token")->capture_default_str()->check(CLI::Range(1, 4096));
  train.add_option("--capacity-factor", o.capacity_factor, "with --moe: expert capacity factor (0: dropless)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1000.0));
  train.add_option("--ep", o.ep, "with --moe, under mpirun: expert-parallel group size (divides the ranks)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
}

void add_bench_train(CLI::App& bench, int& exit_code, const std::string& command_line, int default_threads) {
  CLI::App* train = bench.add_subcommand(
      "train", "tokens/s, MFU and peak memory of training steps of a preset model on random tokens");
  auto opts = std::make_shared<bench::TrainBenchOptions>();
  opts->command = command_line;
  auto threads = std::make_shared<int>(default_threads);
  train->add_option("--model", opts->model, "model preset (gpt2-124m, gpt2-350m, llama-110m, gpt2-tiny, ...)")
      ->capture_default_str();
  train->add_option("--set", opts->sets, "key=value overriding a [model] key of the preset (e.g. n_layer=4; d_ff is not re-derived from n_embd)");
  train->add_option("--batch", opts->batch, "B: sequences per step")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  train->add_option("--seq", opts->seq, "T: tokens per sequence")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  train->add_option("--steps", opts->steps, "timed steps")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  train->add_option("--warmup", opts->warmup, "untimed steps before them")->capture_default_str()->check(
      CLI::Range(0, 1 << 20));
  train->add_option("--dtype", opts->dtype,
                    "fp32 | bf16 | fp16 (16-bit compute, fp32 master weights and optimizer state; fp16 with dynamic "
                    "loss scaling)")
      ->capture_default_str()
      ->check(CLI::IsMember(std::vector<std::string>(kPrecisionNames.begin(), kPrecisionNames.end())));
  train->add_option("--recompute", opts->recompute,
                    "none | selective (rerun norms, attention core, activation in backward) | full (rerun blocks)")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "selective", "full"}));
  train->add_option("--threads", *threads, "OpenMP threads (default: the cores this process may use)")
      ->check(CLI::Range(1, 1024));
  add_train_parallel_options(*train, *opts);
  train->add_flag("--json", opts->json, "print one JSON Lines object");
  train->add_flag("--ops", opts->ops,
                  "then --steps more steps with every kernel op timed on its own, and a table of the ops (calls, "
                  "time, share), most time first");
  train->callback([opts, threads, &exit_code] {
    set_num_threads(*threads);
    opts->threads = *threads;
    exit_code = bench::run_train_bench(*opts);
  });
}

// Runs on every rank of an mpirun job (a plain process is a world of one).
void add_bench_comm(CLI::App& bench, int& exit_code, const std::string& command_line) {
  CLI::App* comm = bench.add_subcommand(
      "comm", "time, algbw and busbw of a collective over the ranks of an mpirun job (nccl-tests convention)");
  auto opts = std::make_shared<bench::CommBenchOptions>();
  opts->command = command_line;
  auto min = std::make_shared<std::string>("1K");
  auto max = std::make_shared<std::string>("256M");
  comm->add_option("--op", opts->op, "the collective")
      ->capture_default_str()
      ->check(CLI::IsMember({"all_reduce", "reduce_scatter", "all_gather", "all_to_all"}));
  comm->add_option("--algo", opts->algo, "mpi: MPI's collectives; ring: loom's ring algorithms")
      ->capture_default_str()
      ->check(CLI::IsMember({"mpi", "ring"}));
  comm->add_option("--min", *min, "smallest size in bytes (K, M, G suffixes)")->capture_default_str();
  comm->add_option("--max", *max, "largest size in bytes; sizes double from --min")->capture_default_str();
  comm->add_option("--iters", opts->iters, "at most this many timed iterations per size (>= 3, about 1 s per size)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  comm->add_flag("--check-collectives", opts->check_collectives, "verify every rank issues the same collective");
  comm->add_flag("--json", opts->json, "print JSON Lines, one object per size");
  comm->callback([opts, min, max, &exit_code] {
    opts->min_bytes = bench::parse_bytes(*min);
    opts->max_bytes = bench::parse_bytes(*max);
    exit_code = bench::run_comm_bench(*opts);
  });
}

void add_bench_offload(CLI::App& bench, int& exit_code, const std::string& command_line) {
  CLI::App* cmd = bench.add_subcommand(
      "offload", "read and write MB/s of an offload file (parallel.offload) against the disk's own, O_DIRECT and "
      "through the page cache");
  auto opts = std::make_shared<bench::OffloadBenchOptions>();
  opts->command = command_line;
  auto size = std::make_shared<std::string>("1G");
  auto record = std::make_shared<std::string>("4M");
  cmd->add_option("--dir", opts->dir, "the directory (the disk) to measure")->capture_default_str();
  cmd->add_option("--size", *size, "bytes written and read (K, M, G suffixes)")->capture_default_str();
  cmd->add_option("--record", *record, "bytes a record (a multiple of 4K)")->capture_default_str();
  cmd->add_option("--io-threads", opts->threads, "the offload file's I/O threads")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_option("--depth", opts->depth, "records in flight")->capture_default_str()->check(CLI::Range(1, 256));
  cmd->add_flag("--json", opts->json, "print JSON Lines, one object per method");
  cmd->callback([opts, size, record, &exit_code] {
    opts->size = bench::parse_bytes(*size);
    opts->record = bench::parse_bytes(*record);
    exit_code = bench::run_offload_bench(*opts);
  });
}

void add_bench_ps_transport(CLI::App& bench, int& exit_code, const std::string& command_line) {
  CLI::App* cmd = bench.add_subcommand(
      "ps-transport", "a parameter server's push and pull over MPI point-to-point against one-sided RMA (rank 0 "
      "serves, the other ranks of an mpirun job push)");
  auto opts = std::make_shared<bench::PsTransportOptions>();
  opts->command = command_line;
  auto min = std::make_shared<std::string>("64K");
  auto max = std::make_shared<std::string>("64M");
  cmd->add_option("--min", *min, "smallest gradient in bytes (K, M, G suffixes)")->capture_default_str();
  cmd->add_option("--max", *max, "largest gradient in bytes; sizes double from --min")->capture_default_str();
  cmd->add_option("--iters", opts->iters, "timed rounds per size (the median is printed)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->callback([opts, min, max, &exit_code] {
    opts->min_bytes = bench::parse_bytes(*min);
    opts->max_bytes = bench::parse_bytes(*max);
    comm::mpi_ensure_initialized();
    exit_code = bench::run_ps_transport_bench(*opts);
  });
}

// The model and the engine's sizes of `loom bench serve`.
void add_serve_model_options(CLI::App& serve, bench::ServeBenchOptions& o) {
  serve.add_option("--preset", o.preset, "model preset with random weights (gpt2-124m, gpt2-350m, llama-110m, "
                                         "gpt2-tiny, ...)")
      ->capture_default_str();
  serve.add_option("--model", o.model_dir,
                   "a model directory (loom or Hugging Face format) or GGUF file instead of --preset");
  add_engine_options(serve, o.engine);  // the flags of generate and serve, with their defaults
  serve.add_option("--seed", o.seed, "seeds the weights, the workload and the arrivals")
      ->capture_default_str()
      ->check(CLI::Validator(  // CLI11 would wrap -1 around to 2^64 - 1
          [](std::string& v) { return v.starts_with('-') ? std::string("a seed is an integer >= 0") : std::string(); },
          "UINT"));
}

// The workload (vLLM's benchmark_serving "random" dataset) and the modes.
void add_serve_workload_options(CLI::App& serve, bench::ServeBenchOptions& o) {
  serve.add_option("--mode", o.mode,
                   "throughput: requests through the engine, vLLM's metrics; decode-bound: decode tokens/s of "
                   "--num-requests sequences decoding together against the memory-bandwidth bound; capacity: sequences a KV budget runs at once, paged vs "
                   "contiguous (no model)")
      ->capture_default_str()
      ->check(CLI::IsMember({"throughput", "decode-bound", "capacity"}));
  serve.add_option("--num-requests", o.num_requests, "requests (default: throughput 64, decode-bound 1, capacity 1000)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  serve.add_option("--input-len", o.input_len, "prompt tokens (default 128; capacity: the mean, default 161)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  serve.add_option("--output-len", o.output_len, "new tokens (default 128; capacity: the mean, default 338)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  serve.add_option("--range-ratio", o.range_ratio, "throughput: lengths uniform in [L (1 - r), L (1 + r)]")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.999999));
  // Checked by the bench (> 0): CLI11's number checks reject inf.
  serve.add_option("--request-rate", o.request_rate, "throughput: Poisson arrivals per second (default inf: all at "
                                                     "t = 0)");
  serve.add_option("--concurrency", o.concurrency, "throughput: requests in flight at most (default: no limit)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  serve.add_flag("--ignore-eos,!--no-ignore-eos", o.ignore_eos,
                 "keep generating past EOS, so each request gets --output-len tokens (default, as vLLM's benchmark)");
  serve.add_flag("--batch-invariant,!--no-batch-invariant", o.engine.batch_invariant,
                 "batch-invariant linears (default, as loom generate and loom serve run); --no-batch-invariant: "
                 "oneDNN's GEMM, to measure what invariance costs");
  serve.add_option("--lora-adapters", o.lora_adapters, "throughput: serve this many LoRA adapters unmerged (random, "
                                                       "on every linear), the requests spread over them in turn")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 10));
  serve.add_option("--lora-rank", o.lora_rank, "with --lora-adapters: their rank")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  serve.add_flag("--json", o.json, "print one JSON Lines object");
}

void add_bench_serve(CLI::App& bench, int& exit_code, const std::string& command_line, int default_threads) {
  CLI::App* serve = bench.add_subcommand(
      "serve", "the serving engine offline: vLLM-style throughput and latency, decode of one or more sequences "
               "against the memory bandwidth bound, or paged vs contiguous KV capacity");
  auto opts = std::make_shared<bench::ServeBenchOptions>();
  opts->command = command_line;
  auto threads = std::make_shared<int>(default_threads);
  add_serve_workload_options(*serve, *opts);
  add_serve_model_options(*serve, *opts);
  serve->add_option("--threads", *threads, "OpenMP threads (default: the cores this process may use)")
      ->check(CLI::Range(1, 1024));
  serve->callback([opts, threads, &exit_code] {
    set_num_threads(*threads);
    opts->threads = *threads;
    exit_code = bench::run_serve_bench(*opts);
  });
}

}  // namespace

void add_bench_command(CLI::App& app, int& exit_code, const std::string& command_line, int default_threads) {
  CLI::App* bench = app.add_subcommand("bench", "Measure loom's speed");
  bench->require_subcommand(1);
  add_bench_kernels(*bench, exit_code, command_line, default_threads);
  add_bench_train(*bench, exit_code, command_line, default_threads);
  add_bench_comm(*bench, exit_code, command_line);
  add_bench_ps_transport(*bench, exit_code, command_line);
  add_bench_offload(*bench, exit_code, command_line);
  add_bench_serve(*bench, exit_code, command_line, default_threads);
}

}  // namespace loom::cli
