#!/usr/bin/env python3
"""Records real PyTorch Flight Recorder dumps of provoked hangs, made by PyTorch itself.

Needs PyTorch >= 2.8 (its Flight Recorder records Gloo collectives since 2.8) and a few CPU cores;
no GPU: every job is Gloo over TCP on this machine. Each case runs WORLD processes
(spawned processes) with the recorder on (TORCH_FR_BUFFER_SIZE), provokes one hang class for
real, and has every rank that is still there dump its recorder through PyTorch's own API
(torch._C._distributed_c10d._dump_fr_trace_json) from a thread of its own while its main thread is
stuck in the collective. The dumps go to OUT/<case>/dumps/rank_<r>.json with OUT/<case>/expected.json
(the verdict a reader must reach, the PyTorch version, how the case was made); the analyzer's tests
read every case under tests/data/pytorch/real/ as permanent tests of the importer.

Cases: rank_skips_collective, op_type_mismatch, size_mismatch, rank_exits, p2p_recv_never_sent,
healthy_mid_run.

Usage: scripts/record-pytorch-fr.py [--out tests/data/pytorch/real] [--case NAME ...] [--world 4]
Exit status: 0 when every case was recorded, 1 otherwise (each failure said on stderr).
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time

SETTLE_S = 3.0  # how long the provoked hang lasts before the ranks dump
TIMEOUT_S = 20  # the process group's timeout: the hung collectives end by raising after it


def dump_recorder(rank, out_dir):
    """This rank's recorder as PyTorch writes it, to out_dir/rank_<rank>.json."""
    import torch

    c10d = torch._C._distributed_c10d
    text = c10d._dump_fr_trace_json()  # the backend-agnostic recorder Gloo writes to
    if isinstance(text, bytes):
        text = text.decode()
    trace = json.loads(text)
    trace["rank"] = rank  # the file name says it too; a reader takes either
    with open(os.path.join(out_dir, "rank_%d.json" % rank), "w") as f:
        json.dump(trace, f, indent=1)


def dump_then_exit(rank, out_dir, delay):
    """After `delay`, dumps this rank's recorder and ends the process a moment later (its main
    thread may be stuck in the collective): every rank dumps at about the same time, and none
    leaves before the others have dumped."""

    def run():
        time.sleep(delay)
        try:
            dump_recorder(rank, out_dir)
        finally:
            time.sleep(2.0)
            os._exit(0)

    threading.Thread(target=run, daemon=True).start()


def case_body(name, rank, world, out_dir):
    """Runs one case on this rank, then waits for its dump thread to end the process."""
    import torch
    import torch.distributed as dist

    x = torch.ones(1024)
    for _ in range(3):  # a healthy history in the recorder first
        dist.all_reduce(x)
    dist.barrier()
    if name == "rank_exits" and rank == world - 1:
        os._exit(0)  # gone: no dump, no goodbye
    if name == "size_mismatch":
        # Gloo aborts a rank that receives more bytes than it expects (an enforce in its TCP
        # pair), so every rank dumps right after enqueueing its all_reduce, before the bytes meet:
        # rank 3 a second after the others, whose all_reduce waits for it until then.
        if rank == 3:
            time.sleep(1.0)
        dist.all_reduce(torch.ones(2048) if rank == 3 else x, async_op=True)
        dump_recorder(rank, out_dir)
        time.sleep(2.0)
        os._exit(0)
    dump_then_exit(rank, out_dir, 0.5 if name == "healthy_mid_run" else SETTLE_S)
    try:
        if name == "healthy_mid_run":
            while True:
                dist.all_reduce(x)
        elif name == "rank_skips_collective":
            if rank != 2:
                dist.all_reduce(x)
        elif name == "op_type_mismatch":
            if rank == 1:
                dist.broadcast(x, src=0)
            else:
                dist.all_reduce(x)
        elif name == "rank_exits":
            dist.all_reduce(x)
        elif name == "p2p_recv_never_sent":
            if rank == 2:  # a pipeline stage waiting for what stage 1 never sends
                dist.recv(x, src=1)
    except Exception:  # a peer's exit or the group's timeout: the hang is over for this rank
        pass
    time.sleep(TIMEOUT_S * 2)  # the dump thread ends the process


def worker(rank, world, name, out_dir, init_file):
    os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
    os.environ["TORCH_NCCL_TRACE_BUFFER_SIZE"] = "2000"
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method="file://" + init_file,
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=TIMEOUT_S),
    )
    case_body(name, rank, world, out_dir)
    os._exit(0)  # no destroy_process_group: the peers may still hang in their last op


