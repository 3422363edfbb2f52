"""PyTorch on the cases of `loom bench kernels`, for BENCHMARKS.md (not a test).

    /usr/bin/python3 tests/ref/bench_torch_kernels.py --threads 2 [--seconds 0.5] [--filter S] > torch.jsonl
    /usr/bin/python3 tests/ref/bench_torch_kernels.py --compare loom.jsonl torch.jsonl

Prints the same JSON Lines as `loom bench kernels --json` (plus "impl":
"torch"): matmul f32 and bf16 (torch.matmul into a preallocated output, or
addmm_ where loom accumulates with beta = 1) and causal attention forward +
backward through autograd: torch 1.13 has no scaled_dot_product_attention,
so it is the explicit softmax(q k^T / sqrt(HS) + causal mask) v, which
materialises the (T, T) scores that loom's flash-style kernel never does.
Timing as loom's: one warm-up, then repeats until --seconds (at least 3);
"seconds" is the best repeat, "median_seconds" the median.

--compare joins two such files (several runs may be concatenated: the best of
each case is kept) into the markdown table of BENCHMARKS.md.
"""
import argparse
import json
import math
import sys
import time

import torch

# GPT-2 124M, one training step of B*T = 512 rows: kept equal to bench/kernels_bench.cpp.
ROWS, C, V = 512, 768, 50257
LINEARS = [("qkv", C, 3 * C), ("attn_proj", C, C), ("fc", C, 4 * C), ("mlp_proj", 4 * C, C), ("lm_head", C, V)]
ATTENTION = [(1, 512, 12, 64), (1, 1024, 12, 64)]
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def matmul_cases():
    """(name, m, n, k, trans_a, trans_b, beta), as bench/kernels_bench.cpp."""
    cases = [(f"square_{s}", s, s, s, False, False, 0.0) for s in (1024, 2048, 4096)]
    for name, fan_in, fan_out in LINEARS:
        cases.append((f"gpt2_{name}_fwd", ROWS, fan_out, fan_in, False, True, 0.0))
        cases.append((f"gpt2_{name}_dx", ROWS, fan_in, fan_out, False, False, 1.0))
        cases.append((f"gpt2_{name}_dw", fan_out, fan_in, ROWS, True, False, 1.0))
    return cases


def measure(run, min_seconds):
    run()  # warm-up
    times = []
    start = time.perf_counter()
    while len(times) < 3 or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[0], times[len(times) // 2], len(times)


def uniform(shape, dtype, gen):
    return (torch.rand(shape, generator=gen) * 2 - 1).to(dtype)


def bench_matmul(dtype_name, case, args, gen):
    name, m, n, k, ta, tb, beta = case
    dtype = DTYPES[dtype_name]
    # Stored as loom stores them; op() is a transposed view, which BLAS reads as a transpose flag.
    a = uniform((k, m) if ta else (m, k), dtype, gen)
    b = uniform((n, k) if tb else (k, n), dtype, gen)
    opa, opb = (a.t() if ta else a), (b.t() if tb else b)
    c = torch.zeros(m, n, dtype=dtype)
    if beta == 0:
        run = lambda: torch.matmul(opa, opb, out=c)
    else:
        run = lambda: c.addmm_(opa, opb)
    best, median, reps = measure(run, args.seconds)
    return {"op": "matmul", "dtype": dtype_name, "case": name, "m": m, "n": n, "k": k, "trans_a": ta,
            "trans_b": tb, "beta": beta, "seconds": best, "median_seconds": median, "reps": reps,
            "gflops": round(2.0 * m * n * k / best / 1e9, 2), "threads": args.threads, "impl": "torch"}


def bench_attention(dtype_name, shape, args, gen):
    B, T, NH, HS = shape
    dtype = DTYPES[dtype_name]
    q, k, v, dout = (uniform((B, T, NH, HS), dtype, gen) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_()
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)

    def run():
        for t in (q, k, v):
            t.grad = None
        qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))  # (B, NH, T, HS)
        att = (qh @ kh.transpose(-1, -2)) * (1.0 / math.sqrt(HS))
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        out = (att @ vh).transpose(1, 2)
        out.backward(dout)

    best, median, reps = measure(run, args.seconds)
    return {"op": "attention_fwd_bwd", "dtype": dtype_name, "b": B, "t": T, "nh": NH, "hs": HS,
            "seconds": best, "median_seconds": median, "reps": reps, "tokens_per_s": round(B * T / best, 1),
            "threads": args.threads, "impl": "torch"}


def selected(args, *names):
    return not args.filter or any(args.filter in s for s in names)


def run_benchmarks(args):
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    for dtype_name in DTYPES:
        for case in matmul_cases():
            if selected(args, "matmul", dtype_name, case[0]):
                print(json.dumps(bench_matmul(dtype_name, case, args, gen)), flush=True)
    for dtype_name in DTYPES:
        for shape in ATTENTION:
            if selected(args, "attention_fwd_bwd", dtype_name):
                print(json.dumps(bench_attention(dtype_name, shape, args, gen)), flush=True)


def best_by_case(path):
    """(op, dtype, case or shape) -> the record with the shortest time."""
    best = {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            key = (r["op"], r["dtype"], r.get("case") or f"b={r['b']} t={r['t']} nh={r['nh']} hs={r['hs']}")
            if key not in best or r["seconds"] < best[key]["seconds"]:
                best[key] = r
    return best


def compare(loom_path, torch_path):
    loom, ref = best_by_case(loom_path), best_by_case(torch_path)
    print("| op | dtype | case | m×n×k | loom | PyTorch | loom / PyTorch |")
    print("|---|---|---|---|---:|---:|---:|")
    for (op, dtype, case), r in loom.items():
        t = ref.get(("matmul" if op == "matmul_openblas" else op, dtype, case))
        if op == "matmul_openblas" or t is None:
            continue
        unit = "gflops" if op == "matmul" else "tokens_per_s"
        dims = f"{r['m']}×{r['n']}×{r['k']}" if op == "matmul" else ""
        print(f"| {op} | {dtype} | {case} | {dims} | {r[unit]:,.1f} | {t[unit]:,.1f} | {r[unit] / t[unit]:.2f} |")
    blas = [(k, r) for k, r in loom.items() if k[0] == "matmul_openblas"]
    if blas:
        print("\n| case | m×n×k | oneDNN f32 | OpenBLAS f32 | oneDNN / OpenBLAS |")
        print("|---|---|---:|---:|---:|")
        for (_, dtype, case), r in blas:
            d = loom.get(("matmul", dtype, case))
            if d:
                print(f"| {case} | {r['m']}×{r['n']}×{r['k']} | {d['gflops']:.1f} | {r['gflops']:.1f} | "
                      f"{d['gflops'] / r['gflops']:.2f} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seconds", type=float, default=0.5)
    p.add_argument("--filter", default="")
    p.add_argument("--compare", nargs=2, metavar=("LOOM_JSONL", "TORCH_JSONL"))
    args = p.parse_args()
    if args.compare:
        compare(*args.compare)
    else:
        run_benchmarks(args)


if __name__ == "__main__":
    sys.exit(main())
