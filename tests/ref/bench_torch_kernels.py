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
"seconds" is the best repeat, "median_seconds" the median. "isa" is the ATen
kernels' level (ATEN_CPU_CAPABILITY: torch 1.13 picks AVX2 by default on
AVX-512 CPUs; set it to avx512 for its best level).

The memory-bound ops of bench/kernels_bench_ops.cpp, with its case names,
shapes and byte counts (GB/s of the bytes the op must move, the same formula
in both programs): layernorm, rmsnorm, gelu, swiglu, rope, softmax forward
and backward, cross-entropy forward + backward, AdamW over gpt2-124m's
parameters, token + position embedding forward and backward, the residual
add and the f32 <-> bf16 casts. Each runs as torch's own kernel into
preallocated outputs where ATen has one (native_layer_norm(_backward),
gelu(_backward), _softmax(_backward_data), index_select, index_add_,
add_, copy_); where torch has no op (rmsnorm, swiglu and rope in 1.13) it is
the eager composition Hugging Face's Llama runs, its backward through
autograd on a graph built once (backward(retain_graph=True), grads set to
None before each repeat). "variant" names the torch form where several are
measured: cross-entropy as the four ATen kernels F.cross_entropy's forward
and backward run, into preallocated buffers ("aten_out"), and through
autograd ("autograd"); AdamW with foreach=False ("for_loop") and foreach=True
("foreach": torch 1.13 has no fused CPU AdamW); the embedding backward as a
scatter-add into the gradients ("index_add") and as nn.Embedding's backward
runs it, a dense (V, C) gradient added to the accumulated one
("autograd_dense"). The bf16 AdamW case is mixed precision as loom runs it:
f32 master weights and state, bf16 gradients widened into the f32 .grad
before the step and the bf16 copy of the parameters written after it.

--compare joins two such files (several runs may be concatenated: the best of
each case is kept) into the markdown table of BENCHMARKS.md, with the ratio
loom / PyTorch of each case (of GFLOP/s, tokens/s or GB/s: above 1 is loom
faster), a row per torch variant.
"""
import argparse
import json
import math
import re
import sys
import time

import torch
import torch.nn.functional as F

# GPT-2 124M, one training step of B*T = 512 rows: kept equal to bench/kernels_bench.cpp.
ROWS, C, V = 512, 768, 50257
LINEARS = [("qkv", C, 3 * C), ("attn_proj", C, C), ("fc", C, 4 * C), ("mlp_proj", 4 * C, C), ("lm_head", C, V)]
ATTENTION = [(1, 512, 12, 64), (1, 1024, 12, 64)]
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
# The level ATen's own kernels run at, as loom's "isa" names its own.
ISA = "aten:" + re.search(r"CPU capability usage: (.+)", torch.__config__.show()).group(1).strip().lower()
ISA = ISA.replace(" ", "_")


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
            "gflops": round(2.0 * m * n * k / best / 1e9, 2), "threads": args.threads, "isa": ISA, "impl": "torch"}


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
            "threads": args.threads, "isa": ISA, "impl": "torch"}


# ---- the memory-bound ops: bench/kernels_bench_ops.cpp, kept equal ----------

B, T, HEADS, HS, MAXT, LAYERS = 4, 128, 12, 64, 1024, 12
F_GELU, F_SWIGLU = 4 * C, 2048  # GPT-2's MLP; a Llama MLP at C = 768 (8 C / 3)
SEQS, DECODE_POS = 32, 256
EPS, THETA = 1e-5, 10000.0
ROWS_CASES = [("train_b4t128", ROWS, True), ("decode_s32", SEQS, False)]  # (name, rows, backward too)


def token_ids(n):
    """Distinct token ids, as loom's: (i * 7919) mod V."""
    return torch.arange(n, dtype=torch.int64) * 7919 % V


def dims(*d):
    return "x".join(str(v) for v in d)


