// loom's tokenizer.json files against Hugging Face's own JavaScript
// tokenizers (@huggingface/tokenizers, the tokenizers of
// @huggingface/transformers): the same strings give the same ids (without
// and with the special tokens the post-processor adds) and decode to the
// same text. Four files: GPT-2's and a Llama-3-style one (byte-level BPE,
// written by loom), and LLaMA's in the two SentencePiece forms transformers'
// LlamaConverter writes -- Llama 2's (normalizer Prepend + Replace) and the
// newer one (Metaspace, prepend_scheme "first") -- written here from the
// vocabulary and merges of LLaMA's own tokenizer.json that llama-tokenizer-js
// embeds.
//   node hf_tokenizer_check.mjs HF_TOKENIZER_IDS ENCODER_DIR WORK_DIR INTEROP_DIR [COUNT]
// HF_TOKENIZER_IDS: tests/interop/hf_tokenizer_ids.cpp's executable, which
// writes the files (GPT-2's, and a Llama-3-style one on GPT-2's vocabulary)
// and encodes with loom; INTEROP_DIR: where scripts/fetch-data.sh installed
// tests/interop's lock file (its node_modules holds @huggingface/tokenizers);
// COUNT: strings per tokenizer (default 3000).
//
// The strings: pieces tokenizers trip on (whitespace runs of every kind,
// digits, contractions, punctuation, emoji, CJK, combining marks, special
// tokens' text) and random assigned code points, joined; and the empty
// string. JavaScript strings hold no invalid UTF-8, so that case is tested on
// loom's side only (tests/text/test_hf_tokenizer.cpp). Left out where the
// JavaScript port knowingly differs from the `tokenizers` library loom
// follows:
//   - GPT-2's ByteLevel regex runs with JavaScript's \s, which holds U+FEFF
//     and not U+0085 (the library's Oniguruma \s, and Python's, the reverse):
//     neither character in GPT-2's strings;
//   - Llama 3's (?i:'s) folds only ASCII in the port, while Oniguruma also
//     matches 'ſ (U+017F): no U+017F in Llama 3's strings.
import { spawnSync } from "node:child_process";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";

import { random } from "./seeded_random.mjs";

const [exe, encoderDir, work, interop, countArg] = process.argv.slice(2);
const count = Number(countArg ?? 3000);
const require = createRequire(join(resolve(interop), "node_modules", "_"));
const { Tokenizer } = require("@huggingface/tokenizers");
const { default: llama } = await import(pathToFileURL(require.resolve("llama-tokenizer-js")));
const { version } = JSON.parse(
  readFileSync(join(resolve(interop), "node_modules", "@huggingface", "tokenizers", "package.json"), "utf8"));

function run(args, input) {
  const r = spawnSync(exe, args, { input, maxBuffer: 1 << 30, encoding: "utf8" });
  if (r.status !== 0) throw new Error(`${exe} ${args.join(" ")}: ${r.error ?? "exit " + r.status}\n${r.stderr}`);
  return r.stdout;
}

const PIECES = [
  "hello", "World", " the", " ", "  ", "   ", "      ", "\t", "\n", "\r\n", "\r", "\n\n", " \n ", "\t\t ", " \t\n",
  "'s", "'S", "'t", "'re", "'RE", "'ve", "'m", "'ll", "'LL", "'d", "don't", "I'M", "'", "''",
  "1", "12", "123", "1234", "2024", "99999", "3.14", " 42", "0x1F", "٣٤٥", "४२", "²", "½", "Ⅻ",
  "!", "?!", "...", "(x)", "--", "$", "\"q\"", "@#%", "_", "a_b", "<", ">", "|", "<|", "|>",
  "é", "ñandú", "Łódź", "e\u0301", "Ελληνικά", "кириллица", "العربية", "עברית", "हिन्दी", "ไทย",
  "😀", "👍🏽", "👨‍👩‍👧", "🇺🇸", "🤖!", "中文", "日本語の", "한국어", "ｆｕｌｌ", "\u3000", "\u00a0", "\u2003",
  "\u2028", "\u205f", "\u200b", "\ufffd", "\u0000", "\u007f",
];
const RANGES = [
  [0x20, 0x7e], [0xa0, 0x24f], [0x370, 0x3ff], [0x400, 0x4ff], [0x590, 0x6ff], [0x900, 0x97f], [0x2000, 0x206f],
  [0x2070, 0x209f], [0x2150, 0x218f], [0x3000, 0x30ff], [0x4e00, 0x9fff], [0xac00, 0xd7a3], [0xff00, 0xffef],
  [0x1f300, 0x1faff], [0x10000, 0x2ffff], [0x0, 0x10ffff],
];

function strings(seed, extraPieces, excluded) {
  const rand = random(seed);
  const pick = (list) => list[Math.floor(rand() * list.length)];
  const pieces = [...PIECES, ...extraPieces].filter((p) => ![...p].some((c) => excluded.has(c)));
  const codePoint = () => {
    for (;;) {
      const [lo, hi] = pick(RANGES);
      const cp = lo + Math.floor(rand() * (hi - lo + 1));
      const c = String.fromCodePoint(cp);
      if ((cp >= 0xd800 && cp <= 0xdfff) || /\p{Cn}/u.test(c) || excluded.has(c)) continue;
      return c;
    }
  };
  const out = ["", " ", "\n", "a", " ".repeat(40), "\n".repeat(5) + "x", "1234567890", "<|endoftext|>"];
  while (out.length < count) {
    let s = "";
    const n = Math.floor(rand() * 14);
    for (let k = 0; k < n; ++k) s += rand() < 0.25 ? codePoint() : pick(pieces);
    out.push(s);
  }
  return out;
}

