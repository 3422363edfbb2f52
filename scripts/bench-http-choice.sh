#!/usr/bin/env bash
# Re-measures the HTTP library choice behind loom serve (BENCHMARKS.md "HTTP
# library"): cpp-httplib 0.11.4 (thread pool of 8, 256, 1024) against
# Boost.Beast 1.81 on one Asio thread, each streaming C concurrent responses
# of 100 events 50 ms apart (bench/http_choice/drive.mjs prints one JSON line
# per run). cpp-httplib is not a loom dependency: this script installs
# Debian's libcpp-httplib-dev if it is missing (root or sudo).
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$out"' EXIT
if ! dpkg-query -W -f='${Status}' libcpp-httplib-dev 2>/dev/null | grep -q "install ok installed"; then
  sudo=""; [[ $(id -u) -eq 0 ]] || sudo=sudo
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libcpp-httplib-dev >/dev/null
fi
g++ -O2 -std=c++20 bench/http_choice/httplib_stream.cpp -o "$out/httplib_stream" -lcpp-httplib -lpthread
g++ -O2 -std=c++20 bench/http_choice/beast_stream.cpp -o "$out/beast_stream" -lpthread
ulimit -n 8192
# run NAME CLIENTS... : start the server (the rest of the command line after NAME), drive it.
drive() {
  local label=$1 port=$2 clients=$3
  shift 3
  "$@" 2>/dev/null &
  local pid=$!
  sleep 0.5
  echo "$label $(node bench/http_choice/drive.mjs "$port" "$pid" "$clients" 100 50)"
  kill "$pid"
  wait "$pid" 2>/dev/null || true
}
for c in 200 1000; do
  drive "beast-1-thread" 18181 "$c" "$out/beast_stream" 18181
  drive "httplib-pool-1024" 18182 "$c" "$out/httplib_stream" 18182 1024
  drive "httplib-pool-256" 18183 "$c" "$out/httplib_stream" 18183 256
done
# cpp-httplib's default pool (8 threads here): streams run 8 at a time, so
# 200 take ~25 x 5 s; 1000 would take ten minutes and are not run.
drive "httplib-pool-8" 18184 200 "$out/httplib_stream" 18184 8
echo "measured on: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(date -u +%F)"
echo "command: bash scripts/bench-http-choice.sh"
