// Each `loom` subcommand registers itself on the app; its callback runs the
// command and stores the process exit code. User errors propagate as
// loom::Error and main() prints them.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "comm/launcher.h"

namespace loom::cli {

// command_line: the process's arguments joined, printed by benchmarks so a
// reader can reproduce their figures. default_threads: the --threads default
// main() chose for this process (core/threads.h: default_num_threads, share_of_cpus).
void add_bench_command(CLI::App& app, int& exit_code, const std::string& command_line,
                       int default_threads);  // loom bench kernels, train
void add_data_command(CLI::App& app, int default_threads);  // loom data prepare
// world_size: processes of the job (1: a plain process); launcher: what
// started them (comm/launcher.h), named when the world is not the config's.
void add_train_command(CLI::App& app, int world_size, const comm::Launcher& launcher, int default_threads,
                       int& exit_code);  // loom train (exit_code: 128 + a stop signal)
void add_eval_command(CLI::App& app, int default_threads);  // loom eval
void add_plan_command(CLI::App& app, int world_size);  // loom plan
void add_generate_command(CLI::App& app);  // loom generate
void add_serve_command(CLI::App& app, int default_threads);  // loom serve
void add_model_commands(CLI::App& app);  // loom create, list, show, cp, rm
// default_host: LOOM_HOST, else http://127.0.0.1:8000.
void add_run_commands(CLI::App& app, const std::string& default_host, int default_threads);  // loom run, ps
void add_convert_command(CLI::App& app);   // loom convert, loom quantize, loom init-model

}  // namespace loom::cli
