#!/usr/bin/env node
// Parses a GGUF file with Hugging Face's independent reader (npm
// @huggingface/gguf, written for version 0.4.6) and prints its metadata and
// tensor table in the canonical JSON form of loom's gguf_describe_json()
// (src/io/gguf.h), so a test can check that another implementation reads
// what loom wrote.
//
//   node gguf_hf_parse.mjs FILE.gguf [--modules DIR] [--compare LOOM.json]
//
//   --modules DIR     load @huggingface/gguf from DIR/node_modules (default:
//                     Node's resolution from this script's directory)
//   --compare J       instead of printing, compare with J (the output of
//                     gguf_describe_json for the same file): exit 0 if they
//                     agree, 1 with the first difference on stderr
//
// Canonical form: {"version", "tensor_data_offset": "N", "metadata": [{"key",
// "type", "value"}], "tensors": [{"name", "type", "dims": ["N"], "offset":
// "N"}]}; integers as decimal strings, floats as numbers or "nan"/"inf"/
// "-inf", arrays as {"element_type", "values"}. The comparison normalises
// every leaf to a string first: Hugging Face's reader does not report the
// element types of the inner arrays of an array of arrays, so an inner
// integer 2 and an inner float 2.0 look alike there.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

const VALUE_TYPES = ["u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"];
const INTEGER_TYPES = new Set(["u8", "i8", "u16", "i16", "u32", "i32", "u64", "i64"]);
const FLOAT_TYPES = new Set(["f32", "f64"]);

function usage(message) {
  process.stderr.write(
    `gguf_hf_parse.mjs: ${message}\n` +
      "usage: node gguf_hf_parse.mjs FILE.gguf [--modules DIR] [--compare LOOM.json]\n",
  );
  process.exit(2);
}

function parseArgs(argv) {
  const args = { file: null, modules: null, compare: null };
  for (let i = 0; i < argv.length; ++i) {
    if (argv[i] === "--modules" || argv[i] === "--compare") {
      if (i + 1 >= argv.length) usage(`${argv[i]} needs a value`);
      args[argv[i].slice(2)] = argv[++i];
    } else if (args.file === null) {
      args.file = argv[i];
    } else {
      usage(`unexpected argument '${argv[i]}'`);
    }
  }
  if (args.file === null) usage("no GGUF file given");
  return args;
}

async function loadGguf(modules) {
  if (modules === null) return import("@huggingface/gguf");
  const require = createRequire(path.join(path.resolve(modules), "node_modules", "_"));
  return require("@huggingface/gguf");
}

function floatJson(v) {
  if (Number.isNaN(v)) return "nan";
  if (v === Infinity) return "inf";
  if (v === -Infinity) return "-inf";
  return v;
}

// A value of GGUF type `type`; inner arrays of an array of arrays come
// without their element types (type null).
function valueJson(type, v, subType) {
  if (type === "array") {
    const element = subType === undefined ? null : VALUE_TYPES[subType];
    const values = v.map((x) => valueJson(element ?? guessType(x), x, undefined));
    return subType === undefined ? values : { element_type: element, values };
  }
  if (INTEGER_TYPES.has(type)) return String(v);
  if (FLOAT_TYPES.has(type)) return floatJson(v);
  return v;
}

function guessType(x) {
  if (Array.isArray(x)) return "array";
  if (typeof x === "bigint") return "i64";
  if (typeof x === "number") return "f64";
  if (typeof x === "boolean") return "bool";
  return "string";
}

function describe(parsed) {
  const metadata = [];
  // The first three entries are the header's version, tensor_count and
  // kv_count, not keys of the file.
  for (const [key, entry] of Object.entries(parsed.typedMetadata).slice(3)) {
    const type = VALUE_TYPES[entry.type];
    metadata.push({ key, type, value: valueJson(type, entry.value, type === "array" ? entry.subType : undefined) });
  }
  const tensors = parsed.tensorInfos.map((t) => ({
    name: t.name,
    type: t.dtype,
    dims: t.shape.map((d) => String(d)),
    offset: String(t.offset),
  }));
  return {
    version: parsed.metadata.version,
    tensor_data_offset: String(parsed.tensorDataOffset),
    metadata,
    tensors,
  };
}

// Every leaf as a string: integers (numbers or decimal strings) as their
// decimal digits, other numbers as JavaScript prints them.
function normalise(x) {
  if (Array.isArray(x)) return x.map(normalise);
  if (x !== null && typeof x === "object") {
    const out = {};
    for (const [k, v] of Object.entries(x)) out[k] = normalise(v);
    return out;
  }
  if (typeof x === "number") return Number.isInteger(x) ? BigInt(x).toString() : String(x);
  return String(x);
}

function firstDifference(a, b, where) {
  const differ = `${where}: ${JSON.stringify(a)} vs ${JSON.stringify(b)}`;
  if (typeof a !== typeof b || Array.isArray(a) !== Array.isArray(b)) return differ;
  if (typeof a !== "object" || a === null) return a === b ? null : differ;
  const keys = Array.isArray(a)
    ? [...Array(Math.max(a.length, b.length)).keys()]
    : [...new Set([...Object.keys(a), ...Object.keys(b)])];
  for (const k of keys) {
    if (!(k in a) || !(k in b)) return `${where}.${k}: present in only one (${k in a ? "huggingface" : "loom"})`;
    const d = firstDifference(a[k], b[k], `${where}.${k}`);
    if (d !== null) return d;
  }
  return null;
}

const args = parseArgs(process.argv.slice(2));
const { gguf } = await loadGguf(args.modules);
const parsed = await gguf(path.resolve(args.file), { allowLocalFile: true, typedMetadata: true });
const mine = describe(parsed);
if (args.compare === null) {
  process.stdout.write(JSON.stringify(mine, null, 1) + "\n");
} else {
  const loom = JSON.parse(readFileSync(args.compare, "utf8"));
  const d = firstDifference(normalise(mine), normalise(loom), "$");
  if (d !== null) {
    process.stderr.write(
      `gguf_hf_parse.mjs: @huggingface/gguf and loom disagree on ${args.file} at ${d} (huggingface vs loom)\n`,
    );
    process.exit(1);
  }
  const counts = `${mine.metadata.length} keys, ${mine.tensors.length} tensors`;
  process.stdout.write(`gguf_hf_parse.mjs: @huggingface/gguf agrees with loom on ${args.file}: ${counts}\n`);
}
