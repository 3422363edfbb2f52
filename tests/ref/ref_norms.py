"""Reference cases for LayerNorm and RMSNorm (tests/kernels/test_norms.cpp).

Inputs are float32 from a fixed seed; expected values are computed in float64
from those exact inputs: F.layer_norm for LayerNorm, an explicit float64
RMSNorm for Llama (y = w * (x * rsqrt(mean(x^2) + eps))), autograd for every
gradient. Each case also stores a pre-filled gradient ("*_prefill") so the C++
test can check that the backward accumulates (+=).
"""
import os

import torch
import torch.nn.functional as F

import loomref

# name -> x shape (..., C). Odd shapes: C = 100, a single row, GPT-2's C = 768,
# and N = 130 rows so the fixed row blocks of the dw/db reduction hold 2-3 rows.
SHAPES = {
    "c100": (2, 65, 100),
    "n1": (1, 768),
    "c768": (4, 8, 768),
}


def inputs(shape, gen):
    C = shape[-1]
    # A non-zero mean and a scale != 1 so the normalisation does something.
    x = torch.randn(shape, generator=gen) * 2.0 + 0.5
    w = torch.randn(C, generator=gen) * 0.5 + 1.0
    b = torch.randn(C, generator=gen) * 0.1
    dy = torch.randn(shape, generator=gen)
    prefill = {k: torch.randn(s, generator=gen) for k, s in (("dx", shape), ("dw", (C,)), ("db", (C,)))}
    return x, w, b, dy, prefill


def layernorm_case(out, name, shape, eps, gen):
    x, w, b, dy, prefill = inputs(shape, gen)
    x64, w64, b64 = (t.double().requires_grad_() for t in (x, w, b))
    y = F.layer_norm(x64, (shape[-1],), w64, b64, eps)
    y.backward(dy.double())
    var, mean = torch.var_mean(x.double(), dim=-1, unbiased=False)
    loomref.save(os.path.join(out, f"layernorm_{name}.ref"), {
        "x": x, "w": w, "b": b, "dy": dy, "eps": eps,
        "y": y, "mean": mean, "rstd": torch.rsqrt(var + eps),
        "dx": x64.grad, "dw": w64.grad, "db": b64.grad,
        "dx_prefill": prefill["dx"], "dw_prefill": prefill["dw"], "db_prefill": prefill["db"],
    })


def rmsnorm_case(out, name, shape, eps, gen):
    x, w, _, dy, prefill = inputs(shape, gen)
    x64, w64 = (t.double().requires_grad_() for t in (x, w))
    rstd = torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    y = w64 * (x64 * rstd)
    y.backward(dy.double())
    loomref.save(os.path.join(out, f"rmsnorm_{name}.ref"), {
        "x": x, "w": w, "dy": dy, "eps": eps,
        "y": y, "rstd": rstd.squeeze(-1),
        "dx": x64.grad, "dw": w64.grad,
        "dx_prefill": prefill["dx"], "dw_prefill": prefill["dw"],
    })


def main():
    out = loomref.out_dir()
    gen = torch.Generator().manual_seed(1234)
    for name, shape in SHAPES.items():
        layernorm_case(out, name, shape, 1e-5, gen)  # GPT-2's eps
        rmsnorm_case(out, name, shape, 1e-6, gen)  # Llama's eps


if __name__ == "__main__":
    main()
