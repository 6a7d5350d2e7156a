"""The step loop: a training script's own loop, wrapped step by step.

::

    trainer = regroup.Trainer(model, optimizer, scheduler, config=regroup.TrainerConfig(...))
    for step in trainer.steps(total_steps):
        with step:                                   # a failed step is restored and done again
            for mb in step.microbatches():           # this replica's share of the step
                x, y = data[mb.indices], targets[mb.indices]
                with mb:                             # dropout seeded by (seed, step, micro-batch)
                    loss = loss_fn(step.model(x), y) # summed over the samples, not averaged
                    step.backward(loss)
            trainer.commit(step)                     # reduce, vote, apply on commit
        print(step.number, step.generation.world_size)

Under ``regroup-agent`` ($REGROUP_AGENT_SOCKET set) every step is voted on through the agent
and applied only when the manager commits it; an abort, a rolled-back vote or a failed
collective restores the step-start state, rebuilds the process group when the generation
changed, and yields the same step again. Without an agent (a plain single process, or torchrun
style RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT) the same script trains without recovery: that is
the reference run of the exactness tests.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import sys
import threading
import time
from typing import Any, Callable, Iterator, Optional, Tuple

import torch
import torch.distributed as dist

from regroup import contract
from regroup._proto import runtime_pb2 as pb
from regroup.abort import GroupSockets, Watchdog
from regroup.agent import AgentLink, LinkLost
from regroup.api import (EXIT_ABORT_STUCK, AgentConnectionError, CheckpointError, CollectiveFailed,
                         ConfigError, GenerationAborted, ProtocolError, StateSyncError, StepFailed,
                         StepRolledBack, StopMode, TrainerConfig, TrainingStopped, UsageError)
from regroup.checkpoint import CheckpointInfo, Checkpointer
from regroup.group import Layout, ProcessGroups, build_groups, default_backend
from regroup.state import Snapshot, TrainingState, cpu_clone, recv_state, reduce_gradients, send_state

log = logging.getLogger("regroup")

_Mark = Tuple[int, int]  # (epoch, generation): compared as a pair
_NONE: _Mark = (-1, -1)

# Messages of collectives that failed because a peer or the network did (torch has no common
# type for them before 2.x's DistBackendError / DistNetworkError).
_COMM_ERROR = re.compile(
    r"gloo|nccl|connection|socket|broken pipe|timed out|timeout|closed|reset by peer|"
    r"peer|unbound buffer|transport|ProcessGroup|store|abort",
    re.IGNORECASE)


def is_communication_error(error: BaseException) -> bool:
    """Whether an exception looks like a failed collective rather than a bug in the script."""
    for name in ("DistBackendError", "DistNetworkError", "DistStoreError"):
        cls = getattr(dist, name, None)
        if cls is not None and isinstance(error, cls):
            return True
    return isinstance(error, RuntimeError) and bool(_COMM_ERROR.search(str(error)))


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
                 trainer: Optional["Trainer"] = None):
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
        ddp = self._trainer._ddp if self._trainer is not None else None
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
        committed: whether it was committed.
        failure: why it failed, when it did.
    """

    def __init__(self, trainer: "Trainer", number: int, generation: Generation):
        self._trainer = trainer
        self.number = number
        self.epoch = trainer.sampler.epoch_of(number)
        self.generation = generation
        self.committed = False
        self.failure: Optional[StepFailed] = None
        self.stop: Optional["_Stop"] = None
        self.reduced = False
        self._entered = False
        self._closed = False
        self.snapshot: Optional[Snapshot] = None

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
            t._check_aborted(self)
            yield MicroBatch(j, t.sampler.microbatch(self.number, j), self.number,
                             contract.microbatch_seed(t.config.seed, self.number, j), j == end - 1, t)

    def samples(self) -> torch.Tensor:
        """Every global sample index of this replica's micro-batches of the step."""
        parts = [mb.indices for mb in self.microbatches()]
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.long)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, after checking that the generation was not aborted. With the DDP
        wrapper, call it inside the micro-batch's ``with mb:`` block."""
        self._trainer._check_aborted(self)
        loss.backward()

    def reduce_gradients(self) -> None:
        """Sums the gradients over the replicas and divides them by the global batch size.

        With the DDP wrapper this already happened in the backward pass; calling it is harmless.

        Raises:
            StepFailed: the collective failed (absorbed by the ``with`` block).
        """
        self._trainer._reduce(self)

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
                except _Stop as e:
                    self.stop = e
            return False
        if isinstance(exc, StepFailed):
            self.failure = exc
            return True
        if isinstance(exc, _Stop):
            self.stop = exc  # handled by the trainer once the block is left
            return True
        if isinstance(exc, (_NewStart, TrainingStopped, UsageError, ConfigError, AgentConnectionError, ProtocolError)):
            return False
        if isinstance(exc, Exception) and (t._aborted() or is_communication_error(exc)):
            self.failure = t._collective_failed(self, exc)
            return True
        return False


