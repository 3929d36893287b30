#!/usr/bin/env bash
# What tracing costs the whole job, its agent included, counted in instructions (valgrind's
# callgrind on every process: the same count for the same work whatever else runs): a layout
# (default (2,1,1)) trained traced and untraced, side by side, for STEPS and 3 x STEPS steps, each
# run's processes
# summed per role, the short run subtracted from the long so start-up drops out, per step. ROUNDS
# rounds, each printing the ranks', the agent's and the whole job's (ranks + agent) instructions
# per step traced and untraced and the whole job's ratio; then the median ratio.
# The agent drains and samples on wall-clock periods, and under valgrind a step lasts ~50x longer:
# its periodic share per step is inflated, its per-record share is not (bench/tracing_cost.sh).
# Usage: bench/job_cost.sh [ROUNDS=3] [STEPS=5] [DP TP PP]   (results: bench/results/job_cost.txt)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
steps=${2:-5}
layout=(${3:-2} ${4:-1} ${5:-1})
source bench/common.sh  # $bin, $work, $work/data.bin, $model
echo "# command: bench/job_cost.sh $rounds $steps ${layout[*]}   ($(date -u +%F), $(nproc) cores, valgrind $(valgrind --version | cut -d- -f2))"
for r in $(seq "$rounds"); do
  for n in "$steps" $((3 * steps)); do
    # Traced and untraced side by side: both see the same machine, so the agents' wall-clock
    # periods (drain, samples, snapshots) come round as often in each.
    pids=()
    for mode in trace no-trace; do
      d=$work/$r-$mode-$n
      mkdir -p "$d/cg"
      flag=""
      [[ $mode == no-trace ]] && flag="--no-trace"
      valgrind --tool=callgrind --trace-children=yes --callgrind-out-file="$d/cg/out.%p" \
        "$bin" train --dp "${layout[0]}" --tp "${layout[1]}" --pp "${layout[2]}" \
        --data "$work/data.bin" --run-dir "$d/run" --job "jc$$-$r$mode$n" $model --steps "$n" \
        $flag >"$d/log" 2>&1 &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || { tail -20 "$work"/$r-*-$n/log >&2; exit 1; }; done
  done
  python3 - "$work" "$r" "$steps" "${layout[*]}" <<'PY'
import glob, sys
work, r, steps, layout = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]

def per_role(d):
    out = {"rank": 0, "agent": 0}
    for f in glob.glob(d + "/cg/out.*"):
        cmd, total = "", 0
        for line in open(f, errors="replace"):
            if line.startswith("cmd:"):
                cmd = line[4:]
            elif line.startswith(("summary:", "totals:")):
                total = int(line.split()[1])
        role = "rank" if " worker" in cmd else "agent" if " agent" in cmd else None
        if role:
            out[role] += total
    return out

step = {}
for mode in ("trace", "no-trace"):
    a, b = (per_role(f"{work}/{r}-{mode}-{n}") for n in (steps, 3 * steps))
    step[mode] = {k: (b[k] - a[k]) / (2 * steps) for k in a}
t, u = step["trace"], step["no-trace"]
job_t, job_u = t["rank"] + t["agent"], u["rank"] + u["agent"]
print(f"round {r} ({layout.replace(' ', ',')}): per step traced/untraced: ranks {t['rank']:,.0f} / "
      f"{u['rank']:,.0f} ({100 * (t['rank'] / u['rank'] - 1):+.2f} %), agent {t['agent']:,.0f} / "
      f"{u['agent']:,.0f}, whole job {job_t:,.0f} / {job_u:,.0f}: {100 * (job_t / job_u - 1):+.2f} %")
PY
done | tee "$work/rounds.txt"
python3 - "$work/rounds.txt" <<'PY'
import re, statistics, sys
v = [float(m.group(1)) for m in (re.search(r"whole job .*: ([+-][\d.]+) %$", l) for l in open(sys.argv[1])) if m]
print(f"whole job traced vs untraced, median of {len(v)} rounds: {statistics.median(v):+.2f} % "
      f"({min(v):+.2f} .. {max(v):+.2f}); target <= +0.3 %")
PY
