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

import importlib.util
import io
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))
_spec = importlib.util.spec_from_file_location("steady_hsdp", REPO / "bench" / "sharded" / "steady_hsdp.py")
steady = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(steady)   # the same options, data, model, loop and report as HSDP's bench


def tensor_bytes(tree) -> int:
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, dict):
        return sum(tensor_bytes(v) for v in tree.values())
    return 0


def main() -> int:
    args = steady.arguments(("torch", "regroup", "zero1", "zero1x2")).parse_args()
    rank, world, G, data, target = steady.setup(args)
    model = steady.model_of(args)
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
        steady.train(trainer, args.steps, data, target, ends)
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
    out["param_bytes"] = sum(p.numel() * p.element_size() for p in steady.model_of(args).parameters())
    steady.report(args, rank, ends, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
