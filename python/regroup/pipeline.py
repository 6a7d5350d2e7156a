# SPDX-License-Identifier: Apache-2.0
"""A pipeline schedule rebuilt for every generation (torch 2.x ``torch.distributed.pipelining``).

A rank of a dp x tp x pp grid (``TrainerConfig.pipeline_parallel``) holds one stage of its
replica's model (and, with tp > 1, its tensor-parallel shard of that stage). Each generation has
new process groups, so the stage and its schedule are built again on the generation's pipeline
group, with as many pipeline micro-batches as the replica has micro-batches in a step::

    pipe = regroup.pipeline.Pipeline(model, loss_fn, example_input)   # model: this rank's stage
    for step in trainer.steps(total):
        with step:
            idx = step.samples()                     # the replica's samples, micro-batch order
            loss = pipe.run(step, x[idx], y[idx])    # forward and backward of every micro-batch
            step.reduce_gradients()
            trainer.commit(step)

One pipeline micro-batch is one micro-batch of the step contract, in order, so the gradients
are the same sums whatever the layout. ``loss_fn`` must sum over the samples (the contract; the
schedule is built with ``scale_grads=False``). The schedule runs the micro-batches itself: the
per-micro-batch random numbers of ``with mb:`` are not set (keep a pipelined model free of
dropout, or draw its masks from the sample indices). A replica given no micro-batch in a step
(fewer micro-batches than replicas) has nothing to run: :meth:`Pipeline.run` returns None.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional, Tuple

import torch

from regroup.api import ConfigError

log = logging.getLogger("regroup")

SCHEDULES = ("gpipe", "1f1b")


def _pipelining() -> Any:
    try:
        import torch.distributed.pipelining as pipelining
    except ImportError:
        raise ConfigError(f"a pipeline schedule needs torch.distributed.pipelining (torch 2.4 or "
                          f"later); this is torch {torch.__version__}") from None
    return pipelining


def build_schedule(stage_module: torch.nn.Module, groups: Any, microbatches: int,
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                   example_input: torch.Tensor, example_output: torch.Tensor,
                   schedule: str = "gpipe", device: Optional[torch.device] = None) -> Any:
    """A pipeline stage of ``stage_module`` on the generation's pipeline group, and its schedule.

    Args:
        stage_module: this rank's stage.
        groups: the generation's groups (``step.generation.groups``).
        microbatches: pipeline micro-batches per run (the replica's micro-batches in a step).
        loss_fn: ``loss_fn(output, target)``, summed over the samples.
        example_input, example_output: one micro-batch's input and output of this stage (their
            shapes and dtypes; no shape inference over the network).
        schedule: "gpipe" or "1f1b".
        device: where the stage runs (the CPU by default).

    Raises:
        ConfigError: torch has no pipelining, the grid has one stage, or a bad schedule name.
    """
    pipelining = _pipelining()
    layout = groups.layout
    if layout.pp < 2 or groups.pp_group is None:
        raise ConfigError(f"a pipeline schedule needs pipeline_parallel >= 2 (this generation has "
                          f"{layout.pp} stage(s))")
    if schedule not in SCHEDULES:
        raise ConfigError(f"schedule={schedule!r} must be one of {', '.join(SCHEDULES)}")
    if microbatches < 1:
        raise ConfigError(f"a pipeline schedule needs a micro-batch (got {microbatches})")
    # torch takes from the examples' requires_grad whether a gradient crosses between stages:
    # into every stage but the first, out of every stage.
    example_input = example_input.detach().requires_grad_(
        layout.stage > 0 and example_input.is_floating_point())
    example_output = example_output.detach().requires_grad_(example_output.is_floating_point())
    stage = pipelining.PipelineStage(stage_module, layout.stage, layout.pp,
                                     device or torch.device("cpu"),
                                     input_args=example_input, output_args=example_output,
                                     group=groups.pp_group)
    cls = pipelining.ScheduleGPipe if schedule == "gpipe" else pipelining.Schedule1F1B
    # Every stage is given the loss function: torch runs the backward passes only where one is.
    return cls(stage, microbatches, loss_fn=loss_fn, scale_grads=False)


class Pipeline:
    """This rank's stage and a schedule rebuilt when the generation changes (see the module).

    Args:
        stage_module: this rank's stage of the model (the module the trainer holds, or a part);
            None: ``trainer.module`` as it is in each generation (a state that rebuilds the
            module every generation, as ``tensor_parallel_plan`` does, needs it).
        loss_fn: ``loss_fn(output, target)`` summed over the samples (used on the last stage).
        example_input: one sample's input to this stage (shape without the batch dimension is
            taken from it: ``example_input[:1]`` is enough).
        example_output: one sample's output of this stage.
        schedule: "gpipe" or "1f1b".
    """

    def __init__(self, stage_module: Optional[torch.nn.Module],
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                 example_input: torch.Tensor, example_output: torch.Tensor, schedule: str = "gpipe"):
        _pipelining()
        if schedule not in SCHEDULES:
            raise ConfigError(f"schedule={schedule!r} must be one of {', '.join(SCHEDULES)}")
        self.module = stage_module
        self.loss_fn = loss_fn
        self.example_input = example_input[:1]
        self.example_output = example_output[:1]
        self.schedule_name = schedule
        self._key: Optional[Tuple[int, int, int]] = None
        self._schedule: Any = None
        self.rebuilt = 0  # schedules built (one per generation the rank ran a step in)

    def schedule_for(self, step: Any, micro_batch_size: int) -> Any:
        """The schedule of the step's generation (built on its first step)."""
        g = step.generation
        key = (g.epoch, g.number, g.microbatch_count)
        if key != self._key:
            self._schedule = None  # the previous generation's stage and groups go with it
            groups = g.groups
            if groups is None:
                raise ConfigError("the step's generation has no groups (it ended)")
            shape_in = (micro_batch_size,) + tuple(self.example_input.shape[1:])
            shape_out = (micro_batch_size,) + tuple(self.example_output.shape[1:])
            module = self.module if self.module is not None else step._trainer.module
            self._schedule = build_schedule(
                module, groups, g.microbatch_count, self.loss_fn,
                torch.empty(shape_in, dtype=self.example_input.dtype),
                torch.empty(shape_out, dtype=self.example_output.dtype), self.schedule_name)
            self._key = key
            self.rebuilt += 1
            log.info("regroup: pipeline stage %d of %d rebuilt for generation %d (%d micro-batches, %s)",
                     groups.layout.stage, groups.layout.pp, g.number, g.microbatch_count,
                     self.schedule_name)
        return self._schedule

    def run(self, step: Any, inputs: torch.Tensor, targets: torch.Tensor) -> Optional[torch.Tensor]:
        """Forward and backward of the replica's micro-batches of ``step``: ``inputs`` and
        ``targets`` are their samples in micro-batch order (only the first stage reads
        ``inputs``, only the last ``targets``). Returns the summed loss on the last stage, a
        zero elsewhere, None when the replica has no micro-batch in the step.

        Raises:
            GenerationAborted: the generation was aborted (before the run).
            RuntimeError: a stage's send or receive failed (the step's ``with`` absorbs it).
        """
        g = step.generation
        if g.microbatch_count == 0:
            return None
        step._trainer.check_aborted(step)
        micro = inputs.shape[0] // g.microbatch_count
        schedule = self.schedule_for(step, micro)
        layout = g.groups.layout
        if layout.stage == 0:
            schedule.step(inputs)
            return torch.zeros(())
        if layout.stage == layout.pp - 1:
            losses: list = []
            schedule.step(target=targets, losses=losses)
            return torch.stack([loss.detach() for loss in losses]).sum()
        schedule.step()
        return torch.zeros(())
