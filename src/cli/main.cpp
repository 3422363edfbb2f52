// loom: the command line. main() is the only place that reads the
// environment or the process's arguments; it builds what the libraries need
// and calls them (DESIGN.md §1.5).
//
// Under mpirun every process runs main(). The commands that work across
// processes (train, bench comm, bench train) run on every rank; every other
// command runs on rank 0 while the other ranks wait for it and exit with its
// status, so `mpirun -np N loom <anything>` does the work once. Every log line carries
// "[rank r/N]".
#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "comm/mpi_backend.h"
#include "core/error.h"
#include "core/log.h"

namespace {

// train, bench comm and bench train run on every rank; the rest on rank 0 only.
bool runs_on_every_rank(int argc, char** argv) {
  const std::string first = argc > 1 ? argv[1] : "", second = argc > 2 ? argv[2] : "";
  return first == "train" || (first == "bench" && (second == "comm" || second == "train"));
}

int run_command(int argc, char** argv, int world_size) {
  CLI::App app{"loom: train and serve transformer language models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "loom 0.1.0");
  std::string command_line = argv[0];
  for (int i = 1; i < argc; ++i) command_line += std::string(" ") + argv[i];
  int exit_code = 0;
  loom::cli::add_bench_command(app, exit_code, command_line);
  loom::cli::add_data_command(app);
  loom::cli::add_train_command(app, world_size);
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

}  // namespace

int main(int argc, char** argv) {
  // OpenMPI's launcher sets OMPI_COMM_WORLD_SIZE in every process it starts;
  // a plain process skips MPI (and its start-up time) altogether.
  if (std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr) return run_command(argc, argv, 1);
  std::unique_ptr<loom::comm::Communicator> world;
  try {
    // Ranks other than 0 may wait as long as rank 0's command runs.
    loom::comm::Options idle;
    idle.timeout_s = 365.0 * 24 * 3600;
    world = loom::comm::mpi_world(idle);
  } catch (const loom::Error& e) {
    loom::log_error(e.what());
    return 1;
  }
  loom::set_log_rank(world->rank(), world->size());
  if (runs_on_every_rank(argc, argv)) {
    const int code = run_command(argc, argv, world->size());
    world.reset();  // before MPI_Finalize at exit
    return code;
  }
  int32_t code = world->rank() == 0 ? run_command(argc, argv, world->size()) : 0;
  world->broadcast(loom::Tensor(&code, loom::DType::i32, {1}), 0)->wait();
  world.reset();
  return code;
}
