# A one-node Slurm cluster under a temporary directory, for tests: munged with
# a generated key, slurmctld and slurmd with a generated slurm.conf
# (NodeName=localhost, CPUs from nproc but at least 8, cons_tres, MpiDefault=pmix). Sourced,
# not run:
#   . tests/slurm/cluster.sh
#   slurm_up DIR          # starts the daemons, waits for the node; exports SLURM_CONF
#   ... srun / sbatch ...
#   slurm_down            # stops every daemon it started, by PID
# Needs root (slurmd starts tasks as the submitting user) and Debian's
# slurmctld, slurmd, slurm-client and munge.

slurm_free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

slurm_up() {
  SLURM_TEST_DIR=$1
  mkdir -p "$SLURM_TEST_DIR"/{munge,state,spool,log}
  chmod 711 "$SLURM_TEST_DIR/munge"
  local d=$SLURM_TEST_DIR
  SLURM_PIDS=()
  # munge: a fresh key, its own socket; munged refuses a key others can read.
  dd if=/dev/urandom of="$d/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$d/munge/munge.key"
  munged --key-file="$d/munge/munge.key" --socket="$d/munge/munge.sock" --pid-file="$d/munge/munged.pid" \
         --log-file="$d/log/munged.log" --seed-file="$d/munge/seed" --foreground --force > "$d/log/munged.out" 2>&1 &
  SLURM_PIDS+=($!)
  local ctl_port slurmd_port cpus
  ctl_port=$(slurm_free_port)
  slurmd_port=$(slurm_free_port)
  # Eight CPUs at least, whatever the machine has: the tests start up to
  # eight small tasks on two cores (slurmd takes the config's count).
  cpus=$(nproc)
  ((cpus >= 8)) || cpus=8
  cat > "$d/slurm.conf" <<CONF
ClusterName=loomtest
SlurmctldHost=localhost
SlurmctldPort=$ctl_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$d/munge/munge.sock
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd.log
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
NodeName=localhost CPUs=$cpus Sockets=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=1024 State=UNKNOWN
PartitionName=test Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
CONF
  export SLURM_CONF=$d/slurm.conf
  slurmctld -D -i -f "$d/slurm.conf" > "$d/log/slurmctld.out" 2>&1 &
  SLURM_PIDS+=($!)
  slurmd -D -N localhost -f "$d/slurm.conf" > "$d/log/slurmd.out" 2>&1 &
  SLURM_PIDS+=($!)
  local i
  for i in $(seq 1 60); do
    if sinfo -h -N -o '%T' 2>/dev/null | grep -q -E '^(idle|mixed|allocated)'; then return 0; fi
    sleep 0.5
  done
  echo "slurm_up: the node did not come up within 30 s; logs in $d/log" >&2
  tail -20 "$d"/log/*.log "$d"/log/*.out >&2
  return 1
}

slurm_down() {
  local pid
  for pid in "${SLURM_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${SLURM_PIDS[@]}"; do
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  SLURM_PIDS=()
}
