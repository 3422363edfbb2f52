"""Reference GPT-2 and Llama forward/backward for test_model (tests/model/test_model.cpp).

A tiny model of each family is written here directly in torch (float64),
independently of loom: GPT-2 pre-LN blocks with a tanh-GELU MLP and tied
embeddings; Llama blocks with RMSNorm, Hugging Face RoPE (rotate_half), GQA
and SwiGLU, untied lm head. Random float32 weights are stored, with loom's
names and layout (every linear (out, in)), in a hand-written safetensors file;
the float64 computation starts from those exact values.

Outputs (in argv[1]), for f in gpt2, llama:
  model_<f>.safetensors  the weights
  model_gpt2_hf.safetensors  the GPT-2 weights in Hugging Face's Conv1D layout
  model_<f>.ref          config, tokens, targets (one -100 ignored), logits,
                         loss, grad.<name> for every parameter, and the losses
                         of 5 AdamW steps (adamw_losses, before each step)
"""
import math
import os

import torch
import torch.nn.functional as F

from loomref import out_dir, save
from ref_safetensors import write_safetensors

ADAMW = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
B, T = 2, 8


def gpt2_config():
    return dict(family=0, n_layer=2, n_embd=32, n_head=4, n_kv_head=4, d_ff=128, vocab_size=61, max_seq_len=16,
                tie=1, norm_eps=1e-5, rope_theta=10000.0)


def llama_config():
    return dict(family=1, n_layer=2, n_embd=32, n_head=4, n_kv_head=2, d_ff=72, vocab_size=61, max_seq_len=16,
                tie=0, norm_eps=1e-5, rope_theta=10000.0)


def gpt2_shapes(c):
    C, F_, V = c["n_embd"], c["d_ff"], c["vocab_size"]
    s = {"wte.weight": (V, C), "wpe.weight": (c["max_seq_len"], C)}
    for i in range(c["n_layer"]):
        p = f"h.{i}."
        s.update({p + "ln_1.weight": (C,), p + "ln_1.bias": (C,), p + "attn.c_attn.weight": (3 * C, C),
                  p + "attn.c_attn.bias": (3 * C,), p + "attn.c_proj.weight": (C, C), p + "attn.c_proj.bias": (C,),
                  p + "ln_2.weight": (C,), p + "ln_2.bias": (C,), p + "mlp.c_fc.weight": (F_, C),
                  p + "mlp.c_fc.bias": (F_,), p + "mlp.c_proj.weight": (C, F_), p + "mlp.c_proj.bias": (C,)})
    s.update({"ln_f.weight": (C,), "ln_f.bias": (C,)})
    return s


def llama_shapes(c):
    C, F_, V = c["n_embd"], c["d_ff"], c["vocab_size"]
    KV = c["n_kv_head"] * C // c["n_head"]
    s = {"model.embed_tokens.weight": (V, C)}
    for i in range(c["n_layer"]):
        p = f"model.layers.{i}."
        s.update({p + "input_layernorm.weight": (C,), p + "self_attn.q_proj.weight": (C, C),
                  p + "self_attn.k_proj.weight": (KV, C), p + "self_attn.v_proj.weight": (KV, C),
                  p + "self_attn.o_proj.weight": (C, C), p + "post_attention_layernorm.weight": (C,),
                  p + "mlp.gate_proj.weight": (F_, C), p + "mlp.up_proj.weight": (F_, C),
                  p + "mlp.down_proj.weight": (C, F_)})
    s.update({"model.norm.weight": (C,), "lm_head.weight": (V, C)})
    return s


def random_weights(shapes, g):
    """Norm gains near 1, everything else N(0, 0.1^2) (biases too): float32."""
    w = {}
    for name, shape in shapes.items():
        r = torch.randn(shape, generator=g)
        w[name] = 1.0 + 0.1 * r if ("ln_" in name or "norm" in name) and name.endswith(".weight") else 0.1 * r
    return w


