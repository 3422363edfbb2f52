"""Reference cases for matmul and linear (tests/kernels/test_matmul.cpp).

Inputs are float32 from a fixed seed; expected values are computed in float64
from those exact inputs with torch.matmul / F.linear and autograd for every
gradient (dc, dy: random upstream gradients). Pre-filled gradients for the +=
checks are made by the C++ test (result = prefill + the gradient stored here),
which keeps the LM-head case at ~40 MB instead of ~60 MB.
"""
import os

import torch
import torch.nn.functional as F

import loomref

# name -> (a shape, b shape, trans_a, trans_b, alpha, beta). Shapes are as
# stored (a is (K, M) when trans_a). K = 100 and odd M, N throughout.
MATMUL_CASES = {
    "nn": ((9, 100), (100, 13), False, False, 1.0, 0.0),
    "nt": ((9, 100), (13, 100), False, True, 1.0, 0.0),
    "tn": ((100, 9), (100, 13), True, False, 1.0, 0.0),
    "tt": ((100, 9), (13, 100), True, True, 1.0, 0.0),
    "alpha_beta": ((6, 10), (4, 10), False, True, 0.5, 1.0),
    "beta_neg": ((10, 6), (10, 4), True, False, -1.5, -2.0),
    "m1": ((1, 100), (100, 257), False, False, 1.0, 0.0),
    # Batched: both operands batched, or one 2-D operand shared by every batch.
    "batched": ((3, 5, 7), (3, 7, 4), False, False, 1.0, 0.0),
    "batched_tt": ((3, 7, 5), (3, 4, 7), True, True, 1.0, 0.0),
    "shared_a": ((5, 7), (3, 7, 4), False, False, 1.0, 0.0),
    "shared_a_tt": ((7, 5), (3, 4, 7), True, True, 1.0, 0.0),
    "shared_b": ((3, 5, 7), (7, 4), False, False, 1.0, 0.0),
    "shared_b_ta": ((3, 7, 5), (7, 4), True, False, 1.0, 0.0),
    "shared_b_tt": ((3, 7, 5), (4, 7), True, True, 1.0, 0.0),
    "shared_b_4d": ((2, 3, 5, 7), (7, 4), False, False, 0.25, 1.0),
}

# name -> (x shape, OC, bias). IC = 100; the LM-head case has GPT-2's V = 50257
# outputs for 4 rows (and a bias, to test the dbias column blocks' ragged end).
LINEAR_CASES = {
    "bias": ((2, 3, 100), 36, True),
    "nobias": ((5, 100), 7, False),
    "row1": ((1, 100), 50, True),
    "lmhead": ((4, 100), 50257, True),
}


def op(t, trans):
    return t.transpose(-1, -2) if trans else t


def matmul_case(out, name, a_shape, b_shape, ta, tb, alpha, beta, gen):
    a = torch.randn(a_shape, generator=gen)
    b = torch.randn(b_shape, generator=gen)
    a64, b64 = (t.double().requires_grad_() for t in (a, b))
    prod = torch.matmul(op(a64, ta), op(b64, tb))
    c0 = torch.randn(prod.shape, generator=gen)
    c = alpha * prod + beta * c0.double()
    dc = torch.randn(prod.shape, generator=gen)
    c.backward(dc.double())
    loomref.save(os.path.join(out, f"matmul_{name}.ref"), {
        "a": a, "b": b, "c0": c0, "dc": dc,
        "trans_a": float(ta), "trans_b": float(tb), "alpha": alpha, "beta": beta,
        "c": c, "da": a64.grad, "db": b64.grad,
    })


def linear_case(out, name, x_shape, oc, has_bias, gen):
    ic = x_shape[-1]
    x = torch.randn(x_shape, generator=gen)
    w = torch.randn(oc, ic, generator=gen) * ic ** -0.5
    bias = torch.randn(oc, generator=gen) if has_bias else None
    x64, w64 = (t.double().requires_grad_() for t in (x, w))
    b64 = bias.double().requires_grad_() if has_bias else None
    y = F.linear(x64, w64, b64)
    dy = torch.randn(y.shape, generator=gen)
    y.backward(dy.double())
    tensors = {"x": x, "w": w, "dy": dy, "y": y, "dx": x64.grad, "dw": w64.grad}
    if has_bias:
        tensors.update(bias=bias, dbias=b64.grad)
    loomref.save(os.path.join(out, f"linear_{name}.ref"), tensors)


def main():
    out = loomref.out_dir()
    gen = torch.Generator().manual_seed(20261121)
    for name, args in MATMUL_CASES.items():
        matmul_case(out, name, *args, gen)
    for name, args in LINEAR_CASES.items():
        linear_case(out, name, *args, gen)


if __name__ == "__main__":
    main()
