#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The job under torchft (0.2.0), adopted as its train_ddp example does: one replica group per
`torchrun --nproc_per_node=1 --max_restarts=N` (here 2 groups per node, 4 in all), a
torchft.Manager (gloo) joined to the lighthouse in TORCHFT_LIGHTHOUSE, torchft's
DistributedDataParallel and Optimizer wrappers, and state_dict callbacks a recovering group
heals from. Gradients go through `manager.allreduce` (as torchft's PureDistributedDataParallel
does, once per step after the micro-batches), not torchft.DistributedDataParallel: in 0.2.0 on gloo
its comm hook fails an assertion (ddp.py, `assert fut._fut`) when a peer dies mid-allreduce, which
crashed every surviving group (see README.md, Findings). Each group takes its share of the global batch for the manager's current step (so a
restarted group does not replay the epoch from its start); the batch shrinks while groups are
missing, as torchft's does."""

import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torchft

sys.path.insert(0, str(Path(__file__).resolve().parent))
import job  # noqa: E402


def main() -> int:
    args = job.parse_args(lambda p: p.add_argument("--groups", type=int, default=4))
    torch.set_num_threads(1)
    event = job.Events(args.events)
    x, y = job.make_data(args)
    group = int(os.environ["REPLICA_GROUP_ID"])
    model = job.make_model(args)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])

    def state_dict():
        return {"model": model.state_dict(), "optim": opt.state_dict()}

    manager = torchft.Manager(pg=torchft.ProcessGroupGloo(timeout=timedelta(seconds=5)), min_replica_size=1,
                              load_state_dict=load_state_dict, state_dict=state_dict,
                              replica_id=f"bench_{group}", timeout=timedelta(seconds=30))
    opt = torchft.Optimizer(manager, opt)
    while manager.current_step() < args.steps:
        opt.zero_grad()
        step = manager.current_step()
        idx = job.batch(args, step, group, args.groups)
        for mb in idx.split(args.micro_batch):
            loss = ((model(x[mb]) - y[mb]) ** 2).sum() / len(idx)
            loss.backward()
        for work in [manager.allreduce(p.grad) for p in model.parameters()]:
            work.wait()
        participating, world = manager.is_participating(), manager.num_participants()
        opt.step()
        if manager.current_step() > step:
            if participating:
                event.samples(step, group, world, idx)
            if manager.participating_rank() == 0:
                event(kind="commit", step=step, world=world)
    if manager.participating_rank() == 0:
        event.final(args, model)
    manager.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
