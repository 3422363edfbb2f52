"""Reference Mixtral-style MoE model forward/backward for test_moe (tests/model/test_moe.cpp).

A tiny Llama model whose MLPs are (some of them) sparse MoE blocks, written
here directly in torch float64, independently of loom:
  router logits = h @ gate^T; scores = softmax (or sigmoid) in float64;
  top-k of scores + bias (the loss-free balancing bias: selection only),
  the larger first, ties to the lower expert id (a stable sort of -key);
  weights = the chosen scores, divided by their sum when norm_topk_prob;
  capacity per routing group of G sequences: ceil(cf * G*T * k / E); each
  expert keeps its choices with the highest score for it, ties to the earlier
  token; dropped choices contribute nothing; cf = 0 keeps all;
  experts: w2(silu(w1 x) * w3 x); shared experts: one SwiGLU added to all;
  aux loss per layer: mean over groups of E * sum_e f_e P_e, f_e = choices of
  e (before drops) / (G*T*k), P_e = mean normalised score (sigmoid: s / sum s);
  z-loss per layer: mean over tokens of logsumexp(logits)^2.
The objective is CE + sum over MoE layers of aux_coef * aux + z_coef * z;
autograd gives every gradient. Selection and drops are discrete, so they are
decided once and the same in autograd (they carry no gradient).

Cases (in argv[1]): moe_<name>.safetensors and moe_<name>.ref with config,
tokens, targets, loss (the CE), aux, z (sums over MoE layers), load
(layers x E choices before drops), dropped, and grad.<name> of the objective.
"""
import math
import os

import torch
import torch.nn.functional as F

from loomref import out_dir, save
from ref_safetensors import write_safetensors
from ref_model import llama_attention, rms_norm

B, T = 4, 8


def base_config(**kw):
    c = dict(n_layer=2, n_embd=32, n_head=4, n_kv_head=2, d_ff=24, vocab_size=61, max_seq_len=16, norm_eps=1e-5,
             rope_theta=10000.0, n_expert=4, top_k=2, capacity_factor=0.0, aux_loss_coef=0.01, z_loss_coef=0.001,
             moe_every=1, n_shared_expert=0, sigmoid=0, norm_topk_prob=1, routing_group=1, bias=0)
    c.update(kw)
    return c


CASES = {
    # Capacity 1.0 drops choices; router rows 0 and 1 of layer 0 equal, so their scores tie everywhere.
    "softmax_top2_capacity": base_config(capacity_factor=1.0, tie_rows=1),
    # Top-1 dropless, sigmoid scores unnormalised, a shared expert, only layer 1 is MoE, a selection bias
    # that keeps expert 3 from ever being chosen (an expert with no token).
    "sigmoid_top1_shared_bias": base_config(top_k=1, sigmoid=1, norm_topk_prob=0, n_shared_expert=1, moe_every=2,
                                            bias=1, n_layer=2),
    # 8 experts, capacity 1 per expert per group of two sequences (cf tiny): most choices dropped.
    "tiny_capacity_groups": base_config(n_expert=8, capacity_factor=0.01, routing_group=2),
}


def shapes(c):
    C, F_, V, E = c["n_embd"], c["d_ff"], c["vocab_size"], c["n_expert"]
    KV = c["n_kv_head"] * C // c["n_head"]
    s = {"model.embed_tokens.weight": (V, C)}
    for i in range(c["n_layer"]):
        p = f"model.layers.{i}."
        s.update({p + "input_layernorm.weight": (C,), p + "self_attn.q_proj.weight": (C, C),
                  p + "self_attn.k_proj.weight": (KV, C), p + "self_attn.v_proj.weight": (KV, C),
                  p + "self_attn.o_proj.weight": (C, C), p + "post_attention_layernorm.weight": (C,)})
        if (i + 1) % c["moe_every"] != 0:
            s.update({p + "mlp.gate_proj.weight": (F_, C), p + "mlp.up_proj.weight": (F_, C),
                      p + "mlp.down_proj.weight": (C, F_)})
            continue
        m = p + "block_sparse_moe."
        s[m + "gate.weight"] = (E, C)
        if c["bias"]:
            s[m + "gate.e_score_correction_bias"] = (E,)
        if c["n_shared_expert"]:
            Fs = c["n_shared_expert"] * F_
            s.update({m + "shared_experts.gate_proj.weight": (Fs, C), m + "shared_experts.up_proj.weight": (Fs, C),
                      m + "shared_experts.down_proj.weight": (C, Fs)})
        for e in range(E):
            s.update({m + f"experts.{e}.w1.weight": (F_, C), m + f"experts.{e}.w2.weight": (C, F_),
                      m + f"experts.{e}.w3.weight": (F_, C)})
    s.update({"model.norm.weight": (C,), "lm_head.weight": (V, C)})
    return s


def random_weights(c, g):
    w = {}
    for name, shape in shapes(c).items():
        r = torch.randn(shape, generator=g)
        if "norm" in name:
            w[name] = 1.0 + 0.1 * r
        elif name.endswith("gate.weight"):
            w[name] = 0.5 * r  # router: scores far enough apart that f32 and f64 pick the same experts
        elif name.endswith("e_score_correction_bias"):
            w[name] = torch.tensor([0.05, -0.02, 0.0, -100.0])[: shape[0]]
        else:
            w[name] = 0.1 * r
    if c.get("tie_rows"):
        w["model.layers.0.block_sparse_moe.gate.weight"][1] = w["model.layers.0.block_sparse_moe.gate.weight"][0]
    return w


def swiglu(x, w1, w3, w2):
    return F.linear(F.silu(F.linear(x, w1)) * F.linear(x, w3), w2)


