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

This module is the loop and the state it keeps; the rest is beside it, one concern a module:

- regroup.step: what a script holds (Step, MicroBatch, Generation) and which exceptions fail a step;
- regroup.dispatch: the agent's messages (aborts on the link thread, the rest where the loop waits);
- regroup.forming: forming a generation (vote settled, groups built, state synced, DDP wrapper);
- regroup.sync: which rank sends the committed state to which when a generation forms;
- regroup.checkpointing: periodic checkpoints and the dump; regroup.stops: StopTraining.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
import time
from typing import Any, Callable, Iterator, Optional

import torch

from regroup import checkpointing, contract, forming
from regroup._proto import wire_pb2 as pb
from regroup.abort import GroupSockets, Watchdog
from regroup.agent import AgentLink, LinkLost
from regroup.api import (EXIT_ABORT_STUCK, AgentConnectionError, CheckpointError, CollectiveFailed,
                         ConfigError, GenerationAborted, StepFailed, StepRolledBack, TrainerConfig,
                         UsageError)
from regroup.checkpoint import CheckpointInfo, Checkpointer
from regroup.dispatch import NO_GENERATION, Mark, NewStart, dispatch, next_item, on_urgent
from regroup.group import ProcessGroups, default_backend
from regroup.guards import retire_groups, retire_model
from regroup.state import Snapshot, TrainingState, reduce_gradients
from regroup.step import Generation, MicroBatch, Step, is_communication_error
from regroup.stops import Stop, handle_stop

__all__ = ["Generation", "MicroBatch", "Step", "Trainer", "is_communication_error"]

log = logging.getLogger("regroup")


