#include "bench/kernels_bench.h"
#include "cli/commands.h"
#include "core/threads.h"

namespace loom::cli {

void add_bench_command(CLI::App& app, int& exit_code, const std::string& command_line) {
  CLI::App* bench = app.add_subcommand("bench", "Measure loom's speed");
  bench->require_subcommand(1);
  CLI::App* kernels = bench->add_subcommand("kernels", "GFLOP/s of matmul and tokens/s of attention on the CPU");
  auto opts = std::make_shared<bench::KernelBenchOptions>();
  opts->command = command_line;
  auto threads = std::make_shared<int>(default_num_threads());
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

}  // namespace loom::cli
