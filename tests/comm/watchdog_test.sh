#!/bin/sh
# Driver of the mpi.comm.Watchdog* tests:
#   watchdog_test.sh MODE HANG_PROBE MPIRUN [mpirun flags...]
# Rank 1 of 3 sleeps 30 s (MODE exit: leaves the job's collectives and
# returns from main); the timeout is 2 s; the others wait (MODE wait, exit),
# poll test() (MODE test) or destroy the communicator with the op pending
# (MODE destroy). Passes when mpirun exits non-zero within 2 + 5 s of rank 0
# starting to wait, the message names the op, its sequence number, the
# communicator and rank 1 (and, for destroy, that the communicator was
# destroyed with it pending; for exit, that rank 1 did not answer, and never
# rank 2, which arrived), and no process of this job is left running.
mode=$1
probe=$2
shift 2
marker="loom-watchdog-$$"
out=$("$@" -np 3 "$probe" 2 1 30 "$marker" "$mode" 2>&1)
rc=$?
end=$(date +%s.%N)
echo "$out"
echo "mpirun exit status: $rc"
fail() { echo "FAIL: $1"; exit 1; }
[ "$rc" -ne 0 ] || fail "mpirun exited 0"
start=$(echo "$out" | sed -n 's/^probe: rank 0 waits on the second all_reduce at \([0-9.]*\)$/\1/p')
[ -n "$start" ] || fail "rank 0 never reached the second all_reduce"
elapsed=$(awk "BEGIN { print $end - $start }")
echo "abort took $elapsed s after rank 0 started waiting"
awk "BEGIN { exit !($elapsed < 7) }" || fail "took $elapsed s, more than timeout + 5 s"
op="all_reduce(f32, 4 elements, sum) #2 on communicator 'probe\[ranks 0,1,2\]'"
prefix=""
[ "$mode" = destroy ] && prefix="communicator 'probe\[ranks 0,1,2\]' was destroyed with unfinished operations (all_reduce(f32, 4 elements, sum) #2); "
blame="ranks that did not arrive: 1 (world rank 1) (last issued #1)"
[ "$mode" = exit ] && blame="ranks that did not answer (exited, failed or stuck): 1 (world rank 1)\."
echo "$out" | grep -q "comm watchdog: $prefix$op did not complete within 2 s; $blame" \
  || fail "the watchdog message does not name the op, #2, the communicator and rank 1"
if echo "$out" | grep "comm watchdog" | grep -q "world rank 2"; then fail "the watchdog blames rank 2, which arrived"; fi
sleep 1
if pgrep -f "$marker" > /dev/null; then fail "processes of the job are still running"; fi
echo "PASS"
