#!/usr/bin/env python3
"""loom plan against the Ultra-Scale Playbook's best training configurations
(published-configs.md in the planner's acceptance data): for every cell
(model x nodes of 8 H100 80 GB), loom's memory and predicted MFU for the
published layout, and loom's own choice from its search, as a Markdown table.

    bench/plan_playbook.py LOOM PUBLISHED_CONFIGS_MD

The models are the table's (Llama layout, multi-head attention, vocabulary
131072, embeddings tied under 4B); runs are bf16, sequence 4096, 256
sequences per step, no recompute, tp with sequence parallelism, 1F1B. The
search is limited to ZeRO 0 and 1, the stages nanotron (which measured the
table) offers."""
import json
import re
import subprocess
import sys

MODELS = {  # name: (layers, hidden, heads, d_ff, tied)
    "1.34B": (16, 2048, 32, 8192, True),
    "3.57B": (28, 3072, 32, 8192, True),
    "8.86B": (32, 4096, 32, 14336, False),
    "80B": (80, 8192, 64, 28672, False),
}
MAX_ZERO = 1  # nanotron, which measured the table, offers ZeRO 0 and 1
CELL = re.compile(r"(\d+)/(\d+)/(\d+) · (\d+) · (\d+) · Z(\d) → ([\d.]+) · ([\d.]+)")


def model_sets(name):
    layers, hidden, heads, d_ff, tied = MODELS[name]
    sets = {"model.n_layer": layers, "model.n_embd": hidden, "model.n_head": heads, "model.n_kv_head": heads,
            "model.d_ff": d_ff, "model.vocab_size": 131072, "model.tie_embeddings": str(tied).lower()}
    out = ["--model", "llama-110m", "--seq", "4096", "--dtype", "bf16"]
    for k, v in sets.items():
        out += ["--set", f"{k}={v}"]
    return out


def run(loom, args):
    p = subprocess.run([loom, "plan"] + args, capture_output=True, text=True)
    if p.returncode != 0:
        return None, p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "failed"
    return p.stdout, None


def layout_figures(loom, model, nodes, dp, tp, pp, ga, mb, zero):
    sets = ["--set", f"parallel.dp={dp}", "--set", f"parallel.tp={tp}", "--set", f"parallel.pp={pp}",
            "--set", f"parallel.zero_stage={zero}", "--set", f"train.grad_accum={ga}",
            "--set", f"train.micro_batch={mb}", "--set", f"parallel.sequence_parallel={'true' if tp > 1 else 'false'}"]
    out, err = run(loom, model_sets(model) + sets + ["--cluster", "h100", "--nodes", str(nodes), "--json"])
    if err:
        return None, None, err
    per_rank, step = {}, None
    for line in out.splitlines():
        j = json.loads(line)
        if "world_rank" in j:
            per_rank[j["world_rank"]] = per_rank.get(j["world_rank"], 0) + j["peak_bytes"]
        elif "step_s" in j:
            step = j
    return max(per_rank.values()) / 1e9, step["mfu"], None


def search(loom, model, nodes):
    out, err = run(loom, model_sets(model) + ["--cluster", "h100", "--nodes", str(nodes), "--global-batch", "256",
                                              "--top", "1", "--max-zero", str(MAX_ZERO), "--json"])
    if err:
        return err
    for line in out.splitlines():
        j = json.loads(line)
        if "layout" in j:
            return (f"{j['dp']}/{j['tp']}/{j['pp']} · {j['grad_accum']} · {j['micro_batch']} · Z{j['zero_stage']}"
                    f"{' cp ' + str(j['cp']) if j['cp'] > 1 else ''}{', ' + j['recompute'] if j['recompute'] != 'none' else ''}"
                    f" → {100 * j['mfu']:.1f} % · {j['peak_bytes'] / 1e9:.1f} GB")
    return "nothing fits"


def main():
    loom, table = sys.argv[1], sys.argv[2]
    rows = [l for l in open(table) if re.match(r"\| \d+ \|", l)]
    print("| model | nodes | published DP/TP/PP · GAS · MBS · ZeRO → MFU · GB | loom: that layout's GB, predicted MFU "
          "| loom's choice → predicted MFU · GB |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        cells = [c.strip().replace("**", "") for c in row.strip().strip("|").split("|")]
        nodes = int(cells[0])
        for model, cell in zip(MODELS, cells[1:]):
            m = CELL.search(cell)
            if not m:
                continue
            dp, tp, pp, ga, mb, zero = (int(x) for x in m.groups()[:6])
            gb, mfu, err = layout_figures(loom, model, nodes, dp, tp, pp, ga, mb, zero)
            mine = err if err else f"{gb:.1f} GB, {100 * mfu:.1f} %"
            print(f"| {model} | {nodes} | {m.group(0)} | {mine} | {search(loom, model, nodes)} |", flush=True)


main()
