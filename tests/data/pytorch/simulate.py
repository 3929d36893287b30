#!/usr/bin/env python3
"""A second, independent source of PyTorch Flight Recorder dumps: a simulated job, not hand-made
cases. Each rank runs a training step's program of collectives (data, tensor and pipeline
parallel groups, coalesced broadcast blocks, pipeline send/recv) through a model of
ProcessGroupNCCL and its FlightRecorder, written from their sources, not from megascope's reader:

- sequence numbers: collective_seq_id per process group, bumped once per collective and once per
  coalesced block (at its first op; an empty block consumes none); p2p_seq_id per group for p2p;
- a coalesced block: its members recorded without events (forever "scheduled", no times), then the
  closing "nccl:coalesced" entry with the block's events;
- the device runs a rank's ops in the order the CPU queued them (the CPU runs a few ops ahead); a
  collective completes when every member's device has it at the head of its queue and all issued
  the same op, sizes and dtype; a send when its receiver's device has the matching recv at its head;
- TORCH_NCCL_ENABLE_TIMING: an op at the head of its device's queue is "started"; without it an op
  is "scheduled" until it completes;
- the ring keeps the newest TORCH_NCCL_TRACE_BUFFER_SIZE entries, record_id counting on;
- dumps: every live rank's, as dump_json writes them (version 2.10).

One fault per job, and the verdict it must lead to comes from the fault, never from an analysis:
skip (a rank skips a collective: rank_not_joined), type/size/dtype (a rank issues another op:
op_mismatch), exit (a rank's process is gone, no dump: rank_dead), device (a rank's GPU is stuck
in a kernel of its own before a collective, timing on: rank_not_joined), empty_block (a rank's
coalesced block is empty: op_mismatch), stage (a pipeline rank stops before its recv:
rank_not_joined), none (a healthy job dumped mid-run: healthy).

Usage: simulate.py OUT_DIR [--seeds N] -- writes OUT_DIR/<case>/dumps/rank_<r>.json and
OUT_DIR/<case>/expected.json for seeds 0..N-1.
"""
import json
import os
import random
import sys

T0 = 1_730_000_000_000_000_000
FAULTS = ["skip", "type", "size", "dtype", "exit", "device", "empty_block", "stage", "none"]


class Op:
    def __init__(self, pg, kind, name, sizes, dtype="Float", peer=None, block=None):
        self.pg, self.kind, self.name, self.sizes, self.dtype = pg, kind, name, sizes, dtype
        self.peer, self.block = peer, block  # peer: global rank (p2p); block: member ops
        self.seq = None       # (collective or p2p) sequence number
        self.entries = []     # the recorder's entries of this op (members, then the op's own)
        self.done = False


