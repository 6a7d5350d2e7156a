# SPDX-License-Identifier: Apache-2.0
"""When the trainer writes checkpoints: every ``checkpoint_interval`` committed steps (replica 0
only, asynchronously), and at once when a stop asks for a dump. The files themselves (names,
manifests, fencing by generation, loading) are regroup.checkpoint.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional

from regroup._proto import wire_pb2 as pb
from regroup.api import CheckpointError, TrainerConfig
from regroup.membership import NO_GENERATION
from regroup.state import Snapshot, cpu_clone

if TYPE_CHECKING:
    from regroup.step import Step
    from regroup.trainer import Trainer

log = logging.getLogger("regroup")


def maybe_checkpoint(t: Trainer, step: Step, snapshot: Optional[Snapshot] = None) -> None:
    """After a commit: every ``checkpoint_interval`` steps, replica 0 writes its shards.

    ``snapshot``: the start of the step in flight when the commit is heard during it (the vote
    off the critical path): the model's buffers and the random generators are taken from it,
    as they were when the committed step ended; parameters and optimizer are the committed
    step's (the step in flight is not applied yet)."""
    interval = t.config.checkpoint_interval
    if t.checkpointer is None or not interval or (step.number + 1) % interval:
        return
    g = step.generation
    files = t.state.checkpoint_files(g, False, g.tp_rank, g.tp)
    if not files:
        return
    t.report_phase(pb.PHASE_CHECKPOINTING, step.number)
    try:
        t.checkpointer.wait(t.config.timeouts.checkpoint)
    except CheckpointError as e:
        log.warning("regroup: %s", e)
    ((position, count, part),) = files  # one file a rank at a periodic checkpoint
    state = t.state.checkpoint_state(step.number, part)
    if snapshot is not None and "model" in state:  # (a ZeRO-1 slice's file but the first: none)
        model = state["model"]
        for name, value in snapshot.buffers.items():
            if name in model:
                model[name] = value
        state["rng"] = snapshot.rng
    state = cpu_clone(state)
    t.checkpointer.write_async(state, step=step.number, epoch=g.epoch, generation=g.number,
                               position=position, replica_size=count, meta=meta(t.config))


def meta(c: TrainerConfig) -> dict:
    """What a checkpoint records of the step contract, so a resume can check it."""
    return {"dataset_size": c.dataset_size, "micro_batch_size": c.micro_batch_size,
            "microbatches_per_step": c.microbatches_per_step, "seed": c.seed,
            "tensor_parallel": c.tensor_parallel}


def checkpoint_now(t: Trainer) -> str:
    """Writes this rank's shard of the committed state now (blocking); returns the path.

    Raises:
        CheckpointError: no checkpoint directory, or the write failed.
    """
    if t.checkpointer is None:
        raise CheckpointError("no checkpoint_dir is configured: nothing can be dumped")
    g = t.generation
    epoch, number = (g.epoch, g.number) if g is not None else (t.membership.active if t.membership.active != NO_GENERATION else (0, 0))
    tp = g.tp if g is not None else t.config.replica_size
    position = g.tp_rank if g is not None else t.membership.position
    t.checkpointer.wait(t.config.timeouts.checkpoint)
    path = None
    for index, count, part in t.state.checkpoint_files(g, True, position, tp):
        path = t.checkpointer.write(t.state.checkpoint_state(t.committed_step, part), step=t.committed_step,
                                    epoch=epoch, generation=number, position=index,
                                    replica_size=count, meta=meta(t.config))
    return str(path)
