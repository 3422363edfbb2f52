#!/usr/bin/env python3
"""The reference for bench_cuda_kernels: the same ops at the same sizes in
PyTorch on the same GPU (cuBLAS GEMMs, F.scaled_dot_product_attention's
flash kernel, fused AdamW), timed the same way (CUDA events, mean of the
timed repetitions after 3 warm-ups), printed as the same JSON lines.

    python3 bench/cuda/torch_kernels_bench.py [--reps N]
"""
import argparse
import json

import torch
import torch.nn.functional as F


def time_ms(fn, reps):
    for _ in range(3):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / reps


def report(op, shape, dtype, ms, flops=0, nbytes=0):
    r = {"bench": "torch_kernels", "op": op, "shape": shape, "dtype": dtype, "ms": round(ms, 4)}
    if flops:
        r["tflops"] = round(flops / ms / 1e9, 1)
    if nbytes:
        r["gbps"] = round(nbytes / ms / 1e6)
    print(json.dumps(r), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    reps = ap.parse_args().reps
    torch.backends.cuda.matmul.allow_tf32 = False  # loom's f32 GEMM is f32
    dev = "cuda"
    print(f"# torch {torch.__version__} on {torch.cuda.get_device_name()}", flush=True)
    names = {torch.bfloat16: "bf16", torch.float32: "f32"}
    for dt in (torch.bfloat16, torch.float32):
        n = 4096 if dt == torch.float32 else 8192
        a = torch.full((n, n), 0.01, device=dev, dtype=dt)
        b = torch.full((n, n), 0.01, device=dev, dtype=dt)
        report("matmul", f"{n}^3", names[dt], time_ms(lambda: a @ b, reps), 2.0 * n ** 3)
        del a, b
    n = 8192
    for name, cin, cout in (("qkv", 768, 2304), ("attn_proj", 768, 768), ("fc", 768, 3072),
                            ("mlp_proj", 3072, 768), ("lm_head", 768, 50304), ("lm_head_v50257", 768, 50257)):
        x = torch.full((n, cin), 0.01, device=dev, dtype=torch.bfloat16, requires_grad=True)
        w = torch.full((cout, cin), 0.01, device=dev, dtype=torch.bfloat16, requires_grad=True)
        bias = torch.full((cout,), 0.01, device=dev, dtype=torch.bfloat16, requires_grad=True)
        flops = 2.0 * n * cin * cout
        shape = f"{n}x{cin}->{cout}"
        with torch.no_grad():
            report(f"linear_forward_{name}", shape, "bf16", time_ms(lambda: F.linear(x, w, bias), reps), flops)
        y = F.linear(x, w, bias)
        dy = torch.full_like(y, 0.01)
        report(f"linear_backward_{name}", shape, "bf16",
               time_ms(lambda: torch.autograd.grad(y, (x, w, bias), dy, retain_graph=True), reps), 2 * flops)
    B, T, NH, HS = 8, 1024, 12, 64
    for dt in (torch.bfloat16, torch.float32):
        q, k, v = (torch.full((B, NH, T, HS), 0.01, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
        fwd = 2.0 * 2 * B * NH * T * T * HS / 2
        shape = "B8 T1024 NH12 HS64 causal"
        with torch.no_grad():
            report("attention_forward", shape, names[dt],
                   time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), reps), fwd)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        dout = torch.full_like(out, 0.01)
        report("attention_backward", shape, names[dt],
               time_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), reps), 2.5 * fwd)
    N, C, V = 8192, 768, 50257
    x = torch.full((N, C), 0.01, device=dev, dtype=torch.bfloat16, requires_grad=True)
    ln = torch.nn.LayerNorm(C, device=dev, dtype=torch.bfloat16)
    with torch.no_grad():
        report("layernorm_forward", "8192x768", "bf16", time_ms(lambda: ln(x), reps), 0, 2.0 * N * C * 2)
    y = ln(x)
    dy = torch.full_like(y, 0.01)
    report("layernorm_backward", "8192x768", "bf16",
           time_ms(lambda: torch.autograd.grad(y, (x,), dy, retain_graph=True), reps), 0, 4.0 * N * C * 2)
    g = torch.full((N, 4 * C), 0.01, device=dev, dtype=torch.bfloat16)
    report("gelu_forward", "8192x3072", "bf16", time_ms(lambda: F.gelu(g, approximate="tanh"), reps), 0,
           2.0 * N * 4 * C * 2)
    logits = torch.full((N, V), 0.01, device=dev, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.arange(N, device=dev)

    def ce():
        loss = F.cross_entropy(logits, targets)
        return torch.autograd.grad(loss, (logits,))
    report("cross_entropy_forward_backward", "8192x50257", "bf16", time_ms(ce, reps), 0, 2.0 * N * V * 2)
    del logits
    P = 124475904
    p = torch.nn.Parameter(torch.full((P,), 0.01, device=dev))
    p.grad = torch.full_like(p, 0.01)
    opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.1, fused=True)
    report("adamw_step", str(P), "f32", time_ms(opt.step, reps), 0, P * (4.0 * 4 + 3.0 * 4))


if __name__ == "__main__":
    main()
