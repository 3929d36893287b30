#!/usr/bin/env bash
# Recovery benchmark: runs `megascope launch` with each fault kind of the matrix N times, then a
# soak (a fault every PERIOD seconds for SOAK seconds), and reads every stage time back from
# control.db. Reports per fault kind: injection -> verdict, verdict -> resumed (first completed
# step of the new attempt), steps lost, snapshot cost per step (the blocking copy, as a share of
# step time), and the soak's ETTR. Usage: bench/recovery.sh [N] [SOAK_S] [PERIOD_S]
# (defaults 3, 1200, 120; results: bench/results/recovery.txt)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-3}
soak=${2:-1200}
period=${3:-120}
scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release --target megascope >/dev/null
bin=build/release/cli/megascope
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
$bin prepare-data tests/data/text/notes_on_training.txt -o "$work/data.bin" >/dev/null
model="--layers 4 --width 128 --heads 4 --seq 64 --batch 8 --microbatches 2 --lr 2e-3"
out=bench/results/recovery.txt
{
  echo "# command: bench/recovery.sh $n $soak $period"
  echo "# date: $(date -u +%FT%TZ)  host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  echo "# job: (dp,tp,pp) = (2,1,2), 4 ranks on 2 simulated nodes + spares, $model; defaults of launch (hang after 3 s / 8 median steps)"
  for kind in crash hang stall-send kill-agent; do
    for i in $(seq "$n"); do
      run="$work/$kind-$i"
      case $kind in
        crash) inject="crash:node=node1,at=8" ;;
        hang) inject="hang:node=node1,at=8" ;;
        stall-send) inject="stall-send:rank=0,at=8" ;;
        kill-agent) inject="kill-agent:node=node0,at=8" ;;
      esac
      $bin launch --dp 2 --pp 2 --nodes 2 --spares 1 --data "$work/data.bin" --run-dir "$run" --job rec$$ $model \
        --steps 20 --inject "$inject" > "$run.log" 2>&1 || { echo "# $kind run $i failed:"; tail -5 "$run.log"; }
      echo "RUN $kind $run"
    done
  done
  # Soak: one fault every $period s (a crash of each rank in turn, wherever it runs; an evicted node may return as a
  # spare after passing its self-check), for $soak s.
  run="$work/soak"
  step_s=$(python3 -c "
import json; s=[json.loads(l)['step_time_s'] for l in open('$work/crash-1/progress.jsonl') if 'event' not in l]
print(sorted(s)[len(s)//2])")
  steps=$(python3 -c "print(int($soak / $step_s))")
  every=$(python3 -c "print(max(10, int($period / $step_s)))")
  injects=""
  k=0
  for at in $(seq "$every" "$every" "$((steps - 5))"); do
    injects="$injects --inject crash:rank=$((k % 4)),at=$at"
    k=$((k + 1))
  done
  $bin launch --dp 2 --pp 2 --nodes 2 --spares 1 --data "$work/data.bin" --run-dir "$run" --job soak$$ $model \
    --steps "$steps" --readmit-after 1 --max-evictions 1000 $injects > "$run.log" 2>&1 || { echo "# soak failed:"; tail -5 "$run.log"; }
  echo "SOAK $run $steps $every"
} > "$work/runs.txt"
python3 bench/summarize_recovery.py "$work/runs.txt" | tee "$out.tmp"
{ head -3 "$work/runs.txt" | grep '^#' || true; cat "$out.tmp"; } > "$out"
rm -f "$out.tmp"
echo "results in $out"
