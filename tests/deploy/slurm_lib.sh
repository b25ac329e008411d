# shellcheck shell=bash
# slurm_lib.sh - a throw-away one-node Slurm cluster for tests (sourced).
#   slurm_start DIR [NGPUS]
#                     writes DIR/slurm.conf (node "localhost" on 127.0.0.1,
#                     auth/none, no cgroups, state under DIR), starts
#                     slurmctld and slurmd, waits until the node is idle,
#                     exports SLURM_CONF.  Returns non-zero on failure.
#                     NGPUS > 0: that many stand-in GPUs (gres/gpu on
#                     character devices made with mknod, alike /dev/null)
#                     so --gpus-per-task binding (CUDA_VISIBLE_DEVICES) is
#                     real Slurm behaviour; SLURM_TEST_GPUS says how many
#                     there are (0 where mknod is not allowed).
#   slurm_stop        stops both daemons (and what they left).
#   free_port         prints a TCP port nobody listens on.
# Needs root (slurmd launches jobs as the submitting user) and the
# Debian packages slurmctld, slurmd, slurm-client.

SLURM_CTLD_PID=
SLURM_D_PID=

free_port() {
  # below the kernel's ephemeral range: a port there can be some open
  # connection's local end, which a connect() probe does not see and
  # bind() then refuses (CI, 2026-12-03: slurmd "Address already in use")
  local p lo
  lo=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null)
  [ -n "$lo" ] && [ "$lo" -gt 12000 ] || lo=32768
  for _ in $(seq 1 50); do
    p=$((10000 + RANDOM % (lo - 10000)))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$p"; return 0
    fi
  done
  return 1
}

slurm_available() {
  [ "$(id -u)" = 0 ] && command -v slurmctld >/dev/null &&
    command -v slurmd >/dev/null && command -v sbatch >/dev/null
}

# Up to three tries: a daemon that could not bind its port (taken
# between free_port and the bind) is retried on fresh ports.
slurm_start() {
  local try
  for try in 1 2 3; do
    slurm_start_once "$@" && return 0
    grep -qs "Address already in use" "$1"/slurmctld.log "$1"/slurmd.log \
      "$1"/slurmctld.out "$1"/slurmd.out || return 1
    slurm_stop
    echo "slurm_start: a port was taken, try $((try + 1))" >&2
    rm -rf "$1"/slurmctld.log "$1"/slurmd.log "$1"/slurmctld.out \
      "$1"/slurmd.out "$1"/state "$1"/spool
  done
  return 1
}

slurm_start_once() {
  local dir=$1 ngpus=${2:-0} ctld_port d_port cpus gres="" i
  ctld_port=$(free_port) && d_port=$(free_port) || return 1
  [ "$d_port" != "$ctld_port" ] || d_port=$(free_port) || return 1
  cpus=8   # more than the machine has: config_overrides lets jobs share it
  mkdir -p "$dir/state" "$dir/spool" || return 1
  SLURM_TEST_GPUS=0
  if [ "$ngpus" -gt 0 ]; then
    for i in $(seq 0 $((ngpus - 1))); do
      [ -c "$dir/gpu$i" ] || mknod "$dir/gpu$i" c 1 3 2>/dev/null || break
      SLURM_TEST_GPUS=$((i + 1))
    done
  fi
  if [ "$SLURM_TEST_GPUS" -gt 0 ]; then
    gres="Gres=gpu:$SLURM_TEST_GPUS"
    echo "NodeName=localhost Name=gpu File=$dir/gpu[0-$((SLURM_TEST_GPUS - 1))]" \
      >"$dir/gres.conf"
  fi
  cat >"$dir/slurm.conf" <<EOF
ClusterName=batontest
GresTypes=gpu
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=${SLURM_TEST_SELECT:-CR_CPU_Memory}
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=5
MessageTimeout=10
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=2
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=${SLURM_TEST_MEM:-4000} $gres State=UNKNOWN
PartitionName=test Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
  export SLURM_CONF=$dir/slurm.conf
  BATON_TEST_SLURM=$SLURM_CONF slurmctld -D -i -f "$SLURM_CONF" \
    >"$dir/slurmctld.out" 2>&1 &
  SLURM_CTLD_PID=$!
  BATON_TEST_SLURM=$SLURM_CONF slurmd -D -N localhost -f "$SLURM_CONF" \
    >"$dir/slurmd.out" 2>&1 &
  SLURM_D_PID=$!
  local state=""
  for _ in $(seq 1 100); do
    state=$(timeout 5 sinfo -h -N -o '%t' 2>/dev/null)
    [ "$state" = idle ] && return 0
    kill -0 $SLURM_CTLD_PID 2>/dev/null && kill -0 $SLURM_D_PID 2>/dev/null ||
      break
    sleep 0.2
  done
  echo "slurm_start: node state '$state'" >&2
  tail -n 20 "$dir/slurmctld.log" "$dir/slurmd.log" "$dir/slurmctld.out" \
    "$dir/slurmd.out" >&2 2>/dev/null
  return 1
}

slurm_stop() {
  local p
  for p in $SLURM_D_PID $SLURM_CTLD_PID; do
    kill -TERM "$p" 2>/dev/null
  done
  for _ in $(seq 1 50); do
    kill -0 $SLURM_D_PID 2>/dev/null || kill -0 $SLURM_CTLD_PID 2>/dev/null ||
      break
    sleep 0.1
  done
  for p in $SLURM_D_PID $SLURM_CTLD_PID; do
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  SLURM_D_PID='' SLURM_CTLD_PID=''
}

# job_pids JOBID: pids of processes that run in Slurm job JOBID of this
# test cluster (from their environment), slurmstepd aside.
job_pids() {
  local e pid
  for e in /proc/[0-9]*/environ; do
    pid=${e#/proc/}; pid=${pid%/environ}
    grep -qzx "SLURM_JOB_ID=$1" "$e" 2>/dev/null &&
      grep -qzx "SLURM_CONF=$SLURM_CONF" "$e" 2>/dev/null && echo "$pid"
  done
}

# daemon_pids: the daemons of this test cluster and the slurmstepd they
# started (marked with BATON_TEST_SLURM in their environment).
daemon_pids() {
  local e pid
  for e in /proc/[0-9]*/environ; do
    pid=${e#/proc/}; pid=${pid%/environ}
    grep -qzx "BATON_TEST_SLURM=$SLURM_CONF" "$e" 2>/dev/null && echo "$pid"
  done
}

# slurm_kill_leftovers JOBID...: SIGKILL whatever the jobs and the
# daemons left (after a failure; a clean run leaves nothing).
slurm_kill_leftovers() {
  local j p
  for j in "$@"; do
    for p in $(job_pids "$j"); do kill -KILL "$p" 2>/dev/null; done
  done
  for p in $(daemon_pids); do kill -KILL "$p" 2>/dev/null; done
}
