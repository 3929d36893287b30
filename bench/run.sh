#!/usr/bin/env bash
# Builds the release preset and runs a benchmark, keeping its output and the command in
# bench/results/<name>.txt.   Usage: bench/run.sh tracer|comm
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
  comm)
    cmake --build --preset release --target comm_bench >/dev/null
    out=bench/results/comm_bench.txt
    json=$(mktemp)
    cmd="build/release/bench/comm_bench --benchmark_repetitions=9 --benchmark_report_aggregates_only=true"
    {
      echo "# command: bench/run.sh comm  ->  $cmd"
      echo "# date: $(date -u +%FT%TZ)  host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
      $cmd --benchmark_out="$json" --benchmark_out_format=json 2>&1
      python3 - "$json" <<'PY'
import json, sys
rows = {}
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    if b.get("aggregate_name") == "median":
        rows[b["label"]] = b["real_time"]
print("\nsummary (medians of 9 repetitions, ns per blocking all-reduce of one float):")
for t in ("instant", "gloo"):
    u, tr = rows[t + " untraced"], rows[t + " traced"]
    print(f"  {t:8s} untraced {u:8.1f}   traced {tr:8.1f}   host cost of tracing an op {tr - u:7.1f} ns")
PY
    } | tee "$out"
    rm -f "$json"
    ;;
  *) echo "unknown benchmark '$name' (known: tracer, comm)" >&2; exit 2 ;;
esac
