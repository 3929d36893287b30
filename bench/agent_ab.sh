#!/usr/bin/env bash
# The agent's CPU per traced step, this tree against another revision, side by side in one run:
# for an agent change, what the change itself is worth, with the machine's drift paired out.
# Each round trains the tracing-cost model (bench/tracing_cost.sh's) at (2,2,2) with this tree's
# megascope and with REV's (built in a worktree), each for 20 and 120 steps, one after the other
# (which goes first alternates); the agent's CPU per step is its CPU (getrusage, from agent.log)
# of the long run minus the short one's over the 100 extra steps, so start-up drops out. The
# workers' code may differ too: only the agent's CPU is compared. Also each revision's agent
# instructions per traced step (valgrind --tool=callgrind on the agent alone, the workers native:
# the same count whatever else runs, though the drains per step follow wall time).
# Usage: bench/agent_ab.sh REV [ROUNDS]   (results: bench/results/agent_ab.txt)
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:?usage: bench/agent_ab.sh REV [ROUNDS]}
rounds=${2:-8}
old_sha=$(git rev-parse --verify "$rev^{commit}")
[ -n "${SKIP_SETUP:-}" ] || scripts/setup.sh
command -v valgrind >/dev/null || { echo "valgrind is missing (apt-get install valgrind)" >&2; exit 1; }
cmake --preset release >/dev/null
cmake --build --preset release --target megascope >/dev/null
work=$(mktemp -d)
trap 'git worktree remove --force "$work/old" 2>/dev/null || true; rm -rf "$work"' EXIT
git worktree add --detach "$work/old" "$old_sha" >/dev/null 2>&1
echo "building $rev's megascope ..." >&2
(cd "$work/old" && cmake --preset release >/dev/null && cmake --build --preset release --target megascope >/dev/null)
declare -A bins=([new]=$PWD/build/release/cli/megascope [old]=$work/old/build/release/cli/megascope)
"${bins[new]}" prepare-data tests/data/text/notes_on_training.txt -o "$work/data.bin" >/dev/null
model="--layers 2 --width 64 --heads 4 --seq 32 --batch 8 --microbatches 2"
train() {  # which steps run-dir [wrapper...]
  local which=$1 steps=$2 dir=$3
  shift 3
  "$@" "${bins[$which]}" train --dp 2 --tp 2 --pp 2 --data "$work/data.bin" --run-dir "$dir" \
    --job "ab$$-$which-$steps-$RANDOM" $model --steps "$steps" >"$dir.log" 2>&1 ||
    { tail -20 "$dir.log" >&2; exit 1; }
}
cpu_of() {  # the agent's CPU seconds, as it reported them when it stopped
  sed -n 's/.*cpu \([0-9.]*\) s user, \([0-9.]*\) s system.*/\1 \2/p' "$1"/nodes/*/agent.log |
    awk '{s += $1 + $2} END {printf "%.4f", s}'
}
{
  echo "# command: bench/agent_ab.sh $rev $rounds   (new: $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo '+changes'), old: $(git rev-parse --short "$old_sha"))"
  echo "# date: $(date -u +%FT%TZ)  host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  echo "# model: $model at (2,2,2), traced; agent CPU per step = (120-step run - 20-step run) / 100"
  for r in $(seq "$rounds"); do
    order="new old"
    ((r % 2)) || order="old new"
    for which in $order; do
      train "$which" 20 "$work/$r-$which-20"
      train "$which" 120 "$work/$r-$which-120"
      echo "ROUND $r $which $(cpu_of "$work/$r-$which-20") $(cpu_of "$work/$r-$which-120")"
    done
  done
  for which in new old; do
    for n in 20 120; do
      mkdir -p "$work/cg-$which-$n"
      train "$which" "$n" "$work/cg-$which-$n/run" valgrind --tool=callgrind --trace-children=yes \
        --trace-children-skip-by-arg=worker --callgrind-out-file="$work/cg-$which-$n/out.%p"
      for f in "$work/cg-$which-$n"/out.*; do  # the agent's profile among the launcher's
        callgrind_annotate "$f" >"$f.txt" 2>/dev/null || continue
        if grep -q 'agent::Agent::Impl::Drain' "$f.txt"; then
          echo "CALLGRIND $which $n $(sed -n 's/^ *\([0-9,]*\) .*PROGRAM TOTALS.*/\1/p' "$f.txt" | tr -d ,)"
        fi
      done
    done
  done
} >"$work/raw.txt"
python3 - "$work/raw.txt" <<'PY' | tee bench/results/agent_ab.txt
import statistics, sys
sys.path.insert(0, "bench")
from paired_stats import paired
lines = open(sys.argv[1]).read().splitlines()
for l in lines:
    if l.startswith("#"):
        print(l)
per = {"new": {}, "old": {}}
cg = {"new": {}, "old": {}}
for l in lines:
    p = l.split()
    if p and p[0] == "ROUND":
        per[p[2]][int(p[1])] = (float(p[4]) - float(p[3])) / 100 * 1e3
    elif p and p[0] == "CALLGRIND":
        cg[p[1]][int(p[2])] = int(p[3])
rounds = sorted(per["new"])
print("round  agent CPU per traced step (ms): new      old")
for r in rounds:
    print(f"{r:5d}  {per['new'][r]:36.3f} {per['old'][r]:8.3f}")
ratio, half = paired([per["new"][r] for r in rounds], [per["old"][r] for r in rounds])
mean = lambda which: statistics.mean(per[which][r] for r in rounds)
print(f"new/old: x{ratio:.3f} +- {half:.3f} (mean paired difference over the old mean, 95 % CI over"
      f" {len(rounds)} rounds); new {mean('new'):.3f} ms, old {mean('old'):.3f} ms per step")
for which in ("new", "old"):
    if 20 in cg[which] and 120 in cg[which]:
        print(f"agent instructions per traced step, {which}: {(cg[which][120] - cg[which][20]) / 100:,.0f}"
              " (callgrind on the agent alone, workers native)")
PY
