#!/usr/bin/env bash
# A real Slurm cluster on this machine, for tests and the demo: munged, slurmctld and one slurmd
# per host of the testbed (scripts/testbed.sh), each slurmd inside its host's network namespace.
#
#   scripts/slurm-local.sh up [N]   a cluster of the testbed's first N hosts (default: all of them);
#                                   idempotent (a running cluster of this testbed is replaced)
#   scripts/slurm-local.sh down     cancels its jobs, stops its daemons, removes its state
#   scripts/slurm-local.sh status   sinfo of the cluster, or exit 1 when it is not up
#   scripts/slurm-local.sh check    exit 0 when the daemons can run here, else exit 2 with the
#                                   reason (tests skip on it)
#
# The testbed comes first: MEGASCOPE_TESTBED=P scripts/testbed.sh up N. Slurm node <P><i> is the
# testbed host of that name; slurmd listens on its frontend address (NodeAddr) and slurmctld on
# this machine's end of the frontend bridge, 10.78.S.1. Everything lives in /run/megascope-slurm/<P>
# (configuration, munge key and socket, spool, logs). Use the cluster with
#   export SLURM_CONF=/run/megascope-slurm/<P>/slurm.conf
# then salloc, sbatch, srun, squeue as on any cluster. Ports: slurmctld 7000+2S, slurmd 7001+2S
# (S = $MEGASCOPE_TESTBED_SUBNET), so that two testbeds can each have their cluster.
set -euo pipefail

P=${MEGASCOPE_TESTBED:-msh}
S=${MEGASCOPE_TESTBED_SUBNET:-0}
[[ $S =~ ^[0-9]+$ ]] && ((S <= 255)) || { echo "slurm-local: MEGASCOPE_TESTBED_SUBNET must be 0..255" >&2; exit 2; }
D=/run/megascope-slurm/$P
HOSTS_FILE=/run/megascope-testbed/$P.hosts
CONF=$D/slurm.conf
HERE=$(cd "$(dirname "$0")" && pwd)

die() { echo "slurm-local: $*" >&2; exit 1; }

check() {
  local b
  for b in munged slurmctld slurmd srun salloc scontrol sinfo squeue scancel runuser nsenter unshare; do
    command -v "$b" >/dev/null ||
      { echo "slurm-local: '$b' is not installed (scripts/setup.sh installs slurm-wlm and munge)" >&2; return 2; }
  done
  id munge >/dev/null 2>&1 || { echo "slurm-local: no 'munge' user (reinstall munge)" >&2; return 2; }
  ((EUID == 0)) || { echo "slurm-local: the daemons need root" >&2; return 2; }
  MEGASCOPE_TESTBED=$P "$HERE/testbed.sh" check || return 2
}

pidfile_kill() {  # pid file
  [[ -s $1 ]] || return 0
  local pid
  pid=$(cat "$1")
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
}

down() {
  if [[ -f $CONF ]]; then
    # Jobs first: their steps end with them, before the daemons that would reap them go.
    SLURM_CONF=$CONF timeout 10 scancel --full --quiet --user=root 2>/dev/null || true
    for f in "$D"/nodes/*/slurmd.pid; do [[ -e $f ]] && pidfile_kill "$f"; done
    pidfile_kill "$D/ctld/slurmctld.pid"
  fi
  pidfile_kill "$D/munge/munged.pid"
  # A step daemon whose slurmd is gone: its processes live in a testbed host.
  for f in "$D"/nodes/*/slurmd.pid; do
    [[ -e $f ]] || continue
    local ns
    ns=$(basename "$(dirname "$f")")
    local pids
    pids=$(ip netns pids "$ns" 2>/dev/null | xargs -r ps -o pid= -o comm= -p 2>/dev/null | awk '$2 ~ /^slurmstepd/ {print $1}' || true)
    [[ -n $pids ]] && kill -9 $pids 2>/dev/null || true
  done
  rm -rf "$D"
  echo "slurm-local: down" >&2
}

