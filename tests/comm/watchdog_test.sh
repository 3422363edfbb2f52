#!/bin/sh
# Driver of mpi.comm.WatchdogAbortsJobNamingTheMissingRank:
#   watchdog_test.sh HANG_PROBE MPIRUN [mpirun flags...]
# Rank 1 of 3 sleeps 30 s; the timeout is 2 s. Passes when mpirun exits
# non-zero within 2 + 5 s of rank 0 starting to wait, the message names the
# op, its sequence number, the communicator and rank 1, and no process of
# this job is left running.
probe=$1
shift
marker="loom-watchdog-$$"
out=$("$@" -np 3 "$probe" 2 1 30 "$marker" 2>&1)
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
echo "$out" | grep -q "comm watchdog: all_reduce(f32, 4 elements, sum) #2 on communicator 'probe\[ranks 0,1,2\]' did not complete within 2 s; ranks that did not arrive: 1 (world rank 1) (last issued #1)" \
  || fail "the watchdog message does not name the op, #2, the communicator and rank 1"
sleep 1
if pgrep -f "$marker" > /dev/null; then fail "processes of the job are still running"; fi
echo "PASS"
