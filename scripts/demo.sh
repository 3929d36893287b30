#!/usr/bin/env bash
# The main job, as far as it goes today: installs what is missing, builds, trains a GPT with
# (dp,tp,pp) = (2,2,2) on a real text across two simulated nodes, runs the tracer's
# self-demonstration (the flight recorder of a rank stuck in an all-reduce), then faulty-machine
# detection on a simulated 64-machine job with faults injected.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
echo "[demo] building (dev preset, 2 jobs)"
cmake --preset dev >/dev/null
cmake --build --preset dev >/dev/null
bin=build/dev/cli/megascope
work=${DEMO_DIR:-runs/demo}  # kept after the demo (git ignores runs/)
rm -rf "$work"
mkdir -p "$work"

echo "[demo] training a 4-layer GPT with dp=2 tp=2 pp=2 (8 worker processes, Gloo over TCP) on a real text"
$bin prepare-data tests/data/text/notes_on_training.txt -o "$work/notes.bin"
$bin train --dp 2 --tp 2 --pp 2 --nodes 2 --data "$work/notes.bin" --run-dir "$work/run" --job demo \
  --layers 4 --width 128 --heads 4 --seq 64 --batch 8 --microbatches 2 --steps "${TRAIN_STEPS:-40}" --lr 2e-3 \
  --warmup 5 --checkpoint-every 20
echo "[demo] run directory: run.json, ranks/<r>/worker.log, nodes/<node>/trace.db, checkpoints/step_20/"
url=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['agents'][0]['url'])" "$work/run/run.json")
echo "[demo] during the run, node0's agent served Prometheus metrics at $url/metrics (and /state, /dump/<rank>)"
echo
echo "[demo] megascope query $work/run steps        (time breakdown per step over all 8 ranks)"
$bin query "$work/run" steps
echo
echo "[demo] megascope query $work/run stragglers   (compute per step against peers at the same (pp,tp))"
$bin query "$work/run" stragglers
echo
echo "[demo] megascope query $work/run waits --limit 5   (collectives with the longest wait, and who arrived last)"
$bin query "$work/run" waits --limit 5
$bin timeline "$work/run" --steps 20:22 --html "$work/run/timeline.html" -o "$work/run/timeline.json"
echo "[demo] 3D-parallel timeline of steps 20-22: $work/run/timeline.html (open it in a browser; the JSON opens in Perfetto)"
echo

echo "[demo] injecting a hang: rank 5 stops in compute at step 3, its heartbeat still alive"
$bin train --dp 2 --tp 2 --pp 2 --nodes 2 --data "$work/notes.bin" --run-dir "$work/hang" --job demohang \
  --layers 4 --width 128 --heads 4 --seq 64 --batch 8 --microbatches 2 --steps 20 --timeout 120000 \
  --fault hang:rank=5,step=3 > "$work/hang.log" 2>&1 &
train=$!
verdict=""
for _ in $(seq 90); do
  sleep 1
  agents=$(python3 -c "import json,sys; print(','.join(a['url'] for a in json.load(open(sys.argv[1]))['agents']))" \
           "$work/hang/run.json" 2>/dev/null) || continue
  verdict=$($bin analyze hang --agents "$agents" --min-wait 5 2>/dev/null) || continue
  grep -q '^HANG' <<<"$verdict" && break
done
echo "[demo] megascope analyze hang --agents $agents"
echo "$verdict"
$bin timeline "$work/hang" --html "$work/hang/timeline.html" --highlight 5 >/dev/null
echo "[demo] timeline of the hung run, rank 5 highlighted: $work/hang/timeline.html"
kill "$train" 2>/dev/null || true
wait "$train" 2>/dev/null || true
echo

$bin trace-demo --ranks "${RANKS:-4}" --steps "${STEPS:-500}"
cat <<'MSG'

[demo] What this showed:
  - each writer process traced spans, collectives, p2p ops, heartbeats and metrics into its own
    shared-memory ring without locks or syscalls;
  - the reader drained every ring and accounted for every record (drained + dropped = emitted);
  - the last rank, stuck inside an all-reduce, dumped its flight recorder on SIGUSR1 from its dump
    thread (FORMATS.md section 1), and after it was killed the reader still dumped it from the
    ring, marked alive=false -- what the agent will do for dead ranks.
MSG

echo
echo "[demo] faulty-machine detection: simulating 1 h of a 64-machine job with 4 faults"
$bin fleet-sim --machines 64 --hours 1 --faults 4 --seed "${SEED:-7}" -o "$work/fleet"
echo "[demo] injected faults (labels.csv):"
column -s, -t < "$work/fleet/labels.csv" | sed 's/^/  /'
echo "[demo] megascope detect --metrics $work/fleet/metrics.csv --labels $work/fleet/labels.csv"
$bin detect --metrics "$work/fleet/metrics.csv" --labels "$work/fleet/labels.csv"
