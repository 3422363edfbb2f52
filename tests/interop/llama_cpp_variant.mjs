// node-llama-cpp (tests/interop/package-lock.json) with a chosen CPU variant
// of ggml, for the llama.cpp benches: to compare with loom at one ISA level
// (loom --isa avx2 against llama.cpp's haswell variant).
//
// The prebuilt package ships one libggml-cpu-<variant>.so per x86 level
// (haswell: AVX2 + FMA + F16C; skylakex, icelake, sapphirerapids, zen4:
// AVX-512 levels; ...) next to llama-addon.node, and ggml loads the best one
// this CPU runs from that directory. To force a variant, a module resolve
// hook points node-llama-cpp's import of @node-llama-cpp/linux-x64 at a
// temporary copy of that package whose bins directory links every file but
// the other CPU variants (removed on exit). Which library ggml loaded is read
// from its log line "loaded CPU backend from PATH", with or without a variant.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import {register} from "node:module";
import {pathToFileURL} from "node:url";

const binsPackage = "@node-llama-cpp/linux-x64";

// Removes "--cpu-variant V" from args (in place); V, or undefined.
export function takeCpuVariant(args) {
  const i = args.indexOf("--cpu-variant");
  if (i < 0) return undefined;
  const [, variant] = args.splice(i, 2);
  if (!variant) throw new Error("--cpu-variant needs a value, e.g. haswell");
  return variant;
}

// A copy of the bins package with only libggml-cpu-<variant>.so of the CPU
// libraries; returns its dist/index.js.
function packageWithOnlyVariant(interop, variant) {
  const original = path.resolve(interop, "node_modules", binsPackage);
  const bins = path.join(original, "bins", "linux-x64");
  const cpuLib = /^libggml-cpu-(.+)\.so$/;
  const variants = fs.readdirSync(bins).map(f => f.match(cpuLib)?.[1]).filter(Boolean);
  if (!variants.includes(variant))
    throw new Error(`--cpu-variant ${variant}: not in ${bins}; there are ${variants.sort().join(", ")}`);
  const copy = fs.mkdtempSync(path.join(os.tmpdir(), "loom-llama-cpu-"));
  process.on("exit", () => fs.rmSync(copy, {recursive: true, force: true}));
  for (const signal of ["SIGINT", "SIGTERM"]) process.on(signal, () => process.exit(1));  // through "exit"
  fs.mkdirSync(path.join(copy, "bins", "linux-x64"), {recursive: true});
  fs.cpSync(path.join(original, "dist"), path.join(copy, "dist"), {recursive: true});
  fs.copyFileSync(path.join(original, "package.json"), path.join(copy, "package.json"));
  for (const f of fs.readdirSync(bins)) {
    const v = f.match(cpuLib)?.[1];
    if (v === undefined || v === variant) fs.symlinkSync(path.join(bins, f), path.join(copy, "bins", "linux-x64", f));
  }
  return pathToFileURL(path.join(copy, "dist", "index.js")).href;
}

// Runs in node's module-loader thread: sends one specifier to `data.url`.
const hook = `
let target;
export function initialize(data) { target = data; }
export async function resolve(specifier, context, next) {
  if (specifier === target.specifier) return {url: target.url, shortCircuit: true};
  return next(specifier, context);
}`;

// getLlama() on the CPU, printing errors only; with a variant, only that CPU
// library is there to load. cpu() gives, for the JSON lines, the library ggml
// loaded (its log line is below info level) and the CPU features llama.cpp
// says it uses.
export async function loadLlama(interop, variant) {
  if (variant !== undefined)
    register("data:text/javascript," + encodeURIComponent(hook),
             {data: {specifier: binsPackage, url: packageWithOnlyVariant(interop, variant)}});
  const entry = path.resolve(interop, "node_modules/node-llama-cpp/dist/index.js");
  const {getLlama, LlamaLogLevel} = await import(pathToFileURL(entry).href);
  let loaded;
  const logger = (level, message) => {
    const m = message.match(/loaded CPU backend from (\S+)/);
    if (m) loaded = path.basename(m[1]);
    else if (level === LlamaLogLevel.error || level === LlamaLogLevel.fatal) process.stderr.write(message + "\n");
  };
  const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.log, logger});
  const cpu = llama.systemInfo.match(/CPU : ([^\n]*)/)?.[1] ?? "";
  const features = [...cpu.matchAll(/(\w+) = 1/g)].map(m => m[1]).join(" ");
  return {llama, cpu: () => ({cpu_backend: loaded ?? "unknown", cpu_features: features})};
}
