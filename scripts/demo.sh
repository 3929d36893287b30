#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs `megascope launch` -- a GPT trained with
# (dp,tp,pp) = (3,1,2) on a real text across three simulated nodes and a spare, a hang injected
# into a real rank, detected from the live agents, the node evicted, a spare self-checked, training
# resumed from the last step in memory -- then prints the incident report and writes a timeline.
# After it: the tracer's self-demonstration and faulty-machine detection on a simulated fleet.
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

echo "[demo] self-healing training: a 4-layer GPT, (dp,tp,pp) = (3,1,2), 6 worker processes on 3 simulated nodes"
echo "[demo] plus 1 spare; at step 12 a rank of node1 hangs in compute (its heartbeat stays alive)"
$bin prepare-data tests/data/text/notes_on_training.txt -o "$work/notes.bin"
$bin launch --nodes 3 --spares 1 --dp 3 --tp 1 --pp 2 --data "$work/notes.bin" --run-dir "$work/run" --job demo \
  --layers 4 --width 128 --heads 4 --seq 64 --batch 6 --microbatches 2 --steps "${TRAIN_STEPS:-30}" --lr 2e-3 \
  --warmup 5 --checkpoint-every 10 --inject hang:node=node1,at=12
echo
echo "[demo] megascope report $work/run   (every stage of the incident, from control.db)"
$bin report "$work/run"
echo "[demo] run directory: run.json, control.db, ranks/<r>/worker.log, nodes/<node>/trace.db, dumps/attempt_0/"
echo
echo "[demo] megascope query $work/run stragglers   (compute per step against peers at the same (pp,tp))"
$bin query "$work/run" stragglers
$bin timeline "$work/run" --steps 10:15 --html "$work/run/timeline.html" -o "$work/run/timeline.json" --highlight 2
echo "[demo] 3D-parallel timeline of steps 10-15 around the incident (rank 2 of node1 highlighted): $work/run/timeline.html"
echo

$bin trace-demo --ranks "${RANKS:-4}" --steps "${STEPS:-500}"
cat <<'MSG'

[demo] What this showed:
  - each writer process traced spans, collectives, p2p ops, heartbeats and metrics into its own
    shared-memory ring without locks or syscalls;
  - the reader drained every ring and accounted for every record (drained + dropped = emitted);
  - the last rank, stuck inside an all-reduce, dumped its flight recorder on SIGUSR1 from its dump
    thread (docs/formats.md section 1), and after it was killed the reader still dumped it from the
    ring, marked alive=false -- what the agent will do for dead ranks.
MSG

echo
echo "[demo] faulty-machine detection: simulating 1 h of a 64-machine job with 4 faults"
$bin fleet-sim --machines 64 --hours 1 --faults 4 --seed "${SEED:-7}" -o "$work/fleet"
echo "[demo] injected faults (labels.csv):"
column -s, -t < "$work/fleet/labels.csv" | sed 's/^/  /'
echo "[demo] megascope detect --metrics $work/fleet/metrics.csv --labels $work/fleet/labels.csv"
$bin detect --metrics "$work/fleet/metrics.csv" --labels "$work/fleet/labels.csv"

echo
echo "[demo] evicting on evidence: a (4,1,1) job on 4 nodes + 1 spare; from step 10 node2 computes 1.5x slower"
echo "[demo] (nothing crashes or hangs: the straggler analysis names it, the policy evicts it, the spare takes over)"
$bin launch --nodes 4 --spares 1 --dp 4 --data "$work/notes.bin" --run-dir "$work/slow" --job demo-slow \
  --layers 2 --width 64 --heads 4 --seq 32 --batch 8 --microbatches 2 --steps "${SLOW_STEPS:-80}" \
  --straggler-every 8 --inject slow:node=node2,at=10,factor=1.5 | grep -v '^ *step '
echo
echo "[demo] incident reports (open in any browser; events, stages, compute heat map, loss, evidence):"
echo "  $work/run/report.html"
echo "  $work/slow/report.html"
