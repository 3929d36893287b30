#!/usr/bin/env bash
# An always-on job for HOURS with each node's trace.db keeping WINDOW_H hours (issue 45, item 8):
# `megascope launch` of one node (dp=2, a small model) with --retain-hours WINDOW_H (the per-step
# rollups kept two windows, --retain-rollup-hours), and once a
# minute the node's trace.db on disk (file and WAL), its rows, the age of its oldest span and the
# steps done. trace.db stays under its window when its size stops growing once a window of data is
# held and no span is older than the window plus one pruning pass (the agent prunes once a minute).
#
# Usage: bench/retention_soak.sh [HOURS=2] [WINDOW_H=0.25] [BIN=build/release/cli/megascope]
# Output: a line a minute and a summary, also kept in bench/results/retention_soak.txt by whoever
# runs it (with the command).
set -euo pipefail
hours=${1:-2}
window_h=${2:-0.25}
bin=${3:-build/release/cli/megascope}
rollup_h=$(awk -v h="$window_h" 'BEGIN { print 2 * h }')  # the rollups: two windows
[[ -x $bin ]] || { echo "retention_soak: $bin not built (cmake --build --preset release --target megascope)" >&2; exit 2; }
dir=$(mktemp -d /tmp/retention_soak.XXXXXX)
trap '"$bin" stop --run-dir "$dir/run" >/dev/null 2>&1 || true; wait || true; rm -rf "$dir"' EXIT
"$bin" prepare-data tests/data/text/notes_on_training.txt -o "$dir/notes.bin" >/dev/null
"$bin" launch --dp 2 --tp 1 --pp 1 --nodes 1 --data "$dir/notes.bin" --run-dir "$dir/run" \
  --job "soak$$" --steps 100000000 --layers 2 --width 64 --heads 2 --seq 32 --batch 4 \
  --retain-hours "$window_h" --retain-rollup-hours "$rollup_h" > "$dir/launch.log" 2>&1 &
launch_pid=$!
db=$dir/run/nodes/node0/trace.db
end=$(( $(date +%s) + $(awk -v h="$hours" 'BEGIN { printf "%d", h * 3600 }') ))
window_s=$(awk -v h="$window_h" 'BEGIN { printf "%d", h * 3600 }')
echo "retention_soak: ${hours} h, window ${window_h} h (${window_s} s), $bin; minute, trace.db MB (file + WAL), spans, oldest span age s, steps"
max_late=0; size_at_window=0; max_size=0
start=$(date +%s)
while (( $(date +%s) < end )); do
  sleep 60
  kill -0 "$launch_pid" 2>/dev/null || { echo "retention_soak: the launch ended early:"; tail -20 "$dir/launch.log"; exit 1; }
  bytes=$(( $(stat -c %s "$db" 2>/dev/null || echo 0) + $(stat -c %s "$db-wal" 2>/dev/null || echo 0) ))
  row=$("$bin" query "$dir/run" --csv --sql "SELECT COUNT(*), CAST(strftime('%s','now') AS INTEGER) - MIN(start_ns) / 1000000000 FROM spans" | tail -1)
  steps=$(grep -c '"step"' "$dir/run/progress.jsonl" 2>/dev/null || echo 0)
  minute=$(( ($(date +%s) - start) / 60 ))
  age=${row#*,}
  printf '%4d  %8.1f  %9s  %6s  %s\n' "$minute" "$(awk -v b="$bytes" 'BEGIN { print b / 1e6 }')" "${row%%,*}" "$age" "$steps"
  (( bytes > max_size )) && max_size=$bytes
  if (( minute * 60 <= window_s + 120 )); then size_at_window=$bytes; fi
  if (( minute * 60 > window_s + 120 )) && [[ $age =~ ^[0-9]+$ ]] && (( age > max_late )); then max_late=$age; fi
done
echo "summary: trace.db at one window (+2 min) $(awk -v b="$size_at_window" 'BEGIN { print b / 1e6 }') MB, largest after $(awk -v b="$max_size" 'BEGIN { print b / 1e6 }') MB; oldest span after the first window: ${max_late} s (window ${window_s} s + one pass of 60 s)"
