#!/usr/bin/env python3
# Writes a LoRA adapter directory as Hugging Face peft saves one, without
# peft: adapter_config.json (peft_type LORA, r, lora_alpha, target_modules)
# and adapter_model.safetensors (f32, keys base_model.model.transformer.
# h.<i>.<module>.lora_A.weight / lora_B.weight), for a GPT-2 model directory
# (its loom_config.json or config.json gives the shapes). A is uniform within
# 1/sqrt(in) (LoRA's init), B uniform within 0.5: a trained adapter's scale,
# not the zero B training starts from.
#   peft_adapter.py OUT_DIR MODEL_DIR RANK ALPHA SEED MODULE[,MODULE...]
# MODULE: attn.c_attn, attn.c_proj, mlp.c_fc or mlp.c_proj.
import json
import os
import random
import struct
import sys

out, model_dir, rank, alpha, seed, modules = sys.argv[1:7]
rank, alpha, modules = int(rank), float(alpha), modules.split(",")
path = os.path.join(model_dir, "loom_config.json")
cfg = json.load(open(path if os.path.exists(path) else os.path.join(model_dir, "config.json")))
C, F, L = cfg["n_embd"], cfg["d_ff"], cfg["n_layer"]
shape = {"attn.c_attn": (3 * C, C), "attn.c_proj": (C, C), "mlp.c_fc": (F, C), "mlp.c_proj": (C, F)}
rng = random.Random(int(seed))
tensors = []  # (key, shape, values)
for layer in range(L):
    for m in modules:
        o, i = shape[m]
        key = f"base_model.model.transformer.h.{layer}.{m}"
        a = 1.0 / i ** 0.5
        tensors.append((key + ".lora_A.weight", (rank, i), [rng.uniform(-a, a) for _ in range(rank * i)]))
        tensors.append((key + ".lora_B.weight", (o, rank), [rng.uniform(-0.5, 0.5) for _ in range(o * rank)]))
header, blobs, at = {}, [], 0
for key, shp, values in tensors:
    blob = struct.pack(f"<{len(values)}f", *values)
    header[key] = {"dtype": "F32", "shape": list(shp), "data_offsets": [at, at + len(blob)]}
    blobs.append(blob)
    at += len(blob)
head = json.dumps(header).encode()
head += b" " * (-len(head) % 8)
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "adapter_model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(head)) + head + b"".join(blobs))
json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
           "target_modules": modules, "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": True,
           "base_model_name_or_path": model_dir}, open(os.path.join(out, "adapter_config.json"), "w"))
