#!/usr/bin/python3
"""Quantize a GGUF file with llama.cpp's own quantizer, as llama-quantize does.

    llama_quantize.py INTEROP_DIR IN.gguf OUT.gguf TYPE

TYPE is a llama-quantize type name (Q4_1, Q5_0, Q5_1, Q2_K, Q3_K_M, Q4_K_M,
Q5_K_M, Q6_K, Q8_0, ...). Calls llama_model_quantize of the libllama that
node-llama-cpp ships (INTEROP_DIR/node_modules/@node-llama-cpp/linux-x64,
pinned by tests/interop/package-lock.json) through ctypes, with llama.cpp's
default parameters but for the type (no importance matrix: the reference
quantizers, as `llama-quantize IN OUT TYPE` runs them). Prints llama.cpp's
log to stderr and exits non-zero when it fails.
"""
import ctypes
import os
import sys

# enum llama_ftype (llama.h); the values llama-quantize's names map to.
FTYPES = {
    "F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10,
    "Q3_K_S": 11, "Q3_K_M": 12, "Q3_K_L": 13, "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16,
    "Q5_K_M": 17, "Q6_K": 18, "BF16": 32,
}


class Params(ctypes.Structure):
    # llama_model_quantize_params begins with int32 nthread and enum
    # llama_ftype ftype; the rest (types, flags, pointers) keeps llama.cpp's
    # defaults. The buffer is larger than the struct of any llama.cpp
    # release, so the library writes its defaults inside it.
    _fields_ = [("nthread", ctypes.c_int32), ("ftype", ctypes.c_int32), ("rest", ctypes.c_uint8 * 504)]


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    interop, src, dst, name = sys.argv[1:]
    if name.upper() not in FTYPES:
        sys.exit(f"llama_quantize.py: unknown type {name}; known: {', '.join(FTYPES)}")
    bins = os.path.join(interop, "node_modules/@node-llama-cpp/linux-x64/bins/linux-x64")
    libs = [f for f in os.listdir(bins) if f.startswith("libllama.") and f.endswith(".so")] if os.path.isdir(bins) else []
    if not libs:
        sys.exit(f"llama_quantize.py: no libllama in {bins}: run bash scripts/fetch-data.sh")
    llama = ctypes.CDLL(os.path.join(bins, libs[0]))
    llama.llama_model_quantize_default_params.restype = Params
    llama.llama_model_quantize.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(Params)]
    llama.llama_model_quantize.restype = ctypes.c_uint32
    llama.llama_backend_init()
    params = llama.llama_model_quantize_default_params()
    params.ftype = FTYPES[name.upper()]
    params.nthread = 2
    rc = llama.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    llama.llama_backend_free()
    if rc != 0:
        sys.exit(f"llama_quantize.py: llama_model_quantize({src}, {dst}, {name}) returned {rc}")


if __name__ == "__main__":
    main()
