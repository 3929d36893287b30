#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz preset: clang, ASan + UBSan) and runs each for SECONDS over
# its seed corpus in tests/data/fuzz/<target>/ (default 10 s each: the CI budget; bench/fuzz.sh
# runs longer). New inputs go to a scratch corpus, never into the repository. A crash, leak,
# sanitizer report or timeout fails the run and leaves the input under OUT_DIR (default
# build/fuzz/findings): turn it into a regression test (copy it into the seed corpus, fix the
# reader, add a unit test) before committing.
#   scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(fuzz_dump fuzz_dump_stream fuzz_pytorch fuzz_pickle fuzz_metrics_csv fuzz_prometheus fuzz_run_json)

if ! command -v clang++ >/dev/null 2>&1; then
  echo "[fuzz] clang++ not found (scripts/setup.sh installs it)" >&2
  exit 1
fi
echo "[fuzz] configure + build (fuzz preset)"
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz >/dev/null
out=${OUT_DIR:-build/fuzz/findings}
mkdir -p "$out"
status=0
for t in "${targets[@]}"; do
  scratch=$(mktemp -d)
  log=$out/$t.log
  # -timeout: one input may take at most 10 s; -rss_limit_mb: and at most 2 GiB.
  if build/fuzz/tests/fuzz/"$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
       -artifact_prefix="$out/$t-" -print_final_stats=1 "$scratch" "tests/data/fuzz/$t" >"$log" 2>&1; then
    execs=$(grep -m1 'stat::number_of_executed_units' "$log" | awk '{print $2}')
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | awk '{print $2}')
    echo "[fuzz] $t: ok, ${execs:-?} inputs in ${seconds} s, ${cov:-?} coverage points"
  else
    echo "[fuzz] $t: FAILED (log: $log; inputs: $out/$t-*)" >&2
    grep -E 'ERROR|SUMMARY|runtime error|Test unit written' "$log" | head -10 >&2
    status=1
  fi
  rm -rf "$scratch"
done
exit $status
