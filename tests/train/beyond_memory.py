#!/usr/bin/env python3
"""ZeRO-Infinity's proof (issue 41): a model whose f32 weights, gradients and
AdamW moments (16 bytes a parameter) are several times the memory budget
trains with parallel.offload = params under `loom train --memory-budget-mb`,
its peak resident memory within the budget as the OS counts it (the
children's ru_maxrss, read here, not by loom), writes a checkpoint, and
resumes from it under the same budget; the resumed run's losses equal those
of one run straight through without offload, bitwise.

usage: beyond_memory.py LOOM WORKDIR
"""
import json
import os
import resource
import shutil
import struct
import subprocess
import sys

# GPT-2 of 16 layers, C = 512, a vocabulary of 64 (the layers are the model:
# 50.4M parameters), fp32, ZeRO 3 on one rank.
LAYERS, WIDTH, VOCAB = 16, 512, 64
BUDGET_MIB = 180
STEPS, SAVED = 4, 2


def write_shard(path, tokens):
    # llm.c's .bin format (DESIGN.md §7): 256 int32 header, uint16 tokens.
    header = [20240520, 1, len(tokens)] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%dH" % len(tokens), *tokens))


def main():
    loom, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.join(work, "data"))
    write_shard(os.path.join(work, "data", "train_000000.bin"), [(i * 7 + i // 13) % VOCAB for i in range(20000)])
    params = VOCAB * WIDTH + 64 * WIDTH + LAYERS * (12 * WIDTH * WIDTH + 13 * WIDTH) + 2 * WIDTH
    state_mib = 16 * params / 2**20
    print("model: %d parameters; f32 weights, gradients and AdamW moments: %.0f MiB; budget: %d MiB (%.1fx smaller)" %
          (params, state_mib, BUDGET_MIB, state_mib / BUDGET_MIB))

    config = os.path.join(work, "run.toml")
    with open(config, "w") as f:
        f.write("""[model]
preset = "gpt2-tiny"
n_layer = %d
n_embd = %d
n_head = 8
d_ff = %d
vocab_size = %d
max_seq_len = 64
[data]
train = "%s/data/train_*.bin"
[train]
seq_len = 64
micro_batch = 1
dtype = "fp32"
eval_every = 0
[parallel]
zero_stage = 3
[checkpoint]
every = %d
[log]
peak_tflops = 1.0
""" % (LAYERS, WIDTH, 4 * WIDTH, VOCAB, work, SAVED))

    def train(name, steps, offload, budget):
        """Trains (or resumes from WORK/name's newest checkpoint) to `steps`; the metrics' losses by step."""
        out = os.path.join(work, name)
        cmd = [loom, "train", "--config", config, "--threads", "2", "--set", "train.steps=%d" % steps,
               "--set", "log.metrics=%s/metrics.jsonl" % out, "--set", "checkpoint.dir=%s/ckpt" % out]
        if offload:
            cmd += ["--set", "parallel.offload=params", "--set", "parallel.offload_dir=%s/offload" % work,
                    "--set", "parallel.offload_budget_mb=16"]
        if budget:
            cmd += ["--memory-budget-mb", str(budget)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit("FAIL: %s exited with %d:\n%s" % (name, p.returncode, (p.stdout + p.stderr)[-4000:]))
        with open(os.path.join(out, "metrics.jsonl")) as f:
            return {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}

    train("offloaded", SAVED, True, BUDGET_MIB)
    saved = os.path.join(work, "offloaded", "ckpt", "step_%06d" % SAVED)
    if not os.path.exists(os.path.join(saved, "manifest.json")):
        sys.exit("FAIL: no checkpoint at %s" % saved)
    got = train("offloaded", STEPS, True, BUDGET_MIB)  # resumes from it
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux
    print("offloaded runs' peak resident memory (ru_maxrss): %.1f MiB of a %d MiB budget; within it: %s" %
          (peak, BUDGET_MIB, peak <= BUDGET_MIB))
    left = os.listdir(os.path.join(work, "offload"))
    if left:
        sys.exit("FAIL: offload files left: %s" % left)
    want = train("straight", STEPS, False, 0)
    print("losses offloaded, resumed at step %d: %s" % (SAVED, [got.get(s) for s in range(1, STEPS + 1)]))
    print("losses straight, in memory:         %s" % [want.get(s) for s in range(1, STEPS + 1)])
    print("bitwise equal: %s" % (sorted(got.items()) == sorted(want.items())))


if __name__ == "__main__":
    main()
