"""Whether loom's `generate --json` and llama_cpp_greedy.mjs's line for one
prompt agree: the same number of prompt tokens and the same greedy tokens.
Prints one line; exit status 0 when they agree.

    same_greedy.py LOOM.json LLAMA_CPP.json PROMPT
"""
import json
import sys

loom, ref, prompt = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
ok = loom["prompt_tokens"] == len(ref["prompt_tokens"]) and loom["tokens"] == ref["tokens"]
print(f"{prompt!r}: prompt {loom['prompt_tokens']} vs {len(ref['prompt_tokens'])} tokens; "
      f"loom {loom['tokens']}; llama.cpp {ref['tokens']}: {'same' if ok else 'DIFFERENT'}")
sys.exit(0 if ok else 1)