class Rank:
    def __init__(self, r, ring, timing):
        self.r, self.ring, self.timing = r, ring, timing
        self.records, self.next_id = [], 0
        self.seq_coll, self.seq_p2p = {}, {}
        self.program, self.cpu, self.queue = [], 0, []
        self.alive, self.stuck_device = True, False

    def record(self, pg, name, sizes, dtype, seq_c, seq_p, p2p, events, now):
        e = {"record_id": self.next_id, "pg_id": int(pg[0]), "process_group": [pg[0], pg[1]],
             "thread_name": "pt_main_thread", "thread_id": "139871", "collective_seq_id": seq_c,
             "p2p_seq_id": seq_p, "op_id": self.next_id + 1, "profiling_name": name,
             "time_created_ns": now, "input_sizes": [list(s) for s in sizes],
             "input_dtypes": [dtype] * len(sizes), "output_sizes": [list(s) for s in sizes],
             "output_dtypes": [dtype] * len(sizes), "state": "scheduled",
             "time_discovered_started_ns": 0, "time_discovered_completed_ns": 0,
             "retired": False, "timeout_ms": 600000, "is_p2p": p2p, "_events": events}
        self.next_id += 1
        self.records.append(e)
        return e

    def issue(self, op, now):
        """ProcessGroupNCCL::collective / pointToPoint / start+endCoalescing as the recorder sees it."""
        key = op.pg[0]
        if op.kind == "p2p":
            self.seq_p2p[key] = self.seq_p2p.get(key, 0) + 1
            op.seq = self.seq_p2p[key]
            c = self.seq_coll.get(key, 0)
            op.entries.append(self.record(op.pg, op.name, op.sizes, op.dtype, c, op.seq, True, True,
                                          now))
        elif op.block is not None:
            if not op.block:  # an empty coalescing region: nothing recorded, no number consumed
                op.done = True
                return
            self.seq_coll[key] = self.seq_coll.get(key, 0) + 1
            op.seq = self.seq_coll[key]
            for m in op.block:
                op.entries.append(self.record(op.pg, m.name, m.sizes, m.dtype, op.seq, 0, False,
                                              False, now))
            op.entries.append(self.record(op.pg, "nccl:coalesced", [], op.dtype, op.seq, 0, False,
                                          True, now + 1))
        else:
            self.seq_coll[key] = self.seq_coll.get(key, 0) + 1
            op.seq = self.seq_coll[key]
            op.entries.append(self.record(op.pg, op.name, op.sizes, op.dtype, op.seq, 0, False,
                                          True, now))
        self.queue.append(op)

    def dump(self, groups):
        kept = self.records[-self.ring:]
        entries = []
        for e in kept:
            e = dict(e)
            events = e.pop("_events")
            if not events:
                e["state"], e["time_discovered_started_ns"] = "scheduled", 0
                e["time_discovered_completed_ns"], e["retired"] = 0, False
            entries.append(e)
        return {"version": "2.10", "comm_lib_version": "2.27.5",
                "pg_config": {g[0]: {"name": g[0], "desc": g[1], "ranks": str(sorted(m))}
                              for g, m in groups.items() if self.r in m},
                "pg_status": {}, "entries": entries}


def signature(op):
    if op.block is not None:
        return ("block", tuple((m.name, tuple(map(tuple, m.sizes)), m.dtype) for m in op.block))
    return (op.name, tuple(map(tuple, op.sizes)), op.dtype)


def build_job(rng):
    dp, tp, pp = rng.choice([(2, 2, 1), (4, 2, 1), (2, 1, 2), (2, 2, 2), (8, 1, 1), (1, 2, 2)])
    world = dp * tp * pp
    rank_of = lambda d, p, t: (d * pp + p) * tp + t  # noqa: E731
    groups, gid = {}, [1]

    def group(desc, members):
        g = (str(gid[0]), desc)
        gid[0] += 1
        groups[g] = set(members)
        return g

    groups[("0", "default_pg")] = set(range(world))
    tp_g, dp_g, pp_g = {}, {}, {}
    for d in range(dp):
        for p in range(pp):
            g = group("tp", [rank_of(d, p, t) for t in range(tp)]) if tp > 1 else None
            for t in range(tp):
                tp_g[rank_of(d, p, t)] = g
    for p in range(pp):
        for t in range(tp):
            g = group("dp", [rank_of(d, p, t) for d in range(dp)]) if dp > 1 else None
            for d in range(dp):
                dp_g[rank_of(d, p, t)] = g
    for d in range(dp):
        for t in range(tp):
            g = group("pp", [rank_of(d, p, t) for p in range(pp)]) if pp > 1 else None
            for p in range(pp):
                pp_g[rank_of(d, p, t)] = g
    coords = {rank_of(d, p, t): (d, p, t) for d in range(dp) for p in range(pp) for t in range(tp)}
    return world, groups, tp_g, dp_g, pp_g, coords, pp, rank_of