def causal_attention(q, k, v):
    """q: (B, NH, T, HS), k, v: (B, NKV, T, HS); head h reads kv head h // (NH / NKV)."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    t = q.shape[2]
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def heads(x, n):  # (B, T, n*HS) -> (B, n, T, HS)
    b, t, _ = x.shape
    return x.view(b, t, n, -1).transpose(1, 2)


def merge(x):  # (B, NH, T, HS) -> (B, T, C)
    b, _, t, _ = x.shape
    return x.transpose(1, 2).reshape(b, t, -1)


def linear(P, module, x):
    """A block linear by its module name (weight, and bias where P has one)."""
    return F.linear(x, P[module + ".weight"], P.get(module + ".bias"))


def gpt2_hidden(P, c, tokens, lin=linear):
    """The final hidden states (after ln_f): what the LM head reads. lin(P, module, x): each block linear."""
    C, NH, eps = c["n_embd"], c["n_head"], c["norm_eps"]
    x = P["wte.weight"][tokens] + P["wpe.weight"][: tokens.shape[1]]
    for i in range(c["n_layer"]):
        p = f"h.{i}."
        h = F.layer_norm(x, (C,), P[p + "ln_1.weight"], P[p + "ln_1.bias"], eps)
        q, k, v = lin(P, p + "attn.c_attn", h).split(C, dim=-1)
        y = merge(causal_attention(heads(q, NH), heads(k, NH), heads(v, NH)))
        x = x + lin(P, p + "attn.c_proj", y)
        h = F.layer_norm(x, (C,), P[p + "ln_2.weight"], P[p + "ln_2.bias"], eps)
        h = F.gelu(lin(P, p + "mlp.c_fc", h), approximate="tanh")
        x = x + lin(P, p + "mlp.c_proj", h)
    return F.layer_norm(x, (C,), P["ln_f.weight"], P["ln_f.bias"], eps)


def gpt2_logits(P, c, tokens, lin=linear):
    return gpt2_hidden(P, c, tokens, lin) @ P["wte.weight"].T  # tied


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, theta):
    """Hugging Face Llama rotate_half convention. x: (B, n, T, HS)."""
    hs, t = x.shape[-1], x.shape[2]
    inv_freq = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs))
    freqs = torch.arange(t, dtype=torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    x1, x2 = x[..., : hs // 2], x[..., hs // 2:]
    return x * emb.cos() + torch.cat([-x2, x1], dim=-1) * emb.sin()


def llama_attention(P, c, p, x, lin=linear):
    """x plus layer p's attention branch (RMSNorm, RoPE'd GQA attention, o_proj)."""
    NH, NKV, eps, theta = c["n_head"], c["n_kv_head"], c["norm_eps"], c["rope_theta"]
    h = rms_norm(x, P[p + "input_layernorm.weight"], eps)
    q = rope(heads(lin(P, p + "self_attn.q_proj", h), NH), theta)
    k = rope(heads(lin(P, p + "self_attn.k_proj", h), NKV), theta)
    v = heads(lin(P, p + "self_attn.v_proj", h), NKV)
    return x + lin(P, p + "self_attn.o_proj", merge(causal_attention(q, k, v)))


def llama_hidden(P, c, tokens, lin=linear):
    """The final hidden states (after the last RMSNorm): what the LM head reads."""
    eps = c["norm_eps"]
    x = P["model.embed_tokens.weight"][tokens]
    for i in range(c["n_layer"]):
        p = f"model.layers.{i}."
        x = llama_attention(P, c, p, x, lin)
        h = rms_norm(x, P[p + "post_attention_layernorm.weight"], eps)
        h = F.silu(lin(P, p + "mlp.gate_proj", h)) * lin(P, p + "mlp.up_proj", h)
        x = x + lin(P, p + "mlp.down_proj", h)
    return rms_norm(x, P["model.norm.weight"], eps)


def llama_logits(P, c, tokens, lin=linear):
    return llama_hidden(P, c, tokens, lin) @ P["lm_head.weight"].T


def loss_of(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1).long(), ignore_index=-100)


def adamw_reference(params, step_loss):
    """adamw_losses: the losses of 5 torch.optim.AdamW steps over params (step_loss() before each step), and
    adamw: its settings (lr, beta1, beta2, eps, weight_decay)."""
    opt = torch.optim.AdamW(params, **ADAMW)
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = step_loss()
        loss.backward()
        losses.append(loss.item())
        opt.step()
    return {"adamw_losses": torch.tensor(losses, dtype=torch.float64),
            "adamw": torch.tensor([ADAMW["lr"], ADAMW["betas"][0], ADAMW["betas"][1], ADAMW["eps"],
                                   ADAMW["weight_decay"]], dtype=torch.float64)}


def write_case(d, family, c, shapes, logits_fn, seed):
    g = torch.Generator().manual_seed(seed)
    w32 = random_weights(shapes, g)
    V = c["vocab_size"]
    tokens = torch.randint(0, V, (B, T), generator=g, dtype=torch.int32)
    targets = torch.randint(0, V, (B, T), generator=g, dtype=torch.int32)
    targets[1, 3] = -100
    write_safetensors(os.path.join(d, f"model_{family}.safetensors"), w32, {"format": "pt"})
    if family == "gpt2":  # Hugging Face layout: Conv1D weights stored (in, out)
        conv1d = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")
        hf = {n: t.T.contiguous() if n.endswith(conv1d) else t for n, t in w32.items()}
        write_safetensors(os.path.join(d, "model_gpt2_hf.safetensors"), hf, {"format": "pt"})

    P = {n: t.double().requires_grad_(True) for n, t in w32.items()}
    logits = logits_fn(P, c, tokens.long())
    loss = loss_of(logits, targets)
    loss.backward()
    out = {"config": torch.tensor([c["family"], c["n_layer"], c["n_embd"], c["n_head"], c["n_kv_head"], c["d_ff"],
                                   V, c["max_seq_len"], c["tie"]], dtype=torch.int32),
           "norm_eps": c["norm_eps"], "rope_theta": c["rope_theta"],
           "tokens": tokens, "targets": targets, "logits": logits, "loss": loss}
    out.update({"grad." + n: p.grad.clone() for n, p in P.items()})

    out.update(adamw_reference(list(P.values()), lambda: loss_of(logits_fn(P, c, tokens.long()), targets)))
    save(os.path.join(d, f"model_{family}.ref"), out)


def main():
    d = out_dir()
    torch.set_grad_enabled(True)
    write_case(d, "gpt2", gpt2_config(), gpt2_shapes(gpt2_config()), gpt2_logits, 11)
    write_case(d, "llama", llama_config(), llama_shapes(llama_config()), llama_logits, 12)


if __name__ == "__main__":
    main()