function check(name, dir, texts) {
  const tok = new Tokenizer(
    JSON.parse(readFileSync(join(dir, "tokenizer.json"), "utf8")),
    JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8")),
  );
  const lines = run(["encode", join(dir, "tokenizer.json")], texts.map((t) => JSON.stringify(t)).join("\n") + "\n")
    .trimEnd()
    .split("\n");
  if (lines.length !== texts.length) throw new Error(`${name}: ${lines.length} lines from loom for ${texts.length}`);
  let bad = 0;
  texts.forEach((text, i) => {
    const loom = JSON.parse(lines[i]);
    const ids = tok.encode(text, { add_special_tokens: false }).ids;
    const prompt = tok.encode(text).ids;
    const decoded = ids.length ? tok.decode(ids, { skip_special_tokens: true }) : "";
    const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);
    if (same(ids, loom.ids) && same(prompt, loom.prompt) && decoded === loom.text) return;
    if (++bad <= 10)
      console.log(`hf_tokenizer_check: ${name}: ${JSON.stringify(text)}\n  loom: ${JSON.stringify(loom)}\n` +
                  `  js:   ${JSON.stringify({ ids, prompt, text: decoded })}`);
  });
  if (bad) {
    console.log(`hf_tokenizer_check: ${name}: ${bad} of ${texts.length} strings differ`);
    return false;
  }
  console.log(`hf_tokenizer_check: ${name}: ${texts.length} strings: ids, prompt ids and decoded text equal ` +
              `to @huggingface/tokenizers ${version}'s`);
  return true;
}

// LLaMA's tokenizer.json and tokenizer_config.json as transformers writes
// them (legacy: Llama 2's normalizer; else the Metaspace pre-tokenizer).
function writeLlama(dir, legacy) {
  mkdirSync(dir, { recursive: true });
  const sp = "\u2581";
  const special = (id, content) =>
    ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
  const vocab = Object.fromEntries(llama.vocabById.map((t, id) => [t, id]));
  const merges = [...llama.merges.entries()].sort((a, b) => a[1] - b[1]).map(([pair]) => pair);
  const replace = (from, to) => ({ type: "Replace", pattern: { String: from }, content: to });
  const json = {
    version: "1.0", truncation: null, padding: null,
    added_tokens: [special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")],
    normalizer: legacy ? { type: "Sequence", normalizers: [{ type: "Prepend", prepend: sp }, replace(" ", sp)] } : null,
    pre_tokenizer: legacy ? null : { type: "Metaspace", replacement: sp, prepend_scheme: "first", split: false },
    post_processor: {
      type: "TemplateProcessing",
      single: [{ SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
      pair: [{ SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } },
             { SpecialToken: { id: "<s>", type_id: 1 } }, { Sequence: { id: "B", type_id: 1 } }],
      special_tokens: { "<s>": { id: "<s>", ids: [1], tokens: ["<s>"] } },
    },
    decoder: { type: "Sequence", decoders: [replace(sp, " "), { type: "ByteFallback" }, { type: "Fuse" },
                                            { type: "Strip", content: " ", start: 1, stop: 0 }] },
    model: { type: "BPE", dropout: null, unk_token: "<unk>", continuing_subword_prefix: null,
             end_of_word_suffix: null, fuse_unk: true, byte_fallback: true, vocab, merges },
  };
  writeFileSync(join(dir, "tokenizer.json"), JSON.stringify(json));
  writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify(
    { add_bos_token: true, add_eos_token: false, bos_token: "<s>", eos_token: "</s>", unk_token: "<unk>",
      clean_up_tokenization_spaces: false, legacy, tokenizer_class: "LlamaTokenizerFast" }));
}

mkdirSync(join(work, "gpt2"), { recursive: true });
mkdirSync(join(work, "llama3"), { recursive: true });
run(["write-gpt2", encoderDir, join(work, "gpt2")]);
run(["write-llama3", encoderDir, join(work, "llama3")]);
const llamaSpecials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "user",
                       "<|end_header_id|>\n\n", "<|eot"];
writeLlama(join(work, "llama2"), true);
writeLlama(join(work, "llama2-metaspace"), false);
const spmPieces = ["<s>", "</s>", "<unk>", "<s", "\u2581", "\u2581\u2581", "a\u2581b", "<0x41>", "  ", " ".repeat(17),
                   "grabbed", " grabbed", "\ufeff", "\u0085"];
const ok = [
  check("gpt2", join(work, "gpt2"), strings(1, [], new Set(["\u0085", "\ufeff"]))),
  check("llama3", join(work, "llama3"), strings(2, [...llamaSpecials, "\u0085", "\ufeff"], new Set(["\u017f"]))),
  check("llama2", join(work, "llama2"), strings(3, spmPieces, new Set())),
  check("llama2-metaspace", join(work, "llama2-metaspace"), strings(4, spmPieces, new Set())),
];
writeFileSync(join(work, "done"), ok.join(","));
process.exit(ok.every(Boolean) ? 0 : 1);
