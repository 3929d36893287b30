#!/usr/bin/env bash
# The agents' CPU use while a (2,2,2) CPU run trains (target <= 5 % of one core per agent), and
# their ingest rate (bench/agent_ingest). Usage: bench/agent_cpu.sh [seconds]
# Results: bench/results/agent.txt
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-30}
scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release --target megascope agent_ingest >/dev/null
bin=build/release/cli/megascope
work=$(mktemp -d)
trap 'kill $train 2>/dev/null || true; rm -rf "$work"' EXIT
$bin prepare-data tests/data/text/notes_on_training.txt -o "$work/data.bin" >/dev/null
$bin train --dp 2 --tp 2 --pp 2 --nodes 2 --data "$work/data.bin" --run-dir "$work/run" --job agentbench \
  --layers 4 --width 128 --heads 4 --seq 64 --batch 8 --steps 100000 >/dev/null 2>&1 &
train=$!
for _ in $(seq 100); do [[ -s $work/run/nodes/node1/agent.port ]] && break; sleep 0.1; done
sleep 3  # past start-up
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
pids=$(pgrep -f "megascope agent --node node[01] --run-dir $work/run")
declare -A before
for p in $pids; do before[$p]=$(ticks "$p"); done
t0=$(date +%s.%N)
sleep "$secs"
t1=$(date +%s.%N)
hz=$(getconf CLK_TCK)
{
  echo "# command: bench/agent_cpu.sh $secs   (then build/release/bench/agent_ingest)"
  echo "# date: $(date -u +%FT%TZ)  host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  echo "# a (2,2,2) run (4 layers, width 128, seq 64) with one agent per simulated node, measured over ${secs} s"
  for p in $pids; do
    used=$(( $(ticks "$p") - ${before[$p]} ))
    python3 -c "import sys; u,h,w=map(float,sys.argv[1:]); print(f'agent pid $p: {u/h:.2f} CPU s over {w:.1f} s = {100*u/h/w:.2f} % of one core (target <= 5 %)')" "$used" "$hz" "$(echo "$t1 - $t0" | bc)"
  done
  rows=$(sqlite3 "$work/run/nodes/node0/trace.db" "SELECT (SELECT COUNT(*) FROM spans) + (SELECT COUNT(*) FROM collectives) + (SELECT COUNT(*) FROM heartbeats)")
  echo "rows in node0/trace.db so far: $rows"
  kill $train; wait $train 2>/dev/null || true
  build/release/bench/agent_ingest 2>/dev/null
} | tee bench/results/agent.txt