EXPECTED = {
    # name: (verdicts, how it was provoked)
    "rank_skips_collective": (
        [{"cause": "rank_not_joined", "root_ranks": [2]}],
        "rank 2 never issues the fourth all_reduce the others wait in; it stays alive",
    ),
    "op_type_mismatch": (
        [{"cause": "op_mismatch", "root_ranks": [1], "mismatch": "COLLECTIVE_TYPE_MISMATCH"}],
        "rank 1 issues a broadcast where the others issue an all_reduce",
    ),
    "size_mismatch": (
        [{"cause": "op_mismatch", "root_ranks": [3], "mismatch": "SIZE_OR_SYNTAX_MISMATCH"}],
        "rank 3 all_reduces 2048 floats where the others all_reduce 1024",
    ),
    "rank_exits": (
        [{"cause": "rank_dead", "root_ranks": [3]}],
        "rank 3 exits before the fourth all_reduce and leaves no dump",
    ),
    "p2p_recv_never_sent": (
        [{"cause": "rank_not_joined", "root_ranks": [1]}],
        "rank 2 waits to receive from rank 1, which never sends",
    ),
    "healthy_mid_run": (
        [{"kind": "healthy", "cause": None, "root_ranks": []}],
        "every rank all_reduces in a loop; dumped mid-run",
    ),
}


def has_p2p(dump):
    """Whether a dump holds any send or recv."""
    with open(dump) as f:
        return any(e.get("is_p2p") for e in json.load(f).get("entries", []))


def record(name, world, out_root):
    import multiprocessing as mp

    import torch

    case_dir = os.path.join(out_root, name)
    dumps = os.path.join(case_dir, "dumps")
    shutil.rmtree(case_dir, ignore_errors=True)
    os.makedirs(dumps)
    init_file = tempfile.mktemp(prefix="fr-init-")
    # Plain processes joined one by one: torch.multiprocessing's join ends every rank as soon as
    # one dies (Gloo aborts some ranks in size_mismatch), before the others have dumped.
    spawn = mp.get_context("spawn")
    procs = [spawn.Process(target=worker, args=(r, world, name, dumps, init_file)) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.time() + TIMEOUT_S * 3
    for p in procs:
        p.join(max(0.0, deadline - time.time()))
    for p in procs:
        if p.exitcode is None:
            p.kill()
            p.join()
        elif p.exitcode != 0:
            print("[record-pytorch-fr] %s: a rank ended with exit code %d" % (name, p.exitcode), file=sys.stderr)
    written = sorted(os.listdir(dumps))
    verdicts, how = EXPECTED[name]
    want = world - (1 if name == "rank_exits" else 0)
    if len(written) != want:
        print("[record-pytorch-fr] %s: %d of %d dumps written" % (name, len(written), want), file=sys.stderr)
        return False
    if name == "p2p_recv_never_sent" and not has_p2p(os.path.join(dumps, "rank_2.json")):
        # What the dumps can show: this PyTorch's Gloo (2.11 seen) records no send or recv in its
        # recorder, so nothing in them says rank 2 waits; a reader must not invent it.
        verdicts = [{"kind": "healthy", "cause": None, "root_ranks": []}]
        how += "; PyTorch %s's Gloo records no send or recv in its Flight Recorder, so the dumps " \
               "show no wait (a reader must say healthy)" % torch.__version__
    expected = {
        "origin": "recorded by scripts/record-pytorch-fr.py: " + how,
        "form": "json",
        "torch": torch.__version__,
        "host": platform.node(),
        "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        # size_mismatch dumps as it enqueues (Gloo aborts a rank once the sizes meet): no rank has
        # waited yet, so any open op counts.
        "min_wait_s": 0 if name == "size_mismatch" else SETTLE_S / 2,
        # PyTorch's JSON dump holds no time; a reader dates it by the file's modification time,
        # which a checkout resets: the tests restore these.
        "dumped_at_ns": {f: os.stat(os.path.join(dumps, f)).st_mtime_ns for f in written},
        "verdicts": verdicts,
    }
    with open(os.path.join(case_dir, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")
    print("[record-pytorch-fr] %s: %d dumps in %s" % (name, len(written), dumps))
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "data", "pytorch", "real"))
    ap.add_argument("--case", action="append", choices=sorted(EXPECTED), help="a case (repeatable; default all)")
    ap.add_argument("--world", type=int, default=4)
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("[record-pytorch-fr] PyTorch is not installed here (needs >= 2.8)", file=sys.stderr)
        return 1
    major, minor = (int(v) for v in torch.__version__.split(".")[:2])
    if (major, minor) < (2, 8):
        print("[record-pytorch-fr] PyTorch %s records no Gloo collectives (needs >= 2.8)" % torch.__version__, file=sys.stderr)
        return 1
    ok = True
    for name in a.case or sorted(EXPECTED):
        ok &= record(name, a.world, os.path.abspath(a.out))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
