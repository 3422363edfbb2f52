"""Asynchronous parameter-server training (SSP) and its faults.

usage: ps_async.py LOOM WORKDIR CONFIG MPIRUN...

WORKDIR holds data/train_*.bin and data/val_*.bin.
  bound    2 servers, 3 workers, staleness 2, worker 2 slowed by 150 ms a
           step: from the workers' own wall-clock records (LOOM_PS_EVENTS), no
           worker ever began step k before every other worker had sent at least
           k - 2 pushes, the fast workers did run the full 2 steps ahead (the
           bound was reached, so it was tested), and the loss fell.
  resume   the servers' checkpoint (more optimizer updates than steps) resumed
           by the same command with more steps, then by collective dp.
  worker   a worker SIGKILLed mid-run (mpirun --enable-recovery): the others
           finish every step and write the model, and the log names the lost
           worker.
  server   a server SIGKILLed mid-run, synchronous under plain mpirun and
           asynchronous under --enable-recovery: every process is gone within
           parallel.timeout_s + 30 s, with a message naming the server's rank
           (mpirun's, or loom's watchdog's).
"""
import glob
import json
import os
import signal
import subprocess
import sys
import time

loom, work, config = sys.argv[1], sys.argv[2], sys.argv[3]
mpirun = sys.argv[4:]
failed = False


def check(ok, what):
    global failed
    failed |= not ok
    print(f"{'ok' if ok else 'FAIL'} {what}")


def command(name, np, keys, steps, recovery=False):
    cmd = mpirun + (["--enable-recovery"] if recovery else []) + ["-np", str(np), loom, "train", "--config", config,
                                                                   "--threads", "1"]
    keys = [f"data.train={work}/data/train_*.bin", f"data.val={work}/data/val_*.bin", f"train.steps={steps}",
            "train.eval_every=0", "parallel.mode=ps", "parallel.ps_server=optimizer", "parallel.bucket_mb=1",
            "log.every=1"] + keys
    for k in keys:
        cmd += ["--set", k]
    return cmd + ["--metrics", f"{work}/{name}.jsonl"]


def events_env(name, delay=None):
    d = f"{work}/{name}_events"
    subprocess.run(["rm", "-rf", d], check=True)
    os.makedirs(d)
    env = dict(os.environ, LOOM_PS_EVENTS=d)
    if delay:
        env["LOOM_DP_DELAY"] = delay
    return env, d


def read_events(d):
    rec = {}
    for path in glob.glob(f"{d}/worker_*.jsonl"):
        for line in open(path):
            r = json.loads(line)
            rec.setdefault(r["worker"], []).append(r)
    return rec


