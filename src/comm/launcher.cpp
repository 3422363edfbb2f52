#include "comm/launcher.h"

#include <algorithm>
#include <charconv>
#include <string_view>

#include "core/error.h"

namespace loom::comm {
namespace {

const char* var(const Getenv& env, const char* name) {
  const char* v = env(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

// A launcher's count or index: loom::Error for anything else, naming the variable.
int count(const Getenv& env, const char* name, int min) {
  const char* v = var(env, name);
  if (v == nullptr) return -1;
  const std::string_view s(v);
  int n = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  LOOM_REQUIRE(ec == std::errc() && end == s.data() + s.size() && n >= min, "the launcher set ", name, "=", s,
               " in this process's environment; it must be an integer >= ", min);
  return n;
}

std::string pair(const char* name, int value) { return concat(name, "=", value); }

}  // namespace

Launcher detect_launcher(const Getenv& env) {
  Launcher l;
  l.pmix = var(env, "PMIX_RANK") != nullptr;
  l.pmi = var(env, "PMI_RANK") != nullptr || var(env, "PMI_FD") != nullptr;
  const int ompi = count(env, "OMPI_COMM_WORLD_SIZE", 1), srun = count(env, "SLURM_STEP_NUM_TASKS", 1),
            hydra = count(env, "PMI_SIZE", 1);
  if (ompi > 0) {
    l.kind = LauncherKind::open_mpi, l.name = "OpenMPI's mpirun", l.ranks = ompi;
    l.rank = std::max(0, count(env, "OMPI_COMM_WORLD_RANK", 0));
    l.evidence = pair("OMPI_COMM_WORLD_SIZE", ompi);
  } else if (srun > 0) {
    l.kind = LauncherKind::slurm, l.name = "Slurm's srun", l.ranks = srun;
    l.rank = std::max(0, count(env, "SLURM_PROCID", 0));
    l.evidence = pair("SLURM_STEP_NUM_TASKS", srun);
  } else if (hydra > 0) {
    l.kind = LauncherKind::hydra, l.name = "mpiexec (MPICH / Intel MPI's hydra)", l.ranks = hydra;
    l.rank = std::max(0, count(env, "PMI_RANK", 0));
    l.evidence = pair("PMI_SIZE", hydra);
  } else if (l.pmix) {
    l.kind = LauncherKind::pmix, l.name = "a PMIx launcher", l.ranks = 0;
    l.rank = std::max(0, count(env, "PMIX_RANK", 0));
    l.evidence = pair("PMIX_RANK", l.rank);
  } else if (var(env, "SLURM_JOB_ID") != nullptr) {
    l.slurm_batch = true;
    l.slurm_job_tasks = std::max(0, count(env, "SLURM_NTASKS", 1));
  }
  return l;
}

std::string mpi_library_name(MpiLibrary lib) {
  switch (lib) {
    case MpiLibrary::open_mpi: return "OpenMPI";
    case MpiLibrary::mpich: return "MPICH";
    case MpiLibrary::other: break;
  }
  return "its MPI library";
}

void check_launcher_reaches_mpi(const Launcher& l, MpiLibrary lib) {
  if (!l.multi_process()) return;
  const std::string started = concat(l.name, " started this process as rank ", l.rank, " of ", l.ranks, " (",
                                     l.evidence, ")");
  switch (l.kind) {
    case LauncherKind::slurm:
      // OpenMPI joins srun's tasks through PMIx only (Debian builds it
      // without Slurm's PMI-1/2); MPICH through either.
      if (l.pmix || (lib != MpiLibrary::open_mpi && l.pmi)) return;
      fail(started, " without a PMIx server for its tasks to find each other (srun --mpi=none, or a cluster ",
           "whose MpiDefault is none): start it with srun --mpi=pmix (srun --mpi=list shows what the cluster has), ",
           "or set MpiDefault=pmix in slurm.conf");
    case LauncherKind::hydra:
      if (lib != MpiLibrary::open_mpi || l.pmix) return;
      fail(started, ", but this loom is built with OpenMPI, which cannot join processes through hydra's PMI: start ",
           "it with OpenMPI's mpirun -np ", l.ranks, " (or srun -n ", l.ranks, " --mpi=pmix under Slurm), or build ",
           "loom against MPICH to use its mpiexec");
    case LauncherKind::open_mpi:
      if (lib == MpiLibrary::mpich)
        fail(started, ", but this loom is built with MPICH, whose processes OpenMPI's mpirun cannot join: start it ",
             "with MPICH's mpiexec -n ", l.ranks);
      return;
    case LauncherKind::pmix:
    case LauncherKind::none: return;
  }
}

void check_world_matches_launcher(const Launcher& l, int mpi_world_size) {
  if (l.ranks <= 0 || mpi_world_size == l.ranks) return;
  fail(l.name, " started ", l.ranks, " processes (", l.evidence, ") but MPI joined ", mpi_world_size,
       " of them into its world: the launcher and the MPI library did not connect. ",
       "Start it with ", start_command(l, l.ranks), ", using the launcher that comes with the MPI library loom is ",
       "built with");
}

std::string start_command(const Launcher& l, int n) {
  switch (l.kind) {
    case LauncherKind::slurm: return concat("srun -n ", n, " --mpi=pmix");
    case LauncherKind::hydra: return concat("mpiexec -n ", n);
    case LauncherKind::open_mpi:
    case LauncherKind::pmix:
    case LauncherKind::none: break;
  }
  if (l.slurm_batch) return concat("srun -n ", n, " --mpi=pmix");
  return concat("mpirun -np ", n);
}

std::string world_hint(const Launcher& l, int world_size, int needed) {
  if (world_size == needed) return "";
  if (l.kind == LauncherKind::none && l.slurm_batch)
    return concat("this process runs alone, in a Slurm batch job's script (SLURM_NTASKS=", l.slurm_job_tasks,
                  "): start the job's tasks with ", start_command(l, needed), " loom ...");
  if (l.kind == LauncherKind::none)
    return concat("this process runs alone (no mpirun, srun or mpiexec started it): start ", needed,
                  " processes, e.g. mpirun -np ", needed, " loom ..., or srun -n ", needed,
                  " --mpi=pmix loom ... under Slurm");
  if (needed == 1)
    return concat(l.name, " started ", world_size, " processes; this config trains in one: run loom alone");
  return concat(l.name, " started ", world_size, " processes: start ", needed, " with ", start_command(l, needed),
                " loom ...");
}

}  // namespace loom::comm