class Ops:
    """Selection, timing and the JSON line of each memory-bound case."""

    def __init__(self, args, gen):
        self.args, self.gen = args, gen

    def wants(self, op, dtype, name):
        return selected(self.args, op, dtype, name)

    def u(self, shape, dtype):
        return uniform(shape, dtype, self.gen)

    def time(self, op, dtype, name, shape, nbytes, run, variant=None):
        best, median, reps = measure(run, self.args.seconds)
        r = {"op": op, "dtype": dtype, "case": name, "shape": shape, "bytes": int(nbytes), "seconds": best,
             "median_seconds": median, "reps": reps, "gb_per_s": round(nbytes / best / 1e9, 2),
             "threads": self.args.threads, "isa": ISA, "impl": "torch"}
        if variant:
            r["variant"] = variant
        print(json.dumps(r), flush=True)


def hf_rmsnorm(x, w):
    """Hugging Face LlamaRMSNorm.forward."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
    return w * h.to(x.dtype)


def backward_repeated(out, dout, inputs):
    """A run() that reruns out's backward on its graph, built once."""
    def run():
        for t in inputs:
            t.grad = None
        out.backward(dout, retain_graph=True)
    return run


def bench_norms(o):
    for dn, dtype in DTYPES.items():
        s = torch.finfo(dtype).bits // 8
        for name, N, train in ROWS_CASES:
            nc, stats = N * C, 4 * N
            if o.wants("layernorm_fwd", dn, name) or (train and o.wants("layernorm_bwd", dn, name)):
                x, w, b = o.u((N, C), dtype), o.u((C,), dtype), o.u((C,), dtype)
                y, mean, rstd = torch.native_layer_norm(x, [C], w, b, EPS)
                if o.wants("layernorm_fwd", dn, name):
                    o.time("layernorm_fwd", dn, name, dims(N, C), (2 * nc + 2 * C) * s + 2 * stats,
                           lambda: torch.ops.aten.native_layer_norm.out(x, [C], w, b, EPS, out0=y, out1=mean,
                                                                        out2=rstd))
                if train and o.wants("layernorm_bwd", dn, name):
                    dy = o.u((N, C), dtype)
                    dx, dw, db = torch.empty_like(x), torch.empty_like(w), torch.empty_like(b)
                    o.time("layernorm_bwd", dn, name, dims(N, C), (3 * nc + 3 * C) * s + 2 * stats,
                           lambda: torch.ops.aten.native_layer_norm_backward.out(
                               dy, x, [C], mean, rstd, w, b, [True, True, True], out0=dx, out1=dw, out2=db))
            if o.wants("rmsnorm_fwd", dn, name):
                x, w = o.u((N, C), dtype), o.u((C,), dtype)
                with torch.no_grad():
                    o.time("rmsnorm_fwd", dn, name, dims(N, C), (2 * nc + C) * s + stats, lambda: hf_rmsnorm(x, w))
            if train and o.wants("rmsnorm_bwd", dn, name):
                x, w, dy = o.u((N, C), dtype).requires_grad_(), o.u((C,), dtype).requires_grad_(), o.u((N, C), dtype)
                o.time("rmsnorm_bwd", dn, name, dims(N, C), (3 * nc + 2 * C) * s + stats,
                       backward_repeated(hf_rmsnorm(x, w), dy, [x, w]))


def bench_activations(o):
    for dn, dtype in DTYPES.items():
        s = torch.finfo(dtype).bits // 8
        for name, N, train in ROWS_CASES:
            ng, nw = N * F_GELU, N * F_SWIGLU
            x, y = o.u((N, F_GELU), dtype), torch.empty(N, F_GELU, dtype=dtype)
            if o.wants("gelu_fwd", dn, name):
                o.time("gelu_fwd", dn, name, dims(N, F_GELU), 2 * ng * s,
                       lambda: torch._C._nn.gelu(x, approximate="tanh", out=y))
            if train and o.wants("gelu_bwd", dn, name):
                dy, dx = o.u((N, F_GELU), dtype), torch.empty_like(x)
                o.time("gelu_bwd", dn, name, dims(N, F_GELU), 3 * ng * s,
                       lambda: torch.ops.aten.gelu_backward.grad_input(dy, x, approximate="tanh", grad_input=dx))
            gate, up = o.u((N, F_SWIGLU), dtype), o.u((N, F_SWIGLU), dtype)
            if o.wants("swiglu_fwd", dn, name):
                act, y = torch.empty_like(gate), torch.empty_like(gate)

                def swiglu():
                    torch.ops.aten.silu.out(gate, out=act)
                    torch.mul(act, up, out=y)
                o.time("swiglu_fwd", dn, name, dims(N, F_SWIGLU), 3 * nw * s, swiglu)
            if train and o.wants("swiglu_bwd", dn, name):
                dy = o.u((N, F_SWIGLU), dtype)
                gate.requires_grad_(), up.requires_grad_()
                o.time("swiglu_bwd", dn, name, dims(N, F_SWIGLU), 5 * nw * s,
                       backward_repeated(F.silu(gate) * up, dy, [gate, up]))


