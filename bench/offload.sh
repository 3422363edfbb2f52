#!/usr/bin/env bash
# ZeRO-Infinity's disk tier measured (BENCHMARKS.md "ZeRO-Infinity"):
#   bench/offload.sh LOOM WORK [PRESET] [STEPS]
# WORK must be on the disk to measure (the offload files and fio's go there).
#  1. The disk's own sequential bandwidth by fio (pinned by Debian 12: 3.33),
#     4 MiB blocks, O_DIRECT, 1 GiB: one synchronous thread (psync), two
#     threads of pread/pwrite (what loom's I/O thread pool is), and io_uring
#     with 4 blocks in flight (the offload streams' depth); then `loom bench
#     offload` (io::OffloadFile: 2 threads, 4 records in flight, CRC-32C) on
#     the same disk, so the engines are compared in one run.
#  2. PRESET (default gpt2-350m), fp32, one process, ZeRO 3, 4 x 128 tokens a
#     step, STEPS steps (default 4) with parallel.offload = none, optimizer
#     and params: tokens/s (median of the steps after the first), the disk's
#     bytes a step, the seconds compute waited for reads and the optimizer
#     step's seconds, and the process's peak resident set (getrusage).
set -euo pipefail
loom=$(realpath "$1") work=$2 preset=${3:-gpt2-350m} steps=${4:-4}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$work" && work=$(realpath "$work")
[ -e "$root/data/brown/train_000000.bin" ] ||
  { echo "bench/offload.sh: needs data/brown (bash scripts/quickstart.sh)"; exit 1; }
echo "bench/offload.sh: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores," \
  "$(free -g | awk '/Mem:/ {print $2}') GiB; disk: $(df --output=source,fstype "$work" | tail -1)"
echo "reproduce: bench/offload.sh $loom $work $preset $steps"

# fio_rate ENGINE JOBS DEPTH RW: MB/s of one fio job group.
fio_rate() {
  rm -f "$work"/fio.*
  fio --name=fio --directory="$work" --rw="$4" --bs=4M --size=1G --direct=1 --ioengine="$1" --numjobs="$2" \
    --iodepth="$3" --group_reporting --output-format=json --end_fsync=1 --fallocate=native 2>/dev/null |
    python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; k="read" if j["read"]["bw_bytes"] else "write"
print("%.0f" % (j[k]["bw_bytes"] / 1e6))'
}
if command -v fio > /dev/null; then
  echo "fio $(fio --version): MB/s, 4 MiB blocks, O_DIRECT"
  echo "| engine | threads | in flight | write | read |"
  echo "|---|---|---|---|---|"
  for cfg in "psync 1 1" "psync 2 1" "io_uring 1 4"; do
    set -- $cfg
    w=$(fio_rate "$1" "$2" "$3" write)
    r=$(fio_rate "$1" "$2" "$3" read)
    echo "| $1 | $2 | $(( $2 * $3 )) | $w | $r |"
  done
  rm -f "$work"/fio.*
else
  echo "fio not installed (apt-get install fio): the disk's own rates skipped"
fi
"$loom" bench offload --dir "$work" --size 1G --record 4M

cat > "$work/run.toml" <<EOF
[model]
preset = "$preset"
[data]
train = "$root/data/brown/train_*.bin"
[train]
seq_len = 128
micro_batch = 4
steps = $steps
dtype = "fp32"
eval_every = 0
[parallel]
zero_stage = 3
[log]
every = 1000
peak_tflops = 1.0
EOF
echo "| offload | tokens/s | vs none | disk GB/step | waited s/step | update s/step | step s | peak RSS MiB |"
echo "|---|---|---|---|---|---|---|---|"
none=0
for mode in none optimizer params; do
  rm -rf "$work/off" "$work/$mode.jsonl"
  sets=(--set "log.metrics=$work/$mode.jsonl")
  if [ "$mode" != none ]; then
    sets+=(--set "parallel.offload=$mode" --set "parallel.offload_dir=$work/off" --set parallel.offload_budget_mb=64)
  fi
  python3 - "$work/$mode.jsonl" "$mode" "$none" "$loom" train --config "$work/run.toml" --threads "$(nproc)" \
    "${sets[@]}" <<'EOF' > "$work/$mode.row"
import json, resource, statistics, subprocess, sys
path, mode, none, cmd = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]
p = subprocess.run(cmd, capture_output=True, text=True)
if p.returncode != 0:
    sys.exit("bench/offload.sh: %s failed:\n%s" % (mode, p.stderr[-3000:]))
rows = [json.loads(l) for l in open(path) if '"loss"' in l][1:]
tps = statistics.median(r["tokens_per_s"] for r in rows)
gb = statistics.median(r.get("disk_bytes", 0) for r in rows) / 1e9
wait = statistics.median(r.get("disk_wait_s", 0) for r in rows)
upd = statistics.median(r.get("disk_update_s", 0) for r in rows)
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print("| %s | %.1f | %.2f | %.2f | %.2f | %.2f | %.2f | %.0f |" %
      (mode, tps, tps / none if none else 1.0, gb, wait, upd, 512 / tps, rss))
print("%.3f" % tps)
EOF
  head -1 "$work/$mode.row"
  if [ "$mode" = none ]; then none=$(tail -1 "$work/$mode.row"); fi
done
rm -rf "$work/off"
