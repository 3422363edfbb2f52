#!/usr/bin/env python3
"""Randomized kill test of `loom train` (issue 15): SIGKILL at seeded random
times, inside saves and right after a resume, must never cost more than the
steps since the newest complete checkpoint, and the run resumed to the end
must equal an uninterrupted run bitwise (final model, last checkpoint) with
each step once in the metrics.

Each trial is a chain in a fresh directory: a run killed at a random time, a
resumed run killed again soon after its start (often before or inside its
first save), then a resumed run to the end. Ranks of an mpirun job are found
by their session (mpirun starts a new one) and killed together, as a node
failure would.

--sigterm: the first two runs of a chain get SIGTERM instead (every process
of the job, as a batch scheduler sends it to every task), must then stop by
themselves within a minute with exit status 143 and "stopped by SIGTERM"
(or have finished first), and the chain must still end bitwise equal.

--offload [TIER]: with the state on disk (parallel.offload = TIER: optimizer,
the default, or params: ZeRO-3's parameter and gradient shards too): a
kill lands inside an update's write-back too, and no offload file may be
left once a chain has ended with a finished run (a killed run cannot remove
its own: a chain ending with one killed after its last checkpoint may leave
that run's files only, and the next trial's first run must remove them).

usage: kill_resume.py LOOM CONFIG WORKDIR [--trials N] [--seed S] [--np N]
                      [--mpirun CMD] [--sigterm] [--offload [TIER]] [--set key=value]...
"""
import argparse
import json
import os
import random
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import time

STEPS = 10


def write_shard(path, tokens):
    # llm.c's .bin format (DESIGN.md §7): 256 int32 header, uint16 tokens.
    header = [20240520, 1, len(tokens)] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%dH" % len(tokens), *tokens))


def session_pids(sid):
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.getsid(int(name)) == sid:
                    pids.append(int(name))
            except OSError:
                pass
    return pids


def offload_file_pid(name):
    """The pid in loom-offload-<host>-<pid>-rank<R>-chunk<C>.bin (a host name may hold dashes)."""
    parts = name.split("-")
    return int(parts[-3]) if len(parts) >= 5 and parts[-3].isdigit() else None


def kill_session(proc):
    """Kills every process of the job; returns their pids."""
    pids = session_pids(proc.pid)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    proc.wait()
    # The ranks are not mpirun's children once it is gone: wait them out.
    deadline = time.time() + 10
    while session_pids(proc.pid) and time.time() < deadline:
        time.sleep(0.01)
    return pids


def stop_session(proc, log_path, finished):
    """SIGTERM to every rank (or the one process); fails the test unless the job stops as it should."""
    for pid in session_pids(proc.pid):
        if pid != proc.pid or len(session_pids(proc.pid)) == 1:
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        kill_session(proc)
        sys.exit("FAIL: the job did not stop within 60 s of SIGTERM")
    if proc.returncode == 0 or os.path.exists(finished):
        return  # it had finished (a signal while it exits may still end it)
    text = read(log_path).decode(errors="replace")
    if proc.returncode != 128 + signal.SIGTERM or "stopped by SIGTERM" not in text:
        sys.exit("FAIL: after SIGTERM the job exited with %d:\n%s" % (proc.returncode, text[-3000:]))