def step_program(r, c, pp, rank_of, tp_g, dp_g, pp_g, step, world_g, rng_sizes):
    """One training step of rank r: forward (tp all-reduce, pipeline send/recv), backward, the
    data-parallel gradient all-reduce, and every third step a coalesced broadcast of buffers."""
    d, p, t = c
    prog = []
    if p > 0:
        src = rank_of(d, p - 1, t)
        prog.append(Op(pp_g[r], "p2p", f"nccl:recv {p}<-{p - 1}", [[64, 16]], peer=src))
    if tp_g[r]:
        prog.append(Op(tp_g[r], "coll", "nccl:all_reduce", [[64, 16]]))
    if p < pp - 1:
        dst = rank_of(d, p + 1, t)
        prog.append(Op(pp_g[r], "p2p", f"nccl:send {p}->{p + 1}", [[64, 16]], peer=dst))
    if p < pp - 1:
        src = rank_of(d, p + 1, t)
        prog.append(Op(pp_g[r], "p2p", f"nccl:recv {p}<-{p + 1}", [[64, 16]], peer=src))
    if tp_g[r]:
        prog.append(Op(tp_g[r], "coll", "nccl:all_reduce", [[64, 16]]))
    if p > 0:
        dst = rank_of(d, p - 1, t)
        prog.append(Op(pp_g[r], "p2p", f"nccl:send {p}->{p - 1}", [[64, 16]], peer=dst))
    if dp_g[r]:
        prog.append(Op(dp_g[r], "coll", "nccl:all_reduce", [[rng_sizes, 16]]))
    if step % 3 == 2:
        members = [Op(world_g, "coll", "nccl:broadcast", [[32, 4]]),
                   Op(world_g, "coll", "nccl:broadcast", [[8]])]
        prog.append(Op(world_g, "coll", "nccl:coalesced", [], block=members))
    prog.append(Op(world_g, "coll", "nccl:all_reduce", [[1]]))  # the loss, reported every step
    return prog


