#!/usr/bin/env python3
"""Writes the PyTorch Flight Recorder cases of tests/data/pytorch/ as PyTorch writes them.

Independent of megascope's reader: the schema follows c10d's FlightRecorderDetail.hpp
(getCollectiveTrace / dump_dict for the pickle, dump_json for the JSON form), the pickle bytes
follow torch/csrc/jit/serialization/pickler.cpp (protocol 2; every dict and list wrapped in
torch.jit._pickle.restore_type_tag(value, "Dict[Any, Any]"), strings memoized with BINPUT and
repeated with BINGET, ints as BININT1/BININT2/BININT/LONG1, floats as big-endian BINFLOAT), and
the semantics follow ProcessGroupNCCL and tools/flight_recorder (p2p ranks in profiling names are
local to the group; coalesced members are recorded without events and the closing
"nccl:coalesced" entry carries the state; pg_status is keyed by pg id). File names are the
default TORCH_NCCL_DEBUG_INFO_TEMP_FILE prefix, /tmp/nccl_trace_rank_<rank>.

Each case: <case>/dumps/ (one file per rank) and <case>/expected.json (origin, form, verdicts).
Run from anywhere: python3 tests/data/pytorch/generate.py (rewrites every generated case).
"""
import json
import os
import pickle
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
T0 = 1_732_000_000_000_000_000  # ns


class JitPickler:
    """The byte stream torch::jit::pickle writes for dicts, lists, tuples and scalars."""

    def __init__(self):
        self.out = bytearray()
        self.memo = 0
        self.strings = {}
        self.globals = {}
        self.shared = {}  # id(obj) -> memo id, for containers referenced more than once
        self.refs = {}

    def binput(self):
        if self.memo <= 255:
            self.out += b"q" + bytes([self.memo])
        else:
            self.out += b"r" + struct.pack("<I", self.memo)
        self.memo += 1
        return self.memo - 1

    def binget(self, k):
        self.out += (b"h" + bytes([k])) if k <= 255 else (b"j" + struct.pack("<I", k))

    def string(self, s):
        if s in self.strings:
            return self.binget(self.strings[s])
        b = s.encode()
        self.out += b"X" + struct.pack("<I", len(b)) + b
        self.strings[s] = self.binput()

    def glob(self, module, name):
        key = module + "\n" + name + "\n"
        if key in self.globals:
            return self.binget(self.globals[key])
        self.out += b"c" + key.encode()
        self.globals[key] = self.binput()

    def int_(self, n):
        if 0 <= n <= 0xFF:
            self.out += b"K" + bytes([n])
        elif 0 <= n <= 0xFFFF:
            self.out += b"M" + struct.pack("<H", n)
        elif -(2**31) <= n < 2**31:
            self.out += b"J" + struct.pack("<i", n)
        else:
            self.out += b"\x8a\x08" + struct.pack("<q", n)

    def count(self, v):
        if isinstance(v, (dict, list)):
            self.refs[id(v)] = self.refs.get(id(v), 0) + 1
            if self.refs[id(v)] == 1:
                for x in v.values() if isinstance(v, dict) else v:
                    self.count(x)
        elif isinstance(v, tuple):
            for x in v:
                self.count(x)

    def value(self, v, annotation=None):
        if isinstance(v, (dict, list)) and id(v) in self.shared:
            return self.binget(self.shared[id(v)])
        if v is None:
            self.out += b"N"
        elif isinstance(v, bool):
            self.out += b"\x88" if v else b"\x89"
        elif isinstance(v, int):
            self.int_(v)
        elif isinstance(v, float):
            self.out += b"G" + struct.pack(">d", v)
        elif isinstance(v, str):
            self.string(v)
        elif isinstance(v, tuple):
            for x in v:
                self.value(x)
            self.out += {0: b")", 1: b"\x85", 2: b"\x86", 3: b"\x87"}[len(v)]
        elif isinstance(v, dict):
            self.glob("torch.jit._pickle", "restore_type_tag")
            self.out += b"}("
            for k, x in v.items():
                self.value(k)
                self.value(x)
            self.out += b"u"
            self.string("Dict[Any, Any]")
            self.out += b"\x86R"
        elif isinstance(v, list):
            self.glob("torch.jit._pickle", "restore_type_tag")
            self.out += b"]("
            for x in v:
                self.value(x)
            self.out += b"e"
            self.string("List[str]" if v and all(isinstance(x, str) for x in v) else "List[Any]")
            self.out += b"\x86R"
        else:
            raise TypeError(type(v))
        if isinstance(v, (dict, list)) and self.refs.get(id(v), 0) > 1:
            self.shared[id(v)] = self.binput()

    def dumps(self, v):
        self.count(v)
        self.out += b"\x80\x02"
        self.value(v)
        self.out += b"."
        return bytes(self.out)


def entry(record_id, pg, seq, name, state, p2p_seq=0, sizes=((1024,),), dtype="Float",
          frames=None, timeout_ms=600000, is_p2p=False, t=0, out_sizes=None, timing=None,
          events=True):
    """One entry as getCollectiveTrace writes it (Python values; pg is (name, desc)).

    timing: None keeps the old cases' times; False writes no start time (no start event without
    TORCH_NCCL_ENABLE_TIMING), True also a duration for a completed op. events=False: a member of a
    coalesced block, recorded with no events (forever "scheduled", no times)."""
    out_sizes = sizes if out_sizes is None else out_sizes
    if not events:
        state = "scheduled"
    started = None if state == "scheduled" or timing is False else T0 + t + 1000
    e = {
        "record_id": record_id,
        "pg_id": int(pg[0]) if pg[0].isdigit() else 0,
        "process_group": (pg[0], pg[1]),
        "thread_name": "pt_main_thread",
        "thread_id": "140245680379712",
        "collective_seq_id": seq,
        "p2p_seq_id": p2p_seq,
        "op_id": record_id + 1,
        "profiling_name": name,
        "time_created_ns": T0 + t,
        "input_sizes": [list(s) for s in sizes],
        "input_dtypes": [dtype] * len(sizes),
        "output_sizes": [list(s) for s in out_sizes],
        "output_dtypes": [dtype] * len(out_sizes),
        "state": state,
        "time_discovered_started_ns": started,
        "time_discovered_completed_ns": T0 + t + 2000 if state == "completed" else None,
        "retired": state == "completed",
        "timeout_ms": timeout_ms,
        "is_p2p": is_p2p,
    }
    if timing and state == "completed":
        e["duration_ms"] = 0.75
    if frames is not None:
        e["frames"] = frames
    return e


