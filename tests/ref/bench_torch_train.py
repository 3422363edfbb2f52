"""PyTorch on the step of `loom bench train`, for BENCHMARKS.md (not a test).

    /usr/bin/python3 tests/ref/bench_torch_train.py --model gpt2-124m --batch 4 --seq 128 \
        --warmup 3 --steps 5 --threads 2 [--dtype fp32|bf16]

Prints one JSON Lines object with the keys of `loom bench train --json` (plus
"impl": "torch"). The model is the GPT-2 of tests/ref/ref_model.py written
with torch modules in float32: token and position embeddings, pre-LN blocks
(LayerNorm, causal attention through an explicit softmax, since torch 1.13 has
no scaled_dot_product_attention, tanh-GELU MLP), final LayerNorm and the lm
head tied to the token embedding. The step is loom's: zero_grad, forward,
cross-entropy, backward, clip_grad_norm_ (1.0), AdamW (betas 0.9, 0.95, eps
1e-8, weight decay 0.1 on 2-D weights only) on random tokens. --dtype bf16
runs forward and loss under torch.autocast("cpu", dtype=torch.bfloat16)
(weights, gradients and AdamW stay float32).

--flush-denormal sets FTZ/DAZ for the run. Without it, on some CPUs (measured
on a Sapphire Rapids-class Xeon, BENCHMARKS.md) the backward of the explicit
softmax meets subnormal values after a few steps and a step takes 10x longer
(microcode assists); loom's attention keeps no probabilities and does not.
BENCHMARKS.md reports both.

Timing as loom's: --warmup untimed steps, then each of --steps timed; tokens/s
and MFU from the best step (step_seconds is the median, best_step_seconds the
best), against an f32 1024^3 matmul (best of 8 after a warm-up) measured
before the model is built. peak_bytes is NOT a per-tensor
count as loom's pools give: it is the growth of the process's peak resident
set (resource.getrusage ru_maxrss) from before the model is built to the end,
so it includes the allocator's caching and any other buffers;
loom's max_rss_growth_bytes is the same measure.
"""
import argparse
import json
import math
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# The GPT-2 presets of src/model/config.cpp: n_layer, n_embd, n_head, vocab_size, max_seq_len.
PRESETS = {"gpt2-124m": (12, 768, 12, 50257, 1024), "gpt2-350m": (24, 1024, 16, 50257, 1024),
           "gpt2-tiny": (2, 64, 4, 512, 64)}
LR, GRAD_CLIP = 3e-4, 1.0


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.nh = NH
        self.ln_1, self.ln_2 = nn.LayerNorm(C, eps=1e-5), nn.LayerNorm(C, eps=1e-5)
        self.c_attn, self.attn_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def attention(self, x):  # x: (B, T, C)
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.nh, -1).transpose(1, 2) for t in self.c_attn(x).split(C, dim=-1))
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        y = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v
        return self.attn_proj(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, L, C, NH, V, max_T):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(max_T, C)
        self.h = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.ln_f = nn.LayerNorm(C, eps=1e-5)

    def forward(self, tokens, targets):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1]))
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied lm head
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def measure_peak_flops():
    """The f32 1024^3 GEMM of loom's train::measure_peak_flops: best of 8 after a warm-up."""
    n = 1024
    a, b, c = torch.full((n, n), 0.5), torch.full((n, n), 0.25), torch.empty(n, n)
    torch.matmul(a, b, out=c)
    best = 1e30
    for _ in range(8):
        t0 = time.perf_counter()
        torch.matmul(a, b, out=c)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best


def max_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="gpt2-124m", choices=sorted(PRESETS))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a preset key as loom bench train --set does: n_layer, n_embd, n_head, "
                        "vocab_size, max_seq_len (d_ff stays 4 n_embd, GPT-2's)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--ops", action="store_true",
                   help="then --steps more steps under torch.profiler, and its table of ops (CPU time, most first) "
                        "on stderr: the reference of loom bench train --ops")
    p.add_argument("--flush-denormal", action="store_true",
                   help="torch.set_flush_denormal(True): subnormal floats read and written as 0 (FTZ/DAZ)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.flush_denormal and not torch.set_flush_denormal(True):
        raise SystemExit("--flush-denormal: this CPU cannot flush subnormals (no SSE3 FTZ/DAZ)")
    torch.manual_seed(1)

    dims = dict(zip(("n_layer", "n_embd", "n_head", "vocab_size", "max_seq_len"), PRESETS[args.model]))
    for kv in args.set:
        key, eq, value = kv.partition("=")
        if not eq or key not in dims:
            p.error(f"--set {kv!r}: allowed are key=value with key one of {', '.join(dims)}")
        dims[key] = int(value)
    L, C, NH, V, max_T = dims.values()
    peak_flops = measure_peak_flops()
    rss_before = max_rss_bytes()
    model = GPT2(L, C, NH, V, max_T)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.95), eps=1e-8)
    tokens = torch.randint(0, V, (args.batch, args.seq))
    targets = torch.randint(0, V, (args.batch, args.seq))

    def step():
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bf16"):
            loss = model(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        opt.step()

    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    if args.ops:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(args.steps):
                step()
        print(f"torch.profiler, {args.steps} more steps (the figures on stdout are without):", file=sys.stderr)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30), file=sys.stderr)
    times.sort()
    median = times[len(times) // 2]
    num_params = sum(p.numel() for p in model.parameters())
    tokens_per_s = args.batch * args.seq / times[0]
    flops_per_token = 6.0 * num_params + 12.0 * L * C * args.seq  # as loom: 6 N + attention (PaLM appendix B)
    rss_growth = max(0, max_rss_bytes() - rss_before)
    print(json.dumps({
        "model": " ".join([args.model] + args.set), "batch": args.batch, "seq": args.seq, "dtype": args.dtype, "threads": args.threads,
        "steps": args.steps, "warmup": args.warmup, "num_params": num_params,
        "tokens_per_s": round(tokens_per_s, 1), "step_seconds": median, "best_step_seconds": times[0],
        "flops_per_token": flops_per_token, "peak_gflops": round(peak_flops / 1e9, 2),
        "mfu": round(flops_per_token * tokens_per_s / peak_flops, 4), "peak_bytes": rss_growth,
        "max_rss_growth_bytes": rss_growth, "impl": "torch", "flush_denormal": args.flush_denormal},
        separators=(",", ":")), flush=True)


if __name__ == "__main__":
    main()
