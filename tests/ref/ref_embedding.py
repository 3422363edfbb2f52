"""Reference cases for the token + position embedding (tests/kernels/test_embedding.cpp).

Inputs are float32 from a fixed seed; expected values are F.embedding plus a
slice of the position table in float64 from those exact inputs, and autograd
for dwte / dwpe. Token lists repeat tokens so the backward's scatter-add
accumulates. Each case stores pre-filled gradients ("*_prefill") so the C++
test can check that the backward accumulates (+=). A case with a "positions"
(B, T) tensor takes each token's position from it (the _at ops), and its
dwpe is autograd's scatter-add over repeated positions.
"""
import os

import torch
import torch.nn.functional as F

import loomref

V = 50257  # GPT-2's vocabulary
MAX_T = 64

# name -> (B, T, C, pos_offset, learned positions)
CASES = {
    "gpt2": (3, 17, 8, 5, True),
    "t1": (4, 1, 5, 37, True),  # one decode step at position 37
    "nopos": (2, 9, 6, 0, False),  # Llama: no learned positions
    "zigzag": (3, 8, 8, 0, True),
    "scattered": (4, 10, 6, 0, True),
}


def positions_of(name, B, T, gen):
    """The case's (B, T) positions, or None for pos_offset + t."""
    if name == "zigzag":  # a context-parallel rank's two chunks [4, 8) and [24, 28), the same for every sequence
        return torch.cat([torch.arange(4, 8), torch.arange(24, 28)]).to(torch.int32).expand(B, T).contiguous()
    if name == "scattered":  # out of order, repeated within and across sequences
        return torch.randint(0, 6, (B, T), generator=gen).to(torch.int32)
    return None


def main():
    out = loomref.out_dir()
    gen = torch.Generator().manual_seed(99)
    for name, (B, T, C, pos_offset, learned) in CASES.items():
        wte = torch.randn(V, C, generator=gen) * 0.02
        wpe = torch.randn(MAX_T, C, generator=gen) * 0.01
        # Draw from a small pool plus the vocabulary's ends, so tokens repeat.
        pool = torch.tensor([0, 1, 7, 50, 1000, 25000, V - 2, V - 1])
        tokens = pool[torch.randint(0, len(pool), (B, T), generator=gen)].to(torch.int32)
        dy = torch.randn(B, T, C, generator=gen)
        positions = positions_of(name, B, T, gen)
        wte64 = wte.double().requires_grad_()
        wpe64 = wpe.double().requires_grad_()
        y = F.embedding(tokens.long(), wte64)
        if learned and positions is not None:
            y = y + wpe64[positions.long()]
        elif learned:
            y = y + wpe64[pos_offset:pos_offset + T]
        y.backward(dy.double())
        case = {
            "tokens": tokens, "wte": wte, "dy": dy, "pos_offset": float(pos_offset), "y": y,
            "dwte": wte64.grad, "dwte_prefill": torch.randn(V, C, generator=gen),
        }
        if positions is not None:
            case["positions"] = positions
        if learned:
            case.update({"wpe": wpe, "dwpe": wpe64.grad, "dwpe_prefill": torch.randn(MAX_T, C, generator=gen)})
        loomref.save(os.path.join(out, f"embedding_{name}.ref"), case)


if __name__ == "__main__":
    main()