def dump(groups, entries, pg_status=None, version="2.10", comm_lib_version="2.21.5"):
    """dump_dict: groups maps name -> (desc, ranks)."""
    d = {
        "version": version,
        "pg_config": {n: {"name": n, "desc": desc, "ranks": str(list(r))} for n, (desc, r) in groups.items()},
        "comm_lib_version": comm_lib_version,
        "pg_status": pg_status or {},
        "entries": entries,
    }
    return d


def as_json(d):
    """dump_json's differences: pg_status values and absent times as written there."""
    j = dict(d)
    j["pg_status"] = {k: {kk: str(vv) for kk, vv in v.items()} for k, v in d["pg_status"].items()}
    ents = []
    for e in d["entries"]:
        e = dict(e)
        e.pop("frames", None)
        e["process_group"] = list(e["process_group"])
        for k in ("time_discovered_started_ns", "time_discovered_completed_ns"):
            e[k] = e[k] or 0
        ents.append(e)
    if ents:
        j["entries"] = ents
    else:
        j.pop("entries")
    return json.dumps(j)


def write_case(name, origin, dumps, expected, form="pickle", warnings=None, dumped_at_ns=None,
               prefix="nccl_trace_rank_", options=None):
    d = os.path.join(HERE, name)
    os.makedirs(os.path.join(d, "dumps"), exist_ok=True)
    for f in os.listdir(os.path.join(d, "dumps")):
        os.remove(os.path.join(d, "dumps", f))
    for rank, x in dumps.items():
        path = os.path.join(d, "dumps", f"{prefix}{rank}")
        if form == "pickle":
            open(path, "wb").write(JitPickler().dumps(x))
        elif form == "python-pickle":  # a dump loaded and saved again by Python (protocol 5)
            open(path, "wb").write(pickle.dumps(x, protocol=5))
        else:
            open(path + ".json", "w").write(as_json(x))
    with open(os.path.join(d, "expected.json"), "w") as f:
        case = {"origin": origin, "form": form, "verdicts": expected}
        if warnings:
            case["warnings"] = warnings  # a part of each warning the reader must give, in order
        if dumped_at_ns is not None:  # each file's time, which the test restores on a copy
            suffix = ".json" if form == "json" else ""
            case["dumped_at_ns"] = {f"{prefix}{r}{suffix}": dumped_at_ns for r in dumps}
        if options:  # how the reader is asked to read the set (the analyze command's flags)
            case["options"] = options
        json.dump(case, f, indent=1)
        f.write("\n")


WORLD = ("0", "default_pg")


def world(n):
    return {"0": ("default_pg", range(n))}


def allreduces(rank, count, last_state="completed", start=0):
    return [entry(start + k, WORLD, start + k + 1, "nccl:all_reduce",
                  last_state if k == count - 1 else "completed", t=k * 10_000_000)
            for k in range(count)]


