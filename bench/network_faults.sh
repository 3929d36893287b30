#!/usr/bin/env bash
# Real network faults on the testbed (scripts/testbed.sh: hosts in network namespaces): a (2,2,2)
# job on 4 hosts + 1 spare, one fault per run on a host's backend link, N runs per fault. Reads
# control.db back: injection -> first verdict naming the host, verdict -> resumed (first step of
# the new attempt), which host was evicted. Needs root (network namespaces).
# Usage: bench/network_faults.sh [N]   (default 2; results: bench/results/network_faults.txt)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-2}
[[ ${SKIP_SETUP:-0} == 1 ]] || scripts/setup.sh
export MEGASCOPE_TESTBED=msb MEGASCOPE_TESTBED_SUBNET=202
scripts/testbed.sh check
cmake --preset release >/dev/null
cmake --build --preset release --target megascope >/dev/null
bin=build/release/cli/megascope
work=$(mktemp -d)
trap 'scripts/testbed.sh down 2>/dev/null; rm -rf "$work"' EXIT
$bin prepare-data tests/data/text/notes_on_training.txt -o "$work/data.bin" >/dev/null
model="--layers 2 --width 64 --heads 4 --seq 32 --batch 4 --microbatches 2"
out=bench/results/network_faults.txt
{
  echo "# command: bench/network_faults.sh $n"
  echo "# date: $(date -u +%FT%TZ)  host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  echo "# job: (dp,tp,pp) = (2,2,2) on 4 testbed hosts + 1 spare, $model; --straggler-every 10, other launch defaults"
  for fault in "loss,loss=100:msb1" "down:msb2" "loss,loss=30:msb2" "slow,rate=0.5:msb3"; do
    spec=${fault%%:*}
    host=${fault##*:}
    for i in $(seq "$n"); do
      scripts/testbed.sh up 5 >/dev/null 2>&1
      run="$work/${spec//[,=]/_}-$i"
      $bin launch --hosts testbed --dp 2 --tp 2 --pp 2 --nodes 4 --spares 1 --data "$work/data.bin" \
        --run-dir "$run" --job nf$$ $model --steps 60 --straggler-every 10 \
        --min-gemm-ratio 0.2 --min-bandwidth-ratio 0.1 \
        --inject "link:node=$host,kind=$spec,at=10" > "$run.log" 2>&1 || { echo "# $spec run $i failed:"; tail -5 "$run.log"; }
      echo "RUN $spec $host $run"
    done
  done
} > "$work/runs.txt"
python3 - "$work/runs.txt" <<'PY' | tee "$out.tmp"
import json, sqlite3, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    if not line.startswith("RUN "):
        continue
    _, spec, host, run = line.split()
    db = sqlite3.connect(f"file:{run}/control.db?mode=ro", uri=True)
    ev = [dict(ts=r[0], kind=r[1], node=r[2], d=json.loads(r[3] or "{}"))
          for r in db.execute("SELECT ts_ns, kind, node, detail_json FROM events ORDER BY ts_ns, rowid")]
    fault = next((e for e in ev if e["kind"] == "fault_injected"), None)
    verdict = next((e for e in ev if e["kind"] == "verdict" and host in e["d"].get("root_nodes", [])), None)
    resumed = next((e for e in ev if e["kind"] == "resumed" and verdict and e["ts"] > verdict["ts"]), None)
    # The policy's first act on the host (an online finding is an alert until it persists).
    acted = next((e for e in ev if e["kind"] == "decision" and host in e["d"].get("nodes", [])
                  and e["d"].get("action") in ("evict", "self_check")), None)
    resumed_after_act = next((e for e in ev if e["kind"] == "resumed" and acted and e["ts"] > acted["ts"]), None)
    evicted = [e["node"] for e in ev if e["kind"] == "eviction"]
    finished = next((e["d"].get("steps") for e in ev if e["kind"] == "job_finished"), None)
    rows.setdefault(spec, []).append(dict(
        cause=verdict["d"]["cause"] if verdict else "-",
        named="+".join(verdict["d"]["root_nodes"]) if verdict else "-",
        to_verdict=(verdict["ts"] - fault["ts"]) / 1e9 if fault and verdict else None,
        to_resumed=(resumed["ts"] - verdict["ts"]) / 1e9 if resumed else None,
        act_to_resumed=(resumed_after_act["ts"] - acted["ts"]) / 1e9 if resumed_after_act else None,
        evicted=",".join(evicted) or "-", host=host, steps=finished))
print(f"{'fault on the host link':24} {'runs':>4}  {'verdict (named)':34} {'inject->verdict':>16} {'verdict->resumed':>17} {'acted->resumed':>15}  evicted  finished")
for spec, rs in rows.items():
    med = lambda k: statistics.median([r[k] for r in rs if r[k] is not None]) if any(r[k] is not None for r in rs) else float("nan")
    causes = ", ".join(sorted({f"{r['cause']} ({r['named']})" for r in rs}))
    ev = ", ".join(sorted({r["evicted"] for r in rs}))
    fin = ", ".join(str(r["steps"]) for r in rs)
    print(f"{spec + ' on ' + rs[0]['host']:24} {len(rs):>4}  {causes:34} {med('to_verdict'):>14.1f} s {med('to_resumed'):>15.1f} s {med('act_to_resumed'):>13.1f} s  {ev:8} {fin}")
for spec, rs in rows.items():
    runs = ", ".join("-" if r["to_resumed"] is None else f"{r['to_resumed']:.1f}" for r in rs)
    print(f"  {spec + ' on ' + rs[0]['host']:22} verdict->resumed per run: {runs} s")
print("(medians over the runs; 'acted': the policy's first decision to self-check or evict the host -- an")
print("online finding is an alert until a second window in a row names it; 'finished': steps completed of")
print("60 in each run)")
PY
{ grep '^#' "$work/runs.txt" || true; cat "$out.tmp"; } > "$out"
rm -f "$out.tmp"
