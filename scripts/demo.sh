#!/usr/bin/env bash
# The main job, as far as it goes today: installs what is missing, builds, runs the tracer's
# self-demonstration (writer processes tracing into shared-memory rings, a reader draining them,
# and the flight recorder of a rank stuck in an all-reduce), then faulty-machine detection on a
# simulated 64-machine job with faults injected.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
echo "[demo] building (dev preset, 2 jobs)"
cmake --preset dev >/dev/null
cmake --build --preset dev >/dev/null
bin=build/dev/cli/megascope

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

work=$(mktemp -d /tmp/megascope-demo.XXXXXX)
echo
echo "[demo] faulty-machine detection: simulating 1 h of a 64-machine job with 4 faults"
$bin fleet-sim --machines 64 --hours 1 --faults 4 --seed "${SEED:-7}" -o "$work/fleet"
echo "[demo] injected faults (labels.csv):"
column -s, -t < "$work/fleet/labels.csv" | sed 's/^/  /'
echo "[demo] megascope detect --metrics $work/fleet/metrics.csv --labels $work/fleet/labels.csv"
$bin detect --metrics "$work/fleet/metrics.csv" --labels "$work/fleet/labels.csv"
rm -rf "$work"
