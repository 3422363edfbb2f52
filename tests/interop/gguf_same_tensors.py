#!/usr/bin/python3
"""Whether two GGUF files hold the same tensors: names, types, shapes and bytes.

    gguf_same_tensors.py A.gguf A.json B.gguf B.json [SKIP_NAME...]

SKIP_NAME: tensors left out of the comparison. A.json, B.json: gguf_describe's JSON of each file (loom's reader: the tensor
table and where the data section starts). Prints one line and exits 1 at the
first tensor that differs, naming it, its types and its first differing block.
"""
import json
import sys

# enum ggml_type -> (values per block, bytes per block), ggml-common.h.
BLOCKS = {0: (1, 4), 1: (1, 2), 30: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
          10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210)}
NAMES = {0: "f32", 1: "f16", 30: "bf16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0", 10: "q2_K",
         11: "q3_K", 12: "q4_K", 13: "q5_K", 14: "q6_K"}


def tensors(path, desc):
    d = json.load(open(desc))
    start = int(d["tensor_data_offset"])
    out = {}
    with open(path, "rb") as f:
        for t in d["tensors"]:
            dims = [int(x) for x in t["dims"]]
            per, size = BLOCKS[t["type"]]
            n = 1
            for x in dims:
                n *= x
            f.seek(start + int(t["offset"]))
            out[t["name"]] = (t["type"], dims, f.read(n // per * size), size)
    return out


def main():
    a_path, a_desc, b_path, b_desc, *skip = sys.argv[1:]
    a, b = tensors(a_path, a_desc), tensors(b_path, b_desc)
    for name in skip:
        a.pop(name, None), b.pop(name, None)
    if sorted(a) != sorted(b):
        sys.exit(f"tensor names differ: only in the first {sorted(set(a) - set(b))}, "
                 f"only in the second {sorted(set(b) - set(a))}")
    for name in sorted(a):
        (ta, da, ba, size), (tb, db, bb, _) = a[name], b[name]
        if ta != tb or da != db:
            sys.exit(f"{name}: {NAMES.get(ta, ta)} {da} vs {NAMES.get(tb, tb)} {db}")
        if ba != bb:
            first = next(i for i in range(len(ba)) if ba[i] != bb[i])
            sys.exit(f"{name} ({NAMES.get(ta, ta)}): bytes differ from block {first // size}")
    print(f"same {len(a)} tensors")


if __name__ == "__main__":
    main()
