#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""One rank of the HSDP steady-state comparison (bench/sharded/bench.py starts them).

The same training two ways, on ranks started with torchrun's environment (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), replicas of ``--shard`` ranks:

  plain    FSDP2's fully_shard on a 2-D DeviceMesh (replicate x shard), the sum of the per-sample
           losses, gradients divided by the global batch, opt.step(): no Regroup at all
  regroup  regroup.Trainer(sharding="hsdp") without an agent: the library's step (snapshot, the
           sharding built from the generation's groups, the micro-batch contract) on the same model

Rank 0 prints one JSON line: the median seconds per step after the warm-up, and for regroup the
bytes of this rank's state a replacement rank would receive (what regroup.sync sends).
"""

from __future__ import annotations

import argparse
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


def arguments(variants) -> argparse.ArgumentParser:
    """The options of a steady-state rank (bench/zero/steady_zero.py takes them too)."""
    p = argparse.ArgumentParser()
    p.add_argument("--variant", choices=variants, required=True)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--microbatches", type=int, default=4)
    return p


def setup(args):
    """One thread; this rank, the world, the global batch, the data and targets of every step."""
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    G = args.micro_batch * args.microbatches
    data = torch.randn(G * args.steps, args.features, generator=torch.Generator().manual_seed(2))
    target = torch.randn(G * args.steps, 8, generator=torch.Generator().manual_seed(3))
    return rank, world, G, data, target


def train(trainer, steps: int, data, target, ends: list) -> None:
    """`steps` steps of the bench's loss under `trainer`, each step's end time appended to `ends`."""
    for step in trainer.steps(steps, _finish=False):
        with step:
            for mb in step.microbatches():
                with mb:
                    step.backward(((step.model(data[mb.indices]) - target[mb.indices]) ** 2).sum())
            trainer.commit(step)
        ends.append(time.perf_counter())


def report(args, rank: int, ends, out: dict) -> None:
    """Rank 0 prints ``out`` with the median seconds between steps after the warm-up."""
    gaps = [b - a for a, b in zip(ends[args.warmup:], ends[args.warmup + 1:])]
    out["step_s"] = statistics.median(gaps)
    if rank == 0:
        print(json.dumps(out), flush=True)


def main() -> int:
    p = arguments(("plain", "regroup"))
    p.add_argument("--shard", type=int, default=2)
    args = p.parse_args()
    rank, world, G, data, target = setup(args)
    model = model_of(args)
    ends = []
    out = {"variant": args.variant, "world": world, "shard": args.shard}
    if args.variant == "plain":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        dist.init_process_group("gloo")
        mesh = init_device_mesh("cpu", (world // args.shard, args.shard), mesh_dim_names=("replicate", "shard"))
        fully_shard(model, mesh=mesh)
        model.set_gradient_divide_factor(float(G))
        model.set_force_sum_reduction_for_comms(True)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        dp = world // args.shard
        replica, position = rank // args.shard, rank % args.shard
        for s in range(args.steps):
            mine = [j for j in range(args.microbatches) if j % dp == replica]
            for n, j in enumerate(mine):
                idx = torch.arange(s * G + j * args.micro_batch, s * G + (j + 1) * args.micro_batch)
                idx = torch.tensor_split(idx, args.shard)[position]
                model.set_requires_gradient_sync(n == len(mine) - 1)
                ((model(data[idx]) - target[idx]) ** 2).sum().backward()
            opt.step()
            opt.zero_grad()
            ends.append(time.perf_counter())
        dist.destroy_process_group()
    else:
        import regroup

        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        config = regroup.TrainerConfig(dataset_size=G * args.steps, micro_batch_size=args.micro_batch,
                                       microbatches_per_step=args.microbatches, tensor_parallel=args.shard,
                                       sharding="hsdp", shuffle=False, checksum_interval=0)
        trainer = regroup.Trainer(model, opt, config=config)
        train(trainer, args.steps, data, target, ends)
        out["state_bytes_per_rank"] = len(trainer.state.to_bytes(trainer.committed_step))
        out["full_model_state_bytes"] = sum(p.numel() * p.element_size() * 3 for p in model_of(args).parameters())
        trainer.close()
    report(args, rank, ends, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
