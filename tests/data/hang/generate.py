#!/usr/bin/env python3
"""Writes the hang scenarios under tests/data/hang/<name>/: flight-recorder dumps (docs/formats.md
section 1) in dumps/ of a simulated 3D-parallel job, and expected.json with the verdicts the analyzer must
give. The simulation runs each rank's program of collectives and p2p ops with their real
semantics (a collective completes when every member issued it; a recv when its send was posted;
sends are asynchronous), injects one fault, runs until nothing can move, and dumps every rank.
Run it again after changing the scenarios: python3 tests/data/hang/generate.py"""
import json, os, shutil

HERE = os.path.dirname(os.path.abspath(__file__))
T0 = 1763700000_000000000
STEP_NS = 200_000_000  # simulated time per op round


class Job:
    def __init__(self, dp, tp, pp, steps=4, mb=2):
        self.dp, self.tp, self.pp, self.steps, self.mb = dp, tp, pp, steps, mb
        self.world = dp * tp * pp

    def coords(self, r):
        return {"dp": (r // self.tp) % self.dp, "pp": r // (self.tp * self.dp), "tp": r % self.tp}

    def rank(self, dp, pp, tp):
        return tp + self.tp * (dp + self.dp * pp)

    def groups(self, r):
        c = self.coords(r)
        g = [("tp.%d.%d" % (c["pp"], c["dp"]), "tp", [self.rank(c["dp"], c["pp"], t) for t in range(self.tp)]),
             ("dp.%d.%d" % (c["pp"], c["tp"]), "dp", [self.rank(d, c["pp"], c["tp"]) for d in range(self.dp)]),
             ("pp.%d.%d" % (c["dp"], c["tp"]), "pp", [self.rank(c["dp"], p, c["tp"]) for p in range(self.pp)]),
             ("mp.%d" % c["dp"], "mp", [self.rank(c["dp"], p, t) for p in range(self.pp) for t in range(self.tp)])]
        return g

    def program(self, r):
        """(step, op, group, peer, bytes) in issue order (GPipe-like schedule)."""
        c = self.coords(r)
        tpg, dpg, ppg, mpg = [g[0] for g in self.groups(r)]
        prev = self.rank(c["dp"], c["pp"] - 1, c["tp"]) if c["pp"] > 0 else None
        nxt = self.rank(c["dp"], c["pp"] + 1, c["tp"]) if c["pp"] < self.pp - 1 else None
        ops = []
        for s in range(self.steps):
            for m in range(self.mb):
                if prev is not None: ops.append((s, "recv", ppg, prev, 8192))
                if self.tp > 1: ops += [(s, "allreduce", tpg, None, 65536)] * 2
                if nxt is not None: ops.append((s, "send", ppg, nxt, 8192))
            for m in range(self.mb):
                if nxt is not None: ops.append((s, "recv", ppg, nxt, 8192))
                if self.tp > 1: ops += [(s, "allreduce", tpg, None, 65536)] * 2
                if prev is not None: ops.append((s, "send", ppg, prev, 8192))
            if self.dp > 1: ops.append((s, "allreduce", dpg, None, 1 << 20))
            if self.tp * self.pp > 1: ops.append((s, "allreduce", mpg, None, 4))
        return ops


def simulate(job, stop=None, mutate=None, stall=None, swap=None):
    """stop: {rank: program index it never passes}; mutate: {(rank, index): dict of field changes};
    stall: (sender, receiver, step) whose transfer stops after a quarter; swap: (rank, i, j) program
    indices exchanged. Returns per-rank entry lists and final heartbeat steps."""
    progs = {r: job.program(r) for r in range(job.world)}
    if swap:
        r, i, j = swap
        progs[r][i], progs[r][j] = progs[r][j], progs[r][i]
    pos = {r: 0 for r in range(job.world)}
    entries = {r: [] for r in range(job.world)}
    coll_seq, send_seq, recv_seq = {}, {}, {}
    issued = {}  # (rank, group, seq) -> entry for collectives ; p2p keyed by (src, dst, group, seq)
    sends, recvs = {}, {}
    now = T0
    blocked = {r: None for r in range(job.world)}

    def issue(r):
        step, op, grp, peer, nbytes = progs[r][pos[r]]
        mut = (mutate or {}).get((r, pos[r]), {})
        e = {"group": grp, "op": mut.get("op", op), "peer": peer, "bytes": mut.get("bytes", nbytes), "dtype": "f32",
             "state": "started", "enqueued_at_ns": now, "started_at_ns": now + 1000, "completed_at_ns": None,
             "bytes_sent": None, "bytes_received": None, "_step": step}
        if op in ("send", "recv"):
            key = (r, peer, grp) if op == "send" else (peer, r, grp)
            table = send_seq if op == "send" else recv_seq
            e["seq"] = table.get(key, 0)
            table[key] = e["seq"] + 1
            (sends if op == "send" else recvs)[(key, e["seq"])] = (r, e)
        else:
            e["seq"] = coll_seq.get((r, grp), 0)
            coll_seq[(r, grp)] = e["seq"] + 1
            issued[(r, grp, e["seq"])] = e
        entries[r].append(e)
        pos[r] += 1
        return e

    def complete(e, t):
        e["state"], e["completed_at_ns"] = "completed", t
        if e["op"] == "send": e["bytes_sent"] = e["bytes"]
        if e["op"] == "recv": e["bytes_received"] = e["bytes"]

    moved = True
    while moved:
        moved = False
        now += STEP_NS
        for r in range(job.world):
            while True:
                if blocked[r] is not None:
                    e = blocked[r]
                    if e["state"] == "completed":
                        blocked[r] = None
                    else:
                        break
                if pos[r] >= len(progs[r]) or (stop and stop.get(r) == pos[r]):
                    break
                e = issue(r)
                moved = True
                if e["op"] != "send":  # sends are asynchronous
                    blocked[r] = e
        # Resolve what can complete.
        for (key, seq), (r, e) in list(recvs.items()):
            s = sends.get((key, seq))
            if s and e["state"] != "completed":
                st = s[1]
                if stall and (key[0], key[1]) == stall[:2] and st["_step"] == stall[2]:
                    st["bytes_sent"] = e["bytes_received"] = st["bytes"] // 4
                    continue
                complete(e, now)
                complete(st, now)
                moved = True
        done = set()
        for (r, grp, seq), e in issued.items():
            if e["state"] == "completed" or (grp, seq) in done:
                continue
            members = next(g[2] for g in job.groups(r) if g[0] == grp)
            peers = [issued.get((m, grp, seq)) for m in members]
            if all(p is not None for p in peers) and len({(p["op"], p["bytes"]) for p in peers}) == 1:
                for p in peers:
                    complete(p, now)
                done.add((grp, seq))
                moved = True
    return entries, progs, pos, now


def write(name, job, entries, pos, progs, now, expected, missing=(), dead=(), stale=(), offsets=None, keep=None,
          dump_delay_s=60):
    top = os.path.join(HERE, name)
    shutil.rmtree(top, ignore_errors=True)
    d = os.path.join(top, "dumps")
    os.makedirs(d)
    dumped = now + dump_delay_s * 1_000_000_000
    for r in range(job.world):
        if r in missing:
            continue
        off = (offsets or {}).get(r, 0)
        step = progs[r][min(pos[r], len(progs[r]) - 1)][0]
        es = entries[r] if keep is None or r not in keep else entries[r][-keep[r]:]
        hb = dumped - 200_000_000 - (600 * 1_000_000_000 if r in stale else 0)
        shift = lambda t: None if t is None else t + off
        dump = {"format": "megascope-flight-recorder", "version": 1, "job": "scenario", "attempt": 0, "rank": r,
                "world_size": job.world, "node": "node%d" % (r // max(1, job.world // 2)), "pid": 1000 + r,
                "coords": job.coords(r), "clock_offset_ns": off, "dumped_at_ns": dumped + off,
                "alive": r not in dead,
                "heartbeat": {"step": step, "phase": "forward", "updated_at_ns": hb + off},
                "groups": [{"name": g[0], "kind": g[1], "ranks": g[2]} for g in job.groups(r)],
                "entries": [{k: (shift(v) if k.endswith("_ns") else v) for k, v in e.items() if not k.startswith("_")}
                            for e in es]}
        with open(os.path.join(d, "rank_%d.json" % r), "w") as f:
            json.dump(dump, f, indent=1)
    with open(os.path.join(top, "expected.json"), "w") as f:
        json.dump({"verdicts": expected}, f, indent=1)
        f.write("\n")


def index_of(job, r, step, op, group_kind, nth=0):
    """The program index of the nth op of a kind in a step."""
    prog = job.program(r)
    hits = [i for i, (s, o, g, p, b) in enumerate(prog) if s == step and o == op and g.startswith(group_kind)]
    return hits[nth]


def scenario(name, job, expected, **kw):
    sim_kw = {k: kw.pop(k) for k in ("stop", "mutate", "stall", "swap") if k in kw}
    entries, progs, pos, now = simulate(job, **sim_kw)
    write(name, job, entries, pos, progs, now, expected, **kw)


def main():
    j = Job(2, 2, 2)
    scenario("not_joined_2x2x2", j, [{"cause": "rank_not_joined", "root_ranks": [5]}],
             stop={5: index_of(j, 5, 2, "allreduce", "tp")})
    j4 = Job(4, 2, 1)
    scenario("not_joined_4x2x1", j4, [{"cause": "rank_not_joined", "root_ranks": [6]}],
             stop={6: index_of(j4, 6, 1, "allreduce", "dp")})
    j142 = Job(1, 4, 2)
    scenario("not_joined_before_send_1x4x2", j142, [{"cause": "rank_not_joined", "root_ranks": [2]}],
             stop={2: index_of(j142, 2, 1, "send", "pp")})
    j8 = Job(8, 1, 1)
    scenario("dead_missing_dump_8x1x1", j8, [{"cause": "rank_dead", "root_ranks": [3]}],
             stop={3: index_of(j8, 3, 2, "allreduce", "dp")}, missing={3})
    scenario("dead_process_gone_2x2x2", j, [{"cause": "rank_dead", "root_ranks": [1]}],
             stop={1: index_of(j, 1, 1, "allreduce", "tp", 1)}, dead={1})
    scenario("dead_stale_heartbeat_2x2x2", j, [{"cause": "rank_dead", "root_ranks": [4]}],
             stop={4: index_of(j, 4, 3, "recv", "pp")}, stale={4})
    scenario("op_mismatch_bytes_2x2x2", j, [{"cause": "op_mismatch", "root_ranks": [6]}],
             mutate={(6, index_of(j, 6, 2, "allreduce", "dp")): {"bytes": 999}})
    scenario("op_mismatch_op_4x2x1", j4, [{"cause": "op_mismatch", "root_ranks": [3]}],
             mutate={(3, index_of(j4, 3, 1, "allreduce", "tp", 1)): {"op": "allgather"}})
    scenario("link_stall_2x2x2", j, [{"cause": "link_stall", "root_ranks": [2, 6]}], stall=(2, 6, 1))
    # A frozen rank (SIGSTOP: its process exists, its heartbeat stopped) mid-transfer: the transfer
    # stops because the rank does; the rank is the root, not the link.
    scenario("frozen_sender_2x2x2", j, [{"cause": "rank_dead", "root_ranks": [2]}], stall=(2, 6, 1),
             stale={2})
    scenario("frozen_receiver_2x2x2", j, [{"cause": "rank_dead", "root_ranks": [6]}], stall=(2, 6, 1),
             stale={6})
    j114 = Job(1, 1, 4)
    scenario("link_stall_pipeline_1x1x4", j114, [{"cause": "link_stall", "root_ranks": [1, 2]}], stall=(1, 2, 2))
    scenario("two_roots_4x2x1", j4, [{"cause": "rank_not_joined", "root_ranks": [1]}, {"cause": "rank_dead", "root_ranks": [6]}],
             stop={1: index_of(j4, 1, 2, "allreduce", "tp"), 6: index_of(j4, 6, 2, "allreduce", "tp")}, dead={6})
    scenario("cascade_from_stage0_2x2x2", j, [{"cause": "rank_not_joined", "root_ranks": [0]}],
             stop={0: index_of(j, 0, 2, "allreduce", "tp", 1)})
    jl = Job(2, 2, 2, steps=40)
    scenario("wrapped_rings_2x2x2", jl, [{"cause": "rank_not_joined", "root_ranks": [5]}],
             stop={5: index_of(jl, 5, 37, "allreduce", "tp")}, keep={r: 256 + 17 * r for r in range(8)})
    scenario("missing_victim_dumps_2x2x2", j, [{"cause": "rank_not_joined", "root_ranks": [5]}],
             stop={5: index_of(j, 5, 2, "allreduce", "tp")}, missing={3, 6})
    scenario("clock_offsets_2x2x2", j, [{"cause": "rank_not_joined", "root_ranks": [5]}],
             stop={5: index_of(j, 5, 2, "allreduce", "tp")}, offsets={r: 120_000_000_000 for r in range(4, 8)})
    scenario("healthy_finished_2x2x2", j, [{"cause": None, "kind": "healthy", "root_ranks": []}])
    # A live snapshot: everyone blocked a moment ago in ops whose peers are still working.
    entries, progs, pos, now = simulate(j, stop={r: index_of(j, r, 3, "allreduce", "dp") for r in range(0, 8, 2)})
    write("healthy_in_flight_2x2x2", j, entries, pos, progs, now, [{"cause": None, "kind": "healthy", "root_ranks": []}],
          dump_delay_s=1)
    j221 = Job(2, 2, 1)
    scenario("order_mismatch_2x2x1", j221, [{"cause": "order_mismatch", "root_ranks": [1]}],
             swap=(1, index_of(j221, 1, 2, "allreduce", "tp", 3), index_of(j221, 1, 2, "allreduce", "mp")))


if __name__ == "__main__":
    main()
