// llama.cpp's decode speed on GGUF files (node-llama-cpp's prebuilt CPU
// build, tests/interop/package-lock.json), for BENCHMARKS.md next to loom's:
// one sequence, a short prompt, then N greedy tokens; the time per token
// counts from the first generated token to the last (the prompt excluded).
// One JSON line per file, naming the CPU library ggml loaded; --cpu-variant
// forces one (haswell: AVX2, llama_cpp_variant.mjs).
//
//   node llama_cpp_decode_bench.mjs INTEROP_DIR THREADS N FILE.gguf... [--cpu-variant V]
import path from "node:path";
import {loadLlama, takeCpuVariant} from "./llama_cpp_variant.mjs";

const args = process.argv.slice(2);
const variant = takeCpuVariant(args);
const [interop, threadsStr, nStr, ...files] = args;
const {llama, cpu} = await loadLlama(interop, variant);
const n = Number(nStr), threads = Number(threadsStr);
for (const file of files) {
  const model = await llama.loadModel({modelPath: file});
  const context = await model.createContext({contextSize: 256, threads, batchSize: 64});
  const sequence = context.getSequence();
  let count = 0, first = 0n;
  for await (const t of sequence.evaluate(model.tokenize("The jury said that the city"), {temperature: 0})) {
    void t;
    if (count === 0) first = process.hrtime.bigint();
    if (++count >= n + 1) break;
  }
  const ms = Number(process.hrtime.bigint() - first) / 1e6 / n;
  console.log(JSON.stringify({bench: "llama_cpp_decode", file: path.basename(file), threads, tokens: n,
                              ms_per_token: Number(ms.toFixed(2)), ...cpu()}));
  await context.dispose();
  await model.dispose();
}
process.exit(0);
