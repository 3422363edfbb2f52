"""Reference cases for softmax over the last dim (tests/kernels/test_softmax.cpp).

Inputs are float32 from a fixed seed; expected values are torch.softmax in
float64 from those exact inputs, and autograd for dx. Each case stores a
pre-filled dx ("dx_prefill") so the C++ test can check that the backward
accumulates (+=).
"""
import os

import torch

import loomref


def inputs(name, gen):
    if name == "c100":
        return torch.randn(3, 7, 100, generator=gen) * 3.0
    if name == "n1":
        return torch.randn(1, 768, generator=gen) * 3.0
    if name == "large":
        # Row offsets of +-1000 and +88: exp would overflow f32 without the max
        # subtraction; the last row has masked (-inf) entries, as a causal mask.
        x = torch.randn(4, 1000, generator=gen) * 10.0
        x[0] += 1000.0
        x[1] -= 1000.0
        x[2] += 88.0
        x[3, 500:] = float("-inf")
        return x
    if name == "vocab":  # a GPT-2 vocabulary row
        return torch.randn(2, 50257, generator=gen) * 4.0
    raise ValueError(name)


def main():
    out = loomref.out_dir()
    gen = torch.Generator().manual_seed(4321)
    for name in ("c100", "n1", "large", "vocab"):
        x = inputs(name, gen)
        dy = torch.randn(x.shape, generator=gen)
        prefill = torch.randn(x.shape, generator=gen)
        x64 = x.double().requires_grad_()
        y = torch.softmax(x64, dim=-1)
        y.backward(dy.double())
        loomref.save(os.path.join(out, f"softmax_{name}.ref"),
                     {"x": x, "dy": dy, "y": y, "dx": x64.grad, "dx_prefill": prefill})


if __name__ == "__main__":
    main()
