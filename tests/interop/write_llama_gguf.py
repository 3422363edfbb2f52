#!/usr/bin/env python3
"""An independent GGUF writer (written from ggml's docs/gguf.md with numpy,
sharing no code with loom's): a small llama-architecture model with random
f32 weights (GQA) and the SentencePiece vocabulary of a tokenizer.model, laid
out by llama.cpp's conventions (tensor names, ggml dimension order, q/k rows
as llama.cpp's converter permutes them). loom and llama.cpp then run the same
file (tests/interop/gguf_foreign.sh). With "normalizer" the file also
carries the tokenizer.model's normalizer as a "t5" GGUF would
(tokenizer.ggml.precompiled_charsmap, remove_extra_whitespaces), keys a
"llama" tokenizer in llama.cpp ignores.

    write_llama_gguf.py OUT.gguf TOKENIZER.model [SEED [normalizer]]
"""
import struct
import sys

import numpy as np
import sentencepiece as spm

U8, U32, I32, F32, BOOL, STRING, ARRAY = 0, 4, 5, 6, 7, 8, 9


def s(text):
    b = text.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, value):
    out = s(key) + struct.pack("<I", vtype)
    if vtype == U32:
        return out + struct.pack("<I", value)
    if vtype == F32:
        return out + struct.pack("<f", value)
    if vtype == BOOL:
        return out + struct.pack("<?", value)
    if vtype == STRING:
        return out + s(value)
    etype, items = value
    out += struct.pack("<IQ", etype, len(items))
    if etype == STRING:
        return out + b"".join(s(x) for x in items)
    return out + np.asarray(items, dtype={U8: "u1", I32: "<i4", F32: "<f4"}[etype]).tobytes()


def proto_fields(data):
    """(field number, value) of a serialized protobuf message, by wire type."""
    i = 0

    def varint():
        nonlocal i
        value = shift = 0
        while True:
            byte = data[i]
            i += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value

    while i < len(data):
        key = varint()
        wire = key & 7
        if wire == 0:
            yield key >> 3, varint()
        elif wire == 2:
            n = varint()
            yield key >> 3, data[i:i + n]
            i += n
        else:
            n = {1: 8, 5: 4}[wire]
            yield key >> 3, data[i:i + n]
            i += n


def charsmap(model_path):
    """ModelProto.normalizer_spec (field 3).precompiled_charsmap (field 2)."""
    spec = [v for f, v in proto_fields(open(model_path, "rb").read()) if f == 3][0]
    return [v for f, v in proto_fields(spec) if f == 2][0]


def vocab(model_path):
    sp = spm.SentencePieceProcessor(model_file=model_path)
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        # llama.cpp's token types: 1 normal, 2 unknown, 3 control, 4 user defined, 6 byte
        types.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else
                     5 if sp.is_unused(i) else 1)
    return sp, tokens, scores, types


def permute(w, n_head):  # llama.cpp's converter: halves of each head -> interleaved pairs
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def main():
    out, model_path = sys.argv[1], sys.argv[2]
    rng = np.random.default_rng(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
    sp, tokens, scores, types = vocab(model_path)
    V, C, NH, NKV, F, L, ctx = len(tokens), 64, 4, 2, 128, 2, 64
    HS = C // NH
    w = lambda *shape: (rng.standard_normal(shape) * 0.3).astype("<f4")  # noqa: E731 (wide: varied tokens)
    norm = lambda: (1 + 0.1 * rng.standard_normal(C)).astype("<f4")  # noqa: E731
    tensors = [("token_embd.weight", w(V, C)), ("output_norm.weight", norm()), ("output.weight", w(V, C))]
    for i in range(L):
        tensors += [(f"blk.{i}.attn_norm.weight", norm()),
                    (f"blk.{i}.attn_q.weight", permute(w(C, C), NH)),
                    (f"blk.{i}.attn_k.weight", permute(w(NKV * HS, C), NKV)),
                    (f"blk.{i}.attn_v.weight", w(NKV * HS, C)),
                    (f"blk.{i}.attn_output.weight", w(C, C)),
                    (f"blk.{i}.ffn_norm.weight", norm()),
                    (f"blk.{i}.ffn_gate.weight", w(F, C)),
                    (f"blk.{i}.ffn_up.weight", w(F, C)),
                    (f"blk.{i}.ffn_down.weight", w(C, F))]
    kvs = [kv("general.architecture", STRING, "llama"), kv("general.name", STRING, "foreign"),
           kv("llama.context_length", U32, ctx), kv("llama.embedding_length", U32, C),
           kv("llama.feed_forward_length", U32, F), kv("llama.block_count", U32, L),
           kv("llama.attention.head_count", U32, NH), kv("llama.attention.head_count_kv", U32, NKV),
           kv("llama.rope.freq_base", F32, 10000.0), kv("llama.rope.dimension_count", U32, HS),
           kv("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
           kv("tokenizer.ggml.model", STRING, "llama"), kv("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
           kv("tokenizer.ggml.scores", ARRAY, (F32, scores)), kv("tokenizer.ggml.token_type", ARRAY, (I32, types)),
           kv("tokenizer.ggml.bos_token_id", U32, sp.bos_id()), kv("tokenizer.ggml.eos_token_id", U32, sp.eos_id()),
           kv("tokenizer.ggml.unknown_token_id", U32, sp.unk_id()), kv("tokenizer.ggml.add_bos_token", BOOL, True)]
    if len(sys.argv) > 4 and sys.argv[4] == "normalizer":
        kvs += [kv("tokenizer.ggml.remove_extra_whitespaces", BOOL, True),
                kv("tokenizer.ggml.precompiled_charsmap", ARRAY, (U8, list(charsmap(model_path))))]
    infos, offset = b"", 0
    for name, t in tensors:
        dims = list(reversed(t.shape))  # ggml order: ne[0] varies fastest
        infos += s(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        infos += struct.pack("<IQ", 0, offset)  # type 0: f32
        offset += (t.nbytes + 31) // 32 * 32
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs) + infos
    with open(out, "wb") as f:
        f.write(head + b"\0" * (-len(head) % 32))
        for _, t in tensors:
            f.write(t.tobytes() + b"\0" * (-t.nbytes % 32))


if __name__ == "__main__":
    main()
