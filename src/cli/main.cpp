// loom: the command line. main() is the only place that reads the
// environment or the process's arguments; it builds what the libraries need
// and calls them (DESIGN.md §1.5).
//
// Under mpirun every process runs main(). The commands that work across
// processes (train, bench comm, bench train) run on every rank; every other
// command runs on rank 0 while the other ranks wait for it and exit with its
// status, so `mpirun -np N loom <anything>` does the work once. Every log line carries
// "[rank r/N]". A command that runs on every rank and fails on one of them
// ends the whole job at once (MPI_Abort with its exit status) after printing
// its error: the other ranks would otherwise wait in their next collective
// until the watchdog's deadline (parallel.timeout_s, 300 s by default).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "comm/launcher.h"
#include "comm/mpi_backend.h"
#include "comm/mpi_runtime.h"
#include "core/error.h"
#include "core/log.h"
#include "core/threads.h"
#include "kernels/cpu_isa.h"

namespace {

// The instruction-set cap: `--isa LEVEL` (or --isa=LEVEL) anywhere on the
// command line, which is taken out of argv before the commands parse it,
// else LOOM_ISA; empty when neither is given. The one place that reads it.
std::string take_isa_cap(int& argc, char** argv) {
  std::string cap;
  const char* env = std::getenv("LOOM_ISA");
  if (env != nullptr) cap = env;
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--isa" && i + 1 < argc) {
      cap = argv[++i];
    } else if (a.rfind("--isa=", 0) == 0) {
      cap = a.substr(6);
    } else if (a == "--isa") {
      throw loom::Error("--isa needs a level: one of " + loom::kernels::cpu_isa_names());
    } else {
      argv[out++] = argv[i];
    }
  }
  argc = out;
  argv[argc] = nullptr;
  return cap;
}

// Chooses the CPU kernels' level (kernels/cpu_isa.h) before any op runs and
// logs it once; loom::Error for a name that is no level.
void choose_cpu_isa(const std::string& cap) {
  using namespace loom::kernels;
  if (!cap.empty()) set_cpu_isa(cpu_isa_from_name_or_fail(cap, "--isa / LOOM_ISA"));
  loom::log_debug(cpu_isa_describe());  // train, serve and bench print it in their headers
}

// train, bench comm, bench train and plan --calibrate run on every rank;
// the rest on rank 0 only.
bool runs_on_every_rank(int argc, char** argv) {
  const std::string first = argc > 1 ? argv[1] : "", second = argc > 2 ? argv[2] : "";
  bool calibrate = false;  // loom plan --calibrate measures the link between ranks
  for (int i = 2; i < argc; ++i) calibrate = calibrate || std::string(argv[i]) == "--calibrate";
  return first == "train" || (first == "bench" && (second == "comm" || second == "train" || second == "ps-transport")) ||
         (first == "plan" && calibrate);
}

// The names of app's subcommands, e.g. "bench, convert, data, ...".
std::string subcommand_names(const CLI::App& app) {
  std::string names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    names += (names.empty() ? "" : ", ") + sub->get_name();
  return names;
}

// CLI11's message, except for a missing subcommand: name the word that was
// not one (`loom trian`) and list the valid subcommands of the command that
// needed one (set on the app before its subcommands, which inherit it).
std::string failure_message(const CLI::App* app, const CLI::Error& e) {
  if (e.get_name() != "RequiredError" || std::string(e.what()) != "A subcommand is required")
    return CLI::FailureMessage::simple(app, e);
  const CLI::App* at = app;  // the deepest command given
  while (!at->get_subcommands().empty()) at = at->get_subcommands().front();
  std::string path = at->get_name();
  for (const CLI::App* p = at->get_parent(); p != nullptr; p = p->get_parent()) path = p->get_name() + " " + path;
  const std::vector<std::string> extra = at->remaining();
  const std::string what = !extra.empty() && !extra.front().empty() && extra.front()[0] != '-'
                               ? loom::concat("unknown subcommand '", extra.front(), "'")
                               : std::string(e.what());
  // simple() is e.what(), a newline and the --help hint.
  const std::string simple = CLI::FailureMessage::simple(app, e);
  return loom::concat(what, ": valid subcommands of '", path, "' are ", subcommand_names(*at),
                      simple.substr(std::string(e.what()).size()));
}

// Logs a command's error and returns its exit status; with abort_job (a
// command that runs on every rank of an mpirun job) it ends the job instead.
int fail_command(const std::string& message, int code, bool abort_job) {
  loom::log_error(message);
  if (abort_job) loom::comm::mpi_abort_job(code);
  return code;
}

// How main runs a command in this process.
struct Launch {
  int world_size = 1;                // processes of the job (1: a plain process, no MPI)
  loom::comm::Launcher launcher;     // what started this process
  int default_threads = 1;           // the --threads default of the commands that take one
  bool abort_job_on_error = false;   // a command on every rank: an error ends the job
  std::string isa_cap;               // --isa / LOOM_ISA, or empty: part of the reproduce line
};