@dataclasses.dataclass
class _Voted:
    step: int
    mark: Mark
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
                 on_commit: Optional[Callable[[Step], None]] = None,
                 _state: Optional[TrainingState] = None):
        if not isinstance(config, TrainerConfig):
            raise ConfigError("config must be a regroup.TrainerConfig")
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            raise ConfigError("give the plain model: the trainer builds the DistributedDataParallel "
                              "wrapper itself, after each state sync (config.ddp=True)")
        self.config = config
        # The drop-in (regroup.dropin) brings its own state: the script steps its optimizer.
        self.state = _state if _state is not None else TrainingState(model, optimizer, scheduler, extra_state)
        if _state is None:
            self.state.scheduler_every = 1 if config.scheduler_interval == "step" else config.steps_per_epoch
            self.state.guard(
                "under regroup.Trainer the optimizer is stepped by trainer.commit(step) once every "
                "rank voted for the step: remove the script's opt.step() and opt.zero_grad()",
                f"the trainer steps the scheduler when a step is committed (scheduler_interval="
                f"{config.scheduler_interval!r}: every {'step' if config.scheduler_interval == 'step' else 'epoch'}): "
                "remove the script's sched.step(), or set TrainerConfig.scheduler_interval")
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
        self._synced = False              # through a generation's state sync: holds the job's state
        self._link: Optional[AgentLink] = None
        self._groups: Optional[ProcessGroups] = None
        self._ddp: Optional[torch.nn.parallel.DistributedDataParallel] = None
        self._lock = threading.Lock()
        self._active: Mark = NO_GENERATION      # the generation being built or run
        self._abort_mark: Mark = NO_GENERATION  # the highest generation aborted
        self._abort_reason = ""
        self._sockets: Optional[GroupSockets] = None
        self._busy = False                # the training thread is in a step or a rebuild
        self._watchdog = Watchdog()
        self._voted: Optional[_Voted] = None
        self._pause_deadline: Optional[float] = None
        self._opened = False
        self._closed = False
        self.metrics = {"aborts": 0, "generations": 0, "abort_to_unblocked_s": [], "rebuild_s": [],
                        "state_bytes_sent": 0,
                        # Seconds spent, summed over the steps committed here (bench/steady.py):
                        # the gradient reduce (without DDP), the checksums, and from the vote to
                        # its outcome (the agent and manager's round trip, and the slowest rank).
                        "committed_steps": 0, "reduce_s": 0.0, "checksum_s": 0.0, "vote_s": 0.0}
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

    def steps(self, total_steps: int, _finish: bool = True) -> Iterator[Step]:
        """Yields the steps from the one after the last committed up to ``total_steps - 1``.

        A step that failed is yielded again (a new Step object with the same number). Returns
        when step ``total_steps - 1`` is committed (and, unless the drop-in walks one epoch at a
        time, tells the agent the training is done).

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
            if _finish:
                self._finish()
        except Stop as stop:
            handle_stop(self, stop)
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
        timed = time.perf_counter()
        if not step.reduced:
            self._reduce(step)
        self._check_aborted(step)
        s = step.number
        interval = self.config.checksum_interval
        summed = time.perf_counter()
        checksum = self.state.checksum() if interval and s % interval == 0 else 0
        voted = time.perf_counter()
        self.metrics["reduce_s"] += summed - timed
        self.metrics["checksum_s"] += voted - summed
        if not self.managed:
            self._apply(step)
            self.metrics["committed_steps"] += 1
            return
        assert self._link is not None and step.snapshot is not None
        self._voted = _Voted(s, self._active, step.snapshot)
        self._phase(pb.PHASE_VOTED, s)
        self._link.vote(step.generation.number, s, True, checksum)
        deadline = None if self.config.timeouts.outcome is None else time.monotonic() + self.config.timeouts.outcome
        while True:
            item = next_item(self, deadline, f"the outcome of step {s}")
            if item is None:
                raise CollectiveFailed(s, f"no outcome for step {s} within {self.config.timeouts.outcome} s")
            kind = item.WhichOneof("body")
            if kind == "outcome":
                o = item.outcome
                if o.generation != step.generation.number or o.step != s:
                    continue  # an outcome of an earlier vote
                if o.commit:
                    self.metrics["vote_s"] += time.perf_counter() - voted
                    self.heard_commit_step = max(self.heard_commit_step, s)
                    self._apply(step)
                    self.metrics["committed_steps"] += 1
                    return
                self._voted = None
                self._rollback(step)
                raise StepRolledBack(s, o.checksum_mismatch)
            dispatch(self, item, step)

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

    def checkpoint_now(self) -> Optional[str]:
        """Writes this rank's shard of the committed state now (blocking); returns the path.

        Raises:
            CheckpointError: no checkpoint directory, or the write failed.
        """
        return checkpointing.checkpoint_now(self)

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
            forming.enter_standalone(self)
            return
        local_rank = int(os.environ.get("REGROUP_LOCAL_RANK", os.environ.get("LOCAL_RANK", "0")))
        self._link = AgentLink(self._socket_path or "", local_rank, self.config.timeouts,
                               functools.partial(on_urgent, self))
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
        if self._aborted():
            # The abort came between two steps (the link thread saw no step to free, so it armed
            # no watchdog): this step runs in an aborted generation. Its first collective fails
            # at once; a body that reaches none is held to the same bound as an interrupted one.
            since = 0.0 if self._abort_at is None else time.monotonic() - self._abort_at
            self._watchdog.arm(max(0.0, self.config.timeouts.abort_exit - since), EXIT_ABORT_STUCK,
                               self._abort_reason or "aborted before the step began")
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
        return self._active != NO_GENERATION and self._abort_mark >= self._active

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
        self.state.step_optimizer(step.number)
        self.state.zero_grad()
        self.committed_step = step.number
        self._voted = None
        step.committed = True
        self._busy = False  # an abort from here on concerns the next step, not this one
        if self.on_commit is not None:
            self.on_commit(step)
        checkpointing.maybe_checkpoint(self, step)
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
        if self._ddp is not None:
            retire_model(self._ddp, self._active[1])
        self._ddp = None
        if self.generation is not None:
            self.generation._groups = None
        since_abort = None
        if self._abort_at is not None:
            since_abort = time.monotonic() - self._abort_at
            self.metrics["abort_to_unblocked_s"].append(since_abort)
            self._abort_at = None
        if groups is not None:
            retire_groups(groups.tp_group, groups.dp_group)
            started = time.monotonic()
            groups.destroy()
            log.info("regroup: left generation %d%s; its groups destroyed in %.1f ms", self._active[1],
                     "" if since_abort is None else f" {since_abort * 1000:.1f} ms after the abort",
                     (time.monotonic() - started) * 1000)
        self._watchdog.disarm()

    # -- between steps --------------------------------------------------------------------------

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
                dispatch(self, item, None)
            except NewStart as new:
                self._leave_generation()
                self.generation = None
                forming.enter(self, new.start)
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
            item = next_item(self, deadline, "the next generation")
            if item is None:
                raise AgentConnectionError(f"no generation started within {self.config.timeouts.start} s")
            try:
                dispatch(self, item, None)
            except NewStart as new:
                forming.enter(self, new.start)
