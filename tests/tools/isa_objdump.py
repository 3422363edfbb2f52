"""Proof that a loom binary runs on any x86-64: code above the baseline is
reached only through the CPU kernel table (src/kernels/CMakeLists.txt).

    /usr/bin/python3 tests/tools/isa_objdump.py build/loom

Disassembles the executable (objdump) and checks, function by function:
  1. no global or weak function uses a ymm/zmm register or an AVX-512 mask
     register: every copy of an inline function or template that the linker
     could have shared between a level's kernels and the rest of loom is the
     baseline's (the levels' own copies are local to their objects);
  2. the functions of loom::kernels::cpu::avx2 use no zmm or mask register;
  3. the functions of loom::kernels::cpu::generic use neither ymm nor zmm;
  4. each level's table entry point exists (the amx level's beside
     avx512_bf16's, in its object), and the avx2 and avx512 kernels are
     really there (their namespaces use ymm / zmm);
  5. AMX tile registers appear only in loom::kernels::cpu::avx512_bf16,
     whose amx table alone reaches them (cpu/linear_amx.cpp).
Prints what it checked; exits 1 with the offending functions otherwise.
"""
import re
import subprocess
import sys

WIDE = re.compile(r"%[yz]mm\d+|%k[1-7]\b|%tmm\d")
TMM = re.compile(r"%tmm\d")
ZMM = re.compile(r"%zmm\d+|%k[1-7]\b")
YMM_OR_ZMM = re.compile(r"%[yz]mm\d+")
LEVELS = ["generic", "avx2", "avx512", "avx512_bf16"]
ENTRY_POINTS = [f"loom_cpu_backend_{level}" for level in LEVELS + ["amx"]]


def functions(binary):
    """(address, demangled name, body text) of every function objdump shows."""
    out = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", binary], capture_output=True, text=True,
                         check=True).stdout
    header = re.compile(r"^([0-9a-f]+) <(.*)>:$")
    addr, name, body = None, None, []
    for line in out.splitlines():
        m = header.match(line)
        if m:
            if name is not None:
                yield addr, name, "\n".join(body)
            addr, name, body = int(m.group(1), 16), m.group(2), []
        elif name is not None:
            body.append(line)
    if name is not None:
        yield addr, name, "\n".join(body)


def global_addresses(binary):
    """Addresses of the global and weak function symbols."""
    out = subprocess.run(["nm", "--defined-only", binary], capture_output=True, text=True, check=True).stdout
    addrs = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] in ("T", "W"):
            addrs.add(int(parts[0], 16))
    return addrs


def main():
    binary = sys.argv[1]
    globals_ = global_addresses(binary)
    bad, counted = [], {level: [0, 0] for level in LEVELS}  # level: [functions, functions with wide registers]
    entries = set()
    total = tiles = 0
    for addr, name, body in functions(binary):
        total += 1
        if name.startswith("loom_cpu_backend_"):
            entries.add(name)
        if addr in globals_ and WIDE.search(body):
            bad.append(f"global function uses registers above the baseline: {name}")
        if TMM.search(body):
            tiles += 1
            if "loom::kernels::cpu::avx512_bf16::" not in name:
                bad.append(f"AMX tiles used outside the avx512_bf16 kernels: {name}")
        for level in LEVELS:
            if f"loom::kernels::cpu::{level}::" not in name:
                continue
            counted[level][0] += 1
            counted[level][1] += bool(WIDE.search(body))
            if level == "avx2" and ZMM.search(body):
                bad.append(f"avx2 kernel uses zmm or mask registers: {name}")
            if level == "generic" and YMM_OR_ZMM.search(body):
                bad.append(f"generic kernel uses ymm/zmm registers: {name}")
    for entry in ENTRY_POINTS:
        if entry not in entries:
            bad.append(f"no entry point {entry}")
    for level in ("avx2", "avx512"):
        if counted[level][1] == 0:
            bad.append(f"the {level} kernels use no wide registers: were they compiled for {level}?")
    print(f"{binary}: {total} functions; {len(globals_)} global or weak symbols, none using ymm/zmm/k registers"
          if not any(b.startswith("global") for b in bad) else f"{binary}: {total} functions")
    for level in LEVELS:
        print(f"  loom::kernels::cpu::{level}: {counted[level][0]} functions, {counted[level][1]} using ymm/zmm")
    print(f"  {tiles} functions using AMX tile registers, all avx512_bf16's")
    for b in bad:
        print("FAIL: " + b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
