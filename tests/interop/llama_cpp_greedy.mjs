// Greedy decoding by llama.cpp itself (node-llama-cpp's prebuilt CPU build,
// pinned in tests/interop/package-lock.json) of GGUF files loom wrote: for
// each file, the prompt tokenized by llama.cpp from the file's own
// tokenizer, then N tokens at temperature 0. One JSON line per file:
//   {"file": ..., "prompt_tokens": [...], "tokens": [...], "text": ...}
// The prompt starts with BOS where the file says to prepend one
// (tokenizer.ggml.add_bos_token), as llama.cpp's own tools do. With
// LOOM_PARSE_SPECIAL=1 special tokens written in the prompt are parsed as
// themselves (llama.cpp's tools' parse_special; loom's prompts do so).
//
//   node llama_cpp_greedy.mjs INTEROP_DIR N PROMPT FILE.gguf...
// (INTEROP_DIR: where scripts/fetch-data.sh installed tests/interop's lock
// file, data/interop.)
import {loadLlama} from "./llama_cpp_variant.mjs";

const [interop, nStr, prompt, ...files] = process.argv.slice(2);
const n = Number(nStr);
// Only the prebuilt binaries, nothing compiled or downloaded; ggml's best CPU library.
const {llama} = await loadLlama(interop, undefined);
for (const file of files) {
  const model = await llama.loadModel({modelPath: file});
  const context = await model.createContext({contextSize: 128, threads: 1});
  const sequence = context.getSequence();
  const promptTokens = model.tokenize(prompt, process.env.LOOM_PARSE_SPECIAL === "1");
  if (model.tokens.shouldPrependBosToken && model.tokens.bos != null) promptTokens.unshift(model.tokens.bos);
  const tokens = [];
  for await (const t of sequence.evaluate(promptTokens, {temperature: 0})) {
    tokens.push(t);
    if (tokens.length >= n) break;
  }
  console.log(JSON.stringify({file, prompt_tokens: promptTokens, tokens, text: model.detokenize(tokens)}));
  await context.dispose();
  await model.dispose();
}
process.exit(0);
