#!/usr/bin/env python3
"""The Grafana dashboard's structure, not only its metric names: panels on the 24-column grid
without overlaps, unique ids and refIds, a legend for every query that names only labels the
query keeps (a legend of a label aggregated away renders empty), distinct legends within a panel,
'per rank' panels keeping the rank, metric names that megascope defines, and panels for restarts,
evictions and verdicts. Prints what is wrong; exits 1 if anything is."""
import json
import re
import sys

AGG = re.compile(r"\b(sum|max|min|avg|count)\s*(by\s*\(([^)]*)\))?\s*\(")
PLACEHOLDER = re.compile(r"\{\{\s*(\w+)\s*\}\}")
METRIC = re.compile(r"\b(megascope_[a-z_]+?)(_bucket|_sum|_count)?\b")


def kept_labels(expr):
    """The labels a query's result keeps: those of its outermost aggregation's `by`, or every
    label (None) when it aggregates nothing."""
    m = AGG.search(expr)
    if not m:
        return None
    labels = {l.strip() for l in (m.group(3) or "").split(",") if l.strip()}
    if expr.lstrip().startswith("histogram_quantile"):
        labels.discard("le")
    return labels


def check(dashboard, defined):
    problems = []
    panels = dashboard.get("panels", [])
    ids, cells = set(), {}
    for p in panels:
        name = f"panel {p.get('id')} '{p.get('title')}'"
        if p.get("id") in ids:
            problems.append(f"{name}: id used twice")
        ids.add(p.get("id"))
        g = p.get("gridPos", {})
        if not all(isinstance(g.get(k), int) for k in ("x", "y", "w", "h")):
            problems.append(f"{name}: gridPos must be four integers, is {g}")
            continue
        if g["x"] < 0 or g["w"] <= 0 or g["x"] + g["w"] > 24 or g["h"] <= 0:
            problems.append(f"{name}: gridPos {g} leaves the 24-column grid")
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                if (x, y) in cells:
                    problems.append(f"{name}: overlaps {cells[(x, y)]}")
                    break
                cells[(x, y)] = name
            else:
                continue
            break
        legends, refs = [], set()
        for t in p.get("targets", []):
            expr, legend = t.get("expr", ""), t.get("legendFormat", "")
            if t.get("refId") in refs:
                problems.append(f"{name}: refId {t.get('refId')} used twice")
            refs.add(t.get("refId"))
            if not legend:
                problems.append(f"{name}: a query without a legend: {expr}")
            kept = kept_labels(expr)
            for label in PLACEHOLDER.findall(legend):
                if kept is not None and label not in kept:
                    problems.append(f"{name}: legend '{legend}' names {label}, which the query "
                                    f"aggregates away: {expr}")
            if "per rank" in p.get("title", "") and (
                    "{{rank}}" not in legend.replace(" ", "") or
                    (kept is not None and "rank" not in kept)):
                problems.append(f"{name}: titled per rank, but its series are not per rank")
            for metric, _ in METRIC.findall(expr):
                if metric not in defined:
                    problems.append(f"{name}: {metric} is not a megascope metric")
            legends.append(legend)
        if len(set(legends)) != len(legends):
            problems.append(f"{name}: two queries with the same legend {legends}")
    exprs = " ".join(t.get("expr", "") for p in panels for t in p.get("targets", []))
    for needed in ("megascope_restarts_total", "megascope_evictions_total",
                   "megascope_verdicts_total"):
        if needed not in exprs:
            problems.append(f"no panel shows {needed}")
    return problems


def defined_metrics(header):
    text = open(header, encoding="utf-8").read()
    return {"megascope_" + n for n in re.findall(r'Def k\w+\{\s*"([a-z_]+)"', text)}


def main(dashboard_path, header):
    problems = check(json.load(open(dashboard_path, encoding="utf-8")), defined_metrics(header))
    for p in problems:
        print(p)
    print(f"check_dashboard: {len(problems)} problem(s)" if problems else
          "check_dashboard: structure, legends and metric names hold")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