up() {
  check || exit 2
  [[ -s $HOSTS_FILE ]] || die "no testbed '$P': bring it up first (MEGASCOPE_TESTBED=$P scripts/testbed.sh up N)"
  local names=() addrs=() name netns backend front rest
  while read -r name netns backend front rest; do
    [[ -z $name || $name == \#* ]] && continue
    names+=("$name")
    addrs+=("$front")
  done <"$HOSTS_FILE"
  local n=${1:-${#names[@]}}
  [[ $n =~ ^[0-9]+$ ]] && ((n >= 1 && n <= ${#names[@]})) ||
    die "usage: slurm-local.sh up [N] (1 <= N <= ${#names[@]}, the testbed's hosts)"
  down 2>/dev/null
  mkdir -p "$D/munge" "$D/ctld" "$D/node"
  # munge: a key of this cluster only, a socket of its own (the system's munged is not touched).
  head -c 1024 /dev/urandom >"$D/munge/munge.key"
  chown -R munge:munge "$D/munge"
  chmod 711 "$D/munge"
  chmod 400 "$D/munge/munge.key"
  runuser -u munge -- munged --key-file="$D/munge/munge.key" --socket="$D/munge/munge.socket" \
    --pid-file="$D/munge/munged.pid" --log-file="$D/munge/munged.log" --seed-file="$D/munge/munged.seed" ||
    die "munged did not start; see $D/munge/munged.log"
  local cpus nodes=""
  cpus=$(nproc)
  {
    echo "# written by scripts/slurm-local.sh: a cluster of the testbed '$P'"
    echo "ClusterName=megascope$P"
    echo "SlurmctldHost=$(hostname -s)(10.78.$S.1)"
    echo "SlurmctldPort=$((7000 + 2 * S))"
    echo "SlurmdPort=$((7001 + 2 * S))"
    echo "SlurmUser=root"
    echo "AuthType=auth/munge"
    echo "AuthInfo=socket=$D/munge/munge.socket"
    echo "CredType=cred/munge"
    echo "StateSaveLocation=$D/ctld"
    echo "SlurmctldPidFile=$D/ctld/slurmctld.pid"
    echo "SlurmctldLogFile=$D/ctld/slurmctld.log"
    # One path for every slurmd: each sees its own nodes/<name> mounted there (below).
    echo "SlurmdSpoolDir=$D/node/spool"
    echo "SlurmdPidFile=$D/node/slurmd.pid"
    echo "SlurmdLogFile=$D/node/slurmd.log"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "SelectType=select/linear"
    echo "SchedulerType=sched/builtin"
    echo "MpiDefault=none"
    echo "ReturnToService=2"
    echo "SlurmdTimeout=30"
    echo "KillWait=5"
    for ((i = 0; i < n; i++)); do
      echo "NodeName=${names[i]} NodeAddr=${addrs[i]} CPUs=$cpus State=UNKNOWN"
      nodes+="${nodes:+,}${names[i]}"
    done
    echo "PartitionName=megascope Nodes=$nodes Default=YES MaxTime=INFINITE State=UP"
  } >"$CONF"
  slurmctld -f "$CONF" || die "slurmctld did not start; see $D/ctld/slurmctld.log"
  for ((i = 0; i < n; i++)); do
    mkdir -p "$D/nodes/${names[i]}"
    # In the host's network only (nsenter --net keeps this machine's /sys and cgroups, which
    # slurmd needs), with a mount namespace of its own where nodes/<name> is its spool and pid path.
    nsenter --net="/run/netns/${names[i]}" unshare --mount --propagation private \
      sh -c "mount --bind '$D/nodes/${names[i]}' '$D/node' && exec slurmd -N '${names[i]}' -f '$CONF'" ||
      die "slurmd of ${names[i]} did not start; see $D/nodes/${names[i]}/slurmd.log"
  done
  for _ in $(seq 300); do
    local idle
    idle=$(SLURM_CONF=$CONF sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)
    if ((idle == n)); then
      echo "slurm-local: $n nodes idle ($nodes); use it with: export SLURM_CONF=$CONF" >&2
      echo "export SLURM_CONF=$CONF"
      return 0
    fi
    sleep 0.1
  done
  SLURM_CONF=$CONF sinfo -N >&2 || true
  die "the nodes did not come up in 30 s; logs in $D"
}

case "${1:-}" in
  up) up "${2:-}" ;;
  down) down ;;
  status) [[ -f $CONF ]] || { echo "slurm-local: not up (scripts/slurm-local.sh up)" >&2; exit 1; }; SLURM_CONF=$CONF sinfo -N ;;
  check) check ;;
  *) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; [[ ${1:-} == -h || ${1:-} == --help ]] || exit 2 ;;
esac
