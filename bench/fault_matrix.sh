#!/usr/bin/env bash
# The fault matrix (issue 45): every fault kind the self-healing loop must survive, run N times
# each as real faults in real processes through `megascope launch`, then one line per kind with its
# outcome, injection -> verdict, verdict -> resumed (control.db), steps lost, nodes evicted (the
# faulty and the healthy counted apart) and what was left behind (processes still holding the run
# directory, files in the run's shared-memory directory). A row passes when every run ends as
# expected, no healthy node is evicted and nothing is left behind.
#
# Usage: bench/fault_matrix.sh [N=3] [ROWS...]   (rows: crash hang freeze stall-send kill-agent
#        two-persistent spare-fault job-error full-disk killed-controller; default all)
# Results: bench/results/fault_matrix.txt (with the command). MEGASCOPE_BIN overrides the binary
# (default: the release build, built here); FAULT_MATRIX_KEEP=1 keeps the runs. full-disk mounts a 64 MB tmpfs (root only; skipped
# otherwise); the disk is filled once the job has done 5 steps, and emptied once it pauses.
set -uo pipefail
cd "$(dirname "$0")/.."
n=${1:-3}
shift || true
rows=("$@")
((${#rows[@]})) || rows=(crash hang freeze stall-send kill-agent two-persistent spare-fault job-error
  full-disk killed-controller)
bin=${MEGASCOPE_BIN:-}
if [[ -z $bin ]]; then
  cmake --preset release >/dev/null && cmake --build --preset release --target megascope >/dev/null ||
    { echo "fault_matrix: the release build failed" >&2; exit 1; }
  bin=build/release/cli/megascope
fi
work=$(mktemp -d /tmp/fault_matrix.XXXXXX)
mounts=()
cleanup() {
  for m in "${mounts[@]}"; do umount "$m" 2>/dev/null; done
  if [[ -n ${FAULT_MATRIX_KEEP:-} ]]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
"$bin" prepare-data tests/data/text/notes_on_training.txt -o "$work/data.bin" >/dev/null
cp README.md "$work/not-tokens.txt"  # a data file that is no token file: the job's own error
model="--layers 2 --width 64 --heads 2 --seq 32 --batch 4 --microbatches 2"
list=$work/runs.txt

# The newest step in RUN's progress stream (0 when none).
newest_step() {
  python3 -c 'import json,sys
s=0
try:
    for l in open(sys.argv[1]):
        j=json.loads(l)
        if "event" not in j: s=max(s,j.get("step",0))
except Exception: pass
print(s)' "$1/progress.jsonl"
}
# Waits up to $2 seconds for `$1` to be true.
wait_for() {
  local i
  for ((i = 0; i < $2 * 10; i++)); do eval "$1" && return 0; sleep 0.1; done
  return 1
}

run_one() {  # ROW I
  local row=$1 i=$2 run=$work/$1-$2 shm=$work/shm-$1-$2 job=fm$$${1//-/}$2 spares=1
  local data=$work/data.bin faulty="" rc=0 args=()
  mkdir -p "$shm"
  case $row in
    crash) args=(--inject crash:node=node1,at=8); faulty=node1 ;;
    hang) args=(--inject hang:node=node1,at=8); faulty=node1 ;;
    freeze) args=(--inject freeze:node=node1,at=8); faulty=node1 ;;
    stall-send) args=(--inject stall-send:rank=0,at=8); faulty="" ;;  # a link: both ends pass
    kill-agent) args=(--inject kill-agent:node=node0,at=8); faulty="" ;;
    two-persistent)
      args=(--inject crash:node=node0,at=8,persist --inject hang:node=node1,at=8,persist)
      faulty="node0 node1" spares=2 ;;
    spare-fault)  # node1 crashes; the spare that joins for it (node2) crashes too, three steps on
      args=(--inject crash:node=node1,at=6 --inject crash:node=node2,at=9)
      faulty="node1 node2" spares=2 ;;
    job-error) data=$work/not-tokens.txt ;;
    full-disk | killed-controller) ;;
  esac
  local cmd=("$bin" launch --dp 2 --pp 2 --nodes 2 --spares "$spares" --data "$data" --job "$job"
    --shm-dir "$shm" $model)
  case $row in
    full-disk)
      local mnt=$work/disk-$i
      mkdir -p "$mnt"
      if ! mount -t tmpfs -o size=64m tmpfs "$mnt" 2>/dev/null; then
        echo "SKIP $row $i (cannot mount a tmpfs: not root?)" >>"$list"
        return
      fi
      mounts+=("$mnt")
      run=$mnt/run
      "${cmd[@]}" --run-dir "$run" --min-free-mb 0 --checkpoint-every 10 --steps 30 >"$work/$row-$i.log" 2>&1 &
      local pid=$!
      wait_for "[[ \$(newest_step $run) -ge 5 ]]" 60
      dd if=/dev/zero of="$mnt/fill" bs=64k 2>/dev/null  # to the last byte
      # (its control.db is on the full disk too: the pause is said in the log, recorded once space is back)
      wait_for "grep -q PAUSED $work/$row-$i.log" 60 || echo "# $row $i: no pause within 60 s" >>"$work/notes"
      rm -f "$mnt/fill"  # space is back: the job resumes by itself
      wait "$pid"; rc=$?
      ;;
    killed-controller)
      "${cmd[@]}" --run-dir "$run" --steps 30 >"$work/$row-$i.log" 2>&1 &
      local pid=$!
      wait_for "[[ \$(newest_step $run) -ge 10 ]]" 60
      kill -9 "$pid"; wait "$pid" 2>/dev/null
      # Its ranks and agents stop by themselves (the ranks save their newest state to disk): the
      # newest step done is read once they are gone.
      wait_for "! pgrep -f -- '--run-dir $run' >/dev/null" 30
      echo "$(newest_step "$run")" >"$work/$row-$i.killed_at"
      "${cmd[@]}" --run-dir "$run" --steps 30 >>"$work/$row-$i.log" 2>&1; rc=$?
      ;;
    *)
      "${cmd[@]}" --run-dir "$run" --steps 20 "${args[@]}" >"$work/$row-$i.log" 2>&1; rc=$?
      ;;
  esac
  sleep 0.5
  local procs shm_left
  procs=$(pgrep -f -- "--run-dir $run" | wc -l)
  shm_left=$(find "$shm" -type f | wc -l)
  echo "RUN $row $i $run rc=$rc faulty=${faulty// /,} procs=$procs shm=$shm_left killed_at=$(cat "$work/$row-$i.killed_at" 2>/dev/null || echo -)" >>"$list"
  [[ $row == full-disk ]] && cp -r "$run" "$work/$row-$i.run" && sed -i "s|$run |$work/$row-$i.run |" "$list"
}

: >"$list"
for row in "${rows[@]}"; do
  for i in $(seq "$n"); do
    echo "fault_matrix: $row, run $i of $n" >&2
    run_one "$row" "$i"
  done
done
echo "# command: bench/fault_matrix.sh $n ${*:-}"
echo "# date: $(date -u +%FT%TZ)  host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
echo "# job: (dp,tp,pp) = (2,1,2), 4 ranks on 2 nodes + spares, $model, 20 steps (30 for full-disk and killed-controller)"
cat "$work/notes" 2>/dev/null
python3 bench/summarize_fault_matrix.py "$list"
