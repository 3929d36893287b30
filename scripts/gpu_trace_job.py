#!/usr/bin/env python3
"""A small PyTorch training job on the GPU, for scripts/gpu-trace-check.sh: nothing in it knows
megascope (it is what `megascope wrap` traces unchanged).

A stack of bf16 linear layers on cuda:LOCAL_RANK, trained with SGD; after every backward each
gradient is all-reduced by hand (dist.all_reduce over NCCL), so the job knows exactly how many
collectives it issued. Every rank writes OUT.rank<R>.json: its step times (s, after
torch.cuda.synchronize), the all-reduces it issued, NCCL's version and the world size.

--hang-at STEP: at that step the rank given by --hang-rank first launches a kernel that spins for
minutes (torch.cuda._sleep), then issues its all-reduce, which waits behind it on the device and
never starts; the other ranks' all-reduce waits for it. Prints "hanging" and blocks there until
killed.

Run under torchrun (RANK, WORLD_SIZE, LOCAL_RANK). With two ranks on one GPU, NCCL >= 2.30 needs
NCCL_MULTI_RANK_GPU_ENABLE=1 (older NCCL refuses two ranks on one GPU).
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--width", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--hang-at", type=int, default=-1)
    ap.add_argument("--hang-rank", type=int, default=0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    model = torch.nn.Sequential(
        *[torch.nn.Linear(a.width, a.width, dtype=torch.bfloat16, device=dev) for _ in range(a.layers)]
    )
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=1e-6)
    x = torch.randn(a.batch, a.width, dtype=torch.bfloat16, device=dev)
    allreduces, times = 0, []
    for step in range(a.steps):
        if step == a.hang_at:
            if rank == a.hang_rank:
                torch.cuda._sleep(1 << 40)  # about ten minutes of spinning on the device
            print("hanging", flush=True)
            dist.all_reduce(params[0].grad)
            allreduces += 1
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        model(x).float().pow(2).mean().backward()
        for p in params:
            dist.all_reduce(p.grad)
            allreduces += 1
        opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    dist.destroy_process_group()
    nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
    with open(f"{a.out}.rank{rank}.json", "w") as f:
        json.dump({"rank": rank, "world": world, "allreduces": allreduces, "step_s": times,
                   "nccl": nccl, "torch": torch.__version__}, f)


if __name__ == "__main__":
    main()
