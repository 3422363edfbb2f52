"""Reference conversions for cast (tests/kernels/test_elementwise.cpp).

elementwise_cast.ref: PyTorch's own conversions (.to(torch.bfloat16),
.to(torch.float16), .float()) of edge values and of random bit patterns:
  x (f32): the inputs: rounding ties for bf16 and f16, f16 overflow
      (65504, 65519, 65520), f16 subnormals and underflow (1e-8, 2^-25),
      f32 subnormals, FLT_MAX, bf16's max and its tie with Inf, +-0, NaN,
      +-Inf; then random 32-bit patterns (every exponent, NaN payloads)
  x_to_bf16, x_to_f16: x converted
  b (bf16) = x_to_bf16: b_to_f16, b_to_f32
  h (f16) = x_to_f16: h_to_bf16, h_to_f32
torch writes the canonical NaN (0x7fc0 in bf16) where loom keeps the payload,
so the test compares NaN-ness there and bits everywhere else.
"""
import os
import struct

import torch

import loomref


def from_bits(u):
    return struct.unpack("<f", struct.pack("<I", u))[0]


def edge_values():
    v = [
        1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, -(1 + 2**-8),  # bf16 ties to even, just above a tie
        1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-11 + 2**-22,  # f16 ties to even, just above a tie
        65504.0, 65519.0, 65520.0, -65520.0, 65536.0,  # f16 max, rounds to max, ties to Inf, Inf
        1e-8, 2**-24, 2**-25, 1.5 * 2**-25, 3 * 2**-26, 2**-14, 2**-14 - 2**-25, 6e-5, -6e-8,  # f16 subnormals
        1e-40, 1.4e-45, from_bits(0x007FFFFF), from_bits(0x00008000), from_bits(0x00018000),  # f32 subnormals
        from_bits(0x7F7FFFFF), from_bits(0x7F7F0000), from_bits(0x7F7F8000), from_bits(0x7F7F7FFF),  # bf16 top
        0.0, -0.0, 0.1, -1.5, 1 / 3, 3.14159265, -1e10, 1e30,
        float("nan"), -float("nan"), from_bits(0x7F800001), from_bits(0xFFC12345), float("inf"), -float("inf"),
    ]
    return torch.tensor(v, dtype=torch.float32)


def main():
    out = loomref.out_dir()
    torch.manual_seed(77)
    bits = torch.randint(-2**31, 2**31 - 1, (20000,), dtype=torch.int64).to(torch.int32)
    x = torch.cat([edge_values(), bits.view(torch.float32)])
    b = x.to(torch.bfloat16)
    h = x.to(torch.float16)
    loomref.save(os.path.join(out, "elementwise_cast.ref"), {
        "x": x, "x_to_bf16": b, "x_to_f16": h,
        "b": b, "b_to_f16": b.to(torch.float16), "b_to_f32": b.float(),
        "h": h, "h_to_bf16": h.to(torch.bfloat16), "h_to_f32": h.float(),
    })


if __name__ == "__main__":
    main()