def simulate(seed):
    rng = random.Random(seed)
    fault = FAULTS[seed % len(FAULTS)]
    world, groups, tp_g, dp_g, pp_g, coords, pp, rank_of = build_job(rng)
    world_g = ("0", "default_pg")
    timing = fault == "device" or rng.random() < 0.4
    ring = rng.choice([2000, 2000, 24, 16])
    steps = rng.randint(4, 8)
    ranks = [Rank(r, ring, timing) for r in range(world)]
    grad = 4096
    for rk in ranks:
        for s in range(steps):
            rk.program += step_program(rk.r, coords[rk.r], pp, rank_of, tp_g, dp_g, pp_g, s,
                                       world_g, grad)
    victim = rng.randrange(world)
    expected = None
    # The fault, at an op of the last step.
    if fault in ("skip", "type", "size", "dtype", "device", "exit"):
        prog = ranks[victim].program
        # An op of the world group's, in a random step (what comes after it never runs).
        last = rng.choice([i for i, op in enumerate(prog) if op.kind == "coll" and
                           op.block is None and op.pg == world_g])
        if fault == "skip":
            del prog[last:]  # it skipped the op and took another path out of the loop
            expected = {"cause": "rank_not_joined", "root_ranks": [victim]}
        elif fault == "type":
            prog[last].name = "nccl:all_gather"
            expected = {"cause": "op_mismatch", "root_ranks": [victim],
                        "mismatch": "COLLECTIVE_TYPE_MISMATCH"}
        elif fault == "size":
            prog[last].sizes = [[2]]
            expected = {"cause": "op_mismatch", "root_ranks": [victim],
                        "mismatch": "SIZE_OR_SYNTAX_MISMATCH"}
        elif fault == "dtype":
            prog[last].dtype = "BFloat16"
            expected = {"cause": "op_mismatch", "root_ranks": [victim],
                        "mismatch": "COLLECTIVE_DTYPE_MISMATCH"}
        elif fault == "device":
            ranks[victim].stuck_before = prog[last]
            expected = {"cause": "rank_not_joined", "root_ranks": [victim],
                        "mismatch": "COLLECTIVE_STATE_MISMATCH"}
        else:
            ranks[victim].exit_before = prog[last]
            expected = {"cause": "rank_dead", "root_ranks": [victim]}
    elif fault == "empty_block":
        prog = ranks[victim].program
        blocks = [op for op in prog if op.block]
        if blocks:
            blocks[-1].block = []
            expected = {"cause": "op_mismatch", "root_ranks": [victim],
                        "mismatch": "COLLECTIVE_TYPE_MISMATCH"}
        else:
            fault = "none"
    elif fault == "stage":
        if pp > 1:
            stage1 = [r for r in range(world) if coords[r][1] == pp - 1]
            victim = rng.choice(stage1)
            prog = ranks[victim].program
            recvs = [i for i, op in enumerate(prog) if op.kind == "p2p" and "recv" in op.name]
            ranks[victim].program = prog[:recvs[-1]]
            expected = {"cause": "rank_not_joined", "root_ranks": [victim]}
        else:
            fault = "none"
    hold_last = False
    if fault == "none":
        # Dumped mid-run at a point every rank reaches (_dump_nccl_trace after a step): the job's
        # first k steps, and half the time the step's last all-reduce still in flight everywhere.
        k = rng.randint(2, steps)
        for rk in ranks:
            rk.program = [op for op in rk.program][:len(rk.program) * k // steps]
        hold_last = rng.random() < 0.5
        expected = {"kind": "healthy", "cause": None, "root_ranks": []}

    depth = rng.randint(1, 4)
    # Run: each tick every live rank's CPU queues up to `depth` ops ahead of its device, then devices
    # complete what can complete, until nothing moves.
    now = T0
    for _ in range(100000):
        now += 1_000_000
        moved = False
        for rk in ranks:
            if not rk.alive:
                continue
            while rk.cpu < len(rk.program) and len(rk.queue) < depth:
                op = rk.program[rk.cpu]
                if getattr(rk, "exit_before", None) is op:
                    rk.alive = False
                    break
                rk.issue(op, now)
                rk.cpu += 1
                moved = True
            rk.queue = [op for op in rk.queue if not op.done]
        heads = {rk.r: rk.queue[0] for rk in ranks if rk.alive and rk.queue and
                 getattr(rk, "stuck_before", None) is not rk.queue[0]}
        held = {r for r, op in heads.items()
                if hold_last and op is ranks[r].program[-1]}  # in flight when dumped
        for r, op in heads.items():
            if ranks[r].timing:
                for e in op.entries[-1:]:
                    if e["_events"] and not e["time_discovered_started_ns"]:
                        e["state"], e["time_discovered_started_ns"] = "started", now
        done = []
        for r, op in heads.items():
            if op.kind == "p2p":
                other = heads.get(op.peer)
                ok = other is not None and other.kind == "p2p" and other.peer == r and \
                    ("send" in op.name) != ("send" in other.name)
            else:
                members = groups[op.pg]
                ok = all(m in heads and heads[m].pg == op.pg and heads[m].seq == op.seq and
                         signature(heads[m]) == signature(op) for m in members)
            if ok and r not in held:
                done.append(op)
        for op in done:
            op.done = True
            for e in op.entries:
                if e["_events"]:
                    e["state"], e["retired"] = "completed", True
                    e["time_discovered_completed_ns"] = now
                    if not e["time_discovered_started_ns"] and ranks[0].timing:
                        e["time_discovered_started_ns"] = now
            moved = True
        for rk in ranks:
            rk.queue = [op for op in rk.queue if not op.done]
        if not moved:
            break
    dumps = {rk.r: rk.dump(groups) for rk in ranks if rk.alive}
    expected["fault"] = fault
    return dumps, expected, {"world": world, "timing": timing, "ring": ring, "steps": steps}


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    seeds = int(sys.argv[sys.argv.index("--seeds") + 1]) if "--seeds" in sys.argv else 45
    for seed in range(seeds):
        dumps, expected, info = simulate(seed)
        d = os.path.join(out, f"sim_{seed:03d}_{expected['fault']}")
        os.makedirs(os.path.join(d, "dumps"), exist_ok=True)
        for r, x in dumps.items():
            with open(os.path.join(d, "dumps", f"rank_{r}.json"), "w") as f:
                json.dump(x, f)
        with open(os.path.join(d, "expected.json"), "w") as f:
            json.dump({"origin": "tests/data/pytorch/simulate.py seed %d" % seed, **info,
                       "verdicts": [{k: v for k, v in expected.items() if k != "fault"}]}, f,
                      indent=1)


if __name__ == "__main__":
    main()
