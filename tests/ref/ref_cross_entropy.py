"""Reference cases for the fused cross-entropy (tests/kernels/test_cross_entropy.cpp).

Logits are float32 from a fixed seed; the loss, per-row losses and dlogits
are computed in float64 from those exact logits with
F.cross_entropy(ignore_index=-100, reduction='mean') and autograd (dlogits is
the gradient of dloss * mean loss). Each file cross_entropy_<case>.ref holds:
  logits (N, V) f32, targets (N) i32, dloss (scalar),
  loss (scalar), losses (N) (reduction='none'), dlogits (N, V)
"""
import os

import torch
import torch.nn.functional as F

import loomref

IGNORE = -100


def case(out, name, logits, targets, dloss):
    x = logits.double().requires_grad_()
    loss = F.cross_entropy(x, targets.long(), ignore_index=IGNORE, reduction="mean")
    (dlogits,) = torch.autograd.grad(loss * dloss, [x])
    losses = F.cross_entropy(x.detach(), targets.long(), ignore_index=IGNORE, reduction="none")
    loomref.save(os.path.join(out, f"cross_entropy_{name}.ref"), {
        "logits": logits, "targets": targets.int(), "dloss": dloss,
        "loss": loss.detach(), "losses": losses, "dlogits": dlogits,
    })


def main():
    out = loomref.out_dir()
    torch.manual_seed(4321)
    # GPT-2 vocabulary (odd, 24 full chunks of 2048 and a ragged one), (B, T) = (2, 4), one ignored row.
    V = 50257
    targets = torch.randint(0, V, (8,))
    targets[5] = IGNORE
    targets[0] = V - 1
    case(out, "gpt2", torch.randn(8, V) * 2, targets, 1.0)
    # Small odd vocabulary, large logits (stability of the log-sum-exp), dloss != 1.
    case(out, "v100", torch.randn(5, 100) * 30, torch.randint(0, 100, (5,)), 0.5)
    # A single row.
    case(out, "n1", torch.randn(1, 100) * 3, torch.tensor([42]), 1.0)
    # Rows where the max sits in a later chunk than the first one: exercises the rescale of the running sum.
    x = torch.randn(4, 5000)
    x[0, 4999] = 40.0
    x[1, 2048] = 25.0
    x[2, 0] = -50.0
    case(out, "rescale", x, torch.tensor([4999, 7, IGNORE, 2047]), 2.0)

    # Vocab-parallel cases (the test splits the columns over tp = 2, 3, 4 ranks).
    # Odd V crossing a 2048-column chunk on the tp = 2 shards; targets at both
    # ends of the vocabulary, three ignored rows.
    V = 4099
    targets = torch.randint(0, V, (12,))
    targets[[2, 7, 11]] = IGNORE
    targets[0], targets[1] = 0, V - 1
    case(out, "shard_v4099", torch.randn(12, V) * 3, targets, 1.0)
    # V = 5: padded to 8 for tp = 4, whose last shard is all padding.
    case(out, "shard_v5", torch.randn(6, 5) * 2, torch.tensor([0, 4, IGNORE, 2, 3, 4]), 1.0)
    # Every target below 200 of 1003: the shards past the first hold none.
    targets = torch.randint(0, 200, (6,))
    targets[3] = IGNORE
    case(out, "shard_low", torch.randn(6, 1003) * 2, targets, 1.0)


if __name__ == "__main__":
    main()
