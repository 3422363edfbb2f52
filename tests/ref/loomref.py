"""Writes reference cases for loom's C++ tests (read by tests/common/ref.h).

A .ref file is little-endian:
  b"LOOMREF1", u32 count, then per tensor:
  u32 name_len, name (utf-8), u32 dtype (loom DType order: f32=0 bf16=1
  f16=2 i32=3 i64=4 u8=5), u32 ndim, i64 dims[ndim], raw row-major data.
"""
import os
import struct
import sys

import torch

_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.int32: 3, torch.int64: 4, torch.uint8: 5}


def out_dir():
    """The output directory passed by CTest as argv[1]."""
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUTPUT_DIR")
    os.makedirs(sys.argv[1], exist_ok=True)
    return sys.argv[1]


def save(path, tensors):
    """tensors: dict name -> torch tensor (any supported dtype) or python float."""
    with open(path + ".tmp", "wb") as f:
        f.write(b"LOOMREF1")
        f.write(struct.pack("<I", len(tensors)))
        for name, t in tensors.items():
            if not isinstance(t, torch.Tensor):
                t = torch.tensor(t, dtype=torch.float32)
            t = t.detach().contiguous().cpu()
            if t.dtype == torch.float64:
                t = t.float()
            raw = name.encode()
            f.write(struct.pack("<I", len(raw)) + raw)
            f.write(struct.pack("<II", _DTYPES[t.dtype], t.dim()))
            f.write(struct.pack(f"<{t.dim()}q", *t.shape))
            if t.dtype in (torch.bfloat16, torch.float16):
                t = t.view(torch.int16)
            f.write(t.numpy().tobytes())
    os.replace(path + ".tmp", path)
