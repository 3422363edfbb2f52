"""`loom train --device cuda` under mpirun: one GPU per process, the mesh over NCCL.

  train_mpi.py LOOM MPIRUN WORK refusal|layouts

refusal: one more rank than the host has GPUs is refused at start, naming the
ranks and GPUs (NCCL cannot place two ranks of one communicator on one GPU).
layouts: on 2 GPUs, dp 2 (ZeRO 1 and 3), tp 2 + SP, cp 2 (ring), pp 2 (1F1B, and
interleaved with 2 chunks a rank) and, for a Mixtral-style variant, ep 2 train
the quickstart's model on Brown 10 steps with the losses of the same layout on
CPUs within 1e-5 relative (fp32: the GPU's kernels and reduction order are not
the CPU's). On one GPU with LOOM_NCCL_SHARE_GPU=1 in the environment the two
ranks share it (comm/nccl/nccl_backend.h: NCCL over loopback sockets).
Exits 77 (skipped, the reason printed) without the GPUs either case needs.
"""
import json, os, shutil, subprocess, sys

loom, mpirun, work, case = sys.argv[1], sys.argv[2].split(";"), sys.argv[3], sys.argv[4]
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
smi = shutil.which("nvidia-smi")
gpus = 0
if smi:
    out = subprocess.run([smi, "-L"], capture_output=True, text=True).stdout
    gpus = sum(1 for line in out.splitlines() if line.startswith("GPU "))
if not shutil.which(mpirun[0]):
    print("skipped: no %s here (Open MPI's launcher)" % mpirun[0])
    sys.exit(77)
if gpus == 0:
    print("skipped: no NVIDIA GPU here (nvidia-smi -L lists none)")
    sys.exit(77)
share = os.environ.get("LOOM_NCCL_SHARE_GPU", "") not in ("", "0")
if case == "layouts" and gpus < 2 and not share:
    print("skipped: %d GPU here; the multi-GPU layouts need 2 (or LOOM_NCCL_SHARE_GPU=1)" % gpus)
    sys.exit(77)
run_timeout = int(os.environ.get("LOOM_GPU_RUN_TIMEOUT", "400"))  # each mpirun
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)


def train(ranks, device, name, sets, share_gpu=False):
    metrics = os.path.join(work, name + ".jsonl")
    env = dict(os.environ)
    env.pop("LOOM_NCCL_SHARE_GPU", None)
    if share_gpu:
        env["LOOM_NCCL_SHARE_GPU"] = "1"
    cmd = mpirun + ["-np", str(ranks)] + ["-x", "LOOM_NCCL_SHARE_GPU"] * share_gpu
    cmd += [loom, "train", "--config", os.path.join(root, "configs/quickstart.toml"),
            "--device", device, "--threads", "1", "--set", "train.steps=10", "--set", "train.eval_every=0",
            "--set", "data.train=%s/data/brown/train_*.bin" % root,
            "--set", "data.val=%s/data/brown/val_*.bin" % root,
            "--set", "log.metrics=" + metrics, "--set", "log.peak_tflops=1", "--out", os.path.join(work, name)]
    for s in sets:
        cmd += ["--set", s]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=run_timeout, env=env)
    except subprocess.TimeoutExpired as e:
        out = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        p = subprocess.CompletedProcess(cmd, 124, "", "timed out after %d s\n%s" % (run_timeout, out))
    losses = [json.loads(l)["loss"] for l in open(metrics)] if p.returncode == 0 else []
    return p, losses


if case == "refusal":
    p, _ = train(gpus + 1, "cuda", "refused", ["parallel.dp=%d" % (gpus + 1)])
    said = "start at most one process per GPU" in p.stderr
    print("%d ranks on %d GPU(s): exit %d, refused naming ranks and GPUs: %s" % (gpus + 1, gpus, p.returncode, said),
          flush=True)
    if p.returncode == 0 or not said:
        sys.exit("expected a refusal; stderr:\n" + p.stderr[-3000:])
    sys.exit(0)

# A Mixtral-style variant of the quickstart's model (4 experts, top 2) for ep.
moe = ["model.family=llama", "model.n_kv_head=4", "model.n_expert=4", "model.top_k=2"]
layouts = [("dp2_zero1", ["parallel.dp=2", "parallel.zero_stage=1"]),
           ("dp2_zero3", ["parallel.dp=2", "parallel.zero_stage=3"]),
           ("tp2_sp", ["parallel.tp=2", "parallel.sequence_parallel=true"]),
           ("cp2_ring", ["parallel.cp=2"]),
           ("moe_ep2", moe + ["parallel.dp=2", "parallel.ep=2"]),
           ("pp2_1f1b", ["parallel.pp=2", "train.grad_accum=4", "train.micro_batch=2"]),
           ("pp2_interleaved", ["parallel.pp=2", "parallel.pp_schedule=interleaved",
                                "parallel.virtual_stages=2", "train.grad_accum=4", "train.micro_batch=2"])]
if gpus < 2:  # two ranks on one GPU, NCCL over loopback sockets: the dp/ZeRO and tp + SP, in time
    layouts = [l for l in layouts if l[0] in ("dp2_zero1", "dp2_zero3", "tp2_sp")]
ok = True
for name, sets in layouts:
    pc, cpu = train(2, "cpu", name + "_cpu", sets)
    pg, gpu = train(2, "cuda", name + "_gpu", sets, share_gpu=gpus < 2)
    if pc.returncode or pg.returncode or len(cpu) != 10 or len(gpu) != 10:
        print("%s: failed\n%s\n%s" % (name, pc.stderr[-2000:], pg.stderr[-2000:]), flush=True)
        ok = False
        continue
    diff = max(abs(a - b) / abs(b) for a, b in zip(gpu, cpu))
    print("%s: losses %.4f -> %.4f on the GPUs, max relative difference to the CPUs %.3g"
          % (name, gpu[0], gpu[-1], diff), flush=True)
    ok = ok and diff <= 1e-5
print("every layout within 1e-5: %s" % ok)
sys.exit(0 if ok else 1)
