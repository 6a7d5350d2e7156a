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

import os
import sys
import time
from pathlib import Path

T_START = time.time()

import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "bench" / "compare"))
import job  # noqa: E402
import regroup  # noqa: E402


def main() -> int:
    args = job.parse_args()
    torch.set_num_threads(1)
    event = job.Events(args.events)

    event(kind="start", t_process=T_START, rank_env=int(os.environ.get("RANK", "-1")),
          restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "-1")),
          managed=bool(os.environ.get("REGROUP_AGENT_SOCKET")))
    x, y = job.make_data(args)
    model = job.make_model(args)
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
        used = []
        with step:
            for mb in step.microbatches():
                with mb:
                    out = step.model(x[mb.indices])
                    step.backward(((out - y[mb.indices]) ** 2).sum())
                    used += list(mb.indices)
            trainer.commit(step)
        if step.committed:
            event.samples(step.number, gen.rank, gen.world_size, used)
        if step.committed and gen.rank == 0:
            event(kind="commit", step=step.number, world=gen.world_size, generation=gen.number)
    event(kind="end", committed=trainer.committed_step)
    if trainer.generation is not None and trainer.generation.rank == 0:
        event.final(args, model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
