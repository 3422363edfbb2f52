"""Reference values for attention_forward / attention_backward (ops.h).

Explicit causal softmax attention in float64 from float32 inputs: k and v heads
are repeated for GQA (head h reads kv head h // (NH // NKV)), query t sits at
position q_pos + t (q_pos = Tk - Tq unless the case gives one) and sees keys
0 ..= that position, scale 1 / sqrt(HS). The cases with their own q_pos
(saved in the file as "q_pos") are the blocks of ring attention: queries
over a chunk of keys wholly in their past, or partly, more or fewer of them.
lse is the log-sum-exp of the scaled, masked scores; dq, dk, dv come from
autograd with upstream gradient dout.
"""
import math

import torch

import loomref

# name: (B, Tq, Tk, NH, NKV, HS[, q_pos])
CASES = {
    "attention_basic": (2, 17, 17, 3, 3, 16),
    "attention_gqa": (2, 17, 17, 6, 2, 16),
    "attention_nh12": (1, 64, 64, 12, 12, 64),
    "attention_t1": (2, 1, 1, 3, 3, 16),
    "attention_decode1": (2, 1, 9, 4, 2, 16),
    "attention_decode4": (1, 4, 20, 4, 4, 20),
    "attention_t130": (1, 130, 130, 2, 1, 32),
    "attention_prefix": (1, 70, 150, 4, 2, 64),
    "attention_past_block": (2, 24, 40, 4, 2, 16, 40),
    "attention_past_block_edge": (1, 33, 70, 3, 1, 32, 69),
    "attention_more_queries_than_keys": (1, 90, 40, 4, 4, 16, 55),
    "attention_mid_offset": (2, 30, 70, 6, 3, 16, 20),
    "attention_keys_run_out": (1, 100, 30, 2, 2, 24, 5),
}


def reference(q, k, v, dout, q_pos=None):
    """q: (B, Tq, NH, HS)  k, v: (B, Tk, NKV, HS), float64 leaves -> out, lse."""
    B, Tq, NH, HS = q.shape
    Tk, NKV = k.shape[1], k.shape[2]
    q_pos = Tk - Tq if q_pos is None else q_pos
    kr = k.repeat_interleave(NH // NKV, dim=2).transpose(1, 2)  # (B, NH, Tk, HS)
    vr = v.repeat_interleave(NH // NKV, dim=2).transpose(1, 2)
    s = q.transpose(1, 2) @ kr.transpose(-1, -2) / math.sqrt(HS)  # (B, NH, Tq, Tk)
    pos = torch.arange(Tq).unsqueeze(1) + q_pos
    visible = torch.arange(Tk).unsqueeze(0) <= pos  # (Tq, Tk)
    s = s.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # (B, NH, Tq)
    out = (torch.softmax(s, dim=-1) @ vr).transpose(1, 2)  # (B, Tq, NH, HS)
    out.backward(dout)
    return out, lse


def main():
    out_dir = loomref.out_dir()
    torch.manual_seed(1234)
    for name, (B, Tq, Tk, NH, NKV, HS, *q_pos) in CASES.items():
        q = torch.randn(B, Tq, NH, HS)
        k = torch.randn(B, Tk, NKV, HS)
        v = torch.randn(B, Tk, NKV, HS)
        dout = torch.randn(B, Tq, NH, HS)
        q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
        out, lse = reference(q64, k64, v64, dout.double(), *q_pos)
        tensors = {"q": q, "k": k, "v": v, "dout": dout,
                   "out": out, "lse": lse, "dq": q64.grad, "dk": k64.grad, "dv": v64.grad}
        if q_pos:
            tensors["q_pos"] = torch.tensor(q_pos, dtype=torch.float32)
        loomref.save(f"{out_dir}/{name}.ref", tensors)


if __name__ == "__main__":
    main()
