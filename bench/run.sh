#!/usr/bin/env bash
# Builds the release preset and runs a benchmark, keeping its output and the command in
# bench/results/<name>.txt.   Usage: bench/run.sh tracer|comm
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?usage: bench/run.sh tracer|comm}

# google_bench NAME TARGET SUMMARY: the target's 9 repetitions (aggregates), then SUMMARY's
# reading of their JSON, into bench/results/TARGET.txt.
google_bench() {
  local name=$1 target=$2 summary=$3
  cmake --build --preset release --target "$target" >/dev/null
  local out=bench/results/$target.txt json
  json=$(mktemp)
  local cmd="build/release/bench/$target --benchmark_repetitions=9 --benchmark_report_aggregates_only=true"
  {
    echo "# command: bench/run.sh $name  ->  $cmd"
    echo "# date: $(date -u +%FT%TZ)  host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
    $cmd --benchmark_out="$json" --benchmark_out_format=json 2>&1
    python3 "$summary" "$json"
  } | tee "$out"
  rm -f "$json"
}

case $name in
  tracer | comm) ;;
  *) echo "unknown benchmark '$name' (known: tracer, comm)" >&2; exit 2 ;;
esac
scripts/setup.sh
cmake --preset release >/dev/null
case $name in
  tracer) google_bench tracer tracer_bench bench/summarize_tracer.py ;;
  comm) google_bench comm comm_bench bench/summarize_comm.py ;;
esac
