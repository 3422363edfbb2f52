# loom bench serve on gpt2-tiny: each mode prints its JSON line (under
# --ignore-eos every request gets the tokens it asked for; a cache of one
# sequence preempts, a big one does not); options a mode does not take, and
# a decode of one token, are user errors. These tests carry their label
# themselves.
set(LOOM_BENCH_SERVE_TINY --preset gpt2-tiny --threads 1 --json --max-model-len 64)

add_test(NAME Cli.BenchServeThroughputGivesEveryRequestItsTokens
         COMMAND $<TARGET_FILE:loom> bench serve ${LOOM_BENCH_SERVE_TINY} --num-requests 6 --input-len 12
                 --output-len 8 --concurrency 4)
set_tests_properties(Cli.BenchServeThroughputGivesEveryRequestItsTokens PROPERTIES PASS_REGULAR_EXPRESSION
  "\\{\"mode\":\"throughput\",\"model\":\"gpt2-tiny\",[^\n]*\"concurrency\":4,\"ignore_eos\":true,[^\n]*\"completed\":6,\"total_input_tokens\":72,\"total_output_tokens\":48,\"asked_output_tokens\":48,\"request_throughput_req_per_s\":[0-9.e+-]+,\"output_tokens_per_s\":[0-9.e+-]+,\"total_tokens_per_s\":[0-9.e+-]+,\"ttft_ms_mean\":[0-9.e+-]+,\"ttft_ms_p50\":[0-9.e+-]+,[^\n]*\"tpot_ms_p99\":[0-9.e+-]+,[^\n]*\"itl_ms_p90\":[0-9.e+-]+,[^\n]*\"e2e_ms_p99\":[0-9.e+-]+,[^\n]*\"peak_running\":4,\"preemptions\":0,")

# A cache of 5 blocks of 16 tokens (null block included: one 64-token
# sequence) cannot hold three 20 + 20-token requests at once. (With oneDNN's
# linears, the engine's other GEMM path.)
add_test(NAME Cli.BenchServeSmallKvCachePreempts
         COMMAND $<TARGET_FILE:loom> bench serve ${LOOM_BENCH_SERVE_TINY} --num-requests 3 --input-len 20
                 --output-len 20 --kv-cache-mb 0.08 --no-batch-invariant)
set_tests_properties(Cli.BenchServeSmallKvCachePreempts PROPERTIES PASS_REGULAR_EXPRESSION
  "\"batch_invariant\":false,[^\n]*\"completed\":3,[^\n]*\"total_output_tokens\":60,[^\n]*\"kv_blocks_total\":4,\"peak_kv_blocks_used\":4,[^\n]*\"preemptions\":[1-9][0-9]*,")

add_test(NAME Cli.BenchServeDecodeBoundPrintsTheBound
         COMMAND $<TARGET_FILE:loom> bench serve ${LOOM_BENCH_SERVE_TINY} --mode decode-bound --input-len 8
                 --output-len 8 --dtype bf16 --kv-dtype bf16)
set_tests_properties(Cli.BenchServeDecodeBoundPrintsTheBound PROPERTIES PASS_REGULAR_EXPRESSION
  "\"mode\":\"decode-bound\",[^\n]*\"dtype\":\"bf16\",[^\n]*\"decode_tokens_per_s\":[0-9.e+-]+,\"decode_steps\":7,[^\n]*\"bandwidth_gb_per_s\":[0-9.e+-]+,\"bytes_per_token\":[0-9]+,[^\n]*\"bound_tokens_per_s\":[0-9.e+-]+,\"bound_ratio\":[0-9.e+-]+\\}")

# Three requests prefilled in one step, then decoding together: 7 steps of 3 tokens.
add_test(NAME Cli.BenchServeDecodeBoundTimesTheStepsThatDecodeAllRequests
         COMMAND $<TARGET_FILE:loom> bench serve ${LOOM_BENCH_SERVE_TINY} --mode decode-bound --num-requests 3
                 --input-len 8 --output-len 8)
set_tests_properties(Cli.BenchServeDecodeBoundTimesTheStepsThatDecodeAllRequests PROPERTIES PASS_REGULAR_EXPRESSION
  "\"mode\":\"decode-bound\",[^\n]*\"num_requests\":3,[^\n]*\"decode_tokens_per_s\":[0-9.e+-]+,\"decode_steps\":7,")

