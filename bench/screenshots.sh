#!/usr/bin/env bash
# Pictures of the pages an SRE opens after an incident, this tree against another revision, from
# the same three runs: the incident report (`megascope report RUN --html`) of a hang (the demo's),
# a straggler evicted on evidence and a faulty machine named by the detector, and the demo's
# 3D-parallel timeline (`megascope timeline RUN --html`), each rendered in headless Chromium.
# The runs are made once with this tree's binary; REV's binary (built in a worktree) renders the
# same run directories for "before".
# Usage: bench/screenshots.sh [REV]   (results: bench/results/screenshots/*.png)
# MEGASCOPE_BIN and BEFORE_BIN name binaries already built instead of building them.
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-}
[ -n "${SKIP_SETUP:-}" ] || scripts/setup.sh
command -v chromium >/dev/null || { echo "chromium is missing (scripts/setup.sh installs it)" >&2; exit 1; }
if [ -z "${MEGASCOPE_BIN:-}" ]; then
  cmake --preset release >/dev/null
  cmake --build --preset release --target megascope >/dev/null
fi
bin=$(realpath "${MEGASCOPE_BIN:-build/release/cli/megascope}")
work=$(mktemp -d)
trap 'rm -rf "$work"; [ -z "$rev" ] || git worktree remove --force "$work.rev" 2>/dev/null || true' EXIT
out=bench/results/screenshots
mkdir -p "$out"

$bin prepare-data tests/data/text/notes_on_training.txt -o "$work/notes.bin" >/dev/null
echo "[screenshots] a hang (the demo's run)"
$bin launch --nodes 3 --spares 1 --dp 3 --tp 1 --pp 2 --data "$work/notes.bin" --run-dir "$work/hang" --job shot-hang \
  --layers 4 --width 128 --heads 4 --seq 64 --batch 6 --microbatches 2 --steps 30 --lr 2e-3 --warmup 5 \
  --checkpoint-every 10 --inject hang:node=node1,at=12 >/dev/null
echo "[screenshots] a straggler (the demo's slowed node)"
$bin launch --nodes 4 --spares 1 --dp 4 --data "$work/notes.bin" --run-dir "$work/slow" --job shot-slow \
  --layers 2 --width 64 --heads 4 --seq 32 --batch 8 --microbatches 2 --steps 80 \
  --straggler-every 8 --inject slow:node=node2,at=10,factor=1.5 >/dev/null
echo "[screenshots] a faulty machine (receive errors on node1 from 25 s; stopped 80 s in)"
timeout -s INT 80 $bin launch --nodes 4 --dp 4 --spares 1 --data "$work/notes.bin" --run-dir "$work/metric" \
  --job shot-metric --steps 100000 --layers 2 --width 64 --heads 4 --seq 32 --batch 8 --microbatches 2 \
  --hang-after 2 --tick 0.1 --detector-warmup 20 --straggler-every 0 \
  --inject metric:node=node1,what=nic-errors,at=25s >/dev/null || true

shoot() {  # shoot BINARY TAG
  local b=$1 tag=$2 chrome="timeout 90 chromium --headless --no-sandbox --disable-gpu --no-first-run --hide-scrollbars --user-data-dir=$work/chrome"
  for run in hang slow metric; do
    $b report "$work/$run" --html "$work/$run/report-$tag.html" >/dev/null
    $chrome --window-size=1300,3200 --screenshot="$out/report_${run}_$tag.png" "file://$work/$run/report-$tag.html" 2>/dev/null
  done
  $b timeline "$work/hang" --steps 10:15 --html "$work/hang/timeline-$tag.html" -o "$work/hang/timeline-$tag.json" \
    --highlight 2 >/dev/null
  $chrome --virtual-time-budget=3000 --window-size=1400,900 --screenshot="$out/timeline_$tag.png" \
    "file://$work/hang/timeline-$tag.html" 2>/dev/null
}
shoot "$bin" after
if [ -n "${BEFORE_BIN:-}" ]; then
  shoot "$(realpath "$BEFORE_BIN")" before
elif [ -n "$rev" ]; then
  echo "[screenshots] building $rev in a worktree"
  git worktree add --force --detach "$work.rev" "$rev" >/dev/null
  cmake -S "$work.rev" -B "$work.rev/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEGASCOPE_BUILD_TESTS=OFF \
    -DMEGASCOPE_BUILD_BENCH=OFF >/dev/null
  cmake --build "$work.rev/build" --target megascope >/dev/null
  shoot "$work.rev/build/cli/megascope" before
fi
ls -1 "$out"
