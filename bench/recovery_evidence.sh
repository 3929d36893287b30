#!/usr/bin/env bash
# Recovery on evidence (faults that do not stop the job): runs `megascope launch` N times with a
# node slowed 1.5x for good (`persist`: a machine that stays slow until evicted, as a broken one
# does; named by the straggler analysis or the detector), N times with a failing NIC
# error counter on one node (named by the detector, confirmed by the self-check) and N times with a
# node whose outgoing data is shaped to 40 MB/s (a communication straggler, confirmed by the
# all-reduce bandwidth of its self-check), then a healthy
# soak of SOAK_S seconds with a benign 20-60 s metric excursion on some node every ~2 minutes.
# Reports per fault: injection -> verdict, verdict -> resumed, the node evicted; for the soak:
# evictions (the target is none) and verdicts. Usage: bench/recovery_evidence.sh [N] [SOAK_S]
# (defaults 3, 1200; results: bench/results/recovery_evidence.txt). A fault run that ends without an
# eviction keeps its run directory and log under KEEP_DIR (default /tmp/recovery_evidence-kept-DATE).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-3}
soak=${2:-1200}
[ -n "${SKIP_SETUP:-}" ] || scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release --target megascope >/dev/null
bin=build/release/cli/megascope
work=$(mktemp -d)
keep=${KEEP_DIR:-/tmp/recovery_evidence-kept-$(date -u +%Y%m%dT%H%M%SZ)}
trap 'pkill -f "megascope agent --node .* --run-dir $work" 2>/dev/null || true; rm -rf "$work" /dev/shm/megascope-ev$$-*-memory' EXIT
$bin prepare-data tests/data/text/notes_on_training.txt -o "$work/data.bin" >/dev/null
model="--layers 2 --width 64 --heads 4 --seq 32 --batch 8 --microbatches 2"
common="--dp 4 --nodes 4 --spares 1 --data $work/data.bin $model --min-gemm-ratio 0.2 --min-bandwidth-ratio 0.1"
# Runs a launch in the background until control.db shows `until` (an SQL condition) or `limit` s.
run_until() {  # run inject until limit
  local run=$1 inject=$2 until=$3 limit=$4
  $bin launch $common --run-dir "$run" --job "ev$$-$(basename "$run")" --steps 10000000 $inject > "$run.log" 2>&1 &
  local pid=$! t=0 met=0
  while [ $t -lt "$limit" ]; do
    sleep 1; t=$((t + 1))
    if [ -f "$run/control.db" ] && [ "$(sqlite3 "$run/control.db" "SELECT COUNT(*) > 0 FROM events WHERE $until" 2>/dev/null || echo 0)" = 1 ]; then met=1; break; fi
    kill -0 $pid 2>/dev/null || break
  done
  $bin stop --run-dir "$run" >/dev/null 2>&1 || true
  wait $pid || true
  # A fault run that never got there keeps its run directory and log for a look afterwards.
  if [ $met = 0 ] && [ "$until" != 0 ]; then
    mkdir -p "$keep" && cp -r "$run" "$run.log" "$keep/" 2>/dev/null || true
    echo "# kept $run's run directory and log (no eviction within $limit s): $keep/$(basename "$run")"
  fi
}
# The first step done after an eviction (a false suspect's restart in place does not end a run).
after_eviction="kind = 'resumed' AND ts_ns > (SELECT MIN(ts_ns) FROM events WHERE kind = 'eviction')"
{
  echo "# command: bench/recovery_evidence.sh $n $soak"
  echo "# date: $(date -u +%FT%TZ)  host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  echo "# job: (dp,tp,pp) = (4,1,1), 4 ranks on 4 simulated nodes + 1 spare, $model; launch defaults (detector tick 1 s, warm-up 60 ticks, straggler analysis every 20 steps, 2 windows)"
  for i in $(seq "$n"); do
    run_until "$work/slow-$i" "--inject slow:node=node2,at=1500,factor=1.5,persist" "$after_eviction" 400
    echo "RUN slow $work/slow-$i"
    run_until "$work/metric-$i" "--inject metric:node=node1,what=nic-errors,at=90s" "$after_eviction" 400
    echo "RUN metric $work/metric-$i"
    run_until "$work/link-$i" "--inject link:node=node3,kind=slow,rate=40,at=1500" "$after_eviction" 400
    echo "RUN link $work/link-$i"
  done
  # The soak: healthy, with a benign excursion (memory +40 % for 20-60 s) on node (k mod 4) every 120 s.
  injects=""
  k=0
  for at in $(seq 120 120 $((soak - 60))); do
    injects="$injects --inject metric:node=node$((k % 4)),what=memory,at=${at}s,seconds=$((20 + (k * 13) % 41))"
    k=$((k + 1))
  done
  run_until "$work/soak" "$injects" "0" "$soak"
  echo "SOAK $work/soak $soak"
} > "$work/runs.txt"
python3 bench/summarize_evidence.py "$work/runs.txt" | tee "$work/out.txt"
{ grep '^#' "$work/runs.txt" || true; cat "$work/out.txt"; } > bench/results/recovery_evidence.txt
