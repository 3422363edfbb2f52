"""Reference LoRA for test_lora (tests/model/test_lora.cpp), in float64 torch.

A LoRA linear is written here directly (Hu et al. 2021), without peft:
    y = x W^T + b + (alpha / r) (x A^T) B^T
on every block linear ("all-linear") of ref_model.py's tiny GPT-2 and Llama.
The base weights W, b are random and frozen; A and B are random too (B not at
zero, so A's gradient is not zero either). Outputs (in argv[1]), for f in
gpt2, llama:
  lora_<f>_base.safetensors      base weights, loom names and layout
  lora_<f>_adapters.safetensors  A, B with loom's adapter names
  lora_<f>.ref  config, rank, alpha, tokens, targets, logits, loss,
                grad.<adapter> for every A and B, and the losses of 5 AdamW
                steps that update only A and B (adamw_losses, before each
                step); bf16_logits, bf16_loss: the same from the base weights
                rounded to bf16 (what a bf16 base holds), still in float64
"""
import os

import torch
import torch.nn.functional as F

from loomref import out_dir, save
from ref_model import (B, T, adamw_reference, gpt2_config, gpt2_logits, gpt2_shapes, linear, llama_config,
                       llama_logits, llama_shapes, loss_of, random_weights)
from ref_safetensors import write_safetensors

RANK, ALPHA = 4, 8.0


def adapter_shapes(base_shapes):
    """A (r, in), B (out, r) for every 2-D block linear weight."""
    s = {}
    for name, shape in base_shapes.items():
        if len(shape) == 2 and (name.startswith("h.") or name.startswith("model.layers.")):
            module = name[: -len(".weight")]
            s[module + ".lora_A.weight"] = (RANK, shape[1])
            s[module + ".lora_B.weight"] = (shape[0], RANK)
    return s


def lora_linear(A):
    """The block linear with its adapter: A holds the adapters by name."""
    scale = ALPHA / RANK

    def lin(P, module, x):
        y = linear(P, module, x)
        return y + scale * F.linear(F.linear(x, A[module + ".lora_A.weight"]), A[module + ".lora_B.weight"])

    return lin


def write_case(d, family, c, shapes, logits_fn, seed):
    g = torch.Generator().manual_seed(seed)
    base = random_weights(shapes, g)
    adapters = {n: 0.2 * torch.randn(s, generator=g) for n, s in adapter_shapes(shapes).items()}
    V = c["vocab_size"]
    tokens = torch.randint(0, V, (B, T), generator=g, dtype=torch.int32)
    targets = torch.randint(0, V, (B, T), generator=g, dtype=torch.int32)
    targets[0, 5] = -100
    write_safetensors(os.path.join(d, f"lora_{family}_base.safetensors"), base, {"format": "pt"})
    write_safetensors(os.path.join(d, f"lora_{family}_adapters.safetensors"), adapters, {"format": "pt"})

    P = {n: t.double() for n, t in base.items()}  # frozen: no gradient
    A = {n: t.double().requires_grad_(True) for n, t in adapters.items()}
    logits = logits_fn(P, c, tokens.long(), lora_linear(A))
    loss = loss_of(logits, targets)
    loss.backward()
    out = {"config": torch.tensor([c["family"], c["n_layer"], c["n_embd"], c["n_head"], c["n_kv_head"], c["d_ff"],
                                   V, c["max_seq_len"], c["tie"]], dtype=torch.int32),
           "norm_eps": c["norm_eps"], "rope_theta": c["rope_theta"], "rank": float(RANK), "alpha": ALPHA,
           "tokens": tokens, "targets": targets, "logits": logits, "loss": loss}
    out.update({"grad." + n: a.grad.clone() for n, a in A.items()})

    P16 = {n: t.bfloat16().double() for n, t in base.items()}
    A16 = {n: t.bfloat16().double() for n, t in adapters.items()}
    with torch.no_grad():
        logits16 = logits_fn(P16, c, tokens.long(), lora_linear(A16))
    out["bf16_logits"], out["bf16_loss"] = logits16, loss_of(logits16, targets)

    out.update(adamw_reference(list(A.values()),
                               lambda: loss_of(logits_fn(P, c, tokens.long(), lora_linear(A)), targets)))
    save(os.path.join(d, f"lora_{family}.ref"), out)


def main():
    d = out_dir()
    torch.set_grad_enabled(True)
    write_case(d, "gpt2", gpt2_config(), gpt2_shapes(gpt2_config()), gpt2_logits, 31)
    write_case(d, "llama", llama_config(), llama_shapes(llama_config()), llama_logits, 32)


if __name__ == "__main__":
    main()