class _Stop(Exception):
    """Internal: a StopTraining was received; carries it to where it is handled."""

    def __init__(self, mode: StopMode, reason: str):
        super().__init__(reason)
        self.mode = mode
        self.reason = reason


class _NewStart(Exception):
    """Internal: a StartGeneration arrived while a generation was running."""

    def __init__(self, start: Any):
        super().__init__("a new generation started")
        self.start = start


@dataclasses.dataclass
class _Voted:
    step: int
    mark: _Mark
    snapshot: Snapshot


class Trainer:
    """Runs a training script's steps under Regroup.

    Args:
        model: the module (its parameters are this rank's shard under tensor parallelism).
        optimizer: its optimizer (stepped only when a step is committed).
        scheduler: an LR scheduler stepped after the optimizer, or None.
        config: see :class:`regroup.TrainerConfig`.
        extra_state: more state kept, checkpointed and sent to new ranks (see
            :class:`regroup.state.TrainingState`).
        agent_socket: the agent's socket; default ``$REGROUP_AGENT_SOCKET`` (unset: no agent).
        on_commit: called as ``on_commit(step)`` right after a step's optimizer step.

    Raises:
        ConfigError: the configuration cannot work.
    """

    def __init__(self, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
                 scheduler: Any = None, *, config: TrainerConfig, extra_state: Any = None,
                 agent_socket: Optional[str] = None,
                 on_commit: Optional[Callable[[Step], None]] = None):
        if not isinstance(config, TrainerConfig):
            raise ConfigError("config must be a regroup.TrainerConfig")
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            raise ConfigError("give the plain model: the trainer builds the DistributedDataParallel "
                              "wrapper itself, after each state sync (config.ddp=True)")
        self.config = config
        self.state = TrainingState(model, optimizer, scheduler, extra_state)
        self.sampler = contract.Sampler(config.dataset_size, config.micro_batch_size,
                                        config.microbatches_per_step, config.seed, config.shuffle)
        self.on_commit = on_commit
        socket_path = agent_socket if agent_socket is not None else os.environ.get("REGROUP_AGENT_SOCKET")
        self.managed = bool(socket_path)
        self._socket_path = socket_path
        self.backend = config.backend or default_backend()
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" \
            else torch.device("cpu")
        self.committed_step = -1
        self.heard_commit_step = -1
        self.generation: Optional[Generation] = None
        self.checkpointer = Checkpointer(config.checkpoint_dir, config.keep_checkpoints) \
            if config.checkpoint_dir else None
        self._resume_from: Optional[CheckpointInfo] = None
        self._link: Optional[AgentLink] = None
        self._groups: Optional[ProcessGroups] = None
        self._ddp: Optional[torch.nn.parallel.DistributedDataParallel] = None
        self._lock = threading.Lock()
        self._active: _Mark = _NONE       # the generation being built or run
        self._abort_mark: _Mark = _NONE   # the highest generation aborted
        self._abort_reason = ""
        self._sockets: Optional[GroupSockets] = None
        self._busy = False                # the training thread is in a step or a rebuild
        self._watchdog = Watchdog()
        self._voted: Optional[_Voted] = None
        self._pause_deadline: Optional[float] = None
        self._opened = False
        self._closed = False
        self.metrics = {"aborts": 0, "generations": 0, "abort_to_unblocked_s": [], "rebuild_s": [],
                        "state_bytes_sent": 0}
        self._abort_at: Optional[float] = None
        self._position = 0                # this rank's last position in a replica (for a dump)

    # -- public properties ----------------------------------------------------------------------

    @property
    def model(self) -> torch.nn.Module:
        """The model to run this generation (the DDP wrapper with ``config.ddp``)."""
        return self._ddp if self._ddp is not None else self.state.model

    @property
    def module(self) -> torch.nn.Module:
        """The plain model (never the wrapper)."""
        return self.state.model

    # -- the loop -------------------------------------------------------------------------------

    def steps(self, total_steps: int) -> Iterator[Step]:
        """Yields the steps from the one after the last committed up to ``total_steps - 1``.

        A step that failed is yielded again (a new Step object with the same number). Returns
        when step ``total_steps - 1`` is committed.

        Raises:
            TrainingStopped: the manager stopped training (EXIT; DUMP and LEAVE exit the process
                with code 0 unless ``config.exit_on_stop`` is off).
            AgentConnectionError: the agent went away.
            UsageError: a step was left neither committed nor failed.
        """
        if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 0:
            raise ConfigError(f"total_steps={total_steps!r} must be an integer >= 0")
        self._open()
        try:
            while self.committed_step + 1 < total_steps:
                if self.generation is None:
                    self._await_generation()
                    continue
                self._poll_boundary()
                if self.generation is None:
                    continue
                step = Step(self, self.committed_step + 1, self.generation)
                self._begin(step)
                yield step
                self._end(step)
            self._finish()
        except _Stop as stop:
            self._on_stop(stop)
        finally:
            self._busy = False
            self._watchdog.disarm()

    def commit(self, step: Step) -> None:
        """Reduces the gradients (unless done), votes, and applies the step if it is committed.

        Raises:
            StepFailed: the step was not committed (absorbed by the step's ``with`` block).
            UsageError: the step is not the one in flight, or was already committed.
        """
        if step._trainer is not self or step._closed or step.committed:
            raise UsageError(f"step {step.number} cannot be committed: it is not the step in flight")
        if step.failure is not None:
            raise step.failure
        if not step.reduced:
            self._reduce(step)
        self._check_aborted(step)
        s = step.number
        interval = self.config.checksum_interval
        checksum = self.state.checksum() if interval and s % interval == 0 else 0
        if not self.managed:
            self._apply(step)
            return
        assert self._link is not None and step.snapshot is not None
        self._voted = _Voted(s, self._active, step.snapshot)
        self._phase(pb.PHASE_VOTED, s)
        self._link.vote(step.generation.number, s, True, checksum)
        deadline = None if self.config.timeouts.outcome is None else time.monotonic() + self.config.timeouts.outcome
        while True:
            item = self._next(deadline, f"the outcome of step {s}")
            if item is None:
                raise CollectiveFailed(s, f"no outcome for step {s} within {self.config.timeouts.outcome} s")
            kind = item.WhichOneof("body")
            if kind == "outcome":
                o = item.outcome
                if o.generation != step.generation.number or o.step != s:
                    continue  # an outcome of an earlier vote
                if o.commit:
                    self.heard_commit_step = max(self.heard_commit_step, s)
                    self._apply(step)
                    return
                self._voted = None
                self._rollback(step)
                raise StepRolledBack(s, o.checksum_mismatch)
            self._dispatch(item, step)

    def close(self) -> None:
        """Ends the link to the agent and destroys the process groups (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._watchdog.disarm()
        self._leave_generation()
        if self._link is not None:
            self._link.close()
            self._link = None

    # -- opening and finishing ------------------------------------------------------------------

    def _open(self) -> None:
        if self._opened:
            return
        self._opened = True
        if self.checkpointer is not None:
            info = self.checkpointer.newest()
            if info is not None:
                self._resume_from = info
                self.committed_step = self.heard_commit_step = info.step
                log.info("regroup: resuming from checkpoint %s (step %d)", info.path, info.step)
        if not self.managed:
            self._enter_standalone()
            return
        local_rank = int(os.environ.get("REGROUP_LOCAL_RANK", os.environ.get("LOCAL_RANK", "0")))
        self._link = AgentLink(self._socket_path or "", local_rank, self.config.timeouts, self._on_urgent)
        hello = pb.TrainerHello(local_rank=local_rank, pid=os.getpid(), epoch=0, generation=0,
                                committed_step=self.committed_step,
                                heard_commit_step=self.heard_commit_step)
        self._link.connect(hello)

    def _finish(self) -> None:
        if self.checkpointer is not None:
            try:
                self.checkpointer.wait(self.config.timeouts.checkpoint)
            except CheckpointError as e:
                log.warning("regroup: %s", e)
        if self._link is not None:
            try:
                self._link.set_status(self.committed_step, pb.PHASE_DONE, beat_now=True)
            except AgentConnectionError:
                pass
        self.close()

    # -- steps ----------------------------------------------------------------------------------

    def _phase(self, phase: int, step: Optional[int] = None) -> None:
        if self._link is not None:
            # Leaving a step is told at once (the manager waits for it), and so is the first
            # moment of a new step: a rank that fails early in a step is then blamed on that step,
            # which the poison-step guard needs (one frame a step). The rest rides the beat.
            now = (phase == pb.PHASE_PAUSED and self._link.phase != pb.PHASE_PAUSED) or \
                (phase == pb.PHASE_COMPUTING and step is not None and step != self._link.step)
            if phase in (pb.PHASE_PAUSED, pb.PHASE_SYNCING):
                # Outside a step: no step (-1). A rank that dies while waiting for or forming a
                # generation did not fail the step the job resumes at; reporting that step would
                # make a second fault during a recovery look like "the same step failing twice"
                # (the engine's poison-step guard), and the job would be dumped, not recovered.
                step = -1
            try:
                self._link.set_status(self.committed_step + 1 if step is None else step, phase, beat_now=now)
            except AgentConnectionError:
                pass  # the link thread reports the loss

    def _begin(self, step: Step) -> None:
        step.snapshot = self.state.snapshot()
        self._busy = True
        self._phase(pb.PHASE_COMPUTING, step.number)

    def _end(self, step: Step) -> None:
        step._closed = True
        if step.committed:
            self._busy = False
            return
        if step.stop is not None:
            if self._voted is None or self._voted.step != step.number:
                self._rollback(step)
            self._busy = False
            raise step.stop
        if step.failure is None:
            self._busy = False
            raise UsageError(f"step {step.number} ended without a commit: call trainer.commit(step) "
                             "inside `with step:` (or let the block end normally)")
        self._recover(step)
        self._busy = False

    def _check_aborted(self, step: Step) -> None:
        if self._aborted():
            raise GenerationAborted(step.number, self._active[1], self._abort_reason)

    def _aborted(self) -> bool:
        return self._active != _NONE and self._abort_mark >= self._active

    def _reduce(self, step: Step) -> None:
        if step.reduced:
            return
        self._check_aborted(step)
        self._phase(pb.PHASE_REDUCING, step.number)
        grads = self.state.materialize_grads()
        if self._ddp is None:
            groups = self._groups
            size = groups.layout.dp if groups is not None else 1
            try:
                reduce_gradients(grads, groups.dp_group if groups is not None else None, size,
                                 self.config.global_batch_size,
                                 wait=groups.sockets.wait if groups is not None and groups.backend == "gloo"
                                 else None)
            except RuntimeError as e:
                raise self._collective_failed(step, e) from None
        step.reduced = True

    def _apply(self, step: Step) -> None:
        self._phase(pb.PHASE_APPLYING, step.number)
        opt, sched = self.state.optimizer, self.state.scheduler
        if opt is not None:
            opt.step()
        if sched is not None:
            sched.step()
        self.state.zero_grad()
        self.committed_step = step.number
        self._voted = None
        step.committed = True
        self._busy = False  # an abort from here on concerns the next step, not this one
        if self.on_commit is not None:
            self.on_commit(step)
        self._maybe_checkpoint(step)
        self._phase(pb.PHASE_COMPUTING, step.number + 1)

    def _rollback(self, step: Step) -> None:
        if step.snapshot is not None:
            self.state.restore(step.snapshot)
        self.state.zero_grad()

    def _collective_failed(self, step: Step, error: BaseException) -> StepFailed:
        """A collective raised: an abort (now or within the grace), else a fault to report."""
        if self._aborted():
            return GenerationAborted(step.number, self._active[1], self._abort_reason)
        if not self.managed:
            raise error
        deadline = time.monotonic() + self.config.timeouts.abort_grace
        while time.monotonic() < deadline and not self._aborted():
            time.sleep(0.005)
        if self._aborted():
            return GenerationAborted(step.number, self._active[1], self._abort_reason)
        detail = f"rank {step.generation.rank} at step {step.number}: {error}"
        log.warning("regroup: a collective failed without an abort; reporting it: %s", detail)
        try:
            assert self._link is not None
            self._link.fault(pb.FAULT_KIND_COLLECTIVE_ERROR, step.generation.number, step.number, detail)
        except AgentConnectionError:
            pass
        return CollectiveFailed(step.number, str(error))

    # -- failures and generations ---------------------------------------------------------------

    def _recover(self, step: Step) -> None:
        """After a failed step: restore its start, and leave the generation unless only the vote
        was rolled back (then the same generation continues, unless an abort follows)."""
        failure = step.failure
        voted = self._voted is not None and self._voted.step == step.number
        if not voted:
            self._rollback(step)
        if isinstance(failure, StepRolledBack) and not self._aborted():
            return
        # An abort, a fault, or a newer generation: this generation is over.
        self._leave_generation()
        self.generation = None

    def _leave_generation(self) -> None:
        with self._lock:
            groups, self._groups = self._groups, None
            self._sockets = None
        self._ddp = None
        if self.generation is not None:
            self.generation._groups = None
        since_abort = None
        if self._abort_at is not None:
            since_abort = time.monotonic() - self._abort_at
            self.metrics["abort_to_unblocked_s"].append(since_abort)
            self._abort_at = None
        if groups is not None:
            started = time.monotonic()
            groups.destroy()
            log.info("regroup: left generation %d%s; its groups destroyed in %.1f ms", self._active[1],
                     "" if since_abort is None else f" {since_abort * 1000:.1f} ms after the abort",
                     (time.monotonic() - started) * 1000)
        self._watchdog.disarm()

    def _on_urgent(self, item: Any) -> None:
        """On the link thread: an abort or a lost link. Free the training thread at once."""
        if isinstance(item, LinkLost):
            mark = (1 << 62, 1 << 62)
            reason = item.reason
        else:
            a = item.abort
            mark = (a.epoch, a.generation)
            reason = a.reason
        with self._lock:
            if mark < self._active and not isinstance(item, LinkLost):
                return  # an abort of an older generation
            if self._abort_mark < mark:
                self.metrics["aborts"] += 1
            self._abort_mark = max(self._abort_mark, mark)
            self._abort_reason = reason
            self._abort_at = time.monotonic()
            sockets = self._sockets
            if sockets is not None:
                sockets.shutdown(include_store=True)
            if self._groups is not None and self._groups.backend == "nccl":
                self._groups.abort_nccl()
        if self._busy:
            self._watchdog.arm(self.config.timeouts.abort_exit, EXIT_ABORT_STUCK, reason)

    def _next(self, deadline: Optional[float], waiting_for: str) -> Any:
        """The next item from the agent (None at the deadline). A lost link raises."""
        assert self._link is not None
        while True:
            timeout = None if deadline is None else deadline - time.monotonic()
            if self._pause_deadline is not None:
                left = self._pause_deadline - time.monotonic()
                if left <= 0:
                    raise AgentConnectionError(f"the manager was away longer than the agent's pause "
                                               f"timeout while waiting for {waiting_for}")
                timeout = left if timeout is None else min(timeout, left)
            if timeout is not None and timeout <= 0:
                return None
            item = self._link.get(timeout if timeout is None else max(0.0, timeout))
            if item is None:
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                continue
            if isinstance(item, LinkLost):
                raise AgentConnectionError(f"lost the agent while waiting for {waiting_for}: {item.reason}")
            return item

    def _dispatch(self, item: Any, step: Optional[Step]) -> None:
        """Handles an agent reply that is not the one being waited for."""
        kind = item.WhichOneof("body")
        if kind == "welcome":
            return
        if kind == "pause":
            p = item.pause
            self._pause_deadline = time.monotonic() + p.timeout_ms / 1000.0 if p.timeout_ms > 0 else None
            log.warning("regroup: paused by the agent: %s", p.reason)
            return
        if kind == "abort":
            a = item.abort
            if (a.epoch, a.generation) >= self._active and self._active != _NONE:
                with self._lock:
                    self._abort_mark = max(self._abort_mark, (a.epoch, a.generation))
                    self._abort_reason = a.reason
                if step is not None:
                    raise GenerationAborted(step.number, a.generation, a.reason)
                self._leave_generation()
                self.generation = None
            return
        if kind == "start":
            plan = item.start.plan
            if (plan.epoch, plan.generation) <= self._active:
                return  # the one we are in (replayed), or older
            self._pause_deadline = None
            if step is not None:
                self._link.unget(item)
                with self._lock:
                    self._abort_mark = max(self._abort_mark, self._active)
                raise GenerationAborted(step.number, self._active[1], "a newer generation started")
            raise _NewStart(item.start)
        if kind == "stop":
            mode = StopMode(item.stop.mode) if item.stop.mode in (1, 2, 3, 4) else StopMode.EXIT
            if mode != StopMode.STANDBY:
                raise _Stop(mode, item.stop.reason)
            # No rank in the next generation: keep the state, wait for a start.
            log.info("regroup: standing by: %s", item.stop.reason)
            with self._lock:
                self._abort_mark = max(self._abort_mark, self._active)
            if step is not None:
                raise GenerationAborted(step.number, self._active[1], f"standby: {item.stop.reason}")
            self._leave_generation()
            self.generation = None
            return
        if kind == "outcome":
            return  # late outcome of a step no longer in flight

    def _poll_boundary(self) -> None:
        """Between steps: handle what the agent sent (abort, stop, a newer generation)."""
        assert self.generation is not None
        if self._aborted():
            self._leave_generation()
            self.generation = None
        if not self.managed:
            return
        assert self._link is not None
        while True:
            item = self._link.get_nowait()
            if item is None:
                break
            if isinstance(item, LinkLost):
                raise AgentConnectionError(f"lost the agent: {item.reason}")
            try:
                self._dispatch(item, None)
            except _NewStart as new:
                self._leave_generation()
                self.generation = None
                self._enter(new.start)
                return
        if self._pause_deadline is not None and self.generation is not None:
            # The manager is away: no new step until it forms a generation (or the pause ends).
            self._phase(pb.PHASE_PAUSED)
            self._leave_generation()
            self.generation = None

    def _await_generation(self) -> None:
        """Waits for a StartGeneration (handling stops and pauses) and enters it."""
        if not self.managed:
            raise UsageError("no generation without an agent")  # never: standalone has one
        deadline = None if self.config.timeouts.start is None else time.monotonic() + self.config.timeouts.start
        while self.generation is None:
            self._phase(pb.PHASE_PAUSED)
            item = self._next(deadline, "the next generation")
            if item is None:
                raise AgentConnectionError(f"no generation started within {self.config.timeouts.start} s")
            try:
                self._dispatch(item, None)
            except _NewStart as new:
                self._enter(new.start)

    # -- entering a generation ------------------------------------------------------------------

    def _enter_standalone(self) -> None:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        start = pb.StartGeneration(directive_id=0)
        plan = start.plan
        plan.epoch, plan.generation, plan.world_size = 0, 1, world
        plan.tensor_parallel, plan.pipeline_parallel = self.config.tensor_parallel, 1
        plan.data_parallel = world // self.config.tensor_parallel if world % self.config.tensor_parallel == 0 else 0
        plan.store_host = os.environ.get("MASTER_ADDR", "127.0.0.1")
        plan.store_port = int(os.environ.get("MASTER_PORT", "29500"))
        plan.committed_step = self.committed_step
        plan.sync_source_rank = 0
        if self._resume_from is None:
            plan.needs_state.extend(range(1, world))
        start.assignment.rank = rank
        start.assignment.replica = rank // self.config.tensor_parallel
        self._enter(start)
        if self.generation is None:
            raise StateSyncError("the process group could not be formed (see the log)")

    def _plan_layout(self, start: Any) -> Tuple[Layout, int, int]:
        plan, a = start.plan, start.assignment
        replica_size = max(1, plan.tensor_parallel) * max(1, plan.pipeline_parallel)
        if replica_size != self.config.tensor_parallel:
            raise ConfigError(f"generation {plan.generation} has replicas of {replica_size} ranks "
                              f"(tensor {plan.tensor_parallel} x pipeline {plan.pipeline_parallel}) but "
                              f"the script has tensor_parallel={self.config.tensor_parallel}: give the job "
                              "and the script the same sizes")
        layout = Layout(plan.world_size, a.rank, replica_size)
        M = self.config.microbatches_per_step
        if plan.microbatches_per_step:
            if plan.microbatches_per_step != M:
                raise ConfigError(f"the job has {plan.microbatches_per_step} micro-batches per step "
                                  f"(regroup.io/global-batch-size / micro-batch-size) but the script has "
                                  f"{M}: make them equal")
            begin, count = a.microbatch_begin, a.microbatch_count
            if begin + count > M:
                raise ConfigError(f"generation {plan.generation} gives replica {a.replica} micro-batches "
                                  f"[{begin}, {begin + count}) of {M}")
        else:
            begin, count = contract.replica_range(M, layout.dp, layout.replica)
        if self.config.ddp and count == 0:
            raise ConfigError(f"replica {layout.replica} has no micro-batch in a step ({M} micro-batches "
                              f"over {layout.dp} replicas): the DDP wrapper needs at least one")
        return layout, begin, count

    def _enter(self, start: Any) -> None:
        """Forms a generation: groups, state sync, the DDP wrapper. On failure, stays out of it."""
        plan = start.plan
        mark = (plan.epoch, plan.generation)
        layout, begin, count = self._plan_layout(start)
        # A step this rank voted for may have been committed after the abort.
        if self._voted is not None:
            voted = self._voted
            self._voted = None
            if plan.committed_step == voted.step == self.committed_step + 1:
                self._phase(pb.PHASE_APPLYING, voted.step)
                opt, sched = self.state.optimizer, self.state.scheduler
                if opt is not None:
                    opt.step()
                if sched is not None:
                    sched.step()
                self.committed_step = voted.step
                self.heard_commit_step = max(self.heard_commit_step, voted.step)
                log.info("regroup: applied step %d, committed after the abort", voted.step)
                if self.on_commit is not None:
                    done = Step(self, voted.step, Generation(plan.epoch, plan.generation, layout.rank,
                                                             layout.world_size, layout.dp, layout.replica,
                                                             layout.replica_size, layout.position, begin,
                                                             count, plan.committed_step))
                    done.committed = True
                    self.on_commit(done)
            else:
                self.state.restore(voted.snapshot)
            self.state.zero_grad()
        if plan.committed_step < self.committed_step:
            detail = (f"generation {plan.generation} resumes after step {plan.committed_step}, but this "
                      f"rank holds step {self.committed_step}"
                      + (f" (checkpoint {self._resume_from.path})" if self._resume_from else "")
                      + ": it needs a generation formed with its state")
            log.error("regroup: %s", detail)
            if self.managed and self._link is not None:
                self._link.fault(pb.FAULT_KIND_COLLECTIVE_ERROR, plan.generation, plan.committed_step + 1, detail)
                return
            raise StateSyncError(detail)
        self._busy = True
        self._phase(pb.PHASE_SYNCING, plan.committed_step + 1)
        started = time.monotonic()
        sockets = GroupSockets(plan.store_port)
        with self._lock:
            self._active = mark
            self._sockets = sockets
            self._abort_reason = ""
        aborted_event = _AbortFlag(self)
        groups: Optional[ProcessGroups] = None
        try:
            if not self.managed and layout.world_size == 1:
                groups = _single_process_groups(layout, self.backend)
            else:
                groups = build_groups(store_host=plan.store_host, store_port=plan.store_port,
                                      layout=layout, backend=self.backend,
                                      rendezvous_s=self.config.timeouts.rendezvous,
                                      collective_s=self.config.timeouts.collective,
                                      aborted=aborted_event, sockets=sockets)
            with self._lock:
                self._groups = groups
            if self._aborted():
                raise RuntimeError("aborted while forming the groups")
            self._sync_state(plan, layout, groups)
            if self.config.ddp:
                self._ddp = _build_ddp(self.state.model, groups, self.config.global_batch_size)
        except (RuntimeError, StateSyncError, CheckpointError) as e:
            aborted = self._aborted()
            if isinstance(e, CheckpointError) or (not self.managed):
                self._busy = False
                self._leave_generation()
                raise
            if not aborted:
                time.sleep(0)  # an abort may be on its way; report if none within the grace
                deadline = time.monotonic() + self.config.timeouts.abort_grace
                while time.monotonic() < deadline and not self._aborted():
                    time.sleep(0.005)
            if not self._aborted():
                detail = f"rank {layout.rank} could not form generation {plan.generation}: {e}"
                log.warning("regroup: %s", detail)
                try:
                    assert self._link is not None
                    self._link.fault(pb.FAULT_KIND_COLLECTIVE_ERROR, plan.generation, plan.committed_step + 1, detail)
                except AgentConnectionError:
                    pass
            else:
                log.info("regroup: generation %d aborted while forming: %s", plan.generation, e)
            if groups is None:
                with self._lock:
                    self._sockets = None
                sockets.release()
            self._leave_generation()
            self._busy = False
            return
        self._busy = False
        self.committed_step = plan.committed_step
        self.heard_commit_step = max(self.heard_commit_step, plan.committed_step)
        self._resume_from = None
        self._position = layout.position
        self.generation = Generation(plan.epoch, plan.generation, layout.rank, layout.world_size,
                                     layout.dp, layout.replica, layout.replica_size, layout.position,
                                     begin, count, plan.committed_step, groups)
        self.metrics["generations"] += 1
        self.metrics["rebuild_s"].append(time.monotonic() - started)
        if self.managed and self._link is not None:
            try:
                self._link.ack(start.directive_id)
            except AgentConnectionError:
                pass
        log.info("regroup: generation %d (epoch %d): rank %d of %d, dp %d, micro-batches [%d, %d), "
                 "resuming at step %d; formed in %.1f ms", plan.generation, plan.epoch, layout.rank,
                 layout.world_size, layout.dp, begin, begin + count, plan.committed_step + 1,
                 (time.monotonic() - started) * 1000)

    def _sync_state(self, plan: Any, layout: Layout, groups: ProcessGroups) -> None:
        """Receivers get the state at plan.committed_step from a holder at their position."""
        # Load the checkpoint this rank announced, if it still holds nothing newer.
        if self._resume_from is not None and self.committed_step == self._resume_from.step == plan.committed_step:
            self.state.load_state_dict(self.checkpointer.load(self._resume_from, layout.position))
        holds = 1 if self.committed_step == plan.committed_step else 0
        needs = set(plan.needs_state)
        if plan.all_need_state:  # a first generation: everyone but the source receives
            needs = set(range(layout.world_size)) - {plan.sync_source_rank}
        if layout.world_size == 1:
            if not holds:
                raise StateSyncError(f"no rank holds the state at step {plan.committed_step}")
            return
        # Who holds the state at the committed step: every rank says, over the new group.
        mine = torch.tensor([holds, self.committed_step], dtype=torch.int64, device=self.device)
        everyone = [torch.zeros_like(mine) for _ in range(layout.world_size)]
        gloo = groups.backend == "gloo"
        if gloo:  # an abort frees this rank at once (see regroup.abort)
            groups.sockets.wait(dist.all_gather(everyone, mine, async_op=True), "the state-sync census")
        else:
            dist.all_gather(everyone, mine)
        holders = [bool(t[0].item()) for t in everyone]
        fresh = plan.committed_step < 0
        receivers = {r for r in range(layout.world_size) if r in needs or not holders[r]}
        sources = {}
        for position in range(layout.replica_size):
            ranks = layout.position_ranks(position)
            wanted = [r for r in ranks if r in receivers]
            if not wanted:
                continue
            source_replica = plan.sync_source_rank // layout.replica_size
            preferred = source_replica * layout.replica_size + position
            candidates = [r for r in ranks if holders[r] and r not in needs]
            if preferred in candidates or (fresh and holders[preferred]):
                src = preferred
            elif candidates:
                src = candidates[0]
            else:
                other = [r for r in ranks if holders[r]]
                if not other:
                    raise StateSyncError(f"no rank at position {position} holds the state at step "
                                         f"{plan.committed_step}: it cannot be recovered from a peer")
                src = other[0]
            sources[position] = (src, [r for r in wanted if r != src])
        for position, (src, to) in sorted(sources.items()):
            if not to:
                continue
            if layout.rank == src:
                sent = send_state(self.state, plan.committed_step, to, self.device,
                                  call=groups.sockets.call if gloo else None)
                self.metrics["state_bytes_sent"] += sent
            elif layout.rank in to:
                got = recv_state(self.state, src, self.device, call=groups.sockets.call if gloo else None)
                if got != plan.committed_step:
                    raise StateSyncError(f"rank {src} sent the state of step {got}, not "
                                         f"{plan.committed_step}")
                self.committed_step = got

    # -- checkpoints ----------------------------------------------------------------------------

    def _maybe_checkpoint(self, step: Step) -> None:
        interval = self.config.checkpoint_interval
        if self.checkpointer is None or not interval or (step.number + 1) % interval:
            return
        g = step.generation
        if g.replica != 0:
            return
        self._phase(pb.PHASE_CHECKPOINTING, step.number)
        try:
            self.checkpointer.wait(self.config.timeouts.checkpoint)
        except CheckpointError as e:
            log.warning("regroup: %s", e)
        state = cpu_clone(self.state.state_dict(step.number))
        self.checkpointer.write_async(state, step=step.number, epoch=g.epoch, generation=g.number,
                                      position=g.tp_rank, replica_size=g.tp, meta=self._meta())

    def _meta(self) -> dict:
        c = self.config
        return {"dataset_size": c.dataset_size, "micro_batch_size": c.micro_batch_size,
                "microbatches_per_step": c.microbatches_per_step, "seed": c.seed,
                "tensor_parallel": c.tensor_parallel}

    def checkpoint_now(self) -> Optional[str]:
        """Writes this rank's shard of the committed state now (blocking); returns the path.

        Raises:
            CheckpointError: no checkpoint directory, or the write failed.
        """
        if self.checkpointer is None:
            raise CheckpointError("no checkpoint_dir is configured: nothing can be dumped")
        g = self.generation
        epoch, number = (g.epoch, g.number) if g is not None else (self._active if self._active != _NONE else (0, 0))
        tp = g.tp if g is not None else self.config.tensor_parallel
        position = g.tp_rank if g is not None else self._position
        self.checkpointer.wait(self.config.timeouts.checkpoint)
        path = self.checkpointer.write(self.state.state_dict(self.committed_step), step=self.committed_step,
                                       epoch=epoch, generation=number, position=position,
                                       replica_size=tp, meta=self._meta())
        return str(path)

    # -- stops ----------------------------------------------------------------------------------

    def _on_stop(self, stop: _Stop) -> None:
        """StopTraining: EXIT raises; DUMP writes a checkpoint and exits 0; LEAVE exits 0;
        STANDBY is handled where it arrives."""
        log.warning("regroup: StopTraining %s: %s", stop.mode.name, stop.reason)
        if self._voted is not None:
            self.state.restore(self._voted.snapshot)
            self._voted = None
        self.state.zero_grad()
        if stop.mode == StopMode.DUMP and self.committed_step >= 0:
            try:
                path = self.checkpoint_now()
                log.warning("regroup: dumped the state of step %d to %s", self.committed_step, path)
            except CheckpointError as e:
                log.error("regroup: the dump failed: %s", e)
                self.close()
                raise TrainingStopped(StopMode.EXIT, f"dump failed: {e}") from e
        self.close()
        error = TrainingStopped(stop.mode, stop.reason)
        if error.exit_code == 0 and self.config.exit_on_stop:
            sys.stdout.flush()
            sys.stderr.flush()
            raise SystemExit(0)
        raise error


class _AbortFlag:
    """``is_set()`` for the rendezvous: whether the generation being formed was aborted."""

    def __init__(self, trainer: Trainer):
        self._trainer = trainer

    def is_set(self) -> bool:
        return self._trainer._aborted()


def _single_process_groups(layout: Layout, backend: str) -> ProcessGroups:
    """A world of one without an agent: a group over an in-memory store (no sockets)."""
    if dist.is_initialized():
        dist.destroy_process_group()
    store = dist.HashStore()
    dist.init_process_group(backend, store=store, rank=0, world_size=1)
    groups = ProcessGroups(layout, backend, store, GroupSockets(0))
    groups.dp_group = dist.group.WORLD
    return groups


def _build_ddp(model: torch.nn.Module, groups: ProcessGroups, global_batch: int) -> Any:
    """DistributedDataParallel over the data-parallel group: buffers not broadcast, gradients
    summed then divided by the global batch size (the step contract), never averaged."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    # Each replica keeps its own buffers (batch-norm statistics): not broadcast at construction
    # either, where DDP would otherwise copy replica 0's over the others at every rebuild.
    buffers = [name for name, _ in model.named_buffers()]
    if buffers and hasattr(DDP, "_set_params_and_buffers_to_ignore_for_model"):
        DDP._set_params_and_buffers_to_ignore_for_model(model, buffers)
    ddp = DDP(model, process_group=groups.dp_group, broadcast_buffers=False)
    gloo = groups.backend == "gloo"
    sockets = groups.sockets

    def sum_hook(state, bucket):  # no annotations: DDP checks them against dist.GradBucket
        tensor = bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()
        work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=state, async_op=True)
        if gloo:  # an abort fails the future at once, so backward() raises (see regroup.abort)
            return sockets.future(work, lambda t: t.div_(global_batch))

        def divide(f):
            return f.value()[0].div_(global_batch)

        return work.get_future().then(divide)

    ddp.register_comm_hook(groups.dp_group, sum_hook)
    return ddp
