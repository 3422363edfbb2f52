#include "comm/launcher.h"

#include <gtest/gtest.h>

#include <functional>
#include <initializer_list>
#include <map>
#include <string>

#include "common/tensors.h"
#include "core/error.h"

namespace loom::comm {
namespace {

using test::expect_error;


// The variables each launcher sets, as seen on this project's machines
// (OpenMPI 4.1 mpirun, Slurm 22.05 srun --mpi=pmix / --mpi=none, sbatch's
// script, MPICH 4's hydra).
using Env = std::map<std::string, std::string>;

// Every fragment appears in text (GoogleTest alone: Debian's libgtest-dev
// has no GoogleMock).
void expect_contains(const std::string& text, std::initializer_list<std::string> fragments) {
  for (const std::string& f : fragments) EXPECT_NE(text.find(f), std::string::npos) << "'" << f << "' in: " << text;
}

Launcher detect(const Env& env) {
  return detect_launcher([&env](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(Launcher, APlainProcessIsAlone) {
  const Launcher l = detect({{"HOME", "/root"}});
  EXPECT_EQ(l.kind, LauncherKind::none);
  EXPECT_FALSE(l.multi_process());
  EXPECT_FALSE(l.slurm_batch);
}

TEST(Launcher, EachLauncherIsNamedWithItsCountAndRank) {
  const Launcher ompi = detect({{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_RANK", "2"}, {"PMIX_RANK", "2"}});
  EXPECT_EQ(ompi.kind, LauncherKind::open_mpi);
  EXPECT_EQ(ompi.ranks, 4);
  EXPECT_EQ(ompi.rank, 2);
  EXPECT_TRUE(ompi.multi_process());

  const Launcher srun = detect({{"SLURM_JOB_ID", "7"}, {"SLURM_NTASKS", "4"}, {"SLURM_STEP_NUM_TASKS", "2"},
                                {"SLURM_PROCID", "1"}, {"PMIX_RANK", "1"}, {"SLURM_MPI_TYPE", "pmix"}});
  EXPECT_EQ(srun.kind, LauncherKind::slurm);
  EXPECT_EQ(srun.ranks, 2);  // the step's tasks, not the job's
  EXPECT_EQ(srun.rank, 1);
  EXPECT_TRUE(srun.pmix);
  EXPECT_EQ(srun.name, "Slurm's srun");

  const Launcher hydra = detect({{"PMI_SIZE", "3"}, {"PMI_RANK", "0"}, {"PMI_FD", "5"}});
  EXPECT_EQ(hydra.kind, LauncherKind::hydra);
  EXPECT_EQ(hydra.ranks, 3);
  EXPECT_TRUE(hydra.pmi);
  EXPECT_FALSE(hydra.pmix);

  const Launcher prte = detect({{"PMIX_RANK", "5"}});
  EXPECT_EQ(prte.kind, LauncherKind::pmix);
  EXPECT_EQ(prte.ranks, 0);  // PMIx does not say how many: MPI is asked
  EXPECT_EQ(prte.rank, 5);
  EXPECT_TRUE(prte.multi_process());
}

// One task (srun -n 1, mpirun -np 1) needs no MPI: it starts as fast as a
// plain process, and srun --mpi=none -n 1 works.
TEST(Launcher, OneProcessFromALauncherSkipsMpi) {
  EXPECT_FALSE(detect({{"SLURM_STEP_NUM_TASKS", "1"}, {"SLURM_PROCID", "0"}}).multi_process());
  EXPECT_FALSE(detect({{"OMPI_COMM_WORLD_SIZE", "1"}}).multi_process());
  EXPECT_NO_THROW(check_launcher_reaches_mpi(detect({{"SLURM_STEP_NUM_TASKS", "1"}}), MpiLibrary::open_mpi));
}

// sbatch's script runs once, with the job's variables but no step: it is
// not one of the job's tasks.
TEST(Launcher, ASlurmBatchScriptIsOneProcessThatKnowsItsJob) {
  const Launcher l = detect({{"SLURM_JOB_ID", "9"}, {"SLURM_NTASKS", "4"}, {"SLURM_PROCID", "0"}});
  EXPECT_EQ(l.kind, LauncherKind::none);
  EXPECT_TRUE(l.slurm_batch);
  EXPECT_EQ(l.slurm_job_tasks, 4);
  expect_contains(world_hint(l, 1, 4), {"batch job's script (SLURM_NTASKS=4)", "srun -n 4 --mpi=pmix loom"});
}

TEST(Launcher, ACountThatIsNoNumberIsAnErrorNamingTheVariable) {
  expect_error([] { detect({{"SLURM_STEP_NUM_TASKS", "two"}}); }, {"SLURM_STEP_NUM_TASKS=two", "integer >= 1"});
  expect_error([] { detect({{"OMPI_COMM_WORLD_SIZE", "0"}}); }, {"OMPI_COMM_WORLD_SIZE=0"});
  expect_error([] { detect({{"PMI_SIZE", "4x"}}); }, {"PMI_SIZE=4x"});
}

// srun --mpi=none starts N tasks with no PMIx server: OpenMPI's MPI_Init
// would abort each with a page about how it was built.
TEST(Launcher, SrunWithoutPmixIsRefusedBeforeMpiWithTheFix) {
  const Launcher l = detect({{"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_PROCID", "0"}});
  expect_error([&] { check_launcher_reaches_mpi(l, MpiLibrary::open_mpi); },
               {"Slurm's srun started this process as rank 0 of 2 (SLURM_STEP_NUM_TASKS=2)", "srun --mpi=pmix",
                "MpiDefault=pmix"});
  // MPICH joins srun's tasks through PMI-2 as well.
  Launcher pmi2 = detect({{"SLURM_STEP_NUM_TASKS", "2"}, {"PMI_FD", "4"}});
  EXPECT_NO_THROW(check_launcher_reaches_mpi(pmi2, MpiLibrary::mpich));
  expect_error([&] { check_launcher_reaches_mpi(pmi2, MpiLibrary::open_mpi); }, {"--mpi=pmix"});
  EXPECT_NO_THROW(check_launcher_reaches_mpi(detect({{"SLURM_STEP_NUM_TASKS", "2"}, {"PMIX_RANK", "0"}}),
                                             MpiLibrary::open_mpi));
}

TEST(Launcher, HydraWithOpenMpiIsRefusedNamingBothAndTheLauncherThatWorks) {
  const Launcher l = detect({{"PMI_SIZE", "2"}, {"PMI_RANK", "1"}});
  expect_error([&] { check_launcher_reaches_mpi(l, MpiLibrary::open_mpi); },
               {"mpiexec (MPICH / Intel MPI's hydra) started this process as rank 1 of 2", "built with OpenMPI",
                "mpirun -np 2"});
  EXPECT_NO_THROW(check_launcher_reaches_mpi(l, MpiLibrary::mpich));
  expect_error([] { check_launcher_reaches_mpi(detect({{"OMPI_COMM_WORLD_SIZE", "2"}}), MpiLibrary::mpich); },
               {"mpiexec -n 2"});
}

TEST(Launcher, AWorldSmallerThanTheLauncherSaidIsAnErrorWithBothNumbers) {
  const Launcher l = detect({{"SLURM_STEP_NUM_TASKS", "4"}, {"PMIX_RANK", "0"}});
  expect_error([&] { check_world_matches_launcher(l, 1); },
               {"Slurm's srun started 4 processes (SLURM_STEP_NUM_TASKS=4) but MPI joined 1", "srun -n 4 --mpi=pmix"});
  EXPECT_NO_THROW(check_world_matches_launcher(l, 4));
  EXPECT_NO_THROW(check_world_matches_launcher(detect({{"PMIX_RANK", "0"}}), 3));  // PMIx alone: MPI's count
}

TEST(Launcher, WorldHintsSayHowToStartTheRightNumber) {
  EXPECT_EQ(world_hint(detect({}), 2, 2), "");
  expect_contains(world_hint(detect({}), 1, 4), {"runs alone", "mpirun -np 4 loom", "srun -n 4 --mpi=pmix loom"});
  expect_contains(world_hint(detect({{"SLURM_STEP_NUM_TASKS", "2"}, {"PMIX_RANK", "0"}}), 2, 4),
                  {"Slurm's srun started 2 processes: start 4 with srun -n 4 --mpi=pmix loom"});
  expect_contains(world_hint(detect({{"OMPI_COMM_WORLD_SIZE", "3"}}), 3, 4), {"mpirun -np 4 loom"});
  expect_contains(world_hint(detect({{"OMPI_COMM_WORLD_SIZE", "2"}}), 2, 1), {"trains in one: run loom alone"});
}

}  // namespace
}  // namespace loom::comm