def wait_for_line(proc, log_path, begin, text):
    deadline = time.time() + 120
    while proc.poll() is None and time.time() < deadline:
        with open(log_path, "rb") as f:
            f.seek(begin)
            if text.encode() in f.read():
                return
        time.sleep(0.01)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def check_complete_step_dirs(ckpt, where):
    for name in sorted(os.listdir(ckpt)) if os.path.isdir(ckpt) else []:
        path = os.path.join(ckpt, name)
        if name.startswith("step_") and name[5:].isdigit():
            if not os.path.exists(os.path.join(path, "manifest.json")):
                sys.exit("FAIL %s: %s is a step dir without a manifest" % (where, path))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("loom")
    ap.add_argument("config")
    ap.add_argument("workdir")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--np", type=int, default=1)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--sigterm", action="store_true")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--offload", nargs="?", const="optimizer", choices=["optimizer", "params"],
                    help="the state on disk (parallel.offload = this: optimizer, or params with ZeRO 3) in "
                    "WORKDIR/offload, which must hold no file once a chain has ended (a killed run's are removed "
                    "by the next)")
    a = ap.parse_args()
    offload_dir = os.path.join(a.workdir, "offload")
    if a.offload:
        a.set += ["parallel.offload=%s" % a.offload, "parallel.offload_dir=%s" % offload_dir,
                  "parallel.offload_budget_mb=0.25"]

    shutil.rmtree(a.workdir, ignore_errors=True)
    os.makedirs(a.workdir)
    data = os.path.join(a.workdir, "data")
    os.makedirs(data)
    write_shard(os.path.join(data, "train_000000.bin"), [i % 37 for i in range(6000)])
    write_shard(os.path.join(data, "val_000000.bin"), [i % 37 for i in range(600)])

    def command(out):
        sets = ["data.train=%s/train_*.bin" % data, "data.val=%s/val_*.bin" % data, "model.vocab_size=64",
                "train.steps=%d" % STEPS, "train.eval_every=0", "checkpoint.every=1", "checkpoint.keep=2",
                "checkpoint.dir=%s" % out, "log.metrics=%s/metrics.jsonl" % out] + a.set
        cmd = [a.loom, "train", "--config", a.config, "--threads", "1"]
        for s in sets:
            cmd += ["--set", s]
        if a.np > 1:
            cmd = shlex.split(a.mpirun) + ["-np", str(a.np)] + cmd
        return cmd

    def start(out, log):
        return subprocess.Popen(command(out), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    ref = os.path.join(a.workdir, "reference")
    with open(os.path.join(a.workdir, "reference.log"), "w") as log:
        t0 = time.time()
        if start(ref, log).wait() != 0:
            sys.exit("FAIL: the uninterrupted run failed: see %s/reference.log" % a.workdir)
        whole = time.time() - t0
    rng = random.Random(a.seed)
    last = "step_%06d" % STEPS
    ranks = [n for n in sorted(os.listdir(os.path.join(ref, last))) if n.startswith("rank_")]
    kills = 0
    for trial in range(a.trials):
        out = os.path.join(a.workdir, "trial")
        shutil.rmtree(out, ignore_errors=True)
        killed = []  # the pids of the chain's last run when it ended killed
        with open(os.path.join(a.workdir, "trial.log"), "w") as log:
            # Killed anywhere in a run, then soon after a resume, then to the end.
            for when in (rng.uniform(0.1, 1.0) * whole, rng.uniform(0.0, 0.5) * whole, None):
                log.flush()
                begin = os.path.getsize(os.path.join(a.workdir, "trial.log"))
                proc = start(out, log)
                if when is not None and a.sigterm:
                    # Signals are handled once `loom train` has started (before
                    # that, as for any program, they end the process): the
                    # time counts from its first line, printed after every
                    # rank installed its handlers.
                    wait_for_line(proc, os.path.join(a.workdir, "trial.log"), begin, "] train: ")
                if when is not None:
                    try:
                        proc.wait(timeout=when)
                    except subprocess.TimeoutExpired:
                        log.flush()
                        if a.sigterm:
                            stop_session(proc, os.path.join(a.workdir, "trial.log"),
                                         os.path.join(out, last, "manifest.json"))
                        else:
                            killed = kill_session(proc)
                        kills += 1
                        check_complete_step_dirs(out, "trial %d after a kill at %.2f s" % (trial, when))
                        # Killed after its last checkpoint (the model is written
                        # before it): the run is complete, and the same command
                        # would now say there is nothing left to train.
                        if os.path.exists(os.path.join(out, last, "manifest.json")):
                            break
                        killed = []
                        continue
                else:
                    proc.wait()
                killed = []
                if proc.returncode != 0:
                    log.flush()
                    sys.exit("FAIL trial %d: loom train exited with %d:\n%s" % (
                        trial, proc.returncode, read(os.path.join(a.workdir, "trial.log")).decode()[-3000:]))
                break  # finished: the rest of the chain would resume past train.steps
        if read(os.path.join(out, "model.safetensors")) != read(os.path.join(ref, "model.safetensors")):
            sys.exit("FAIL trial %d: the final model differs from the uninterrupted run's" % trial)
        for r in ranks:
            if read(os.path.join(out, last, r)) != read(os.path.join(ref, last, r)):
                sys.exit("FAIL trial %d: %s/%s differs from the uninterrupted run's" % (trial, last, r))
        with open(os.path.join(out, "metrics.jsonl")) as f:
            steps = [json.loads(line)["step"] for line in f]
        if steps != list(range(1, STEPS + 1)):
            sys.exit("FAIL trial %d: the metrics hold steps %s" % (trial, steps))
        if a.offload:
            left = [n for n in os.listdir(offload_dir) if offload_file_pid(n) not in killed]
            if left:
                sys.exit("FAIL trial %d: offload files left behind: %s" % (trial, left))
    print("kill_resume: %d trials, %d %s (np %d): every resumed run ended bitwise equal to the "
          "uninterrupted one (%.1f s each)" % (a.trials, kills, "SIGTERMs" if a.sigterm else "SIGKILLs", a.np, whole))


if __name__ == "__main__":
    main()
