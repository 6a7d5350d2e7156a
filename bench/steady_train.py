#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The job of the steady-state benchmark (bench/steady.py): the same model, data and global batch,
trained as plain PyTorch DDP under torchrun or with regroup.Trainer under regroup-agent.

    --mode ddp           torch.nn.parallel.DistributedDataParallel, gloo, from torchrun's env
    --mode regroup-ddp   regroup.Trainer with TrainerConfig(ddp=True): the same DDP wrapper
    --mode regroup       regroup.Trainer reducing the gradients itself (the library's default)

Every rank notes time.perf_counter() when each step ends (the optimizer stepped); rank 0 writes
the gaps between consecutive step ends, and the trainer's own timings (regroup modes), to --out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]
# $REGROUP_LIBRARY: another tree's python/ (bench/steady.py --before: the library before a
# change), imported here, first, so that it is the one every module here uses.
sys.path.insert(0, os.environ.get("REGROUP_LIBRARY") or str(REPO / "python"))
import regroup  # noqa: E402
sys.path.insert(0, str(REPO / "bench" / "compare"))
from job import make_data, make_model  # noqa: E402  (the comparison's MLP and data)


def parse_args(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["ddp", "regroup-ddp", "regroup"], required=True)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--features", type=int, default=512)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dataset", type=int, default=4096)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--microbatches", type=int, default=8, help="micro-batches per step (all replicas)")
    p.add_argument("--checksum-interval", type=int, default=0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--pad-ms", type=float, default=0.0,
                   help="sleep this long in every step, after the backward: a longer step (the "
                        "accelerator's compute, which leaves the CPU free)")
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def plain_ddp(args, x, y, ends):
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.microbatches % world:
        raise SystemExit(f"--microbatches {args.microbatches} is not a multiple of the world size {world}")
    model = DDP(make_model(args))
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    per, batch = args.microbatches // world, args.microbatches * args.micro_batch
    for step in range(args.steps):
        for k in range(per):
            first = ((step * args.microbatches + rank * per + k) * args.micro_batch) % args.dataset
            idx = torch.arange(first, first + args.micro_batch) % args.dataset
            sync = contextlib.nullcontext() if k == per - 1 else model.no_sync()
            with sync:
                (((model(x[idx]) - y[idx]) ** 2).sum() / batch).backward()
        if args.pad_ms:
            time.sleep(args.pad_ms / 1000)
        opt.step()
        opt.zero_grad(set_to_none=True)
        ends.append(time.perf_counter())
    dist.destroy_process_group()
    return rank, world, {}


def with_regroup(args, x, y, ends):
    model = make_model(args)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    config = regroup.TrainerConfig(
        dataset_size=args.dataset, micro_batch_size=args.micro_batch, microbatches_per_step=args.microbatches,
        seed=args.seed, checksum_interval=args.checksum_interval, ddp=args.mode == "regroup-ddp")
    trainer = regroup.Trainer(model, opt, config=config)
    rank = world = 0
    for step in trainer.steps(args.steps):
        rank, world = step.generation.rank, step.generation.world_size
        with step:
            for mb in step.microbatches():
                with mb:
                    step.backward(((step.model(x[mb.indices]) - y[mb.indices]) ** 2).sum())
            if args.pad_ms:
                time.sleep(args.pad_ms / 1000)
            trainer.commit(step)
        if step.committed:
            ends.append(time.perf_counter())
    trainer.close()
    metrics = {k: v for k, v in trainer.metrics.items() if isinstance(v, (int, float))}
    undo = getattr(trainer, "_undo", None)  # absent before the vote went off the critical path
    if undo is not None:
        metrics.update({f"undo_bytes_{device}": n for device, n in undo.nbytes().items()})
    return rank, world, metrics


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    x, y = make_data(args)
    ends: list = []
    run = plain_ddp if args.mode == "ddp" else with_regroup
    rank, world, metrics = run(args, x, y, ends)
    if rank == 0:
        gaps = [b - a for a, b in zip(ends, ends[1:])]
        Path(args.out).write_text(json.dumps({"mode": args.mode, "world": world, "step_s": gaps,
                                              "metrics": metrics, "pid": os.getpid()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
