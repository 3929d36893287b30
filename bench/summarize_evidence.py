#!/usr/bin/env python3
"""Summarises bench/recovery_evidence.sh's runs from their control.db files."""
import json
import sqlite3
import statistics
import sys


def events(run):
    db = sqlite3.connect(f"file:{run}/control.db?mode=ro", uri=True)
    rows = db.execute("SELECT ts_ns, attempt, kind, node, detail_json FROM events ORDER BY ts_ns").fetchall()
    return [(t, a, k, n, json.loads(d) if d else {}) for t, a, k, n, d in rows]


# Per fault kind: the node it is injected into, the verdicts that name it, and the row's label.
FAULTS = {
    "slow": ("node2", {("slow", "compute_straggler"), ("faulty_machine", None)}, "slowed node 1.5x"),
    "metric": ("node1", {("faulty_machine", None)}, "failing NIC errs"),
    "link": ("node3", {("slow", "comm_straggler"), ("slow", "link_slow"), ("faulty_machine", None)},
             "slow network"),
}


def names_fault(e, kind):
    node, verdicts, _ = FAULTS[kind]
    d = e[4]
    return e[2] == "verdict" and e[3] == node and (
        (d.get("kind"), d.get("cause")) in verdicts or (d.get("kind"), None) in verdicts)


def main():
    rows = {k: [] for k in FAULTS}
    soak = None
    for line in open(sys.argv[1]):
        parts = line.split()
        if not parts or parts[0].startswith("#"):
            continue
        if parts[0] == "RUN":
            ev = events(parts[2])
            fault = next((e for e in ev if e[2] == "fault_injected"), None)
            verdict = next((e for e in ev if names_fault(e, parts[1]) and (not fault or e[0] >= fault[0])), None)
            resumed = next((e for e in ev if e[2] == "resumed" and verdict and e[0] > verdict[0]), None)
            evicted = [e[3] for e in ev if e[2] == "eviction"]
            rows[parts[1]].append((fault, verdict, resumed, evicted))
        elif parts[0] == "SOAK":
            soak = (parts[1], int(parts[2]))
    print("fault            runs  injection->verdict (s)  verdict->resumed (s)  named by         evicted")
    for kind, runs in rows.items():
        inj = [(v[0] - f[0]) / 1e9 for f, v, r, _ in runs if f and v]
        res = [(r[0] - v[0]) / 1e9 for f, v, r, _ in runs if v and r]
        by = sorted({f"{v[4].get('kind')}/{v[4].get('cause')}"[:40] for f, v, r, _ in runs if v})
        ev = sorted({",".join(e) or "-" for *_, e in runs})
        fmt = lambda xs: f"med {statistics.median(xs):6.2f} max {max(xs):6.2f}" if xs else "   -"
        label = FAULTS[kind][2]
        print(f"{label:16s} {len(runs):4d}  {fmt(inj):22s}  {fmt(res):20s}  {' '.join(by):16s} {' '.join(ev)}")
    if soak:
        ev = events(soak[0])
        excursions = sum(1 for e in ev if e[2] == "fault_injected")
        evictions = [e for e in ev if e[2] == "eviction"]
        machine_verdicts = [e for e in ev if e[2] == "verdict" and e[4].get("kind") == "faulty_machine"]
        stragglers = [e for e in ev if e[2] == "verdict" and e[4].get("kind") == "slow"]
        checks = [e for e in ev if e[2] == "self_check" and e[4].get("why") != "baseline"]
        wall = (ev[-1][0] - ev[0][0]) / 1e9 if ev else 0
        print(f"healthy soak {wall:.0f} s, {excursions} benign excursions (memory +40 % for 20-60 s): "
              f"{len(evictions)} eviction(s), {len(machine_verdicts)} faulty_machine verdict(s), "
              f"{len(stragglers)} straggler verdict(s) (alerts or self-checks), {len(checks)} self-check(s)")


main()
