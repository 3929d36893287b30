#!/usr/bin/env python3
"""Reads the runs listed by bench/fault_matrix.sh (RUN ROW I RUN_DIR rc=.. faulty=.. procs=..
shm=.. killed_at=..) and prints one line per row: outcome, stage times from control.db, steps
lost, evictions (faulty / healthy), what was left behind, and whether the row passed."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from summarize_recovery import events, fmt, incident_times  # noqa: E402

JOB_ERRORS = {"bad_input", "repeated_failure", "same_failure_everywhere"}
INCOMPLETE = 4  # launch finished every step but could not keep every record (and said which)


def judge(row, run):
    """(passed, why) for one run."""
    ev, rc = run["events"], run["rc"]
    finished = [e for e in ev if e["kind"] == "job_finished"]
    status = finished[-1]["d"].get("status") if finished else "none"
    note = ""
    if row == "job-error":
        causes = {e["d"].get("cause") for e in ev if e["kind"] == "verdict"}
        if rc == 0:
            return False, "exit 0"
        if not causes & JOB_ERRORS:
            return False, f"no job-error verdict ({sorted(c for c in causes if c)})"
    elif row == "full-disk" and rc == INCOMPLETE and status == "finished":
        # a line written as the disk filled is lost: launch names it and exits 4, as it must
        note = "exit 4 (a record lost to the full disk, named)"
    elif rc != 0 or status != "finished":
        return False, f"exit {rc}, {status}"
    if run["healthy"]:
        return False, "evicted healthy " + ",".join(run["healthy"])
    if row == "two-persistent":
        if sorted(run["evicted"]) != ["node0", "node1"]:
            return False, f"evicted {run['evicted']}"
    if row == "full-disk" and not any(e["kind"] == "paused" for e in ev):
        return False, "never paused"
    if run["procs"] or (run["shm"] and status == "finished"):
        return False, f"left {run['procs']} processes, {run['shm']} shm files"
    return True, note


def main():
    rows = {}
    for line in open(sys.argv[1]):
        parts = line.split()
        if not parts or parts[0] != "RUN":
            if parts and parts[0] == "SKIP":
                rows.setdefault(parts[1], []).append(None)
            continue
        row, run_dir = parts[1], parts[3]
        kv = dict(p.split("=", 1) for p in parts[4:])
        try:
            ev = events(run_dir)
        except Exception as exc:  # noqa: BLE001 -- a run that never wrote control.db
            ev = []
            kv["note"] = f"no control.db: {exc}"
        faulty = set(filter(None, kv.get("faulty", "").split(",")))
        evicted = [e["node"] for e in ev if e["kind"] == "eviction"]
        rows.setdefault(row, []).append(dict(
            events=ev, rc=int(kv["rc"]), evicted=evicted, faulty=faulty,
            healthy=[n for n in evicted if n not in faulty], procs=int(kv["procs"]),
            shm=int(kv["shm"]), killed_at=kv.get("killed_at", "-")))
    print(f"{'fault':<18} {'runs':<5} {'passed':<7} {'injection -> verdict':<32} {'verdict -> resumed':<32} "
          f"{'steps lost':<10} {'evicted faulty/healthy':<23} {'left behind':<12} notes")
    all_passed = True
    for row, runs in rows.items():
        if all(r is None for r in runs):
            print(f"{row:<18} skipped (needs root)")
            continue
        runs = [r for r in runs if r is not None]
        inc, lost, notes, passed = [], [], set(), 0
        for r in runs:
            times = incident_times(r["events"])
            inc += times
            lost += [t["steps_lost"] for t in times if t["steps_lost"] is not None]
            adopted = [e for e in r["events"] if e["kind"] == "restart" and e["d"].get("cause") == "adopted"]
            if adopted and r["killed_at"].isdigit():  # the relaunch resumed from where
                lost.append(int(r["killed_at"]) - int(adopted[-1]["d"].get("resume_step", 0)))
            ok, why = judge(row, r)
            passed += ok
            if why:
                notes.add(why)
        all_passed &= passed == len(runs)
        faulty_ev = sum(len(r["evicted"]) - len(r["healthy"]) for r in runs)
        healthy_ev = sum(len(r["healthy"]) for r in runs)
        left = f"{sum(r['procs'] for r in runs)} p, {sum(r['shm'] for r in runs)} f"
        print(f"{row:<18} {len(runs):<5} {passed}/{len(runs):<5} "
              f"{fmt([i['inject_to_verdict'] for i in inc]):<32} "
              f"{fmt([i['verdict_to_resumed'] for i in inc]):<32} "
              f"{('max ' + str(max(lost))) if lost else '-':<10} {f'{faulty_ev} / {healthy_ev}':<23} "
              f"{left:<12} {'; '.join(sorted(notes))}")
    print("every row passed" if all_passed else "SOME ROWS FAILED")
    return 0 if all_passed else 1


if __name__ == "__main__":
    sys.exit(main())