def rope_tables():
    """Hugging Face LlamaRotaryEmbedding's cos and sin caches: (MAXT, HS) f32."""
    inv_freq = 1.0 / (THETA ** (torch.arange(0, HS, 2).float() / HS))
    freqs = torch.outer(torch.arange(MAXT).float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def hf_rope(x, pos, cos_cached, sin_cached):
    """Hugging Face apply_rotary_pos_emb on x: (B, T, NH, HS) at pos (T) or (B, T), the cached rows gathered."""
    cos = cos_cached[pos].to(x.dtype).unsqueeze(-2)
    sin = sin_cached[pos].to(x.dtype).unsqueeze(-2)
    rotated = torch.cat((-x[..., HS // 2:], x[..., :HS // 2]), dim=-1)
    return x * cos + rotated * sin


def bench_rope(o):
    cos_cached, sin_cached = rope_tables()
    for dn, dtype in DTYPES.items():
        s = torch.finfo(dtype).bits // 8
        for name, _, train in ROWS_CASES:
            b, t = (B, T) if train else (SEQS, 1)
            pos = torch.arange(T) if train else torch.full((SEQS, 1), DECODE_POS)
            n, ids = b * t * HEADS * HS, 4 * (T if train else SEQS)
            x = o.u((b, t, HEADS, HS), dtype)
            if o.wants("rope_fwd", dn, name):
                with torch.no_grad():
                    o.time("rope_fwd", dn, name, dims(b, t, HEADS, HS), 2 * n * s + ids,
                           lambda: hf_rope(x, pos, cos_cached, sin_cached))
            if train and o.wants("rope_bwd", dn, name):
                dy = o.u((b, t, HEADS, HS), dtype)
                x.requires_grad_()
                o.time("rope_bwd", dn, name, dims(b, t, HEADS, HS), 2 * n * s + ids,
                       backward_repeated(hf_rope(x, pos, cos_cached, sin_cached), dy, [x]))


def bench_softmax(o):
    for dn, dtype in DTYPES.items():
        s = torch.finfo(dtype).bits // 8
        for name, rows, cols, backward in [("train_scores_b4t128", B * HEADS * T, T, True),
                                           ("decode_vocab_s32", SEQS, V, False)]:
            n = rows * cols
            x, y = o.u((rows, cols), dtype), torch.empty(rows, cols, dtype=dtype)
            torch._softmax(x, -1, False, out=y)
            if o.wants("softmax_fwd", dn, name):
                o.time("softmax_fwd", dn, name, dims(rows, cols), 2 * n * s,
                       lambda: torch._softmax(x, -1, False, out=y))
            if backward and o.wants("softmax_bwd", dn, name):
                dy, dx = o.u((rows, cols), dtype), torch.empty_like(x)
                o.time("softmax_bwd", dn, name, dims(rows, cols), 3 * n * s,
                       lambda: torch.ops.aten._softmax_backward_data.out(dy, y, -1, dtype, grad_input=dx))


def cross_entropy_aten_out(x, targets):
    """A run() of F.cross_entropy's forward and backward as its four ATen kernels, into preallocated buffers."""
    lsm, g, d = torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)
    one = torch.tensor(1.0, dtype=x.dtype)

    def run():
        torch.ops.aten._log_softmax.out(x, 1, False, out=lsm)
        _, total_weight = torch.ops.aten.nll_loss_forward(lsm, targets, None, 1, -100)
        torch.ops.aten.nll_loss_backward.grad_input(one, lsm, targets, None, 1, -100, total_weight, grad_input=g)
        torch.ops.aten._log_softmax_backward_data.out(g, lsm, 1, x.dtype, out=d)
    return run


def bench_cross_entropy(o):
    name = "train_b4t128"
    for dn, dtype in DTYPES.items():
        if not o.wants("cross_entropy_fwd_bwd", dn, name):
            continue
        x, targets = o.u((ROWS, V), dtype), token_ids(ROWS)
        nbytes = 2 * ROWS * V * (torch.finfo(dtype).bits // 8) + 4 * ROWS
        o.time("cross_entropy_fwd_bwd", dn, name, dims(ROWS, V), nbytes, cross_entropy_aten_out(x, targets),
               "aten_out")
        xg = x.clone().requires_grad_()

        def autograd():
            xg.grad = None
            F.cross_entropy(xg, targets).backward()
        o.time("cross_entropy_fwd_bwd", dn, name, dims(ROWS, V), nbytes, autograd, "autograd")


def gpt2_param_sizes():
    """gpt2-124m's parameters in Hugging Face order (lm_head tied to wte): 124,439,808 floats in 148 tensors."""
    layer = [C, C, 3 * C * C, 3 * C, C * C, C, C, C, F_GELU * C, F_GELU, C * F_GELU, C]
    return [V * C, MAXT * C] + layer * LAYERS + [C, C]


def adamw_case(o, dn, variant):
    """One torch.optim.AdamW step over gpt2-124m's parameters, timed; its buffers are freed on return."""
    dtype, sizes = DTYPES[dn], gpt2_param_sizes()
    params = [o.u((k,), torch.float32).requires_grad_() for k in sizes]
    grads = [o.u((k,), dtype) for k in sizes]
    opt = torch.optim.AdamW(params, lr=6e-4, weight_decay=0.1, foreach=variant == "foreach")
    grad_bytes = torch.finfo(dtype).bits // 8
    if dtype == torch.float32:  # p, m, v read and written, g read
        for p, g in zip(params, grads):
            p.grad = g
        run, nbytes = opt.step, sum(sizes) * (24 + grad_bytes)
    else:  # mixed precision: bf16 grads widened into .grad, the bf16 copy of the params written
        copies = [torch.empty(k, dtype=dtype) for k in sizes]
        for p in params:
            p.grad = torch.empty_like(p)

        @torch.no_grad()
        def run():
            for p, g in zip(params, grads):
                p.grad.copy_(g)
            opt.step()
            for c, p in zip(copies, params):
                c.copy_(p)
        nbytes = sum(sizes) * (24 + 2 * grad_bytes)
    o.time("adamw_step", dn, "gpt2_124m", f"{sum(sizes)}_in_{len(sizes)}", nbytes, run, variant)


def bench_adamw(o):
    for dn in DTYPES:
        for variant in ("for_loop", "foreach"):
            if o.wants("adamw_step", dn, "gpt2_124m"):
                adamw_case(o, dn, variant)


def bench_cast(o):
    name, n = "gpt2_124m", sum(gpt2_param_sizes())
    shape = f"{n}_in_{len(gpt2_param_sizes())}"
    for src_name, dst_name in (("f32", "bf16"), ("bf16", "f32")):
        conv = f"{src_name}_to_{dst_name}"
        if o.wants("cast", conv, name):
            src, dst = o.u((n,), DTYPES[src_name]), torch.empty(n, dtype=DTYPES[dst_name])
            o.time("cast", conv, name, shape, n * 6, lambda: dst.copy_(src))


def bench_embedding(o):
    for dn, dtype in DTYPES.items():
        s = torch.finfo(dtype).bits // 8
        for name, _, train in ROWS_CASES:
            b, t = (B, T) if train else (SEQS, 1)
            N, tc = b * t, t * C
            if not (o.wants("embedding_fwd", dn, name) or (train and o.wants("embedding_bwd", dn, name))):
                continue
            tokens, wte, wpe = token_ids(N), o.u((V, C), dtype), o.u((MAXT, C), dtype)
            e, y = torch.empty(N, C, dtype=dtype), torch.empty(b, t, C, dtype=dtype)
            if o.wants("embedding_fwd", dn, name):
                if train:
                    def run():  # nanoGPT / Hugging Face GPT-2: wte(tokens) + wpe(positions)
                        torch.index_select(wte, 0, tokens, out=e)
                        torch.add(e.view(b, t, C), wpe[:t], out=y)
                else:
                    positions, pe = torch.full((N,), DECODE_POS), torch.empty(N, C, dtype=dtype)

                    def run():
                        torch.index_select(wte, 0, tokens, out=e)
                        torch.index_select(wpe, 0, positions, out=pe)
                        torch.add(e, pe, out=y.view(N, C))
                o.time("embedding_fwd", dn, name, dims(b, t, C), (2 * N * C + tc) * s + (4 if train else 8) * N, run)
            if train and o.wants("embedding_bwd", dn, name):
                dy = o.u((b, t, C), dtype)
                dwte, dwpe = torch.zeros(V, C, dtype=dtype), torch.zeros(MAXT, C, dtype=dtype)
                nbytes, psum = (3 * N * C + 2 * tc) * s + 4 * N, torch.empty(t, C, dtype=dtype)

                def index_add():
                    dwte.index_add_(0, tokens, dy.view(N, C))
                    torch.sum(dy, 0, out=psum)
                    dwpe[:t].add_(psum)

                def autograd_dense():  # embedding_dense_backward, then AccumulateGrad's +=
                    dwte.add_(torch.ops.aten.embedding_dense_backward(dy.view(N, C), tokens, V, -1, False))
                    dwpe.add_(torch.ops.aten.embedding_dense_backward(dy.sum(0), torch.arange(t), MAXT, -1, False))
                o.time("embedding_bwd", dn, name, dims(b, t, C), nbytes, index_add, "index_add")
                o.time("embedding_bwd", dn, name, dims(b, t, C), nbytes, autograd_dense, "autograd_dense")


def bench_add(o):
    for dn, dtype in DTYPES.items():
        for name, N, _ in ROWS_CASES:
            if o.wants("add", dn, name):
                x, res = o.u((N, C), dtype), o.u((N, C), dtype)
                o.time("add", dn, name, dims(N, C), 3 * N * C * (torch.finfo(dtype).bits // 8), lambda: x.add_(res))


def bench_ops(args, gen):
    o = Ops(args, gen)
    for bench in (bench_norms, bench_activations, bench_rope, bench_softmax, bench_cross_entropy, bench_adamw,
                  bench_cast, bench_embedding, bench_add):
        bench(o)


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
    bench_ops(args, gen)


def best_by_case(path):
    """(op, dtype, case or shape, variant) -> the record with the shortest time."""
    best = {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            case = r.get("case") or f"b={r['b']} t={r['t']} nh={r['nh']} hs={r['hs']}"
            key = (r["op"], r["dtype"], case, r.get("variant", ""))
            if key not in best or r["seconds"] < best[key]["seconds"]:
                best[key] = r
    return best


# The figure each op is compared by (higher is faster); every other op: GB/s.
UNITS = {"matmul": "gflops", "attention_fwd_bwd": "tokens_per_s"}


def compare(loom_path, torch_path):
    loom, ref = best_by_case(loom_path), best_by_case(torch_path)
    print("| op | dtype | case | shape | loom isa | PyTorch isa, form | unit | loom | PyTorch | loom / PyTorch |")
    print("|---|---|---|---|---|---|---|---:|---:|---:|")
    for (op, dtype, case, _), r in loom.items():
        if op == "matmul_openblas":
            continue
        unit = UNITS.get(op, "gb_per_s")
        for (t_op, t_dtype, t_case, variant), t in ref.items():
            if (t_op, t_dtype, t_case) != (op, dtype, case):
                continue
            if "bytes" in r and r["bytes"] != t.get("bytes"):
                print(f"warning: {op} {dtype} {case}: loom counts {r['bytes']} bytes, PyTorch {t.get('bytes')}",
                      file=sys.stderr)
            dims = f"{r['m']}×{r['n']}×{r['k']}" if op == "matmul" else r.get("shape", "")
            form = ", ".join(x for x in (t.get("isa", ""), variant) if x)
            print(f"| {op} | {dtype} | {case} | {dims} | {r.get('isa', '')} | {form} | {unit} | {r[unit]:,.2f} | "
                  f"{t[unit]:,.2f} | {r[unit] / t[unit]:.2f} |")
    blas = [(k, r) for k, r in loom.items() if k[0] == "matmul_openblas"]
    if blas:
        print("\n| case | m×n×k | oneDNN f32 | OpenBLAS f32 | oneDNN / OpenBLAS |")
        print("|---|---|---:|---:|---:|")
        for (_, dtype, case, _), r in blas:
            d = loom.get(("matmul", dtype, case, ""))
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
