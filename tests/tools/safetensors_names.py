"""Prints the tensor names of a safetensors file, one a line, read from its
header alone (8-byte little-endian length, then JSON): an independent reader
for the CLI tests (tests/mpi.cmake)."""
import json
import struct
import sys

with open(sys.argv[1], "rb") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(n))
for name in sorted(k for k in header if k != "__metadata__"):
    print(name)
