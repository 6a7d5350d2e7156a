#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The training job of the recovery comparison: one script, run unchanged under Regroup
(`regroup-agent`) and under `torchrun`.

An MLP (--features -> --hidden x --layers -> --features, about 2.1 M parameters by default, so
the state a restart reloads is ~25 MB with Adam) on synthetic data, trained with
`regroup.Trainer`. Under `regroup-agent` the library talks to the agent (recovery in place,
state from a peer). Without an agent, under `torchrun`, the same `regroup.Trainer` runs as a plain
PyTorch program from torchrun's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT: each (re)start of the
workers resumes from the newest complete checkpoint in --checkpoint-dir, written every
--checkpoint-interval steps (torchrun's documented pattern: load on start, save periodically).

Every committed step is appended by the generation's rank 0 to --events (JSON lines, wall
time), with the world size, so the harness can time recovery the same way for both systems.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

T_START = time.time()

import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))
import regroup  # noqa: E402


def parse_args():
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
    return p.parse_args()


def make_model(args) -> torch.nn.Module:
    torch.manual_seed(args.seed)
    layers, width = [], args.features
    for _ in range(args.layers):
        layers += [torch.nn.Linear(width, args.hidden), torch.nn.ReLU()]
        width = args.hidden
    layers.append(torch.nn.Linear(width, args.features))
    return torch.nn.Sequential(*layers)


def make_data(args) -> tuple[torch.Tensor, torch.Tensor]:
    """The dataset: args.dataset samples of args.features inputs, regressing tanh of them."""
    g = torch.Generator().manual_seed(args.seed + 1)
    x = torch.randn(args.dataset, args.features, generator=g)
    y = torch.tanh(x) + 0.01 * torch.randn(args.dataset, args.features, generator=g)
    return x, y


def main() -> int:
    args = parse_args()
    torch.set_num_threads(1)
    fd = os.open(args.events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def event(**kv):
        os.write(fd, (json.dumps({"t": time.time(), "pid": os.getpid(), **kv}) + "\n").encode())

    event(kind="start", t_process=T_START, rank_env=int(os.environ.get("RANK", "-1")),
          restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "-1")),
          managed=bool(os.environ.get("REGROUP_AGENT_SOCKET")))
    x, y = make_data(args)
    model = make_model(args)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    config = regroup.TrainerConfig(
        dataset_size=args.dataset, micro_batch_size=args.micro_batch, microbatches_per_step=args.microbatches,
        seed=args.seed, checksum_interval=0, checkpoint_dir=args.checkpoint_dir,
        checkpoint_interval=args.checkpoint_interval, keep_checkpoints=2)
    trainer = regroup.Trainer(model, opt, config=config)
    first = True
    for step in trainer.steps(args.steps):
        gen = step.generation
        if first:
            event(kind="begin", step=step.number, rank=gen.rank, world=gen.world_size)
            first = False
        with step:
            for mb in step.microbatches():
                with mb:
                    out = step.model(x[mb.indices])
                    step.backward(((out - y[mb.indices]) ** 2).sum())
            trainer.commit(step)
        if step.committed and gen.rank == 0:
            event(kind="commit", step=step.number, world=gen.world_size, generation=gen.number)
    event(kind="end", committed=trainer.committed_step)
    os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
