#!/usr/bin/env bash
# Builds the release preset and runs a benchmark, keeping its output and the command in
# bench/results/<name>.txt.   Usage: bench/run.sh tracer
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?usage: bench/run.sh tracer}
scripts/setup.sh
cmake --preset release >/dev/null
case $name in
  tracer)
    cmake --build --preset release --target tracer_bench >/dev/null
    out=bench/results/tracer_bench.txt
    json=$(mktemp)
    cmd="build/release/bench/tracer_bench --benchmark_repetitions=9 --benchmark_report_aggregates_only=true"
    {
      echo "# command: bench/run.sh tracer  ->  $cmd"
      echo "# date: $(date -u +%FT%TZ)  host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
      $cmd --benchmark_out="$json" --benchmark_out_format=json 2>&1
      python3 bench/summarize_tracer.py "$json"
    } | tee "$out"
    rm -f "$json"
    ;;
  *) echo "unknown benchmark '$name' (known: tracer)" >&2; exit 2 ;;
esac
