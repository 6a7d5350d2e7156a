# SPDX-License-Identifier: Apache-2.0
"""What every training script of the comparison shares, so a diff between two of them shows only
what adopting a system costs: the arguments, the model, the data, the sample schedule and the
records the harness reads (committed steps, the samples each applied, the final weights).

Records (JSON lines, wall time, appended to --events): `commit` (step, world) once per committed
step, by one process; `samples` (step, rank, world, indices) by every process that applied a
committed step's gradients; the final parameters go to --final as raw float32 (one process).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

GLOBAL_BATCH = 64


def parse_args(extra=None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--features", type=int, default=512)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=2, help="hidden layers")
    p.add_argument("--dataset", type=int, default=4096)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--microbatches", type=int, default=8, help="micro-batches per step (all replicas)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--checkpoint-interval", type=int, default=0)
    p.add_argument("--events", required=True)
    p.add_argument("--final", default=None, help="write the final parameters here (float32)")
    if extra:
        extra(p)
    return p.parse_args()


def make_model(args) -> torch.nn.Module:
    torch.manual_seed(args.seed)
    layers, width = [], args.features
    for _ in range(args.layers):
        layers += [torch.nn.Linear(width, args.hidden), torch.nn.ReLU()]
        width = args.hidden
    layers.append(torch.nn.Linear(width, args.features))
    return torch.nn.Sequential(*layers)


def make_data(args) -> tuple:
    """The dataset: args.dataset samples of args.features inputs, regressing tanh of them."""
    g = torch.Generator().manual_seed(args.seed + 1)
    x = torch.randn(args.dataset, args.features, generator=g)
    y = torch.tanh(x) + 0.01 * torch.randn(args.dataset, args.features, generator=g)
    return x, y


def batch(args, step: int, part: int, parts: int) -> torch.Tensor:
    """Dataset indices of `part` of `parts` equal-as-possible shares of step's global batch: an
    epoch is one seeded permutation, steps take consecutive slices of it."""
    per_epoch = args.dataset // GLOBAL_BATCH
    epoch, k = divmod(step, per_epoch)
    perm = torch.randperm(args.dataset, generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
    return torch.tensor_split(perm[k * GLOBAL_BATCH:(k + 1) * GLOBAL_BATCH], parts)[part]


class Events:
    def __init__(self, path: str):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def __call__(self, **kv) -> None:
        os.write(self.fd, (json.dumps({"t": time.time(), "pid": os.getpid(), **kv}) + "\n").encode())

    def samples(self, step: int, rank: int, world: int, indices) -> None:
        self(kind="samples", step=step, rank=rank, world=world, indices=[int(i) for i in indices])

    def final(self, args, model: torch.nn.Module) -> None:
        if args.final:
            flat = torch.cat([p.detach().reshape(-1).float().cpu() for p in model.parameters()])
            tmp = f"{args.final}.{os.getpid()}"
            flat.numpy().tofile(tmp)
            os.replace(tmp, args.final)
