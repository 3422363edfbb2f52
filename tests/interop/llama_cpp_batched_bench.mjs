// llama.cpp's batched decode speed on GGUF files (node-llama-cpp's prebuilt
// CPU build, tests/interop/package-lock.json), for BENCHMARKS.md next to
// `loom bench serve --mode decode-bound --num-requests S`: S sequences in one
// context (a KV cache of its own each), each the same short prompt then N
// greedy tokens, all generating at once. node-llama-cpp gathers what its
// sequences queue in one event-loop cycle into one llama_decode, so each step
// decodes S tokens (the ms per step against S = 1 shows it). Timed from the
// moment every sequence has its first token (the prompts' batch comes
// before) to the last token: N steps, S x N tokens. One JSON line per
// (file, S), naming the CPU library ggml loaded; --cpu-variant forces one
// (haswell: AVX2, llama_cpp_variant.mjs).
//
//   node llama_cpp_batched_bench.mjs INTEROP_DIR THREADS N S[,S...] FILE.gguf... [--cpu-variant V]
import path from "node:path";
import {loadLlama, takeCpuVariant} from "./llama_cpp_variant.mjs";

const args = process.argv.slice(2);
const variant = takeCpuVariant(args);
const [interop, threadsStr, nStr, sStr, ...files] = args;
const {llama, cpu} = await loadLlama(interop, variant);
const n = Number(nStr), threads = Number(threadsStr), counts = sStr.split(",").map(Number);

// N + 1 tokens of one sequence; returns when its first and last came.
async function generate(sequence, prompt) {
  let count = 0, first = 0n;
  for await (const t of sequence.evaluate(prompt, {temperature: 0})) {
    void t;
    const now = process.hrtime.bigint();
    if (count === 0) first = now;
    if (++count >= n + 1) return {first, last: now};
  }
  throw new Error(`a sequence stopped after ${count} of ${n + 1} tokens`);
}

const max = xs => xs.reduce((a, b) => (a > b ? a : b));
for (const file of files) {
  const model = await llama.loadModel({modelPath: file});
  const prompt = model.tokenize("The jury said that the city");
  for (const S of counts) {
    // contextSize is per sequence; the batch holds all prompts at once.
    const context = await model.createContext({sequences: S, contextSize: 256, threads,
                                               batchSize: Math.max(64, S * prompt.length)});
    const sequences = Array.from({length: S}, () => context.getSequence());
    const times = await Promise.all(sequences.map(s => generate(s, prompt)));
    const ms = Number(max(times.map(t => t.last)) - max(times.map(t => t.first))) / 1e6;
    console.log(JSON.stringify({bench: "llama_cpp_batched_decode", file: path.basename(file), threads,
                                sequences: S, prompt_tokens: prompt.length, steps: n,
                                tokens_per_s: Number((S * n / (ms / 1e3)).toFixed(1)),
                                ms_per_step: Number((ms / n).toFixed(2)), ...cpu()}));
    await context.dispose();
  }
  await model.dispose();
}
process.exit(0);
