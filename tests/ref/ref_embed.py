"""Reference embeddings for test_embed (tests/infer/test_embed.cpp).

The float64 GPT-2 and Llama of ref_model.py (written there in torch,
independently of loom), with their own random weights and a longer context:
for prompts of several lengths, the final hidden states (after the last
norm, what the LM head reads) averaged over every token (mean pooling) and
the last token's (last pooling). Neither is normalised: the serving APIs do
that on top.

Outputs (in argv[1]), for f in gpt2, llama:
  embed_<f>.safetensors  the weights (loom's names and layout)
  embed_<f>.ref          config, norm_eps, rope_theta, and per prompt i:
                         tokens.<i>, mean.<i>, last.<i>
"""
import os

import torch

from loomref import out_dir, save
from ref_model import gpt2_config, gpt2_hidden, gpt2_shapes, llama_config, llama_hidden, llama_shapes, random_weights
from ref_safetensors import write_safetensors

LENGTHS = (1, 7, 30, 63)  # one token, inside a block, across blocks and chunks, the longest prompt the context allows


def write_case(d, family, c, hidden_fn, seed):
    c = dict(c, max_seq_len=64)
    shapes = gpt2_shapes(c) if family == "gpt2" else llama_shapes(c)
    g = torch.Generator().manual_seed(seed)
    w32 = random_weights(shapes, g)
    write_safetensors(os.path.join(d, f"embed_{family}.safetensors"), w32, {"format": "pt"})
    P = {n: t.double() for n, t in w32.items()}
    out = {"config": torch.tensor([c["family"], c["n_layer"], c["n_embd"], c["n_head"], c["n_kv_head"], c["d_ff"],
                                   c["vocab_size"], c["max_seq_len"], c["tie"]], dtype=torch.int32),
           "norm_eps": c["norm_eps"], "rope_theta": c["rope_theta"]}
    for i, n in enumerate(LENGTHS):
        tokens = torch.randint(0, c["vocab_size"], (1, n), generator=g, dtype=torch.int32)
        h = hidden_fn(P, c, tokens.long())[0]  # (n, C)
        out[f"tokens.{i}"] = tokens[0]
        out[f"mean.{i}"] = h.mean(dim=0)
        out[f"last.{i}"] = h[-1]
    save(os.path.join(d, f"embed_{family}.ref"), out)


def main():
    d = out_dir()
    torch.set_grad_enabled(False)
    write_case(d, "gpt2", gpt2_config(), gpt2_hidden, 21)
    write_case(d, "llama", llama_config(), llama_hidden, 22)


if __name__ == "__main__":
    main()