# ---- the staleness bound, with a deliberately slow worker ----
S_, W_, STALE, STEPS = 2, 3, 2, 12
env, d = events_env("bound", delay="2:150")
out = subprocess.run(command("bound", S_ + W_, [f"parallel.dp={W_}", f"parallel.ps_servers={S_}",
                                                 f"parallel.staleness={STALE}"], STEPS),
                     env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
if out.returncode != 0:
    print(out.stdout)
check(out.returncode == 0, "bound: the run finished")
rec = read_events(d)
check(sorted(rec) == list(range(W_)) and all(len(rec[w]) == STEPS for w in rec),
      f"bound: every worker recorded {STEPS} steps")
worst_lead, server_lead = -99, -99
for w, rs in rec.items():
    for r in rs:
        k = r["step"]
        for v in rec:
            if v == w:
                continue
            pushed = sum(1 for q in rec[v] if q["pushed"] < r["begin"])
            worst_lead = max(worst_lead, k - pushed)
        server_lead = max(server_lead, r["step"] + 1 - r["slowest"]) if w != 2 else server_lead
check(worst_lead <= STALE, f"bound: no worker began step k with another at fewer than k - {STALE} pushes "
      f"(largest lead seen from the workers' clocks: {worst_lead})")
check(server_lead == STALE, f"bound: the fast workers reached the bound (largest lead {server_lead} = {STALE})")
losses = [json.loads(l)["loss"] for l in open(f"{work}/bound.jsonl")]
check(len(losses) == STEPS and sum(losses[-3:]) / 3 < sum(losses[:3]) / 3,
      f"bound: worker 0's loss fell ({losses[0]:.4f} -> {losses[-1]:.4f})" if losses else "bound: losses")


# ---- resuming: the servers' checkpoint (about dp optimizer updates a step)
# resumed by the same command with more steps, then by collective dp ----
ck = f"{work}/async_ck"
subprocess.run(["rm", "-rf", ck], check=True)
ps_keys = ["parallel.dp=3", "parallel.ps_servers=1", "parallel.staleness=2", f"checkpoint.dir={ck}",
           "checkpoint.every=4"]
for name, np, keys, steps in (("resume_first", 4, ps_keys, 8), ("resume_ps", 4, ps_keys, 12),
                              ("resume_collective", 2, ["parallel.mode=collective", "parallel.dp=2",
                                                        f"checkpoint.dir={ck}", "checkpoint.every=4"], 16)):
    out = subprocess.run(command(name, np, keys, steps), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=300)
    resumed = name == "resume_first" or f"at step {steps - 4}" in out.stdout
    check(out.returncode == 0 and resumed, f"resume: {name} ran to step {steps}" +
          ("" if name == "resume_first" else f", resumed at step {steps - 4}"))
    if out.returncode != 0 or not resumed:
        print(out.stdout[-3000:])
updates = json.load(open(f"{ck}/step_000008/manifest.json"))["optimizer"]["steps_taken"]
check(updates > 8, f"resume: the asynchronous servers' checkpoint took more updates than steps ({updates} at step 8)")


def rank_pids(parent):
    """{world rank: pid} of the processes mpirun `parent` started."""
    pids = {}
    for status in glob.glob("/proc/[0-9]*/status"):
        try:
            ppid = int([l for l in open(status) if l.startswith("PPid:")][0].split()[1])
            if ppid != parent:
                continue
            pid = int(status.split("/")[2])
            environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        for e in environ:
            if e.startswith(b"OMPI_COMM_WORLD_RANK="):
                pids[int(e.split(b"=")[1])] = pid
    return pids


def kill_rank_mid_run(name, cmd, env, events, rank, after_steps):
    """Starts cmd, SIGKILLs world rank `rank` once worker 0 recorded after_steps steps."""
    log = open(f"{work}/{name}.log", "w")
    start = time.time()
    p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    killed_at = None
    while p.poll() is None and time.time() - start < 240:
        n = len(open(f"{events}/worker_0.jsonl").readlines()) if os.path.exists(f"{events}/worker_0.jsonl") else 0
        if killed_at is None and n >= after_steps:
            pid = rank_pids(p.pid).get(rank)
            if pid:
                os.kill(pid, signal.SIGKILL)
                killed_at = time.time()
        time.sleep(0.05)
    hung = p.poll() is None
    if hung:
        p.kill()
    p.wait()
    log.close()
    check(not hung, f"{name}: the job exited on its own (within 240 s of its start)")
    return p.returncode, killed_at, open(f"{work}/{name}.log").read()


# ---- a worker killed ----
TIMEOUT = 8
env, d = events_env("lost_worker", delay="1:50")
cmd = command("lost_worker", 5, ["parallel.dp=3", "parallel.ps_servers=2", "parallel.staleness=2",
                                 f"parallel.timeout_s={TIMEOUT}", f"checkpoint.dir={work}/lost_worker_out"], 40,
              recovery=True)
subprocess.run(["rm", "-rf", f"{work}/lost_worker_out"], check=True)
code, killed_at, text = kill_rank_mid_run("lost_worker", cmd, env, d, rank=4, after_steps=5)
check(killed_at is not None, "worker: worker 2 (world rank 4) was killed mid-run")
steps = [json.loads(l)["step"] for l in open(f"{work}/lost_worker.jsonl")] if os.path.exists(
    f"{work}/lost_worker.jsonl") else []
check(steps and steps[-1] == 40, f"worker: the other workers finished all 40 steps (last: {steps[-1] if steps else None})")
check(os.path.exists(f"{work}/lost_worker_out/model.safetensors"), "worker: the final model was written")
named = [l for l in text.splitlines() if "ps: worker 2 (world rank 4) lost" in l]
check(len(named) == 1, "worker: the log names the lost worker" + (f": {named[0]}" if named else ""))
if failed:
    print(text[-3000:])

# ---- a server killed: synchronous under plain mpirun, asynchronous under --enable-recovery ----
for mode, keys, recovery in (("sync", [], False), ("async", ["parallel.staleness=1"], True)):
    name = f"lost_server_{mode}"
    env, d = events_env(name)
    cmd = command(name, 4, ["parallel.dp=2", "parallel.ps_servers=2", f"parallel.timeout_s={TIMEOUT}"] + keys, 400,
                  recovery=recovery)
    code, killed_at, text = kill_rank_mid_run(name, cmd, env, d, rank=1, after_steps=3)
    check(killed_at is not None, f"server ({mode}): server 1 (world rank 1) was killed mid-run")
    if not killed_at:
        continue
    took = time.time() - killed_at
    # mpirun --enable-recovery exits 0 even after a rank's MPI_Abort; without it, the kill fails the job.
    check(took < TIMEOUT + 30 and (recovery or code != 0),
          f"server ({mode}): every process exited (mpirun status {code}) {took:.1f} s after the kill")
    named = [l for l in text.splitlines() if "rank 1" in l and ("watchdog" in l or "exited on signal" in l)]
    check(len(named) >= 1, f"server ({mode}): a message names the lost server" + (f": {named[0][:220]}" if named else ""))
    if not named:
        print(text[-3000:])
sys.exit(1 if failed else 0)