def moe_layer(P, c, p, h, stats):
    """h: (B, T, C). Returns the MoE output and adds aux, z, loads, drops into stats."""
    E, k, C = c["n_expert"], c["top_k"], c["n_embd"]
    m = p + "block_sparse_moe."
    x = h.reshape(-1, C)
    N = x.shape[0]
    logits = F.linear(x, P[m + "gate.weight"])
    scores = torch.sigmoid(logits) if c["sigmoid"] else torch.softmax(logits, dim=-1)
    key = scores.detach() + (P[m + "gate.e_score_correction_bias"].detach() if c["bias"] else 0)
    sel = torch.sort(-key, dim=-1, stable=True).indices[:, :k]  # ties: lower id first
    chosen = scores.gather(1, sel)
    weight = chosen / chosen.sum(-1, keepdim=True) if c["norm_topk_prob"] else chosen
    Tg = c["routing_group"] * T
    keep = torch.ones(N, k, dtype=torch.bool)
    if c["capacity_factor"] > 0:
        cap = math.ceil(c["capacity_factor"] * Tg * k / E)
        for g0 in range(0, N, Tg):
            for e in range(E):
                idx = [(t, j) for t in range(g0, g0 + Tg) for j in range(k) if sel[t, j] == e]
                idx.sort(key=lambda tj: -scores[tj[0], e].item())  # stable: earlier token first on ties
                for t, j in idx[cap:]:
                    keep[t, j] = False
    out = torch.zeros_like(x)
    for t in range(N):
        for j in range(k):
            if keep[t, j]:
                e = sel[t, j].item()
                q = m + f"experts.{e}."
                out[t] = out[t] + weight[t, j] * swiglu(x[t], P[q + "w1.weight"], P[q + "w3.weight"],
                                                          P[q + "w2.weight"])
    if c["n_shared_expert"]:
        out = out + swiglu(x, P[m + "shared_experts.gate_proj.weight"], P[m + "shared_experts.up_proj.weight"],
                           P[m + "shared_experts.down_proj.weight"])
    # Balancing losses, per routing group.
    norm = scores / scores.sum(-1, keepdim=True) if c["sigmoid"] else scores
    counts = torch.zeros(N, E, dtype=torch.float64).scatter_add_(1, sel, torch.ones(N, k, dtype=torch.float64))
    aux = 0
    for g0 in range(0, N, Tg):
        f = counts[g0:g0 + Tg].sum(0) / (Tg * k)
        Pm = norm[g0:g0 + Tg].mean(0)
        aux = aux + E * (f * Pm).sum()
    aux = aux / (N // Tg)
    z = (torch.logsumexp(logits, dim=-1) ** 2).mean()
    stats["aux"] = stats["aux"] + aux
    stats["z"] = stats["z"] + z
    stats["load"].append(counts.sum(0))
    stats["dropped"] += int((~keep).sum())
    return out.reshape(h.shape)


def logits_of(P, c, tokens, stats):
    eps = c["norm_eps"]
    x = P["model.embed_tokens.weight"][tokens]
    for i in range(c["n_layer"]):
        p = f"model.layers.{i}."
        x = llama_attention(P, c, p, x)
        h = rms_norm(x, P[p + "post_attention_layernorm.weight"], eps)
        if (i + 1) % c["moe_every"] == 0:
            x = x + moe_layer(P, c, p, h, stats)
        else:
            x = x + swiglu(h, P[p + "mlp.gate_proj.weight"], P[p + "mlp.up_proj.weight"],
                           P[p + "mlp.down_proj.weight"])
    x = rms_norm(x, P["model.norm.weight"], eps)
    return x @ P["lm_head.weight"].T


KEYS = ["n_layer", "n_embd", "n_head", "n_kv_head", "d_ff", "vocab_size", "max_seq_len", "n_expert", "top_k",
        "moe_every", "n_shared_expert", "sigmoid", "norm_topk_prob", "routing_group", "bias"]


def write_case(d, name, c, seed):
    g = torch.Generator().manual_seed(seed)
    w32 = random_weights(c, g)
    V = c["vocab_size"]
    tokens = torch.randint(0, V, (B, T), generator=g, dtype=torch.int32)
    targets = torch.randint(0, V, (B, T), generator=g, dtype=torch.int32)
    write_safetensors(os.path.join(d, f"moe_{name}.safetensors"), w32, {"format": "pt"})
    P = {n: t.double().requires_grad_(True) for n, t in w32.items()}
    stats = {"aux": 0, "z": 0, "load": [], "dropped": 0}
    logits = logits_of(P, c, tokens.long(), stats)
    ce = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1).long())
    objective = ce + c["aux_loss_coef"] * stats["aux"] + c["z_loss_coef"] * stats["z"]
    objective.backward()
    out = {"config": torch.tensor([c[k] for k in KEYS], dtype=torch.int32),
           "capacity_factor": c["capacity_factor"], "aux_loss_coef": c["aux_loss_coef"],
           "z_loss_coef": c["z_loss_coef"], "norm_eps": c["norm_eps"], "rope_theta": c["rope_theta"],
           "tokens": tokens, "targets": targets, "loss": ce.detach(), "aux": stats["aux"].detach(),
           "z": stats["z"].detach(), "load": torch.stack(stats["load"]),
           "dropped": torch.tensor([stats["dropped"]], dtype=torch.int32)}
    out.update({"grad." + n: p.grad.clone() if p.grad is not None else torch.zeros_like(p) for n, p in P.items()})
    save(os.path.join(d, f"moe_{name}.ref"), out)


def main():
    d = out_dir()
    torch.set_grad_enabled(True)
    for i, (name, c) in enumerate(CASES.items()):
        write_case(d, name, c, 40 + i)


if __name__ == "__main__":
    main()
