"""Writes safetensors files by hand from the format spec, for test_safetensors.

python3-safetensors is not installed, so the file is built here with struct
and json exactly as the reference writer (huggingface/safetensors, tensor.rs
`prepare`) lays it out: tensors sorted by dtype descending (I64, F32, I32,
BF16, F16, U8) then by name, compact JSON with "__metadata__" first, header
padded with spaces to a multiple of 8 bytes, data contiguous in that order.

Outputs (in argv[1]):
  safetensors_hand.safetensors  the file
  safetensors_hand.ref          the same tensors in loom's .ref format
"""
import json
import os
import struct

import torch

from loomref import out_dir, save

_NAMES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16",
          torch.int32: "I32", torch.int64: "I64", torch.uint8: "U8"}
_RANK = {"U8": 0, "F16": 1, "BF16": 2, "I32": 3, "F32": 4, "I64": 5}


def raw_bytes(t):
    t = t.contiguous()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def write_safetensors(path, tensors, metadata):
    order = sorted(tensors.items(), key=lambda kv: (-_RANK[_NAMES[kv[1].dtype]], kv[0]))
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, t in order:
        b = raw_bytes(t)
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    os.replace(path + ".tmp", path)


def main():
    d = out_dir()
    g = torch.Generator().manual_seed(7)
    tensors = {
        "model.embed_tokens.weight": torch.randn(5, 3, generator=g).to(torch.bfloat16),
        "model.norm.weight": torch.randn(3, generator=g),
        "lm_head.weight": torch.randn(2, 3, 4, generator=g).to(torch.float16),
        "positions": torch.arange(-3, 9, dtype=torch.int64).reshape(3, 4),
        "token_ids": torch.randint(-1000, 1000, (7,), dtype=torch.int32, generator=g),
        "mask": torch.randint(0, 256, (2, 2), dtype=torch.uint8, generator=g),
        "scale": torch.tensor(1.5),                         # 0-d
        "empty": torch.zeros(0, 4, dtype=torch.bfloat16),   # no elements
        "bf16.extremes": torch.tensor([float("inf"), -float("inf"), 3.0e38, -0.0, 1e-40], dtype=torch.bfloat16),
    }
    write_safetensors(os.path.join(d, "safetensors_hand.safetensors"), tensors,
                      {"format": "pt", "note": "written by ref_safetensors.py"})
    save(os.path.join(d, "safetensors_hand.ref"), tensors)


if __name__ == "__main__":
    main()
