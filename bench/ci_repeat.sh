#!/usr/bin/env bash
# The landing gate under load: a clean clone of HEAD runs `CI=true bash .ci/run` N times in a row
# while another process keeps one core busy (what a shared CI runner sees). Each run's outcome,
# its time and the tests that failed go to bench/results/ci_repeat.txt; a failed run's log tail
# too. A flaky test shows up here, not on someone's landing.
# Usage: bench/ci_repeat.sh [N]   (default 3; every run is a fresh clone of the commit that was HEAD
# when the series began, and a fresh build)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-3}
repo=$(pwd)
commit=$(git rev-parse HEAD)  # every run tests this commit, whatever lands meanwhile
work=$(mktemp -d)
yes > /dev/null &  # the busy core
spinner=$!
trap 'kill $spinner 2>/dev/null || true; rm -rf "$work"' EXIT
out=bench/results/ci_repeat.txt
passed=0
{
  echo "# command: bench/ci_repeat.sh $n"
  echo "# date: $(date -u +%FT%TZ)  host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  echo "# commit: ${commit:0:7}; each run a clean clone; one core kept busy by \`yes > /dev/null\`"
  for i in $(seq "$n"); do
    rm -rf "$work/clone"
    git clone -q "$repo" "$work/clone"
    git -C "$work/clone" checkout -q "$commit"
    start=$(date +%s)
    rc=0
    (cd "$work/clone" && CI=true bash .ci/run > "$work/ci-$i.log" 2>&1) || rc=$?
    secs=$(($(date +%s) - start))
    # ctest's summary lists each failed test as "  <n> - <name> (<why>)".
    failed=$({ grep -E '^[[:space:]]+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess aborted|Not Run)' \
      "$work/ci-$i.log" || true; } | sed -E 's/^[[:space:]]+[0-9]+ - //' | paste -sd ';' -)
    cp "$work/ci-$i.log" "/tmp/ci_repeat-$i.log"  # the whole log, for a person to read
    echo "run $i: rc=$rc, $((secs / 60)) min $((secs % 60)) s, failed tests: ${failed:-none}"
    # scripts/test.sh's stage times: where the run's minutes went.
    { grep -E '^\[test\]   ' "$work/ci-$i.log" || true; } | sed 's/^\[test\] /  stage/'
    if [[ $rc == 0 ]]; then
      passed=$((passed + 1))
    else
      echo "  last lines of run $i:"
      tail -15 "$work/ci-$i.log" | sed 's/^/  | /'
    fi
  done
  echo "passed $passed of $n"
} | tee "$out"
grep -q "^passed $n of $n" "$out"
