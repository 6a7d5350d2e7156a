#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""One rank of the dp x tp x pp grid benchmark (bench/grid/bench.py starts them).

    rank.py --variant plain   [train_grid.py's flags]   # torchrun's environment, no Regroup
    rank.py --variant regroup [train_grid.py's flags]   # under regroup-agent

Both run examples/train_grid.py's model (its ``GridStage``: the same hand tensor-parallel split,
the same blocks per pipeline stage, the same ``torch.distributed.pipelining`` schedule) on the
same data, flags and micro-batches:

  plain    torch.distributed alone, on ranks started with torchrun's environment (RANK,
           WORLD_SIZE, MASTER_ADDR, MASTER_PORT): the grid's groups made once with
           ``dist.new_group`` (ranks numbered as the manager numbers them: tp fastest, then
           stages, then replicas), the schedule built once on the pipeline group, each replica
           given the step contract's micro-batches (so the training equals one process's, as
           bench/grid/grid_test.py checks), the gradients summed across replicas in one flat
           all-reduce and divided by the global batch, ``opt.step()``. Rank 0 prints one JSON
           line: the median seconds between step ends after ``--warmup`` steps
           (bench/sharded/steady_hsdp.py's report); with ``--out`` replica 0's shards are merged
           into the whole model's parameters there.
  regroup  examples/train_grid.py itself, unchanged, with one addition from here: every step's
           end is appended to ``$REGROUP_GRID_TIMES/<pid>.jsonl`` as it happens (one
           ``os.write`` a step, so a killed process leaves its lines): the wall time, the step, its
           generation's rank, dp and world size, whether it committed, and the trainer's
           ``state_bytes_sent`` so far (the state this rank sent to new or returning ranks).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "examples"))

import regroup  # noqa: E402
import train_grid  # noqa: E402
import train_mlp  # noqa: E402
from regroup.contract import Sampler, replica_range  # noqa: E402
from regroup.group import Layout  # noqa: E402

_spec = importlib.util.spec_from_file_location("steady_hsdp", REPO / "bench" / "sharded" / "steady_hsdp.py")
steady = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(steady)   # its report: rank 0's median step gap as one JSON line


def timed_steps(directory: str):
    """Trainer.steps, recording each step's end in ``directory`` (see the module)."""
    steps = regroup.Trainer.steps
    fd = os.open(str(Path(directory) / f"{os.getpid()}.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def recorded(self, *a, **k):
        for step in steps(self, *a, **k):
            yield step
            g = step.generation
            line = {"t": time.time(), "step": step.number, "committed": bool(step.committed),
                    "rank": g.rank, "dp": g.dp, "world": g.world_size,
                    "sent": int(self.metrics["state_bytes_sent"])}
            os.write(fd, (json.dumps(line) + "\n").encode())
    return recorded


def plain(argv) -> int:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--warmup", type=int, default=5)
    own, rest = p.parse_known_args(argv)
    args = train_grid.parse_args(rest)
    args.warmup = own.warmup
    dtype, _, world = train_mlp.setup_process(args)
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    layout = Layout.grid(world, rank, args.tp, args.pp)
    groups = argparse.Namespace(layout=layout, tp_group=None, pp_group=None, mp_group=None, dp_group=None)
    for kind, ranks in layout.all_groups():   # every rank makes every group, in one order
        group = dist.new_group(ranks)
        if rank in ranks:
            setattr(groups, f"{kind}_group", group)

    x, y = train_mlp.make_data(argparse.Namespace(seed=args.seed, dataset=args.dataset, features=args.features,
                                                  hidden=args.ffn, outputs=args.outputs), dtype)
    model = train_grid.GridStage(args, dtype, layout.tp, layout.tp_rank, layout.pp, layout.stage)
    model.tp_group = groups.tp_group
    if args.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=args.lr or 0.02, momentum=0.9)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=args.lr or 0.01)
    sampler = Sampler(args.dataset, args.micro_batch, args.microbatches, args.seed)
    begin, count = replica_range(args.microbatches, layout.dp, layout.replica)
    schedule = None
    if layout.pp > 1:
        from regroup.pipeline import build_schedule
        width_in = args.features if model.first else args.hidden
        width_out = args.outputs if model.last else args.hidden
        schedule = build_schedule(model, groups, count, train_grid.sum_loss,
                                  torch.empty(args.micro_batch, width_in, dtype=dtype),
                                  torch.empty(args.micro_batch, width_out, dtype=dtype), args.schedule)
    params = list(model.parameters())
    ends = []
    for s in range(args.steps):
        mbs = [sampler.microbatch(s, j) for j in range(begin, begin + count)]
        if schedule is not None and mbs:
            idx = torch.cat(mbs)
            if layout.stage == 0:
                schedule.step(x[idx])
            elif layout.stage == layout.pp - 1:
                schedule.step(target=y[idx], losses=[])
            else:
                schedule.step()
        else:
            for idx in mbs:
                train_grid.sum_loss(model(x[idx]), y[idx]).backward()
        if args.step_sleep:
            time.sleep(args.step_sleep)
        grads = [q.grad if q.grad is not None else torch.zeros_like(q) for q in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        if layout.dp > 1:
            dist.all_reduce(flat, group=groups.dp_group)
        flat.div_(sampler.global_batch_size)
        for q, part in zip(params, flat.split([q.numel() for q in params])):
            q.grad = part.view_as(q)
        opt.step()
        opt.zero_grad()
        ends.append(time.perf_counter())

    if args.out:
        mine = {name: q.detach().clone() for name, q in model.named_parameters()}
        if layout.replica == 0:
            train_mlp.save_atomic({"stage": layout.stage, "tp_rank": layout.tp_rank, "params": mine},
                                  f"{args.out}.p{layout.position}")
        dist.barrier()
        if rank == 0:
            parts = [torch.load(f"{args.out}.p{q}") for q in range(layout.replica_size)]
            train_mlp.save_atomic(train_grid.merge({(q["stage"], q["tp_rank"]): q["params"] for q in parts},
                                                   layout.tp), args.out)
    dist.destroy_process_group()
    steady.report(args, rank, ends, {"variant": "plain", "world": world, "tp": layout.tp, "pp": layout.pp})
    return 0


def main() -> int:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--variant", choices=("plain", "regroup"), required=True)
    own, rest = p.parse_known_args()
    if own.variant == "plain":
        return plain(rest)
    directory = os.environ.get("REGROUP_GRID_TIMES")
    if not directory:
        raise SystemExit("rank.py --variant regroup: set REGROUP_GRID_TIMES to the folder for the step times")
    regroup.Trainer.steps = timed_steps(directory)
    return train_grid.main(rest)


if __name__ == "__main__":
    sys.exit(main())
