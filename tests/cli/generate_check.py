"""loom generate through the engine, end to end (CTest Cli.GenerateEngineOptions).

Usage: generate_check.py LOOM WORKDIR TOKENIZER_DIR

On a tiny random GPT-2 with GPT-2's vocabulary: --json objects carry what
they claim (one per prompt and sample, counts, tokens, logprobs with the top
N); a prompt's greedy output is the same alone, beside another prompt and as
each of n samples; a stop string found in the greedy text ends the text just
before it with finish_reason stop; the streamed text equals the JSON text; a
seed repeats its samples; bf16 weights and KV cache run; a Hugging Face
model's generation_config.json eos_token_id list ends a sample at any of its
ids, as transformers' generate and vLLM stop.
"""
import json
import shutil
import subprocess
import sys

loom, work, tok = sys.argv[1:4]
shutil.rmtree(work, ignore_errors=True)
subprocess.run([loom, "init-model", "--preset", "gpt2-tiny", "--set", "vocab_size=50257", "--seed", "1",
                "--out", f"{work}/m"], check=True, stdout=subprocess.DEVNULL)


def generate(*args, json_out=True):
    cmd = [loom, "generate", "--model", f"{work}/m", "--tokenizer", tok, *args] + (["--json"] if json_out else [])
    out = subprocess.run(cmd, check=True, capture_output=True).stdout.decode()
    return [json.loads(line) for line in out.splitlines()] if json_out else out


def check(cond, what):
    if not cond:
        print("FAILED:", what)
        sys.exit(1)


A, B = "The jury said", "Hello world, this is a longer prompt about the weather"
both = generate("--prompt", A, "--prompt", B, "-n", "2", "--max-tokens", "12", "--temperature", "0",
                "--logprobs", "3")
check([(o["prompt_index"], o["index"]) for o in both] == [(0, 0), (0, 1), (1, 0), (1, 1)], "one object per sample")
for o in both:
    check(o["completion_tokens"] == 12 and len(o["tokens"]) == 12 and o["finish_reason"] == "length", "counts")
    check(len(o["logprobs"]) == 12 and all(len(t["top_logprobs"]) == 3 for t in o["logprobs"]), "logprobs")
    check(all(t["logprob"] <= 0 for t in o["logprobs"]), "log-probabilities are <= 0")
    check(o["stop"] is None, "no stop string")
check(both[0]["tokens"] == both[1]["tokens"], "greedy samples of one prompt are equal")
check(both[0]["prompt_tokens"] == 3, "prompt tokens")

alone = generate("--prompt", A, "--max-tokens", "12", "--temperature", "0", "--logprobs", "3")[0]
check(alone["tokens"] == both[0]["tokens"] and alone["logprobs"] == both[0]["logprobs"],
      "a prompt's greedy tokens and logprobs are the same alone and beside another")

text = alone["text"]
stop = text[len(text) // 2:len(text) // 2 + 3]
check(len(stop) == 3, f"a stop string from the greedy text {text!r}")
stopped = generate("--prompt", A, "--max-tokens", "12", "--temperature", "0", "--stop", stop, "--stop", "zzzz")[0]
check(stopped["text"] == text[:text.find(stop)], f"the text ends before {stop!r}: {stopped['text']!r}")
check(stopped["finish_reason"] == "stop" and stopped["stop"] == stop, "finish_reason stop, the stop string named")

streamed = generate("--prompt", A, "--max-tokens", "12", "--temperature", "0", json_out=False)
check(streamed == A + text + "\n", f"streamed text {streamed!r}")

s1 = generate("--prompt", A, "-n", "2", "--max-tokens", "8", "--seed", "7")
s2 = generate("--prompt", A, "-n", "2", "--max-tokens", "8", "--seed", "7")
check(s1 == s2, "a seed repeats its samples")
check(s1[0]["tokens"] != s1[1]["tokens"], "the n samples draw their own tokens")

low = generate("--prompt", A, "--max-tokens", "6", "--dtype", "bf16", "--kv-dtype", "bf16", "--temperature", "0")
check(low[0]["completion_tokens"] == 6, "bf16 weights and KV cache")
# The same weights as a Hugging Face directory, whose generation_config.json
# lists a token the greedy text makes as an end of sequence.
subprocess.run([loom, "convert", "--to", "hf", "--model", f"{work}/m", "--out", f"{work}/hf", "--tokenizer", tok],
               check=True, stdout=subprocess.DEVNULL)
end = alone["tokens"][4]
first = alone["tokens"].index(end)
with open(f"{work}/hf/generation_config.json", "w") as f:
    json.dump({"bos_token_id": 50256, "eos_token_id": [50256, end]}, f)
cmd = [loom, "generate", "--model", f"{work}/hf", "--prompt", A, "--max-tokens", "12", "--temperature", "0", "--json"]
eos = json.loads(subprocess.run(cmd, check=True, capture_output=True).stdout.decode())
check(eos["finish_reason"] == "stop" and eos["tokens"] == alone["tokens"][:first + 1],
      f"generation_config.json's eos_token_id {end} ends the sample there: {eos}")
print("generate-ok")
