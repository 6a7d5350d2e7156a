#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The same DistributedDataParallel script twice: `ddp_plain.py` as users write it, run by
torchrun, and `ddp_regroup.py`, adopted by Regroup in five changed lines and run by
regroup-agent (python/regroup/dropin_test.py counts them; python/README.md shows how to run it).

    torchrun --nproc-per-node 4 examples/ddp_plain.py --epochs 2

Both take the same flags: gradient accumulation under `no_sync`, clipping, a GradScaler (active
with CUDA, or on the CPU with --amp and torch 2.x), a learning-rate scheduler stepped per step or
per epoch, and a DDP communication hook.
"""

import argparse
import contextlib
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))  # the repo's regroup
from example_ledger import Ledger  # noqa: E402  (tests only: which samples each step used)
import regroup  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--dataset", type=int, default=256, help="samples in the synthetic dataset")
p.add_argument("--batch-size", type=int, default=8, help="samples per rank per batch")
p.add_argument("--accum", type=int, default=1, help="batches per optimizer step (no_sync)")
p.add_argument("--lr", type=float, default=0.05)
p.add_argument("--clip", type=float, default=1.0)
p.add_argument("--sched", choices=("step", "epoch"), default="step")
p.add_argument("--comm-hook", action="store_true", help="register DDP's allreduce_hook")
p.add_argument("--amp", action="store_true", help="a GradScaler on the CPU too (torch 2.x)")
p.add_argument("--workers", type=int, default=0, help="the DataLoader's worker processes")
p.add_argument("--step-sleep", type=float, default=0.0)
p.add_argument("--ledger", default=None)
p.add_argument("--out", default=None)
args = p.parse_args()

torch.set_default_dtype(torch.float64)
regroup.init_process_group("gloo")
torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
x = torch.randn(args.dataset, 16, generator=g)
y = torch.tanh(x @ torch.randn(16, 4, generator=g))
dataset = TensorDataset(x, y, torch.arange(args.dataset))

net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
model = regroup.DDP(net, gradient_as_bucket_view=True)
if args.comm_hook:
    model.register_comm_hook(None, default_hooks.allreduce_hook)
opt = regroup.optimizer(torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9))
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.8)
if args.amp:
    scaler = torch.amp.GradScaler("cpu")
else:
    scaler = torch.cuda.amp.GradScaler(enabled=torch.cuda.is_available())
sampler = DistributedSampler(dataset, shuffle=True, seed=7, drop_last=True)
loader = regroup.DataLoader(
    dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True, num_workers=args.workers)
ledger = Ledger(args.ledger)

for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    for i, (xb, yb, idx) in enumerate(loader):
        ledger.batch(idx)
        sync = (i + 1) % args.accum == 0
        with contextlib.nullcontext() if sync else model.no_sync():
            loss = F.mse_loss(model(xb), yb) / args.accum
            scaler.scale(loss).backward()
        if sync:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            if args.sched == "step":
                sched.step()
            ledger.stepped(loss.item() * args.accum)
            time.sleep(args.step_sleep)
    if args.sched == "epoch":
        sched.step()

if args.out and dist.get_rank() == 0:
    torch.save({k: v.detach().clone() for k, v in net.state_dict().items()}, args.out)
ledger.close()
