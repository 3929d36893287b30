#!/usr/bin/env bash
# Training throughput on CPU and what tracing costs, measured side by side in one run:
# a 4-layer, width-256, seq-128 model at (dp,tp,pp) = (1,1,1) and (2,1,1), each run alternately
# with tracing on and off (--no-trace), several rounds; reports median step time and tokens/s and
# the traced/untraced step-time ratio. Usage: bench/train_cpu.sh [rounds]   (results:
# bench/results/train_cpu.txt)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release --target megascope >/dev/null
bin=build/release/cli/megascope
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
$bin prepare-data tests/data/text/notes_on_training.txt -o "$work/data.bin" >/dev/null
out=bench/results/train_cpu.txt
{
  echo "# command: bench/train_cpu.sh $rounds"
  echo "# date: $(date -u +%FT%TZ)  host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  echo "# model: 4 layers, width 256, 4 heads, seq 128, global batch 8, 2 microbatches, 12 steps (first 2 dropped)"
  for layout in "1 1 1" "2 1 1"; do
    set -- $layout
    for r in $(seq "$rounds"); do
      for mode in trace no-trace; do
        flag=""; [[ $mode == no-trace ]] && flag="--no-trace"
        rm -rf "$work/run"
        $bin train --dp "$1" --tp "$2" --pp "$3" --data "$work/data.bin" --run-dir "$work/run" --job bench \
          --layers 4 --width 256 --heads 4 --seq 128 --batch 8 --microbatches 2 --steps 12 $flag >/dev/null
        python3 - "$work/run/progress.jsonl" "$1,$2,$3" "$mode" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][2:]
times = sorted(r["step_time_s"] for r in rows)
print(f"RUN {sys.argv[2]} {sys.argv[3]} {times[len(times)//2]:.5f} {rows[0]['tokens_per_s']:.0f}")
PY
      done
    done
  done
} > "$work/raw.txt"
python3 - "$work/raw.txt" <<'PY' | tee "$out"
import collections, statistics, sys
lines = open(sys.argv[1]).read().splitlines()
for l in lines:
    if l.startswith("#"): print(l)
runs = collections.defaultdict(list)
for l in lines:
    if l.startswith("RUN"):
        _, layout, mode, t, _ = l.split()
        runs[(layout, mode)].append(float(t))
print(f"{'(dp,tp,pp)':12s} {'tracing':9s} {'median step (s)':>16s} {'tokens/s':>10s}")
for (layout, mode), ts in sorted(runs.items()):
    m = statistics.median(ts)
    print(f"{layout:12s} {mode:9s} {m:16.4f} {8*128/m:10.0f}")
for layout in sorted({k[0] for k in runs}):
    on, off = statistics.median(runs[(layout, "trace")]), statistics.median(runs[(layout, "no-trace")])
    print(f"tracing cost at ({layout}): step time traced/untraced = {on/off:.4f} ({(on/off-1)*100:+.2f} %; target <= +1 %)")
PY
