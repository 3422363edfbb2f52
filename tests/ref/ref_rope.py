"""Reference cases for rotary position embedding (tests/kernels/test_rope.cpp).

Hugging Face Llama's formula, written out in float64 (transformers is not
installed): inv_freq = 1 / theta^(arange(0, HS, 2) / HS), emb = cat(freqs,
freqs), y = x * cos(emb) + rotate_half(x) * sin(emb), rotate_half(x) =
cat(-x[..., HS/2:], x[..., :HS/2]). HF forms the angles in float32; here they
are float64, the exact rotation the C++ kernel is held to at any position.
Each case file rope_<case>.ref holds x (B, T, NH, HS) f32, pos (T) or (B, T)
i32, theta, dy, y = rope(x) and dx = d sum(y * dy) / dx (autograd).
"""
import os

import torch

import loomref


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope(x, pos, theta):
    """x: (B, T, NH, HS) float64   pos: (T) or (B, T) integer."""
    hs = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs))
    p = pos.to(torch.float64)
    if p.dim() == 1:
        p = p[None, :]
    freqs = p[..., None] * inv_freq  # (1 or B, T, HS/2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = emb.cos()[:, :, None, :]  # broadcast over heads
    sin = emb.sin()[:, :, None, :]
    return x * cos + rotate_half(x) * sin


def case(out, name, shape, pos, theta):
    x = torch.randn(shape)
    dy = torch.randn(shape)
    x64 = x.double().requires_grad_()
    y = rope(x64, pos, theta)
    (dx,) = torch.autograd.grad(y, x64, grad_outputs=dy.double())
    loomref.save(os.path.join(out, f"rope_{name}.ref"), {
        "x": x, "pos": pos.to(torch.int32), "theta": float(theta), "dy": dy, "y": y.detach(), "dx": dx,
    })


def main():
    out = loomref.out_dir()
    torch.manual_seed(4321)
    # (B, T, NH, HS): NH = 6, not a power of two; positions 0..T-1.
    case(out, "basic", (2, 5, 6, 64), torch.arange(5), 10000.0)
    # (B, T) positions, random up to 8191, Llama 3's theta.
    case(out, "batch_pos", (2, 4, 3, 64), torch.randint(0, 8192, (2, 4)), 500000.0)
    # T = 1: one decode step at position 7, NH = 12.
    case(out, "t1", (1, 1, 12, 64), torch.tensor([7]), 10000.0)
    # HS = 2: a single pair per head, turning by pos radians.
    case(out, "hs2", (2, 3, 3, 2), torch.tensor([5, 6, 7]), 10000.0)
    # Large positions, where a float32 angle would be off by ~1e-3 rad.
    case(out, "large_pos", (1, 5, 2, 128), torch.tensor([8191, 8192, 32767, 100000, 1000000]), 10000.0)
    case(out, "large_pos_theta5e5", (1, 3, 2, 128), torch.tensor([8192, 65536, 131071]), 500000.0)
    # Big enough to run threaded (B*T*NH*HS >= 2^15), both pos layouts.
    case(out, "threaded", (2, 64, 12, 64), torch.arange(64) + 100, 10000.0)
    case(out, "threaded_batch_pos", (3, 40, 6, 64), torch.randint(0, 4096, (3, 40)), 500000.0)


if __name__ == "__main__":
    main()
