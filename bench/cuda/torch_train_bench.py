#!/usr/bin/env python3
"""PyTorch's side of loom's GPU training benchmark (`loom train --device cuda`).

    python3 bench/cuda/torch_train_bench.py --model gpt2-124m --batch 8 --seq 1024 \
        --warmup 3 --steps 10 --dtype bf16 [--compile] [--device cuda]

The model and step of tests/ref/bench_torch_train.py (loom's GPT-2: pre-LN,
tanh-GELU, tied lm head, vocab 50257; zero_grad, forward, cross-entropy,
backward, clip 1.0, AdamW 0.9/0.95/1e-8, decay 0.1 on 2-D weights, lr 3e-4) with
loom's init (N(0, 0.02), residual projections / sqrt(2 n_layer)), a fresh batch
of torch.randint tokens each step. On the GPU: attention by
F.scaled_dot_product_attention(is_causal=True); bf16 = forward and loss under
torch.autocast(bfloat16), f32 weights, grads and fused AdamW; fp32 = float32
with TF32 off, as loom's f32 GEMMs; --compile = torch.compile(model).

Prints one JSON object: the median of --steps timed steps (wall clock between
device syncs, after --warmup untimed ones), tokens/s, model TFLOP/s, and MFU vs
a measured peak (an 8192^3 matmul in the run's dtype, CUDA events, mean of 10
after 3 warm-ups) and vs the H100/H200 datasheet (989.4 dense bf16, 66.9 f32).
--device cpu (1024^3 peak) is a smoke test, also on torch 1.13 (explicit
softmax attention, unfused AdamW).
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# The GPT-2 presets of src/model/config.cpp: n_layer, n_embd, n_head, vocab_size, max_seq_len.
PRESETS = {"gpt2-124m": (12, 768, 12, 50257, 1024), "gpt2-tiny": (2, 64, 4, 512, 64)}
LR, GRAD_CLIP, INIT_STD = 3e-4, 1.0, 0.02
DATASHEET_TFLOPS = {"bf16": 989.4, "fp32": 66.9}  # H100/H200 SXM, dense
HAS_SDPA = hasattr(F, "scaled_dot_product_attention")  # torch >= 2.0


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
        if HAS_SDPA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
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
        for name, p in self.named_parameters():  # loom's init (src/model/params.cpp)
            if p.dim() == 2:
                residual = name.endswith(("attn_proj.weight", "mlp_proj.weight"))
                nn.init.normal_(p, 0.0, INIT_STD / math.sqrt(2 * L) if residual else INIT_STD)
            elif name.endswith("bias"):
                nn.init.zeros_(p)  # LayerNorm weights stay 1

    def forward(self, tokens, targets):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied lm head
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def disable_tf32():
    m = torch.backends.cuda.matmul
    if hasattr(m, "fp32_precision"):  # torch >= 2.9, where the allow_tf32 flags are deprecated
        m.fp32_precision = "ieee"
        if hasattr(torch.backends.cudnn, "conv"):
            torch.backends.cudnn.conv.fp32_precision = "ieee"
    else:
        m.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def measure_peak_flops(device, dtype):
    """n^3 matmul in the run's dtype, mean of 10 after 3 warm-ups: 8192 with CUDA events, 1024 on cpu."""
    cuda = device.type == "cuda"
    n = 8192 if cuda else 1024
    a, b = (torch.full((n, n), 0.01, device=device, dtype=dtype) for _ in range(2))
    for _ in range(3):
        a @ b
    if not cuda:
        t0 = time.perf_counter()
        for _ in range(10):
            a @ b
        return 2.0 * n ** 3 / ((time.perf_counter() - t0) / 10)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        a @ b
    stop.record()
    torch.cuda.synchronize()
    return 2.0 * n ** 3 / (start.elapsed_time(stop) / 1e3 / 10)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="gpt2-124m", choices=sorted(PRESETS))
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--warmup", type=int, default=3, help="untimed steps")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--dtype", default="bf16", choices=["fp32", "bf16"])
    p.add_argument("--compile", action="store_true", help="wrap the model in torch.compile")
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    L, C, NH, V, max_T = PRESETS[args.model]
    if args.seq > max_T or (args.compile and not hasattr(torch, "compile")):
        p.error(f"--seq must be <= {max_T} for {args.model}; --compile needs torch >= 2.0")
    if cuda:
        disable_tf32()  # fp32: as loom's f32 GEMMs; bf16: autocast's GEMMs are bf16 regardless
    torch.manual_seed(1)
    peak_flops = measure_peak_flops(device, torch.bfloat16 if args.dtype == "bf16" else torch.float32)

    model = GPT2(L, C, NH, V, max_T).to(device)
    num_params = sum(q.numel() for q in model.parameters())  # the tied wte counted once
    decay = [q for q in model.parameters() if q.dim() >= 2]
    no_decay = [q for q in model.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if cuda else {}))
    fwd = torch.compile(model) if args.compile else model
    gen = torch.Generator(device=device)  # tokens drawn on the device: no host copy in the timed step
    gen.manual_seed(1234)

    def step():
        data = torch.randint(0, V, (2, args.batch, args.seq), generator=gen, device=device)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.dtype == "bf16"):
            loss = fwd(data[0], data[1])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        opt.step()
        return loss.detach()

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(args.warmup):
        step()
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()  # the steps' peak, not the peak matmul's buffers
    times, losses = [], []
    for _ in range(args.steps):
        sync()
        t0 = time.perf_counter()
        loss = step()
        sync()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    median = statistics.median(times)
    tokens_per_s = args.batch * args.seq / median
    # flops_per_token as loom's model_flops_per_token (src/train/reports.cpp), so that the two
    # MFUs compare: 6 N for the weight GEMMs forward and backward (N = all parameters, the tied
    # embedding once) + 12 n_layer T C for QK^T and PV (PaLM appendix B, no causal discount;
    # llm.c's estimate_mfu counts 6 n_layer T C).
    flops_per_token = 6.0 * num_params + 12.0 * L * args.seq * C
    achieved = flops_per_token * tokens_per_s
    print(json.dumps({
        "impl": "torch", "torch_version": torch.__version__,
        "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
        "model": args.model, "batch": args.batch, "seq": args.seq, "dtype": args.dtype, "compile": args.compile,
        "params": num_params, "step_seconds": median, "tokens_per_second": tokens_per_s,
        "flops_per_token": flops_per_token, "model_tflops": achieved / 1e12, "peak_tflops": peak_flops / 1e12,
        "mfu": achieved / peak_flops, "mfu_vs_989": achieved / (DATASHEET_TFLOPS[args.dtype] * 1e12),
        "losses": losses, "max_memory_allocated_bytes": torch.cuda.max_memory_allocated(device) if cuda else None,
    }), flush=True)


if __name__ == "__main__":
    main()
