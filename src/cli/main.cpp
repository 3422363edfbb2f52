// loom: the command line. main() is the only place that reads the
// environment or the process's arguments; it builds what the libraries need
// and calls them (DESIGN.md §1.5).
#include <CLI/CLI.hpp>

#include <exception>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"

int main(int argc, char** argv) {
  CLI::App app{"loom: train and serve transformer language models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "loom 0.1.0");
  std::string command_line = argv[0];
  for (int i = 1; i < argc; ++i) command_line += std::string(" ") + argv[i];
  int exit_code = 0;
  loom::cli::add_bench_command(app, exit_code, command_line);
  loom::cli::add_data_command(app);
  loom::cli::add_train_command(app);
  loom::cli::add_eval_command(app);
  loom::cli::add_generate_command(app);
  loom::cli::add_convert_command(app);
  try {
    app.parse(argc, argv);  // runs the chosen command's callback
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const loom::Error& e) {
    loom::log_error(e.what());
    return 1;
  } catch (const std::exception& e) {
    loom::log_error(e.what());
    return 2;
  }
  return exit_code;
}
