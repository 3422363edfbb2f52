# Slurm clusters under a temporary directory, for tests: munged with a
# generated key, slurmctld and slurmd with a generated slurm.conf (cons_tres,
# MpiDefault=pmix), every daemon stopped by PID afterwards. Sourced, not run:
#   . tests/slurm/cluster.sh
#   slurm_up DIR             # one node, "localhost"; exports SLURM_CONF
#   slurm_up_two_hosts DIR   # nodes node1 and node2, each in a network
#                            # namespace of its own joined by a veth pair;
#                            # run clients inside node1's: slurm_on_node1 srun ...
#   slurm_down               # stops every daemon (and job step) it started
# Needs root (slurmd starts tasks as the submitting user; namespaces) and
# Debian's slurmctld, slurmd, slurm-client, munge (and iproute2 for two hosts).

SLURM_PIDS=()
SLURM_NETNS=()

slurm_free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# munged on its own socket with a fresh key (munged refuses a key others can read).
slurm_start_munge() {
  local d=$1
  mkdir -p "$d"/{munge,state,spool,log}
  chmod 711 "$d/munge"
  dd if=/dev/urandom of="$d/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$d/munge/munge.key"
  munged --key-file="$d/munge/munge.key" --socket="$d/munge/munge.sock" --pid-file="$d/munge/munged.pid" \
         --log-file="$d/log/munged.log" --seed-file="$d/munge/seed" --foreground --force > "$d/log/munged.out" 2>&1 &
  SLURM_PIDS+=($!)
}

# slurm_write_conf DIR CONTROLLER CTL_PORT SLURMD_PORT NODE_LINES PARTITION_NODES
slurm_write_conf() {
  cat > "$1/slurm.conf" <<CONF
ClusterName=loomtest
SlurmctldHost=$2
SlurmctldPort=$3
SlurmdPort=$4
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$1/munge/munge.sock
StateSaveLocation=$1/state
SlurmdSpoolDir=$1/spool/%n
TmpFS=$1/tmp/%n
SlurmctldPidFile=$1/slurmctld.pid
SlurmdPidFile=$1/slurmd_%n.pid
SlurmctldLogFile=$1/log/slurmctld.log
SlurmdLogFile=$1/log/slurmd_%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=30
MinJobAge=2
SchedulerType=sched/backfill
$5
PartitionName=test Nodes=$6 Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
CONF
  export SLURM_CONF=$1/slurm.conf
}

# Eight CPUs a node at least, whatever the machine has: the tests start up to
# eight small tasks on two cores (slurmd takes the config's count).
slurm_node_cpus() {
  local cpus
  cpus=$(nproc)
  ((cpus >= 8)) || cpus=8
  echo "$cpus"
}