add_test(NAME Cli.BenchServeCapacityRunsMoreSequencesPagedThanContiguous
         COMMAND $<TARGET_FILE:loom> bench serve --mode capacity --preset gpt2-124m --kv-cache-mb 288 --json)
set_tests_properties(Cli.BenchServeCapacityRunsMoreSequencesPagedThanContiguous PROPERTIES PASS_REGULAR_EXPRESSION
  "\"mode\":\"capacity\",[^\n]*\"contiguous_seqs\":4,[^\n]*\"paged_peak_running\":([5-9]|[1-9][0-9]+),")

set_tests_properties(Cli.BenchServeThroughputGivesEveryRequestItsTokens Cli.BenchServeSmallKvCachePreempts
                     Cli.BenchServeDecodeBoundPrintsTheBound Cli.BenchServeDecodeBoundTimesTheStepsThatDecodeAllRequests
                     Cli.BenchServeCapacityRunsMoreSequencesPagedThanContiguous PROPERTIES LABELS cli)

loom_cli_error_test(Cli.BenchServeDecodeOfOneTokenIsAnError
  "error: bench serve: --output-len 1 is invalid in decode-bound mode: allowed values are >= 2.*exit=1"
  bench serve --mode decode-bound --preset gpt2-tiny --output-len 1)
loom_cli_error_test(Cli.BenchServeRequestRateInCapacityModeIsAnError
  "error: bench serve: --request-rate does not apply to --mode capacity.*exit=1"
  bench serve --mode capacity --preset gpt2-tiny --request-rate 4)
loom_cli_error_test(Cli.BenchServeTooLongRequestsAreAnError
  "error: bench serve: --input-len 60 and --output-len 10 .* over max_model_len = 64.*exit=1"
  bench serve --preset gpt2-tiny --input-len 60 --output-len 10)
# Prompts of 16 tokens prefilled 16 tokens a step: the first request has its
# 2 tokens before the fourth starts, so no step decodes all four.
loom_cli_error_test(Cli.BenchServeDecodeBoundWithoutAStepOfAllRequestsIsAnError
  "error: bench serve: no step decoded all 4 requests at once .*--num-requests x --input-len = 64.*exit=1"
  bench serve --mode decode-bound --preset gpt2-tiny --max-model-len 64 --num-requests 4 --input-len 16
  --output-len 2 --max-num-batched-tokens 16)
loom_cli_error_test(Cli.BenchServeDecodeBoundOfMoreRequestsThanAStepComputesIsAnError
  "error: bench serve: --num-requests 20 is invalid in decode-bound mode: allowed values are <= --max-num-batched-tokens = 16.*exit=1"
  bench serve --mode decode-bound --preset gpt2-tiny --num-requests 20 --max-num-batched-tokens 16)
set_tests_properties(Cli.BenchServeDecodeOfOneTokenIsAnError Cli.BenchServeRequestRateInCapacityModeIsAnError
                     Cli.BenchServeTooLongRequestsAreAnError Cli.BenchServeDecodeBoundWithoutAStepOfAllRequestsIsAnError
                     Cli.BenchServeDecodeBoundOfMoreRequestsThanAStepComputesIsAnError PROPERTIES LABELS cli)

# One set of engine flags (infer::EngineArgs): generate, serve and bench serve
# list the same options with the same defaults.
add_test(NAME Cli.EngineFlagsAreTheSameForGenerateServeAndBenchServe
         COMMAND sh -c "flags() { \"$0\" \"$@\" --help | grep -E '^ +--(dtype|dequantize|kv-dtype|kv-cache-mb|max-model-len|block-size|max-num-seqs|max-num-batched-tokens)( |$)'; }; g=$(flags generate) && s=$(flags serve) && b=$(flags bench serve) && [ \"$g\" = \"$s\" ] && [ \"$g\" = \"$b\" ] && printf '%s\\n' \"$g\" | wc -l"
                 $<TARGET_FILE:loom>)
set_tests_properties(Cli.EngineFlagsAreTheSameForGenerateServeAndBenchServe PROPERTIES TIMEOUT 60
  PASS_REGULAR_EXPRESSION "^8\n$" LABELS cli)
