// llama.cpp's prompt-processing speed on GGUF files (node-llama-cpp's
// prebuilt CPU build, tests/interop/package-lock.json), for BENCHMARKS.md
// next to `loom bench serve --mode throughput --input-len P --output-len 1`:
// one sequence evaluates a prompt of P token ids (i * 37 + 11 mod the
// vocabulary: any ids do) in batches of up to 512, no token generated; the
// best of R runs, each in a fresh context. One JSON line per file, naming
// the CPU library ggml loaded; --cpu-variant forces one (haswell: AVX2).
//
//   node llama_cpp_prefill_bench.mjs INTEROP_DIR THREADS P R FILE.gguf... [--cpu-variant V]
import path from "node:path";
import {loadLlama, takeCpuVariant} from "./llama_cpp_variant.mjs";

const args = process.argv.slice(2);
const variant = takeCpuVariant(args);
const [interop, threadsStr, pStr, rStr, ...files] = args;
const {llama, cpu} = await loadLlama(interop, variant);
const p = Number(pStr), runs = Number(rStr), threads = Number(threadsStr);
for (const file of files) {
  const model = await llama.loadModel({modelPath: file});
  const vocab = model.fileInfo.metadata.tokenizer.ggml.tokens.length;
  const tokens = Array.from({length: p}, (_, i) => (i * 37 + 11) % vocab);
  let best = Infinity;
  for (let r = 0; r < runs; ++r) {
    const context = await model.createContext({contextSize: p + 16, threads, batchSize: Math.min(p, 512)});
    const sequence = context.getSequence();
    const t0 = process.hrtime.bigint();
    await sequence.evaluateWithoutGeneratingNewTokens(tokens);
    best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
    await context.dispose();
  }
  console.log(JSON.stringify({bench: "llama_cpp_prefill", file: path.basename(file), threads, prompt_tokens: p,
                              runs, tokens_per_s: Number((p / best).toFixed(1)), ...cpu()}));
  await model.dispose();
}
process.exit(0);
