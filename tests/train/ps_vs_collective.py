"""Synchronous parameter-server training equals collective data parallelism.

usage: ps_vs_collective.py LOOM WORKDIR CONFIG MPIRUN...

WORKDIR holds data/train_*.bin and data/val_*.bin. For S = 1, 2, 3 servers
and W = 2..5 workers (the server kind alternating, so every S and every W
meets both kinds), 20 fp32 steps of `loom train` with parallel.mode = ps
are compared with collective data parallelism over W ranks on the same
global batch (1 MiB buckets under summation servers, one per model unit
under optimizer servers: the gradients travel in several pieces):
the largest relative loss difference must be within 1e-5
(DESIGN.md §6). Then checkpoints: an optimizer-server run's step 10 is
resumed by collective DP, and a collective run's step 10 by optimizer
servers and by summation servers' workers; each continuation must give the
uninterrupted run's losses of steps 11..20.
"""
import json
import os
import subprocess
import sys

loom, work, config = sys.argv[1], sys.argv[2], sys.argv[3]
mpirun = sys.argv[4:]
STEPS = 20
common = ["--set", f"data.train={work}/data/train_*.bin", "--set", f"data.val={work}/data/val_*.bin",
          "--set", f"train.steps={STEPS}", "--set", "train.eval_every=0", "--set", "parallel.timeout_s=120", "--set", "parallel.bucket_mb=1",
          "--threads", "1"]


def train(name, np, keys):
    metrics = os.path.join(work, name + ".jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = mpirun + ["-np", str(np), loom, "train", "--config", config, "--metrics", metrics] + common
    for k in keys:
        cmd += ["--set", k]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    if out.returncode != 0:
        print(out.stdout)
        sys.exit(f"FAIL {name}: exit {out.returncode}")
    return {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(metrics)}


def worst(a, b, steps):
    return max(abs(a[s] - b[s]) / abs(b[s]) for s in steps)


failed = False
reference = {}
for W in range(2, 6):
    reference[W] = train(f"dp{W}", W, [f"parallel.dp={W}"])
for S in (1, 2, 3):
    for W in range(2, 6):
        kind = "sum" if (S + W) % 2 else "optimizer"
        ps = train(f"ps_s{S}_w{W}_{kind}", S + W,
                   [f"parallel.dp={W}", "parallel.mode=ps", f"parallel.ps_servers={S}", f"parallel.ps_server={kind}"])
        d = worst(ps, reference[W], range(1, STEPS + 1))
        same = all(ps[s] == reference[W][s] for s in range(1, STEPS + 1))
        ok = len(ps) == STEPS and d <= 1e-5
        failed |= not ok
        print(f"{'ok' if ok else 'FAIL'} S={S} W={W} {kind}: max rel loss diff {d:.3g} over {STEPS} steps"
              f"{' (bitwise)' if same else ''}")

# Checkpoints across the two modes: one mode's run of 20 steps saves step 10,
# the other mode resumes from it (checkpoint.resume = its path) to step 20.
ps_opt = ["parallel.dp=2", "parallel.mode=ps", "parallel.ps_servers=2", "parallel.ps_server=optimizer"]
cases = [
    ("optimizer servers -> collective dp 2", (4, ps_opt), (2, ["parallel.dp=2"])),
    ("collective dp 2 -> optimizer servers (3)", (2, ["parallel.dp=2"]),
     (5, ["parallel.dp=2", "parallel.mode=ps", "parallel.ps_servers=3", "parallel.ps_server=optimizer"])),
    ("collective dp 2 -> summation servers (2)", (2, ["parallel.dp=2"]),
     (4, ["parallel.dp=2", "parallel.mode=ps", "parallel.ps_servers=2", "parallel.ps_server=sum"])),
]
for i, (what, (np1, keys1), (np2, keys2)) in enumerate(cases):
    a, b = f"{work}/swap{i}_a", f"{work}/swap{i}_b"
    subprocess.run(["rm", "-rf", a, b], check=True)
    train(f"swap{i}_a", np1, keys1 + [f"checkpoint.dir={a}", "checkpoint.every=10"])
    resumed = train(f"swap{i}_b", np2, keys2 + [f"checkpoint.dir={b}", f"checkpoint.resume={a}/step_000010"])
    d = worst(resumed, reference[2], range(11, STEPS + 1))
    ok = sorted(resumed) == list(range(11, STEPS + 1)) and d <= 1e-5
    failed |= not ok
    print(f"{'ok' if ok else 'FAIL'} checkpoint {what}: steps 11-20 max rel loss diff {d:.3g}")
sys.exit(1 if failed else 0)