# slurm_wait_nodes N: until N nodes are idle (30 s).
slurm_wait_nodes() {
  local i
  for i in $(seq 1 60); do
    [[ $("${SLURM_CLIENT[@]}" sinfo -h -N -o '%T' 2> /dev/null | grep -c -E '^(idle|mixed|allocated)') -ge $1 ]] && return 0
    sleep 0.5
  done
  echo "slurm: the nodes did not come up within 30 s; logs in $SLURM_TEST_DIR/log" >&2
  tail -n 20 "$SLURM_TEST_DIR"/log/* >&2
  return 1
}

slurm_up() {
  SLURM_TEST_DIR=$1
  SLURM_CLIENT=()
  local d=$1 cpus
  slurm_start_munge "$d"
  mkdir -p "$d/spool/localhost" "$d/tmp/localhost"
  cpus=$(slurm_node_cpus)
  slurm_write_conf "$d" localhost "$(slurm_free_port)" "$(slurm_free_port)" \
    "NodeName=localhost CPUs=$cpus Sockets=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=1024 State=UNKNOWN" localhost
  slurmctld -D -i -f "$d/slurm.conf" > "$d/log/slurmctld.out" 2>&1 &
  SLURM_PIDS+=($!)
  slurmd -D -N localhost -f "$d/slurm.conf" > "$d/log/slurmd.out" 2>&1 &
  SLURM_PIDS+=($!)
  slurm_wait_nodes 1
}

# Two "hosts" on this machine: network namespaces A (node1, 10.77.0.1; it
# also runs slurmctld and the clients) and B (node2, 10.77.0.2) joined by a
# veth pair. Each daemon also has its own hostname (a UTS namespace:
# slurmctld checks it is SlurmctldHost) and each node its own TmpFS (DIR/tmp/
# NODE: Slurm's PMIx plugin keeps each step's files there, under the same
# name on every node). The filesystem is otherwise shared, as a cluster's
# shared filesystem is.
slurm_up_two_hosts() {
  SLURM_TEST_DIR=$1
  local d=$1 cpus a="loomslurm$$a" b="loomslurm$$b" va="lsa$$" vb="lsb$$"  # interface names: 15 characters at most
  # 77: this machine cannot make the namespaces (a chroot, a container
  # without CAP_NET_ADMIN): the caller skips.
  # `ip netns add` makes /run/netns a mount point of its own and leaves it;
  # the cleanup unmounts it again if this test made it (a fresh root's
  # removal would fail on it).
  mountpoint -q /run/netns 2> /dev/null || SLURM_NETNS_MOUNT=1
  ip netns add "$a" && SLURM_NETNS+=("$a") || return 77
  ip netns add "$b" && SLURM_NETNS+=("$b") || return 77
  nsenter --net="/run/netns/$a" true || return 77
  ip link add "$va" type veth peer name "$vb" || return 77
  ip link set "$va" netns "$a" && ip link set "$vb" netns "$b" || return 77
  ip -n "$a" addr add 10.77.0.1/24 dev "$va" && ip -n "$b" addr add 10.77.0.2/24 dev "$vb" || return 77
  ip -n "$a" link set lo up && ip -n "$b" link set lo up || return 77
  ip -n "$a" link set "$va" up && ip -n "$b" link set "$vb" up || return 77
  SLURM_CLIENT=(nsenter --net="/run/netns/$a")
  slurm_start_munge "$d"
  mkdir -p "$d/spool/node1" "$d/spool/node2" "$d/tmp/node1" "$d/tmp/node2"
  cpus=$(slurm_node_cpus)
  slurm_write_conf "$d" "node1(10.77.0.1)" 6817 6818 \
    "NodeName=node1 NodeAddr=10.77.0.1 CPUs=$cpus Sockets=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=1024
NodeName=node2 NodeAddr=10.77.0.2 CPUs=$cpus Sockets=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=1024" node1,node2
  nsenter --net="/run/netns/$a" unshare --uts sh -c "hostname node1 && exec slurmctld -D -i -f '$d/slurm.conf'" \
    > "$d/log/slurmctld.out" 2>&1 &
  SLURM_PIDS+=($!)
  local n ns
  for n in 1 2; do
    ns=$a
    [[ $n == 2 ]] && ns=$b
    nsenter --net="/run/netns/$ns" unshare --uts sh -c "hostname node$n && exec slurmd -D -N node$n -f '$d/slurm.conf'" \
      > "$d/log/slurmd$n.out" 2>&1 &
    SLURM_PIDS+=($!)
  done
  slurm_wait_nodes 2
}

slurm_on_node1() { "${SLURM_CLIENT[@]}" "$@"; }

slurm_down() {
  local pid conf=${SLURM_CONF:-}
  for pid in "${SLURM_PIDS[@]}"; do kill "$pid" 2> /dev/null || true; done
  # Job steps still running (slurmstepd outlives slurmd): those of this
  # cluster carry its SLURM_CONF in their environment.
  if [[ -n $conf ]]; then
    for pid in $(pgrep -x slurmstepd); do
      tr '\0' '\n' 2> /dev/null < "/proc/$pid/environ" | grep -q -x "SLURM_CONF=$conf" && kill -9 "$pid" 2> /dev/null
    done
  fi
  for pid in "${SLURM_PIDS[@]}"; do
    for _ in $(seq 1 50); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2> /dev/null || true
  done
  for ns in "${SLURM_NETNS[@]}"; do ip netns del "$ns" 2> /dev/null || true; done  # the veth pair goes with them
  if [ -n "${SLURM_NETNS_MOUNT:-}" ] && [ -z "$(ls -A /run/netns 2> /dev/null)" ]; then
    umount /run/netns 2> /dev/null || true
  fi
  SLURM_PIDS=() SLURM_NETNS=() SLURM_NETNS_MOUNT=""
}
