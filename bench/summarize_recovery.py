#!/usr/bin/env python3
"""Reads the runs listed by bench/recovery.sh and prints per fault kind the stage times from
control.db (medians over the runs) and the soak's ETTR."""
import json
import sqlite3
import statistics
import sys


def events(run):
    db = sqlite3.connect(f"file:{run}/control.db?mode=ro", uri=True)
    rows = db.execute("SELECT ts_ns, attempt, kind, node, rank, detail_json FROM events ORDER BY ts_ns, rowid").fetchall()
    return [dict(ts=r[0], attempt=r[1], kind=r[2], node=r[3], rank=r[4], d=json.loads(r[5] or "{}")) for r in rows]


def steps(run):
    out = []
    for line in open(f"{run}/progress.jsonl"):
        j = json.loads(line)
        if "event" not in j:
            out.append(j)
    return out


def incident_times(ev):
    """Per incident: (inject->verdict or trigger, verdict->resumed, steps lost)."""
    res = []
    fault = None
    for i, e in enumerate(ev):
        if e["kind"] == "fault_injected" and e["d"].get("kind") not in ("degrade", "corrupt-checkpoint"):
            fault = e
        if e["kind"] != "trigger":
            continue
        verdict = next((x for x in ev[i:] if x["kind"] == "verdict"), None)
        resumed = next((x for x in ev[i:] if x["kind"] == "resumed"), None)
        restart = next((x for x in ev[i:] if x["kind"] == "restart"), None)
        t_decide = (verdict or e)["ts"]
        res.append(dict(
            inject_to_verdict=(t_decide - fault["ts"]) / 1e9 if fault else None,
            verdict_to_resumed=(resumed["ts"] - t_decide) / 1e9 if resumed else None,
            steps_lost=restart["d"].get("steps_lost") if restart else None))
        fault = None
    return res


def fmt(xs, unit=" s"):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    return f"median {statistics.median(xs):.2f}{unit}, max {max(xs):.2f}{unit} (n={len(xs)})"


def main():
    by_kind = {}
    soak = None
    for line in open(sys.argv[1]):
        parts = line.split()
        if parts and parts[0] == "RUN":
            by_kind.setdefault(parts[1], []).append(parts[2])
        elif parts and parts[0] == "SOAK":
            soak = parts[1:]
    print(f"{'fault':<12} {'injection -> verdict':<36} {'verdict -> resumed':<36} {'steps lost':<14} {'snapshot / step':<16} notes")
    for kind, runs in by_kind.items():
        inc, snap, notes = [], [], set()
        for run in runs:
            try:
                ev = events(run)
            except Exception as exc:  # a run that failed to start
                notes.add(f"unreadable: {exc}")
                continue
            inc += incident_times(ev)
            s = steps(run)
            snap += [x["snapshot_s"] / x["step_time_s"] for x in s if x.get("step_time_s") and "snapshot_s" in x]
            notes.add(f"{sum(e['kind'] == 'eviction' for e in ev)} eviction(s), "
                      f"{sum(e['kind'] == 'agent_restarted' for e in ev)} agent restart(s) in the last run")
        lost = [i["steps_lost"] for i in inc if i["steps_lost"] is not None]
        print(f"{kind:<12} {fmt([i['inject_to_verdict'] for i in inc]):<36} {fmt([i['verdict_to_resumed'] for i in inc]):<36} "
              f"{('max ' + str(max(lost))) if lost else '-':<14} "
              f"{(f'{100 * statistics.median(snap):.2f} %') if snap else '-':<16} {'; '.join(sorted(notes))}")
    if soak:
        run, n_steps, every = soak
        ev = events(run)
        end = next((e for e in ev if e["kind"] == "job_finished"), None)
        wall = (ev[-1]["ts"] - ev[0]["ts"]) / 1e9
        kept = {}
        for x in steps(run):
            kept[x["step"]] = x["step_time_s"]
        inc = incident_times(ev)
        print(f"\nsoak: {n_steps} steps, a crash every {every} steps; status {end['d'].get('status') if end else 'unfinished'}; "
              f"{len(inc)} incident(s), {sum(e['kind'] == 'eviction' for e in ev)} eviction(s); wall {wall:.0f} s, "
              f"productive step time {sum(kept.values()):.0f} s: ETTR {sum(kept.values()) / wall:.3f}")
        print(f"soak incidents: injection -> verdict {fmt([i['inject_to_verdict'] for i in inc])}; "
              f"verdict -> resumed {fmt([i['verdict_to_resumed'] for i in inc])}")
        print("ETTR counts only step time of kept steps; the agents, the controller and the self-checks share the same 2 cores.")


if __name__ == "__main__":
    main()
