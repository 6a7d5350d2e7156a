# SPDX-License-Identifier: Apache-2.0
"""What a training script holds during a step: the step, its micro-batches and its generation.

The trainer (regroup.trainer) makes these objects; a script only uses them::

    for step in trainer.steps(total_steps):
        with step:                                   # a failure is absorbed: the step comes again
            for mb in step.microbatches():           # this replica's micro-batches of the step
                with mb:                             # RNG seeded by (seed, step, micro-batch)
                    step.backward(loss_fn(step.model(x[mb.indices]), y[mb.indices]))
            trainer.commit(step)

``Step.__exit__`` decides which exceptions are a failure of the step (an abort, a rolled-back
vote, a failed collective: the step is restored and done again) and which end training.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from typing import TYPE_CHECKING, Any, Iterator, Optional

import torch
import torch.distributed as dist

from regroup import contract
from regroup.api import (AgentConnectionError, ConfigError, ProtocolError, StepFailed, TrainingStopped,
                         UsageError)
from regroup.dispatch import NewStart
from regroup.group import ProcessGroups
from regroup.guards import check_sum_loss
from regroup.state import Snapshot
from regroup.stops import Stop

if TYPE_CHECKING:
    from regroup.trainer import Trainer

# Messages of collectives that failed because a peer or the network did (torch has no common
# type for them before 2.x's DistBackendError / DistNetworkError).
_COMM_ERROR = re.compile(
    r"gloo|nccl|connection|socket|broken pipe|timed out|timeout|closed|reset by peer|"
    r"peer|unbound buffer|transport|ProcessGroup|store|abort",
    re.IGNORECASE)


def _chain(error: BaseException) -> "list[BaseException]":
    """The error and the errors it was raised from or while handling, innermost last (a library
    that wraps a failed collective, as torch.distributed.pipelining's stages do, keeps the
    collective's own error as the cause)."""
    chain, seen = [], set()
    e: Optional[BaseException] = error
    while e is not None and id(e) not in seen:
        chain.append(e)
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return chain


def is_communication_error(error: BaseException) -> bool:
    """Whether an exception looks like a failed collective rather than a bug in the script: the
    error itself, or one it was raised from."""
    for e in _chain(error):
        for name in ("DistBackendError", "DistNetworkError", "DistStoreError"):
            cls = getattr(dist, name, None)
            if cls is not None and isinstance(e, cls):
                return True
        if isinstance(e, RuntimeError) and _COMM_ERROR.search(str(e)):
            return True
    return False


# The peer a failed collective names: gloo's errors end with it, "[10.1.0.3]:41233" ("Connection
# closed by peer [10.1.0.3]:41233", "Read error [...]:...: Connection reset by peer").
_PEER = re.compile(r"\[([0-9A-Za-z.:-]+)\]:\d+")


def failed_peer(error: BaseException) -> str:
    """The host of the peer a failed collective's error (or one it was raised from) names, or ""."""
    for e in _chain(error):
        m = _PEER.search(str(e))
        if m:
            return m.group(1)
    return ""


@dataclasses.dataclass


class Generation:
    """The generation a step runs in, as this rank sees it.

    Attributes:
        epoch: the manager incarnation that formed it (0 without an agent).
        number: its number (1 for the only generation of a run without an agent).
        rank: this rank's global rank.
        world_size: ranks in the generation.
        dp: data-parallel replicas.
        replica: this rank's replica.
        tp: ranks per replica (tensor x pipeline parallel).
        tp_rank: this rank's position in its replica.
        microbatch_begin: this replica's first micro-batch of every step.
        microbatch_count: how many it computes.
        committed_step: the step the generation resumed after.
    """

    epoch: int
    number: int
    rank: int
    world_size: int
    dp: int
    replica: int
    tp: int
    tp_rank: int
    microbatch_begin: int
    microbatch_count: int
    committed_step: int
    _groups: Optional[ProcessGroups] = dataclasses.field(default=None, repr=False)

    @property
    def tp_group(self) -> Any:
        """The group of this rank's replica (None with one rank per replica). Do not keep it
        beyond the step: it belongs to this generation."""
        return self._groups.tp_group if self._groups is not None else None

    @property
    def dp_group(self) -> Any:
        """The group of the ranks at this rank's position in every replica."""
        return self._groups.dp_group if self._groups is not None else None

    @property
    def pp_group(self) -> Any:
        """This rank's pipeline-parallel group, in stage order (None with one stage;
        ``TrainerConfig.pipeline_parallel``). Like every group, only for this generation."""
        return self._groups.pp_group if self._groups is not None else None

    @property
    def model_parallel_group(self) -> Any:
        """The group of this rank's whole replica (tp x pp; None with one rank per replica)."""
        return self._groups.mp_group if self._groups is not None else None

    @property
    def groups(self) -> Optional[ProcessGroups]:
        """All of the generation's groups and its layout (``.layout``: tp, pp, stage, tp_rank,
        pp_prev, pp_next; regroup.group)."""
        return self._groups


class MicroBatch:
    """One micro-batch of a step: its global sample indices and its random numbers.

    Use it as a context manager around the micro-batch's forward and backward passes::

        with mb:
            loss = loss_fn(step.model(x[mb.indices]), y[mb.indices])
            loss.backward()

    Inside, torch's global generators are seeded with the micro-batch's seed, and with the DDP
    wrapper every micro-batch but the replica's last runs under ``no_sync`` (its gradients are
    only accumulated). The previous RNG state is put back on leaving.

    Attributes:
        index: the micro-batch's number within the step (0 .. microbatches_per_step - 1).
        indices: its global sample indices (a LongTensor).
        step: the step.
        seed: the seed of its random numbers.
        last: whether it is this replica's last micro-batch of the step.
    """

    def __init__(self, index: int, indices: torch.Tensor, step: int, seed: int, last: bool,
                 trainer: Optional[Trainer] = None):
        self.index = index
        self.indices = indices
        self.step = step
        self.seed = seed
        self.last = last
        self._trainer = trainer  # not the DDP wrapper itself: it must die with its generation
        self._stack: Optional[contextlib.ExitStack] = None

    def __enter__(self) -> "MicroBatch":
        stack = contextlib.ExitStack()
        stack.enter_context(contract.seeded_rng(self.seed))
        ddp = self._trainer.membership.ddp if self._trainer is not None else None
        if ddp is not None and not self.last:
            stack.enter_context(ddp.no_sync())
        self._stack = stack
        return self

    def __exit__(self, *exc: Any) -> bool:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.__exit__(*exc)
        return False

    def rng(self) -> contextlib.AbstractContextManager:
        """A block in which torch's global generators are seeded with this micro-batch's seed
        (dropout and any other random op inside it); the previous state is put back after."""
        return contract.seeded_rng(self.seed)

    def generator(self, device: str = "cpu") -> torch.Generator:
        """A generator seeded with this micro-batch's seed, for explicit use."""
        return contract.generator(self.seed, device)

    def __repr__(self) -> str:
        return f"MicroBatch(step={self.step}, index={self.index}, samples={self.indices.numel()})"


class Step:
    """One training step. Use it as a context manager around the step's work.

    Leaving the ``with`` block with a failure of the step (an abort, a rolled-back vote, a failed
    collective) absorbs the exception: the trainer restores the step-start state and yields the
    step again. Leaving it without having committed commits it.

    Attributes:
        number: the global step index.
        epoch: the epoch it belongs to.
        generation: the generation it runs in.
        committed: whether ``trainer.commit(step)`` went through: the step is applied. Its vote
            may still be in flight (the script goes on meanwhile): it is final once
            ``trainer.committed_step`` reaches it; if the vote is rolled back instead, the
            trainer puts back the step's start and yields it again.
        failure: why it failed, when it did.
    """

    def __init__(self, trainer: Trainer, number: int, generation: Generation):
        self._trainer = trainer
        self.number = number
        self.epoch = trainer.sampler.epoch_of(number)
        self.generation = generation
        self.committed = False
        self.failure: Optional[StepFailed] = None
        self.stop: Optional[Stop] = None
        self.reduced = False
        self._entered = False
        self._closed = False
        self.snapshot: Optional[Snapshot] = None
        # The applied step before this one, when its vote was rolled back while this step was
        # in flight: leaving the block puts back its start (regroup.trainer).
        self.rewind: Any = None

    @property
    def model(self) -> torch.nn.Module:
        """The model to run: the DistributedDataParallel wrapper of this generation when the
        trainer uses one, else the model itself. Fetch it each step."""
        return self._trainer.model

    def microbatches(self) -> Iterator[MicroBatch]:
        """This replica's micro-batches of the step, in order.

        Raises:
            GenerationAborted: the generation was aborted (checked before each micro-batch).
        """
        t = self._trainer
        g = self.generation
        end = g.microbatch_begin + g.microbatch_count
        for j in range(g.microbatch_begin, end):
            t.check_aborted(self)
            yield MicroBatch(j, t.state.share(t.sampler.microbatch(self.number, j)), self.number,
                             contract.microbatch_seed(t.config.seed, self.number, j), j == end - 1, t)

    def samples(self) -> torch.Tensor:
        """Every global sample index of this replica's micro-batches of the step."""
        parts = [mb.indices for mb in self.microbatches()]
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.long)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, after checking that the generation was not aborted. With the DDP
        wrapper, call it inside the micro-batch's ``with mb:`` block."""
        self._trainer.check_aborted(self)
        check_sum_loss(loss, self.number)
        loss.backward()

    def reduce_gradients(self) -> None:
        """Sums the gradients over the replicas and divides them by the global batch size.

        With the DDP wrapper this already happened in the backward pass; calling it is harmless.

        Raises:
            StepFailed: the collective failed (absorbed by the ``with`` block).
        """
        self._trainer.reduce(self)

    def commit(self) -> None:
        """Same as ``trainer.commit(step)``."""
        self._trainer.commit(self)

    def __enter__(self) -> "Step":
        if self._entered:
            raise UsageError(f"step {self.number} was entered twice")
        self._entered = True
        return self

    def __exit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> bool:
        t = self._trainer
        if exc is None:
            if not self.committed and self.failure is None:
                try:
                    t.commit(self)
                except StepFailed as e:
                    self.failure = e
                except Stop as e:
                    self.stop = e
            return False
        if isinstance(exc, StepFailed):
            self.failure = exc
            return True
        if isinstance(exc, Stop):
            self.stop = exc  # handled by the trainer once the block is left
            return True
        if isinstance(exc, (NewStart, TrainingStopped, UsageError, ConfigError, AgentConnectionError, ProtocolError)):
            return False
        if isinstance(exc, Exception) and (t.membership.aborted() or is_communication_error(exc)):
            self.failure = t.collective_failed(self, exc)
            return True
        return False
