#!/usr/bin/env bash
# The long fuzzing budget: every libFuzzer target for SECONDS (default 300) each, results appended
# to bench/results/fuzz.txt. CI runs the same targets for 10 s each (scripts/test.sh).
#   bench/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-300}
{
  echo "# command: bench/fuzz.sh $seconds   date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  host: $(nproc) cores"
  scripts/fuzz.sh "$seconds" 2>&1 | grep -v '^\[fuzz\] configure'
} | tee -a bench/results/fuzz.txt
