#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The job as a plain PyTorch DDP program (torchrun, gloo), with no fault tolerance: the
reference the other scripts are diffed against to count the lines each system costs."""

import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
import job  # noqa: E402


def main() -> int:
    args = job.parse_args()
    torch.set_num_threads(1)
    event = job.Events(args.events)
    x, y = job.make_data(args)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = torch.nn.parallel.DistributedDataParallel(job.make_model(args))
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    for step in range(args.steps):
        idx = job.batch(args, step, rank, world)
        opt.zero_grad()
        chunks = idx.split(args.micro_batch)
        for i, mb in enumerate(chunks):
            ctx = model.no_sync() if i < len(chunks) - 1 else torch.enable_grad()
            with ctx:
                loss = ((model(x[mb]) - y[mb]) ** 2).sum() * world / job.GLOBAL_BATCH
                loss.backward()
        opt.step()
        event.samples(step, rank, world, idx)
        if rank == 0:
            event(kind="commit", step=step, world=world)
    if rank == 0:
        event.final(args, model.module)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
