#!/usr/bin/env python3
"""Reads tracer_bench JSON output and prints the medians against the issue's targets."""
import json
import sys

data = json.load(open(sys.argv[1]))
med = {b["run_name"]: b for b in data["benchmarks"] if b.get("aggregate_name") == "median"}
span = med["BM_RecordSpan"]["real_time"]
coll = med["BM_CollectiveStateChange"]["real_time"] / 3.0
drain = med["BM_Drain"]["items_per_second"] / 1e6
rows = [
    ("span record (2 clock reads + push), median", f"{span:.1f} ns", "<= 25 ns", span <= 25),
    ("collective state change, median", f"{coll:.1f} ns", "<= 50 ns", coll <= 50),
    ("drain, one core, median", f"{drain:.1f} M records/s", ">= 20 M/s", drain >= 20),
]
print("\nsummary (medians of 9 repetitions):")
for what, got, target, ok in rows:
    print(f"  {what:45s} {got:>18s}   target {target:10s} {'met' if ok else 'MISSED'}")
