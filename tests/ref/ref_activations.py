"""Reference cases for GELU (tanh), SiLU and SwiGLU (tests/kernels/test_activations.cpp).

Inputs are float32 from a fixed seed; outputs and gradients are computed in
float64 from those exact inputs with PyTorch's own ops and autograd.
Each case file activations_<case>.ref holds:
  x, dy_x            GELU/SiLU input and upstream gradient
  gelu_y, gelu_dx    F.gelu(x, approximate="tanh") and its input gradient
  silu_y, silu_dx    F.silu(x) and its input gradient
  gate, up, dy_glu   SwiGLU inputs and upstream gradient
  swiglu_y, swiglu_dgate, swiglu_dup   silu(gate) * up and its gradients
"""
import os

import torch
import torch.nn.functional as F

import loomref


def grads(fn, inputs, dy):
    """fn's output and the gradients of sum(fn(inputs) * dy), all in float64."""
    leaves = [t.double().requires_grad_() for t in inputs]
    y = fn(*leaves)
    gs = torch.autograd.grad(y, leaves, grad_outputs=dy.double())
    return [y.detach()] + [g.detach() for g in gs]


def case(out, name, x, gate, up):
    dy_x = torch.randn(x.shape)
    dy_glu = torch.randn(gate.shape)
    gelu_y, gelu_dx = grads(lambda t: F.gelu(t, approximate="tanh"), [x], dy_x)
    silu_y, silu_dx = grads(F.silu, [x], dy_x)
    sw_y, sw_dg, sw_du = grads(lambda g, u: F.silu(g) * u, [gate, up], dy_glu)
    loomref.save(os.path.join(out, f"activations_{name}.ref"), {
        "x": x, "dy_x": dy_x, "gelu_y": gelu_y, "gelu_dx": gelu_dx, "silu_y": silu_y, "silu_dx": silu_dx,
        "gate": gate, "up": up, "dy_glu": dy_glu,
        "swiglu_y": sw_y, "swiglu_dgate": sw_dg, "swiglu_dup": sw_du,
    })


def main():
    out = loomref.out_dir()
    torch.manual_seed(1234)
    # (B, T, C) with C = 100: not a multiple of any vector width.
    case(out, "btc", torch.randn(2, 3, 100) * 3, torch.randn(2, 3, 100) * 3, torch.randn(2, 3, 100))
    # T = 1, 7 elements: a single partial chunk.
    case(out, "t1", torch.randn(1, 1, 7) * 3, torch.randn(1, 1, 7) * 3, torch.randn(1, 1, 7))
    # (N, F) = (5, 4001): 20005 elements, enough chunks to run in parallel, ragged last chunk.
    case(out, "nf", torch.randn(5, 4001) * 2, torch.randn(5, 4001) * 2, torch.randn(5, 4001))
    # The tails: -12 .. 12, where 1 + tanh(u) and 1 - sigmoid underflow.
    ramp = torch.linspace(-12, 12, 2001)
    case(out, "tails", ramp.clone(), ramp.flip(0).clone(), torch.randn(2001))


if __name__ == "__main__":
    main()
