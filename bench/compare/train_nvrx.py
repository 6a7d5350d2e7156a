#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The job under NVIDIA's nvidia-resiliency-ext (0.4.1) in-process restart: the training
function is wrapped in `inprocess.Wrapper`; on a fault every surviving rank leaves it, the
wrapper excludes the terminated ranks (ShiftRanks, its default) and calls it again in the same
process, which re-forms the process group and takes the model and optimizer, kept in memory, from
rank 0. Launched as plain processes (RANK/WORLD_SIZE/MASTER_*), two per node.

Two changes from the documented setup, both for CPU: the wrapper's default abort
(AbortTorchDistributed) looks up each group's CUDA backend to abort NCCL, so the abort here only
destroys the process groups; and gloo collectives cannot be aborted, so the process group has a
5 s timeout: a survivor blocked in a collective with a dead peer leaves it after at most 5 s."""

import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from nvidia_resiliency_ext import inprocess

sys.path.insert(0, str(Path(__file__).resolve().parent))
import job  # noqa: E402


class DestroyGroups(inprocess.abort.Abort):
    def __call__(self, state):
        if dist.is_initialized():
            dist.destroy_process_group()
        return state


def main() -> int:
    args = job.parse_args()
    torch.set_num_threads(1)
    event = job.Events(args.events)
    x, y = job.make_data(args)
    model = job.make_model(args)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    done = {"step": 0}

    @inprocess.Wrapper(abort=DestroyGroups(), store_kwargs={"port": int(os.environ["MASTER_PORT"]) + 1})
    def train(call_wrapper: inprocess.CallWrapper = None):
        dist.init_process_group("gloo", timeout=timedelta(seconds=5))
        rank, world = dist.get_rank(), dist.get_world_size()
        if call_wrapper.iteration > 0:
            state = [done["step"], opt.state_dict()]
            dist.broadcast_object_list(state, src=0)
            done["step"] = state[0]
            opt.load_state_dict(state[1])
            for p in model.parameters():
                dist.broadcast(p.data, src=0)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        for step in range(done["step"], args.steps):
            idx = job.batch(args, step, rank, world)
            opt.zero_grad()
            chunks = idx.split(args.micro_batch)
            for i, mb in enumerate(chunks):
                ctx = ddp.no_sync() if i < len(chunks) - 1 else torch.enable_grad()
                with ctx:
                    loss = ((ddp(x[mb]) - y[mb]) ** 2).sum() * world / job.GLOBAL_BATCH
                    loss.backward()
            opt.step()
            done["step"] = step + 1
            event.samples(step, rank, world, idx)
            if rank == 0:
                event(kind="commit", step=step, world=world)
        if rank == 0:
            event.final(args, model)
        dist.destroy_process_group()

    train()
    return 0


if __name__ == "__main__":
    sys.exit(main())
