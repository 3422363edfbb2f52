// Which program started this process, and whether its MPI library can join
// the processes it started into one world. Launchers say so only through the
// environment, each in its own words: OpenMPI's mpirun (OMPI_COMM_WORLD_*),
// Slurm's srun (SLURM_STEP_NUM_TASKS, SLURM_PROCID; PMIX_RANK with
// --mpi=pmix), MPICH / Intel MPI's mpiexec (hydra: PMI_SIZE, PMI_RANK) and
// any PMIx launcher (PMIX_RANK: prterun, OpenMPI 5). The caller passes the
// environment in (main() is the one reader: DESIGN.md §1.5).
//
// MPI is initialised only under a launcher that started more than one
// process (or a PMIx one, which does not say how many): a singleton
// MPI_Init costs OpenMPI 4.1 about 0.3 s (BENCHMARKS.md "Launch"), which a
// plain `loom generate` should not pay.
#pragma once

#include <functional>
#include <string>

namespace loom::comm {

using Getenv = std::function<const char*(const char*)>;

enum class LauncherKind { none, open_mpi, slurm, hydra, pmix };

struct Launcher {
  LauncherKind kind = LauncherKind::none;
  std::string name;      // "Slurm's srun"; empty for none
  int ranks = 1;         // the processes it started; 0 when it does not say (PMIx alone)
  int rank = 0;          // this process among them
  std::string evidence;  // the variables that said so: "SLURM_STEP_NUM_TASKS=4"
  bool pmix = false;     // PMIX_RANK set: a PMIx server can join the processes
  bool pmi = false;      // PMI_RANK or PMI_FD set: a PMI-1/2 server can
  // Inside a Slurm batch script (SLURM_JOB_ID without a job step): the
  // script's own process, not one of the job's tasks.
  bool slurm_batch = false;
  int slurm_job_tasks = 0;  // SLURM_NTASKS there
  // More than one process (or an unknown number): initialise MPI.
  bool multi_process() const { return kind != LauncherKind::none && ranks != 1; }
};

// loom::Error for a launcher variable that is not a count (SLURM_STEP_NUM_TASKS=x).
Launcher detect_launcher(const Getenv& env);

enum class MpiLibrary { open_mpi, mpich, other };
std::string mpi_library_name(MpiLibrary lib);

// Before MPI_Init: loom::Error when the launcher started several processes
// that `lib` cannot join (srun --mpi=none; hydra's PMI with OpenMPI, which
// Debian builds without PMI-1/2), naming the launcher and the fix. MPI_Init
// would otherwise abort each of them with a message about how OpenMPI was
// built.
void check_launcher_reaches_mpi(const Launcher& launcher, MpiLibrary lib);

// After MPI_Init: loom::Error unless MPI joined as many processes as the
// launcher started (both numbers, the launcher and the fix in the message).
void check_world_matches_launcher(const Launcher& launcher, int mpi_world_size);

// How to start n processes of `loom ...` under this launcher, for messages:
// "srun -n 4 --mpi=pmix", "mpirun -np 4".
std::string start_command(const Launcher& launcher, int n);

// What a world of `world_size` processes looks like to a user whose config
// asks for `needed`: "" when they agree, else a sentence naming the launcher
// (or its absence) and start_command(needed).
std::string world_hint(const Launcher& launcher, int world_size, int needed);

}  // namespace loom::comm
