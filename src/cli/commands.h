// Each `loom` subcommand registers itself on the app; its callback runs the
// command and stores the process exit code. User errors propagate as
// loom::Error and main() prints them.
#pragma once

#include <CLI/CLI.hpp>

namespace loom::cli {

void add_bench_command(CLI::App& app, int& exit_code);  // loom bench kernels

}  // namespace loom::cli