def main():
    frames = [{"name": "all_reduce", "filename": "torch/distributed/distributed_c10d.py", "line": 2696},
              {"name": "train_step", "filename": "/job/train.py", "line": 88}]

    # 1. One rank never reaches the all-reduce its 7 peers wait in (pickle, with stack frames
    #    shared between entries as all_frames are).
    dumps = {}
    for r in range(8):
        ents = allreduces(r, 5 if r != 5 else 4, last_state="started")
        if r == 5:
            ents[-1] = entry(3, WORLD, 4, "nccl:all_reduce", "completed", t=30_000_000)
        for e in ents:
            e["frames"] = frames
        dumps[r] = dump(world(8), ents, {"0": {"last_enqueued_collective": len(ents),
                                               "last_started_collective": len(ents),
                                               "last_completed_collective": len(ents) - (r != 5)}})
    write_case("pickle_rank_not_joined_8", "FlightRecorderDetail.hpp dump_dict + jit pickler.cpp; "
               "the TORCH_NCCL_DUMP_ON_TIMEOUT case of test_c10d_nccl's FR tests (one rank skips a collective)",
               dumps, [{"cause": "rank_not_joined", "root_ranks": [5]}])

    # 1b. The same job, but rank 5 crashed and wrote no dump (TORCH_NCCL_DUMP_ON_TIMEOUT dumps from
    #     the ranks whose watchdog fired; a dead process writes nothing).
    del dumps[5]
    write_case("failed_rank_wrote_no_dump", "a rank that died leaves no nccl_trace_rank_N file; its "
               "peers' dumps show them waiting for it", dumps, [{"cause": "rank_dead", "root_ranks": [5],
                                                                 "waiting_ranks": [0, 1, 2, 3, 4, 6, 7]}])

    # 2. Pipeline send/recv inside a 2-rank group [2, 3]: "nccl:recv 1<-0" names group-local ranks.
    #    Rank 2 never sends (stuck in its own stage); rank 3 waits in its recv.
    pp = ("1", "pp")
    groups = {"0": ("default_pg", range(4)), "1": ("pp", [2, 3])}
    dumps = {}
    for r in range(4):
        ents = allreduces(r, 2)
        if r == 3:
            ents.append(entry(2, pp, 0, "nccl:recv 1<-0", "started", p2p_seq=1, is_p2p=True, t=50_000_000))
        dumps[r] = dump(groups, ents)
    write_case("p2p_group_local_ranks", "ProcessGroupNCCL profiling names 'nccl:recv <self><-<src>' use "
               "group ranks; tools/flight_recorder Op._init_global_src_dst maps them through sorted(pg ranks)",
               dumps, [{"cause": "rank_not_joined", "root_ranks": [2]}])

    # 3. A completed coalesced block (members never change state, the closing entry does), then
    #    an all-reduce rank 2 never joins.
    dumps = {}
    for r in range(4):
        ents = allreduces(r, 1)
        ents += [entry(1, WORLD, 2, "nccl:all_gather_into_tensor_coalesced", "scheduled", t=20_000_000),
                 entry(2, WORLD, 2, "nccl:all_gather_into_tensor_coalesced", "scheduled", t=20_000_100),
                 entry(3, WORLD, 2, "nccl:coalesced", "completed", t=20_000_200)]
        if r != 2:
            ents.append(entry(4, WORLD, 3, "nccl:all_reduce", "started", t=30_000_000))
        dumps[r] = dump(world(4), ents)
    write_case("coalesced_members_take_the_closing_state", "ProcessGroupNCCL endCoalescing records "
               "'nccl:coalesced' with the events; members are recorded with none (tools/flight_recorder "
               "match_coalesced_groups)", dumps, [{"cause": "rank_not_joined", "root_ranks": [2]}])

    # 4. all_to_all_single with uneven splits (legal), then rank 1 misses a barrier-all-reduce.
    dumps = {}
    for r in range(4):
        ents = allreduces(r, 1)
        ents.append(entry(1, WORLD, 2, "nccl:all_to_all", "completed", sizes=((256 * (r + 1),),),
                          t=20_000_000))
        if r != 1:
            ents.append(entry(2, WORLD, 3, "nccl:all_reduce", "started", t=30_000_000))
        dumps[r] = dump(world(4), ents)
    write_case("alltoall_uneven_splits", "all_to_all_v splits may differ per rank (tools/flight_recorder "
               "check_size_alltoall compares totals, not per-rank sizes)", dumps,
               [{"cause": "rank_not_joined", "root_ranks": [1]}])

    # 5. A departing rank: rank 3 issues all_gather where the other three issue all_reduce.
    dumps = {}
    for r in range(4):
        ents = allreduces(r, 3)
        ents.append(entry(3, WORLD, 4, "nccl:all_gather" if r == 3 else "nccl:all_reduce", "started",
                          t=40_000_000))
        dumps[r] = dump(world(4), ents)
    write_case("op_mismatch_minority", "COLLECTIVE_TYPE_MISMATCH of tools/flight_recorder; the culprit is "
               "the rank that departs from the others", dumps, [{"cause": "op_mismatch", "root_ranks": [3]}],
               form="json")

    # 6. Everything completed: healthy.
    dumps = {r: dump(world(4), allreduces(r, 6)) for r in range(4)}
    write_case("healthy_all_completed", "a clean dump_dict of a job that did not hang", dumps,
               [{"kind": "healthy", "cause": None, "root_ranks": []}])

    # 7. A gather (no megascope op name) whose root never arrives.
    dumps = {}
    for r in range(4):
        ents = allreduces(r, 2)
        if r != 0:
            ents.append(entry(2, WORLD, 3, "nccl:gather", "started", t=30_000_000))
        dumps[r] = dump(world(4), ents)
    write_case("gather_root_missing", "gather/scatter are in tools/flight_recorder's COLLECTIVES; "
               "saved again by Python's pickle (protocol 5)", dumps,
               [{"cause": "rank_not_joined", "root_ranks": [0]}], form="python-pickle")

    # 8. No entries (includeCollectives=False): pg_status (keyed by pg id) is the evidence. JSON.
    dumps = {}
    for r in range(4):
        d = dump(world(4), [], {"0": {"last_enqueued_collective": 7 if r != 1 else 6,
                                      "last_started_collective": 7 if r != 1 else 6,
                                      "last_completed_collective": 6}})
        dumps[r] = d
    write_case("pg_status_only", "dump_json with includeCollectives=False: 'entries' is left out and "
               "pg_status values are strings", dumps, [{"cause": "rank_not_joined", "root_ranks": [1]}],
               form="json")

    # 9. The CPU runs ahead of the GPU: ranks 0-2 are stuck in world all-reduce #4 (rank 3 never
    #    issued it) and have already queued their next ops in their tp groups behind it. The stuck
    #    op is the oldest open one, not the newest.
    groups = {"0": ("default_pg", range(4)), "1": ("tp", [0, 1]), "2": ("tp", [2, 3])}
    dumps = {}
    for r in range(4):
        ents = allreduces(r, 3)
        if r != 3:
            ents.append(entry(3, WORLD, 4, "nccl:all_reduce", "started", t=40_000_000))
            tp = ("1", "tp") if r < 2 else ("2", "tp")
            ents.append(entry(4, tp, 1, "nccl:all_reduce", "scheduled", t=40_000_100))
        dumps[r] = dump(groups, ents)
    write_case("cpu_runs_ahead_oldest_open_op_is_stuck", "NCCL ops run in stream order after the CPU "
               "queued them: the watchdog times out the oldest unfinished op (ProcessGroupNCCL "
               "watchdog; tools/flight_recorder reports the first mismatch)", dumps,
               [{"cause": "rank_not_joined", "root_ranks": [3], "waiting_ranks": [0, 1, 2]}])

    # 10. A cross-group deadlock in the first iteration (no periodic history to compare with):
    #     ranks 0-2 issue dp then tp, rank 3 issues tp then dp. On the devices each waits in its
    #     first one; rank 3 departs from the others.
    A, B = ("1", "dp"), ("2", "tp")
    groups = {"0": ("default_pg", range(4)), "1": ("dp", range(4)), "2": ("tp", range(4))}
    dumps = {}
    for r in range(4):
        ents = allreduces(r, 2)
        first, second = (A, B) if r != 3 else (B, A)
        ents.append(entry(2, first, 1, "nccl:all_reduce", "started", t=30_000_000))
        ents.append(entry(3, second, 1, "nccl:all_reduce", "scheduled", t=30_000_100))
        dumps[r] = dump(groups, ents)
    write_case("cross_group_order_deadlock_without_history", "the classic collective-order deadlock "
               "(tools/flight_recorder reports it as a mismatch of collective_seq_id across groups); the "
               "departing rank is the minority", dumps,
               [{"cause": "order_mismatch", "root_ranks": [3], "waiting_ranks": [0, 1, 2]}])

    # 11. The first recorder (PyTorch 2.2's NCCLTraceBuffer::dump, before the dump had a version):
    #     a bare list of entries with pg_id, seq_id, time_created_us and no pg_config, rank or
    #     timeout. Without timing no start event is recorded, so an open op stays "scheduled".
    #     Rank 2 never issues the world's 5th all-reduce. Ranks 0 and 1 also made a subgroup
    #     (pg_id 1 on them; rank 2 and 3 made none): its entries cannot be placed and are left out.
    dumps = {}
    for r in range(4):
        ents = []
        for k in range(5 if r != 2 else 4):
            state = "scheduled" if k == 4 else "completed"
            ents.append({"pg_id": 0, "seq_id": k + 1, "profiling_name": "nccl:all_reduce",
                         "time_created_us": T0 // 1000 + k * 10_000, "input_sizes": [[1024]],
                         "output_sizes": [[1024]], "state": state, "retired": state == "completed",
                         "frames": frames})
        if r < 2:
            ents.insert(1, {"pg_id": 1, "seq_id": 1, "profiling_name": "nccl:broadcast",
                            "time_created_us": T0 // 1000 + 5_000, "input_sizes": [[16]],
                            "output_sizes": [[16]], "state": "completed", "retired": True,
                            "frames": []})
        dumps[r] = ents
    write_case("first_recorder_bare_list", "the first recorder's dump() in c10d TraceUtils.h "
               "(pytorch#110960, PyTorch 2.2; the version tag came with pytorch#118046): "
               "pickle_str of a list of entry dicts", dumps,
               [{"cause": "rank_not_joined", "root_ranks": [2], "waiting_ranks": [0, 1, 3]}],
               warnings=["process group (a first-recorder dump names only the default group's "
                         "members) '1' in 2 dumps"])


    # ---- PyTorch's own semantics (torch/distributed/flight_recorder/components/utils.py and
    # types.py; ProcessGroupNCCL start/endCoalescing; test_fr_analysis.py's build_db cases) ----

    def block(record, pg, seq, members, closing_state, t, closing="nccl:coalesced", timing=False):
        """A coalesced block as ProcessGroupNCCL records it: each member op with no events (forever
        "scheduled", no times), then the closing entry that carries the block's events; all share
        the group's collective_seq_id (bumped once, by the block's first op)."""
        out = [entry(record + i, pg, seq, name, "scheduled", sizes=sz, out_sizes=osz, t=t + i,
                     events=False) for i, (name, sz, osz) in enumerate(members)]
        out.append(entry(record + len(members), pg, seq, closing, closing_state, sizes=(), t=t + 50,
                         timing=timing))
        return out

    # 12. A healthy job dumped mid-run (a periodic _dump_nccl_trace, not a timeout): coalesced
    #     broadcasts every step (dist._coalescing_manager around two broadcasts, the
    #     test_c10d_nccl coalescing tests). The newest block had completed on ranks 0 and 1 and
    #     not yet on 2 and 3 when each dumped. PyTorch matches a closing entry by type only.
    bcasts = [("nccl:broadcast", ((256, 4),), ((256, 4),)), ("nccl:broadcast", ((64,),), ((64,),))]
    dumps = {}
    for r in range(4):
        ents, rec, seq = [], 0, 0
        for step in range(3):
            seq += 1
            ents.append(entry(rec, WORLD, seq, "nccl:all_reduce", "completed", t=step * 10_000_000,
                              timing=False))
            rec += 1
            seq += 1
            last = step == 2 and r >= 2
            ents += block(rec, WORLD, seq, bcasts, "scheduled" if last else "completed",
                          t=step * 10_000_000 + 1_000_000)
            rec += len(bcasts) + 1
        dumps[r] = dump(world(4), ents)
    write_case("coalesced_broadcasts_healthy_periodic_dump", "ProcessGroupNCCL records a coalesced "
               "block's members without events and the closing 'nccl:coalesced' entry with them; "
               "types.py Op.match compares the closing entry by type only, so a block completed on "
               "some ranks and in flight on others is matched (test_fr_analysis build_db case 3)",
               dumps, [{"kind": "healthy", "cause": None, "root_ranks": []}], form="json")

    # 13. A rank whose coalescing block was empty recorded nothing and consumed no sequence
    #     number (ProcessGroupNCCL bumps seqCollective_ at a block's first op; endCoalescing with
    #     nothing coalesced returns): its next op, an all_reduce, has the number the others' block
    #     of broadcasts has. The op mismatch is on that rank.
    dumps = {}
    for r in range(4):
        ents = allreduces(r, 2)
        if r != 3:
            ents += block(2, WORLD, 3, bcasts, "scheduled", t=30_000_000)
        else:
            ents.append(entry(2, WORLD, 3, "nccl:all_reduce", "scheduled", t=30_000_000))
        dumps[r] = dump(world(4), ents)
    write_case("coalesced_block_empty_on_one_rank", "test_fr_analysis build_db case 6 (an empty "
               "coalesced call on one rank); startCoalescing/collective bump the sequence number at "
               "the block's first op", dumps,
               [{"cause": "op_mismatch", "root_ranks": [3], "waiting_ranks": [0, 1, 2],
                 "mismatch": "COLLECTIVE_TYPE_MISMATCH"}])

    # 14. all_gather_into_tensor where rank 2 passes a smaller input than its peers (an uneven
    #     all-gather): SIZE_OR_SYNTAX_MISMATCH on rank 2 (types.py Op.match: input sizes, then
    #     output numel = input numel x group size).
    dumps = {}
    for r in range(4):
        ents = allreduces(r, 2)
        rows = 6 if r == 2 else 8
        ents.append(entry(2, WORLD, 3, "nccl:_all_gather_base", "scheduled", sizes=((rows, 4),),
                          out_sizes=((rows * 4, 4),), t=30_000_000))
        dumps[r] = dump(world(4), ents)
    write_case("all_gather_size_mismatch", "types.py Op.match SIZE_OR_SYNTAX_MISMATCH "
               "(test_fr_analysis test_match_one_event e5/e6); the culprit is the rank outside the "
               "largest matching set", dumps,
               [{"cause": "op_mismatch", "root_ranks": [2], "waiting_ranks": [0, 1, 3],
                 "mismatch": "SIZE_OR_SYNTAX_MISMATCH"}], form="json")

    # 15. An uneven all_gather, which ProcessGroupNCCL runs as one _broadcast_oop per rank's chunk
    #     in a block closed by ALLGATHER_coalesced (the test_c10d_nccl uneven all-gather test:
    #     member i has input_sizes [[i + 1, 2]]). Rank 1 believes chunk 3 has 5 rows.
    dumps = {}
    for r in range(4):
        ents = allreduces(r, 2)
        members = [("nccl:_broadcast_oop", ((5 if (r == 1 and i == 3) else i + 1, 2),),
                    ((5 if (r == 1 and i == 3) else i + 1, 2),)) for i in range(4)]
        ents += block(2, WORLD, 3, members, "scheduled", t=30_000_000,
                      closing="nccl:ALLGATHER_coalesced")
        dumps[r] = dump(world(4), ents)
    write_case("uneven_all_gather_coalesced_size_mismatch", "test_fr_analysis build_db case 4 "
               "(mis-matched uneven all-gather: _broadcast_oop members closed by "
               "ALLGATHER_coalesced, one member's sizes differ)", dumps,
               [{"cause": "op_mismatch", "root_ranks": [1], "mismatch": "SIZE_OR_SYNTAX_MISMATCH"}])

    # 16. One of 8 ranks takes another branch: its 7 peers broadcast (a new op for them after a
    #     run of all-reduces), rank 6 all-reduces again. The one rank is named, not the seven.
    dumps = {}
    for r in range(8):
        ents = allreduces(r, 3)
        ents.append(entry(3, WORLD, 4, "nccl:all_reduce" if r == 6 else "nccl:broadcast",
                          "scheduled", t=40_000_000,
                          frames=frames if r == 6 else [
                              {"name": "broadcast", "filename": "torch/distributed/distributed_c10d.py",
                               "line": 2608},
                              {"name": "save_checkpoint", "filename": "/job/train.py", "line": 131}]))
        dumps[r] = dump(world(8), ents)
    write_case("op_mismatch_one_of_eight", "COLLECTIVE_TYPE_MISMATCH in an 8-rank job; the "
               "minority is the culprit even where the majority changed op", dumps,
               [{"cause": "op_mismatch", "root_ranks": [6], "waiting_ranks": [0, 1, 2, 3, 4, 5, 7],
                 "mismatch": "COLLECTIVE_TYPE_MISMATCH"}])

    # 17. An NCCL error 3 s after rank 1 exited, long before the 10-minute timeout: the three
    #     live ranks dump (TORCH_NCCL_DUMP_ON_TIMEOUT dumps on errors too); rank 1 wrote nothing.
    dumps = {}
    for r in (0, 2, 3):
        ents = allreduces(r, 4, last_state="scheduled")
        dumps[r] = dump(world(4), ents, {"0": {"last_enqueued_collective": 4,
                                               "last_started_collective": 3,
                                               "last_completed_collective": 3}})
    write_case("nccl_error_peer_exited", "a dump on an NCCL error (ProcessGroupNCCL watchdog, "
               "remote error after a peer's exit): a rank with no dump is gone", dumps,
               [{"cause": "rank_dead", "root_ranks": [1], "waiting_ranks": [0, 2, 3]}])

    # 18. TORCH_NCCL_ENABLE_TIMING: start events are recorded, so an op whose kernel began is
    #     "started" and a completed one has a duration. Rank 2's GPU is stuck in a kernel of its
    #     own: its all_reduce #5 is still "scheduled" while its peers' started.
    dumps = {}
    for r in range(4):
        ents = [entry(k, WORLD, k + 1, "nccl:all_reduce", "completed", t=k * 10_000_000,
                      timing=True) for k in range(4)]
        ents.append(entry(4, WORLD, 5, "nccl:all_reduce", "scheduled" if r == 2 else "started",
                          t=40_000_000, timing=True))
        dumps[r] = dump(world(4), ents)
    write_case("timing_kernel_never_started", "with timing on, FlightRecorder::update_state marks "
               "an entry started when its start event completes; a member whose kernel never "
               "started (COLLECTIVE_STATE_MISMATCH: scheduled vs started) is where the job stops",
               dumps, [{"cause": "rank_not_joined", "root_ranks": [2], "waiting_ranks": [0, 1, 3],
                        "mismatch": "COLLECTIVE_STATE_MISMATCH"}], form="json")

    # 19. Wrapped rings with pipeline p2p (TORCH_NCCL_TRACE_BUFFER_SIZE=12): stage 0 (ranks 0, 2)
    #     records 4 ops a step, stage 1 (ranks 1, 3) 3, so the rings dropped different numbers of
    #     each pair's transfers. Step 8: rank 1 never posts its recv; rank 0's send waits for it,
    #     rank 3's dp all-reduce waits for it, rank 2's dp all-reduce waits behind rank 0.
    pp = {0: ("1", "pp"), 1: ("1", "pp"), 2: ("2", "pp"), 3: ("2", "pp")}
    dp = {0: ("3", "dp"), 2: ("3", "dp"), 1: ("4", "dp"), 3: ("4", "dp")}
    ring = 12
    dumps = {}
    for r in range(4):
        groups = {"0": ("default_pg", range(4)), pp[r][0]: ("pp", [0, 1] if r in (0, 1) else [2, 3]),
                  dp[r][0]: ("dp", [0, 2] if r in (0, 2) else [1, 3])}
        ents, rec, p2p, coll = [], 0, 0, 0
        for step in range(1, 9):
            t = step * 100_000_000
            stuck = step == 8
            if r in (0, 2):
                coll += 1
                ents.append(entry(rec, dp[r], coll, "nccl:broadcast", "completed", t=t)); rec += 1
                p2p += 1
                send_state = "scheduled" if (stuck and r == 0) else "completed"
                ents.append(entry(rec, pp[r], 0, "nccl:send 0->1", send_state, p2p_seq=p2p,
                                  is_p2p=True, t=t + 1000)); rec += 1
                p2p += 1
                ents.append(entry(rec, pp[r], 0, "nccl:recv 0<-1",
                                  "scheduled" if (stuck and r == 0) else "completed", p2p_seq=p2p,
                                  is_p2p=True, t=t + 2000)); rec += 1
                coll += 1
                ents.append(entry(rec, dp[r], coll, "nccl:all_reduce",
                                  "scheduled" if stuck else "completed", t=t + 3000)); rec += 1
            elif not (stuck and r == 1):
                p2p += 1
                ents.append(entry(rec, pp[r], 0, "nccl:recv 1<-0", "completed", p2p_seq=p2p,
                                  is_p2p=True, t=t + 1500)); rec += 1
                p2p += 1
                ents.append(entry(rec, pp[r], 0, "nccl:send 1->0", "completed", p2p_seq=p2p,
                                  is_p2p=True, t=t + 1800)); rec += 1
                coll += 1
                ents.append(entry(rec, dp[r], coll, "nccl:all_reduce",
                                  "scheduled" if stuck else "completed", t=t + 3000)); rec += 1
        dumps[r] = dump(groups, ents[-ring:])
    write_case("wrapped_rings_pipeline_rank_not_joined", "FlightRecorder keeps the newest "
               "TORCH_NCCL_TRACE_BUFFER_SIZE entries (record_id keeps counting); utils.py "
               "align_trace_from_beginning: wrapped rings start at different records, so p2p "
               "transfers cannot be counted from each ring's start", dumps,
               [{"cause": "rank_not_joined", "root_ranks": [1], "waiting_ranks": [0, 2, 3]}])

    # 20. Gloo's recorder (PyTorch >= 2.8) and a backend this reader has not seen ("nccl2",
    #     spelling its types in CamelCase): read, not refused, prefixes kept. Rank 0 never issues
    #     the 4th all-reduce.
    for backend, name, case in (("gloo", "all_reduce", "gloo_rank_not_joined"),
                                ("nccl2", "AllReduce", "unknown_backend_rank_not_joined")):
        dumps = {}
        for r in range(4):
            ents = [entry(k, WORLD, k + 1, f"{backend}:{name}", "completed", t=k * 10_000_000,
                          timing=False) for k in range(3 if r == 0 else 4)]
            if r != 0:
                ents[-1] = entry(3, WORLD, 4, f"{backend}:{name}", "scheduled", t=30_000_000)
            dumps[r] = dump(world(4), ents, comm_lib_version="" if backend == "gloo" else "2.29.1")
        write_case(case, f"ProcessGroup{backend.capitalize()} entries named '{backend}:{name}'; "
                   "types.py Op accepts backend prefixes beyond nccl", dumps,
                   [{"cause": "rank_not_joined", "root_ranks": [0], "waiting_ranks": [1, 2, 3]}],
                   form="json")

    # 21. A healthy job dumped mid-run with timing on: every rank's newest all-reduce is in flight
    #     (its kernel started everywhere), nothing else open. PyTorch's analysis finds every
    #     member joined and matching; the copied files do not say how long it had been open.
    dumps = {}
    for r in range(4):
        ents = [entry(k, WORLD, k + 1, "nccl:all_reduce", "completed", t=k * 10_000_000,
                      timing=True) for k in range(5)]
        ents.append(entry(5, WORLD, 6, "nccl:all_reduce", "started", t=50_000_000, timing=True))
        dumps[r] = dump(world(4), ents)
    write_case("healthy_dumped_mid_run_in_flight", "_dump_nccl_trace on a healthy job with "
               "TORCH_NCCL_ENABLE_TIMING: the op in flight is started on every rank; utils.py "
               "error_analysis finds no error", dumps,
               [{"kind": "healthy", "cause": None, "root_ranks": []}])

    # 22. A pipeline's send/recv ordering deadlock (1F1B written wrong): after two healthy steps
    #     both stage ranks post a send to each other first and neither posts its recv. NCCL's send
    #     waits for the peer's recv, so each waits on the other: neither skipped anything, both
    #     issued their ops in an order that cannot meet (test_c10d_nccl's p2p tests; the
    #     p2p_seq_id counts both directions of a group's transfers).
    pp = ("1", "pp")
    groups = {"0": ("default_pg", range(2)), "1": ("pp", [0, 1])}
    dumps = {}
    for r in range(2):
        ents, rec, p2p = [], 0, 0
        for step in range(3):
            t = step * 10_000_000
            first, second = ("nccl:send 0->1", "nccl:recv 0<-1") if r == 0 else \
                            ("nccl:recv 1<-0", "nccl:send 1->0")
            if step == 2:  # both send first
                first = "nccl:send 0->1" if r == 0 else "nccl:send 1->0"
            p2p += 1
            ents.append(entry(rec, pp, 0, first, "started" if step == 2 else "completed",
                              p2p_seq=p2p, is_p2p=True, t=t, timing=True)); rec += 1
            if step < 2:
                p2p += 1
                ents.append(entry(rec, pp, 0, second, "completed", p2p_seq=p2p, is_p2p=True,
                                  t=t + 1000, timing=True)); rec += 1
        dumps[r] = dump(groups, ents)
    write_case("p2p_both_send_first_order_deadlock", "ProcessGroupNCCL send/recv (p2p_seq_id per "
               "group); types.py Op.match: a send matches only its peer's recv, so each rank's send "
               "meets the other's send -- both ranks' order is wrong, neither is missing", dumps,
               [{"cause": "order_mismatch", "root_ranks": [0, 1]}], form="json")

    # 23. A slow collective that is progressing: with TORCH_NCCL_ENABLE_TIMING, the job's big
    #     all-reduce takes about 25 s every step (each completed one's duration_ms says so); the
    #     newest has been in flight 22 s on every rank, its kernel started everywhere, far from
    #     the 10-minute timeout, when a periodic dump is taken. Every member joined and matches,
    #     no op is past its timeout and none is older than the op usually takes: healthy.
    dumps = {}
    for r in range(4):
        ents = []
        for k in range(4):
            e = entry(k, WORLD, k + 1, "nccl:all_reduce", "completed", sizes=((1 << 28,),),
                      t=k * 30_000_000_000, timing=True)
            e["time_discovered_completed_ns"] = e["time_discovered_started_ns"] + 25_000_000_000
            e["duration_ms"] = 24_800.0 + 100 * k
            ents.append(e)
        ents.append(entry(4, WORLD, 5, "nccl:all_reduce", "started", sizes=((1 << 28,),),
                          t=4 * 30_000_000_000, timing=True))
        dumps[r] = dump(world(4), ents)
    write_case("slow_collective_progressing_healthy", "_dump_nccl_trace on a healthy job with "
               "TORCH_NCCL_ENABLE_TIMING (duration_ms from the start and end events): the op in "
               "flight is started on every member and younger than the op's usual duration and "
               "its timeout; utils.py error_analysis finds no error", dumps,
               [{"kind": "healthy", "cause": None, "root_ranks": []}], form="json",
               dumped_at_ns=T0 + 4 * 30_000_000_000 + 22_000_000_000)

    # 24. An in-process restart (torchft, or a job's own abort-and-retry) re-creates the world
    #     group under the same name: ProcessGroupNCCL gives every new instance a new uid (the
    #     entries' pg_id) while pg_config is keyed by the name, and without FlightRecorder's
    #     reset the aborted incarnation's entries stay in the ring, record_id counting on and
    #     collective_seq_id starting again at 1. The aborted incarnation (pg_id 0) left an
    #     all-reduce open on ranks 0-2; the live one (pg_id 3) is stuck because rank 3 never
    #     joins its 3rd all-reduce. The stale entries say nothing about the live hang.
    dumps = {}
    for r in range(4):
        old = [entry(k, WORLD, k + 1, "nccl:all_reduce", "completed", t=k * 10_000_000)
               for k in range(4)]
        old.append(entry(4, WORLD, 5, "nccl:all_reduce", "scheduled" if r == 1 else "started",
                         t=40_000_000))
        live = [entry(5 + k, WORLD, k + 1, "nccl:all_reduce", "completed",
                      t=100_000_000 + k * 10_000_000) for k in range(2)]
        if r != 3:
            live.append(entry(7, WORLD, 3, "nccl:all_reduce", "started", t=130_000_000))
        for e in live:
            e["pg_id"] = 3
        dumps[r] = dump(world(4), old + live, {"0": {"last_enqueued_collective": 5,
                                                     "last_started_collective": 5 - (r == 1),
                                                     "last_completed_collective": 4},
                                               "3": {"last_enqueued_collective": 3 - (r == 3),
                                                     "last_started_collective": 3 - (r == 3),
                                                     "last_completed_collective": 2}})
    write_case("inprocess_restart_same_group_name", "ProcessGroupNCCL uid_ (an entry's pg_id) is "
               "new for every instance, pg_config is keyed by name; FlightRecorder::reset_all was "
               "not called, so the aborted instance's entries stay in the ring", dumps,
               [{"cause": "rank_not_joined", "root_ranks": [3], "waiting_ranks": [0, 1, 2]}],
               warnings=["process group '0' was created again"])

    # 25. all_to_all with per-peer tensors (ProcessGroupNCCL::alltoall records one input and one
    #     output tensor per peer): rank i's input i->j must be rank j's output j<-i. Splits may be
    #     uneven (an MoE's token routing); rank 2 expects 3 rows from every peer where they send it
    #     what they computed (2 from ranks 0 and 3), so every pair that disagrees holds rank 2 and the kernel waits for bytes that
    #     never come. PyTorch's check_size_alltoall sees only that the totals differ.
    def rows(i, j):  # what i sends j, as every rank but 2 computes it
        return 1 + (i + 2 * j) % 3
    dumps = {}
    for r in range(4):
        ents = allreduces(r, 2)
        ins = [(rows(r, j), 8) for j in range(4)]
        outs = [((3 if j != 2 else rows(2, 2)) if r == 2 else rows(j, r), 8) for j in range(4)]
        ents.append(entry(2, WORLD, 3, "nccl:all_to_all", "started", sizes=ins, out_sizes=outs,
                          t=30_000_000, timing=True))
        dumps[r] = dump(world(4), ents)
    write_case("alltoall_splits_disagree_on_one_rank", "ProcessGroupNCCL::alltoall's per-peer "
               "tensors in input_sizes/output_sizes; utils.py check_size_alltoall "
               "(SIZE_OR_SYNTAX_MISMATCH on totals); the rank in every disagreeing pair is named",
               dumps, [{"cause": "op_mismatch", "root_ranks": [2],
                        "mismatch": "SIZE_OR_SYNTAX_MISMATCH"}])

    # 26. torchcomms' FlightRecorderHook (comms/torchcomms/hooks/fr): one recorder per process,
    #     every registered communicator a process group named by the communicator with its backend
    #     as desc and its ranks written "0,1,2,3"; profiling names "nccl:" + the torchcomms op
    #     (all_gather_v, reduce_scatter_v, all_to_all_v_single, barrier, ...); collective_seq_id
    #     from the recorder's one counter, p2p_seq_id 0, is_p2p false; no start or end events, so
    #     every entry stays "scheduled" and the post hook marks it retired. dump_file writes the
    #     pickle to comm_lib_trace_rank_<rank> without stacks. Rank 1 never reaches the barrier.
    ops = [("nccl:all_gather_v", ((16, 4),), ((16, 4), (16, 4), (8, 4), (8, 4))),
           ("nccl:reduce_scatter_v", ((48, 4),), ((12, 4),)),
           ("nccl:all_to_all_v_single", ((40, 4),), ((36, 4),)),
           ("nccl:all_reduce", ((1024,),), ((1024,),)),
           ("nccl:barrier", ((1,),), ((1,),))]
    comms = ("world", "nccl")
    dumps = {}
    for r in range(4):
        ents = []
        for k, (name, ins, outs) in enumerate(ops):
            if r == 1 and name == "nccl:barrier":
                break
            last = name == "nccl:barrier"
            e = entry(k, comms, k, name, "scheduled", sizes=ins, out_sizes=outs, t=k * 10_000_000,
                      timing=False)
            e["pg_id"], e["p2p_seq_id"], e["is_p2p"], e["retired"] = 0, 0, False, not last
            e["time_discovered_completed_ns"] = None
            ents.append(e)
        d = dump({}, ents, comm_lib_version="2.27.5")
        d["pg_config"] = {"world": {"name": "world", "desc": "nccl", "ranks": "0,1,2,3"}}
        dumps[r] = d
    write_case("torchcomms_barrier_rank_not_joined", "torchcomms hooks/fr/FlightRecorder.cpp "
               "(FlightRecorderHook::onPreHook: 'nccl:' + opToString; retire_id on the post hook; "
               "getPgConfig's ranks_str; DebugInfoWriter's comm_lib_trace_rank_)", dumps,
               [{"cause": "rank_not_joined", "root_ranks": [1], "waiting_ranks": [0, 2, 3]}],
               prefix="comm_lib_trace_rank_")

    # 27. A recorder that numbers stacks (stack_id, as fr_trace's add_stack_id_in_entries does)
    #     and writes no frames: rank 2 broadcasts from stack 7 where its peers all-reduce from
    #     stack 3.
    dumps = {}
    for r in range(4):
        ents = allreduces(r, 3)
        for e in ents:
            e["stack_id"] = 3
        last = entry(3, WORLD, 4, "nccl:broadcast" if r == 2 else "nccl:all_reduce", "scheduled",
                     t=40_000_000)
        last["stack_id"] = 7 if r == 2 else 3
        ents.append(last)
        dumps[r] = dump(world(4), ents)
    write_case("op_mismatch_with_stack_ids", "an entry's optional stack_id (fr_trace "
               "add_stack_id_in_entries, Op.stack_id) with no frames", dumps,
               [{"cause": "op_mismatch", "root_ranks": [2], "waiting_ranks": [0, 1, 3],
                 "mismatch": "COLLECTIVE_TYPE_MISMATCH"}], form="json")

    # 28. A partial set: rank 5's dump was not collected (fr_trace --allow-incomplete-ranks). Its
    #     seven peers wait in all-reduce #5 for it; nothing says whether it is dead, stuck or
    #     slow, so the analysis cannot decide (utils.py error_analysis: "We cannot decide what's
    #     wrong with this collective entry because we missed FR dumps").
    dumps = {}
    for r in range(8):
        if r == 5:
            continue
        ents = allreduces(r, 5, last_state="started")
        dumps[r] = dump(world(8), ents)
    write_case("partial_set_allow_incomplete_ranks", "fr_trace --allow-incomplete-ranks: "
               "check_no_missing_dump_files skipped, error_analysis's partial analysis case",
               dumps, [{"cause": "unknown", "root_ranks": []}],
               options={"allow_incomplete_ranks": True})

    # 29. torchft: two replica groups of 2 (global ranks 0-1 and 2-3), each with its own
    #     default_pg whose ranks are replica-local ("[0, 1]" in every dump). fr_trace
    #     --transform-ft 2 moves replica 1's to [2, 3]. In replica 1, rank 3 never joins the 5th
    #     all-reduce; replica 0 finished its 5th.
    dumps = {}
    for r in range(4):
        ents = allreduces(r, 5 if r != 3 else 4, last_state="started" if r == 2 else "completed")
        dumps[r] = dump({"0": ("default_pg", range(2))}, ents)
    write_case("torchft_replica_rank_not_joined", "torchft replica groups; builder.py transform_ft",
               dumps, [{"cause": "rank_not_joined", "root_ranks": [3], "waiting_ranks": [2]}],
               options={"transform_ft": 2})


if __name__ == "__main__":
    main()
