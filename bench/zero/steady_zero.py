#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""One rank of the ZeRO-1 steady-state comparison (bench/zero/bench.py starts them).

The same data-parallel training (Adam, float32, gloo on CPU), on ranks started with torchrun's
environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT):

  torch    DistributedDataParallel and torch's own ZeroRedundancyOptimizer (ZeRO-1): the same
           layout without Regroup
  regroup  regroup.Trainer without an agent, the optimizer state whole on every rank
  zero1    regroup.Trainer(optimizer_sharding="zero1"): each rank steps its slice, the new
           parameters all-gathered (regroup.zero)
  zero1x2  the same with optimizer_copies=2 (each rank also steps a second copy of one slice)

Rank 0 prints one JSON line: the median seconds per step after the warm-up, the bytes of the
optimizer state it holds, and for Regroup's variants the bytes a state sync sends a new rank
(regroup.sync) and, for zero1, the bytes of its slices (what a repartition moves to a rank that
returns with nothing).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))


def model_of(args):
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(args.features, args.hidden), torch.nn.Tanh(),
                               torch.nn.Linear(args.hidden, args.hidden), torch.nn.Tanh(),
                               torch.nn.Linear(args.hidden, 8))


def tensor_bytes(tree) -> int:
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, dict):
        return sum(tensor_bytes(v) for v in tree.values())
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--variant", choices=("torch", "regroup", "zero1", "zero1x2"), required=True)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--microbatches", type=int, default=4)
    args = p.parse_args()
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    G = args.micro_batch * args.microbatches
    data = torch.randn(G * args.steps, args.features, generator=torch.Generator().manual_seed(2))
    target = torch.randn(G * args.steps, 8, generator=torch.Generator().manual_seed(3))
    model = model_of(args)
    ends = []
    out = {"variant": args.variant, "world": world}
    if args.variant == "torch":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        from torch.nn.parallel import DistributedDataParallel as DDP

        dist.init_process_group("gloo")
        ddp = DDP(model)
        opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
        for s in range(args.steps):
            mine = [j for j in range(args.microbatches) if j % world == rank]
            for n, j in enumerate(mine):
                idx = torch.arange(s * G + j * args.micro_batch, s * G + (j + 1) * args.micro_batch)
                if n < len(mine) - 1:
                    with ddp.no_sync():
                        ((ddp(data[idx]) - target[idx]) ** 2).sum().backward()
                else:
                    ((ddp(data[idx]) - target[idx]) ** 2).sum().backward()
            opt.step()
            opt.zero_grad()
            ends.append(time.perf_counter())
        out["optimizer_state_bytes"] = tensor_bytes({str(i): s for i, s in enumerate(opt.optim.state.values())})
        dist.destroy_process_group()
    else:
        import regroup
        from regroup.state import save_tree

        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        zero = args.variant.startswith("zero1")
        config = regroup.TrainerConfig(dataset_size=G * args.steps, micro_batch_size=args.micro_batch,
                                       microbatches_per_step=args.microbatches, shuffle=False, checksum_interval=0,
                                       optimizer_sharding="zero1" if zero else None,
                                       optimizer_copies=2 if args.variant == "zero1x2" else 1)
        trainer = regroup.Trainer(model, opt, config=config)
        for step in trainer.steps(args.steps, _finish=False):
            with step:
                for mb in step.microbatches():
                    with mb:
                        step.backward(((step.model(data[mb.indices]) - target[mb.indices]) ** 2).sum())
                trainer.commit(step)
            ends.append(time.perf_counter())
        out["sync_bytes"] = len(trainer.state.to_bytes(trainer.committed_step))
        if zero:
            held = trainer.state.held
            out["optimizer_state_bytes"] = tensor_bytes({str(k): v for k, v in held.items()})
            buffer = io.BytesIO()
            save_tree(held, buffer)
            out["slices_bytes"] = len(buffer.getvalue())
        else:
            out["optimizer_state_bytes"] = tensor_bytes({str(i): s for i, s in enumerate(opt.state.values())})
        trainer.close()
    gaps = [b - a for a, b in zip(ends[args.warmup:], ends[args.warmup + 1:])]
    out["step_s"] = statistics.median(gaps)
    out["param_bytes"] = sum(p.numel() * p.element_size() for p in model_of(args).parameters())
    if rank == 0:
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
