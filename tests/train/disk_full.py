#!/usr/bin/env python3
"""ZeRO-Infinity's full-disk fault (issue 41): the disk that holds a run's
offload files and checkpoints fills up in the middle of the run.

The run (parallel.offload = params, one rank, ZeRO 3) writes its checkpoint
of step 4 on a small tmpfs of its own; the test then stops it (SIGSTOP),
fills every free byte of that tmpfs and lets it go on. Training goes on,
since the offload files were preallocated at start, until the checkpoint of
step 8, which must fail with a clear error naming the full disk and the
checkpoint kept, leaving that checkpoint whole, no half-written step dir and
no offload file. With the space freed, the same command resumes from step 4
and its losses equal those of a run straight through, bitwise.

The tmpfs is mounted in a private mount namespace (unshare -m), so it goes
away with the test. Where that is not allowed (not root, a chroot) the test
says why and exits 77 (skipped).

usage: disk_full.py LOOM WORKDIR
"""
import errno
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time

STEPS, EVERY, DISK_MIB = 12, 4, 256
INSIDE = "LOOM_DISK_FULL_INSIDE"


def write_shard(path, tokens):
    # llm.c's .bin format (DESIGN.md §7): 256 int32 header, uint16 tokens.
    header = [20240520, 1, len(tokens)] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%dH" % len(tokens), *tokens))


def skip(why):
    print("skipped: " + why)
    sys.exit(77)


def enter_namespace():
    """Runs this script again in a private mount namespace; returns its exit status."""
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        skip("cannot make a private mount namespace here (unshare -m: %s)" % probe.stderr.strip())
    env = dict(os.environ, **{INSIDE: "1"})
    return subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable] + sys.argv, env=env).returncode


def fill(path):
    """Writes PATH until the filesystem has no byte left; the bytes written."""
    written = 0
    with open(path, "wb", buffering=0) as f:
        for chunk in (1 << 20, 4096, 1):
            block = b"\0" * chunk
            while True:
                try:
                    written += f.write(block)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break
    return written


def losses(path):
    with open(path) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}


def main():
    loom, work = sys.argv[1], sys.argv[2]
    if os.environ.get(INSIDE) != "1":
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(os.path.join(work, "data"))
        sys.exit(enter_namespace())
    disk = os.path.join(work, "disk")
    os.makedirs(disk)
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%dm" % DISK_MIB, "tmpfs", disk],
                           capture_output=True, text=True)
    if mount.returncode != 0:
        skip("cannot mount a tmpfs here (%s)" % mount.stderr.strip())
    write_shard(os.path.join(work, "data", "train_000000.bin"), [(i * 7 + i // 13) % 512 for i in range(40000)])
    config = os.path.join(work, "run.toml")
    with open(config, "w") as f:
        f.write("""[model]
preset = "gpt2-tiny"
n_layer = 4
n_embd = 256
n_head = 4
d_ff = 1024
vocab_size = 512
max_seq_len = 128
[data]
train = "%s/data/train_*.bin"
[train]
seq_len = 128
micro_batch = 8
dtype = "fp32"
eval_every = 0
[parallel]
zero_stage = 3
[checkpoint]
every = %d
[log]
peak_tflops = 1.0
""" % (work, EVERY))

    def command(name, offload):
        cmd = [loom, "train", "--config", config, "--threads", "2", "--set", "train.steps=%d" % STEPS,
               "--set", "log.metrics=%s/%s.jsonl" % (work, name)]
        if offload:
            return cmd + ["--set", "checkpoint.dir=%s/ckpt" % disk, "--set", "parallel.offload=params",
                          "--set", "parallel.offload_dir=%s/offload" % disk, "--set", "parallel.offload_budget_mb=8"]
        return cmd + ["--set", "checkpoint.dir=%s/straight_ckpt" % work]

    straight = subprocess.run(command("straight", False), capture_output=True, text=True)
    if straight.returncode != 0:
        sys.exit("FAIL: the straight run exited with %d:\n%s" % (straight.returncode, straight.stderr[-4000:]))
    want = losses(os.path.join(work, "straight.jsonl"))

    ckpt = os.path.join(disk, "ckpt")
    latest = os.path.join(ckpt, "latest")
    run = subprocess.Popen(command("full", True), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and run.poll() is None:
        try:
            with open(latest) as f:
                if f.read().strip() == "step_%06d" % EVERY:
                    break
        except OSError:
            pass
        time.sleep(0.002)
    if run.poll() is not None:
        sys.exit("FAIL: the run ended before its checkpoint of step %d:\n%s" % (EVERY, run.communicate()[1][-4000:]))
    run.send_signal(signal.SIGSTOP)
    logged = max(losses(os.path.join(work, "full.jsonl")), default=0)
    if logged >= 2 * EVERY:
        sys.exit("FAIL: the run was at step %d before the disk could be filled (its steps are too fast)" % logged)
    filler = os.path.join(disk, "filler")
    filled = fill(filler)
    st = os.statvfs(disk)
    print("stopped at step %d; filled the %d MiB disk with %.1f MiB more: %d bytes free" %
          (logged, DISK_MIB, filled / 2**20, st.f_bavail * st.f_frsize))
    run.send_signal(signal.SIGCONT)
    out, err = run.communicate(timeout=300)
    print("the run exited with %d; its error:" % run.returncode)
    print("\n".join(l for l in err.splitlines() if "error" in l.lower())[-2000:])
    got = losses(os.path.join(work, "full.jsonl"))
    print("steps trained with the disk full: %s" % [s for s in sorted(got) if s > logged])
    names = sorted(os.listdir(ckpt))
    with open(latest) as f:
        pointer = f.read().strip()
    whole = os.path.exists(os.path.join(ckpt, "step_%06d" % EVERY, "manifest.json"))
    print("checkpoint.dir holds %s; latest names %s; step_%06d whole: %s" % (names, pointer, EVERY, whole))
    left = os.listdir(os.path.join(disk, "offload")) if os.path.isdir(os.path.join(disk, "offload")) else []
    print("offload files left: %s" % left)

    os.remove(filler)
    resumed = subprocess.run(command("full", True), capture_output=True, text=True)
    if resumed.returncode != 0:
        sys.exit("FAIL: the resumed run exited with %d:\n%s" % (resumed.returncode, resumed.stderr[-4000:]))
    got.update(losses(os.path.join(work, "full.jsonl")))
    print("losses, disk filled and resumed from step %d: %s" % (EVERY, [got.get(s) for s in range(1, STEPS + 1)]))
    print("losses, straight:                              %s" % [want.get(s) for s in range(1, STEPS + 1)])
    print("bitwise equal: %s" % (sorted(got.items()) == sorted(want.items())))


if __name__ == "__main__":
    main()