int run_command(int argc, char** argv, const Launch& launch) {
  const int world_size = launch.world_size, default_threads = launch.default_threads;
  const bool abort_job_on_error = launch.abort_job_on_error;
  CLI::App app{"loom: train and serve transformer language models"};
  app.name("loom");
  app.failure_message(failure_message);
  app.require_subcommand(1);
  app.set_version_flag("--version", "loom 0.1.0");
  app.footer("Every command also takes --isa LEVEL (or LOOM_ISA=LEVEL): run the CPU kernels at most at that "
             "instruction-set level, one of " + loom::kernels::cpu_isa_names() + " (default: the best this CPU has).");
  // With its launcher in front under one ("srun -n 4 --mpi=pmix loom ...").
  std::string command_line =
      world_size > 1 ? loom::comm::start_command(launch.launcher, world_size) + " " + argv[0] : argv[0];
  for (int i = 1; i < argc; ++i) command_line += std::string(" ") + argv[i];
  if (!launch.isa_cap.empty()) command_line += " --isa " + launch.isa_cap;
  int exit_code = 0;
  loom::cli::add_bench_command(app, exit_code, command_line, default_threads);
  loom::cli::add_data_command(app, default_threads);
  loom::cli::add_train_command(app, world_size, launch.launcher, default_threads, exit_code);
  loom::cli::add_eval_command(app, default_threads);
  loom::cli::add_plan_command(app, world_size);
  loom::cli::add_generate_command(app);
  loom::cli::add_serve_command(app, default_threads);
  loom::cli::add_model_commands(app);
  const char* host = std::getenv("LOOM_HOST");
  loom::cli::add_run_commands(app, host != nullptr && *host != '\0' ? host : "http://127.0.0.1:8000", default_threads);
  loom::cli::add_convert_command(app);
  try {
    app.parse(argc, argv);  // runs the chosen command's callback
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // --help and --version: 0
    if (code != 0 && abort_job_on_error) loom::comm::mpi_abort_job(code);
    return code;
  } catch (const loom::comm::CollectiveError& e) {
    if (loom::log_rank() == 0) loom::log_error(e.what());
    return 1;
  } catch (const loom::Error& e) {
    return fail_command(e.what(), 1, abort_job_on_error);
  } catch (const std::exception& e) {
    return fail_command(e.what(), 2, abort_job_on_error);
  }
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  Launch launch;
  try {
    launch.isa_cap = take_isa_cap(argc, argv);
    choose_cpu_isa(launch.isa_cap);
  } catch (const loom::Error& e) {
    loom::log_error(e.what());
    return 1;
  }
  // A plain process (no launcher around it, or one that started only this
  // process) skips MPI and its start-up time altogether (comm/launcher.h).
  try {
    launch.launcher = loom::comm::detect_launcher([](const char* name) { return std::getenv(name); });
  } catch (const loom::Error& e) {
    loom::log_error(e.what());
    return 1;
  }
  if (!launch.launcher.multi_process()) {
    launch.default_threads = loom::default_num_threads();
    return run_command(argc, argv, launch);
  }
  std::unique_ptr<loom::comm::Communicator> world;
  try {
    loom::comm::check_launcher_reaches_mpi(launch.launcher, loom::comm::mpi_library());
    // Ranks may wait on it as long as another rank's command runs.
    loom::comm::Options idle;
    idle.timeout_s = 365.0 * 24 * 3600;
    world = loom::comm::mpi_world(idle);
    loom::set_log_rank(world->rank(), world->size());
    loom::comm::check_world_matches_launcher(launch.launcher, world->size());
  } catch (const loom::Error& e) {
    if (launch.launcher.ranks > 0) loom::set_log_rank(launch.launcher.rank, launch.launcher.ranks);
    loom::log_error(e.what());
    return 1;
  }
  launch.world_size = world->size();
  // The cores this process may use, shared with the job's other processes on
  // this machine (however the launcher placed and bound them).
  int me = 0;
  const std::vector<loom::CpuMask> node = loom::comm::mpi_cpu_masks_on_this_node(me);
  launch.default_threads = loom::share_of_cpus(node, me);
  if (runs_on_every_rank(argc, argv)) {
    launch.abort_job_on_error = world->size() > 1;
    const int code = run_command(argc, argv, launch);
    // No rank reaches MPI_Finalize while another may still fail: OpenMPI
    // 4.1's mpirun can crash or hang when a rank calls MPI_Abort after
    // another has finalized. A rank waiting here still answers watchdogs.
    // A run that lost a rank on purpose (an asynchronous parameter-server
    // worker dropped: parallel/ps.h) cannot meet it here.
    if (!loom::comm::lost_a_peer()) world->barrier()->wait();
    world.reset();  // before MPI_Finalize at exit
    return code;
  }
  int32_t code = world->rank() == 0 ? run_command(argc, argv, launch) : 0;
  world->broadcast(loom::Tensor(&code, loom::DType::i32, {1}), 0)->wait();
  world.reset();
  return code;
}
