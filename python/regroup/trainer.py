# SPDX-License-Identifier: Apache-2.0
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
            trainer.commit(step)                     # reduce, vote, apply (undone if not committed)
        print(step.number, step.generation.world_size)

Under ``regroup-agent`` ($REGROUP_AGENT_SOCKET set) every step is voted on through the agent
and is final only when the manager commits it. With the vote off the critical path
(``TrainerConfig.vote_overlap``: by default on an accelerator) a rank applies the step when it
votes, keeping what undoes it (regroup.undo), computes the next step while the vote travels,
and hears the outcome before its next vote; otherwise (by default on the CPU, where the undo's
copy costs more than the round trip) it waits for the outcome and applies the step only once
committed. An abort, a rolled-back
vote or a failed collective restores the step-start state (the voted step's, when that is the
vote rolled back), rebuilds the process group when the generation changed, and yields the step
again. Without an agent (a plain single process, or torchrun
style RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT) the same script trains without recovery: that is
the reference run of the exactness tests.

This module is the loop and the state it keeps; the rest is beside it, one concern a module:

- regroup.step: what a script holds (Step, MicroBatch, Generation) and which exceptions fail a step;
- regroup.dispatch: the agent's messages (aborts on the link thread, the rest where the loop waits);
- regroup.membership: the generation this rank forms or runs and the aborts it heard (one owner);
- regroup.forming: forming a generation (vote settled, groups built, state synced, DDP wrapper);
- regroup.sync: which rank sends the committed state to which when a generation forms;
- regroup.checkpointing: periodic checkpoints and the dump; regroup.stops: StopTraining.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import time
from typing import Any, Callable, Iterator, Optional, Tuple

import torch

from regroup import checkpointing, contract, forming
from regroup._proto import wire_pb2 as pb
from regroup.abort import Watchdog
from regroup.agent import AgentLink, LinkLost
from regroup.api import (EXIT_ABORT_STUCK, AgentConnectionError, CheckpointError, CollectiveFailed,
                         ConfigError, GenerationAborted, StepFailed, StepRolledBack, TrainerConfig,
                         UsageError)
from regroup.checkpoint import CheckpointInfo, Checkpointer
from regroup.dispatch import NewStart, dispatch, next_item, on_urgent
from regroup.membership import Mark, Membership
from regroup.group import backend_device, resolve_backend
from regroup.sharded import make_state
from regroup.state import Snapshot, TrainingState, reduce_gradients
from regroup.step import Generation, MicroBatch, Step, failed_peer, is_communication_error
from regroup.stops import Stop, handle_stop
from regroup.undo import Undo

__all__ = ["Generation", "MicroBatch", "Step", "Trainer", "is_communication_error"]

log = logging.getLogger("regroup")


def vote_overlap(choice: Optional[bool], device: torch.device) -> bool:
    """TrainerConfig.vote_overlap resolved: the choice, else ``$REGROUP_VOTE_OVERLAP``, else
    overlap on an accelerator and wait on the CPU.

    Raises:
        ConfigError: ``$REGROUP_VOTE_OVERLAP`` is neither 1 nor 0.
    """
    if choice is not None:
        return choice
    value = os.environ.get("REGROUP_VOTE_OVERLAP", "").strip()
    if value:
        if value not in ("0", "1"):
            raise ConfigError(f"REGROUP_VOTE_OVERLAP={value!r} must be 1 (overlap the vote) or 0 (wait for it)")
        return value == "1"
    return device.type != "cpu"


@dataclasses.dataclass
class _Voted:
    """A step this rank voted for and applied (or, ``applied`` False, waits to apply), whose
    outcome it has not heard: ``snapshot`` and ``undo`` together are the state at the step's
    start (buffers and RNG; what the apply changed)."""

    step: int
    mark: Mark
    snapshot: Snapshot
    undo: Optional[Undo] = None
    done: Optional[Step] = None      # the script's Step object (for on_commit and checkpoints)
    applied: bool = True             # False: waited for before the apply (vote_overlap off)


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
        self.state = _state if _state is not None else make_state(config, model, optimizer, scheduler, extra_state)
        if _state is None:
            self.state.scheduler_every = 1 if config.scheduler_interval == "step" else config.steps_per_epoch
            self.state.guard(
                "under regroup.Trainer the optimizer is stepped by trainer.commit(step) once every "
                "rank voted for the step: remove the script's opt.step() and opt.zero_grad()",
                f"the trainer steps the scheduler after every committed {config.scheduler_interval} "
                "(TrainerConfig.scheduler_interval): remove the script's sched.step()")
        self.sampler = contract.Sampler(config.dataset_size, config.micro_batch_size,
                                        config.microbatches_per_step, config.seed, config.shuffle)
        self.on_commit = on_commit
        socket_path = agent_socket if agent_socket is not None else os.environ.get("REGROUP_AGENT_SOCKET")
        self.managed = bool(socket_path)
        self._socket_path = socket_path
        self.backend = resolve_backend(config.backend)
        self.device = backend_device(self.backend)
        self.vote_overlap = vote_overlap(config.vote_overlap, self.device)
        self.committed_step = -1
        self.heard_commit_step = -1
        self.checkpointer = Checkpointer(config.checkpoint_dir, config.keep_checkpoints) \
            if config.checkpoint_dir else None
        self.resume_from: Optional[CheckpointInfo] = None
        self.synced = False              # through a generation's state sync: holds the job's state
        self.link: Optional[AgentLink] = None
        self.membership = Membership()   # the generation being formed or run, and its aborts
        self.busy = False                # the training thread is in a step or a rebuild
        self.watchdog = Watchdog()
        self.voted: Optional[_Voted] = None  # the applied step whose vote is in flight
        self._undo = Undo()
        self._voted_at = 0.0
        self._commit_arrived = -1        # the last step whose commit the link thread saw arrive
        # A committed step heard during the next one, whose checkpoint waits for that step's
        # commit (_poll_outcome), with the snapshot that holds its buffers and RNG.
        self._checkpoint_due: Optional[Tuple[Step, Snapshot]] = None
        self.pause_deadline: Optional[float] = None
        self._opened = False
        self.closed = False
        self.metrics = {"aborts": 0, "generations": 0, "abort_to_unblocked_s": [], "rebuild_s": [],
                        "state_bytes_sent": 0,
                        # Seconds spent, summed over the steps committed here (bench/steady.py):
                        # the gradient reduce (without DDP), the checksums, and the vote's:
                        # vote_s: blocked waiting for an outcome (the vote is off the critical
                        # path: only what the next step's compute did not hide);
                        # vote_round_trip_s: from each vote to its outcome taken; undo_s:
                        # copying what the apply changes (regroup.undo); apply_s: the
                        # optimizer's (and scheduler's) step.
                        "committed_steps": 0, "reduce_s": 0.0, "checksum_s": 0.0, "vote_s": 0.0,
                        "vote_round_trip_s": 0.0, "undo_s": 0.0, "apply_s": 0.0}

    # -- public properties ----------------------------------------------------------------------

    @property
    def generation(self) -> Optional[Generation]:
        """The generation this rank runs its steps in (None between generations)."""
        return self.membership.generation

    @property
    def model(self) -> torch.nn.Module:
        """The model to run this generation (the DDP wrapper with ``config.ddp``)."""
        return self.membership.ddp if self.membership.ddp is not None else self.state.model

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
        self.open()
        try:
            while True:
                if self.generation is None:
                    self.await_generation()
                    continue
                self._poll_boundary()
                if self.generation is None:
                    continue
                number = self.applied_step + 1
                if number >= total_steps:
                    if self.voted is None:
                        break
                    self.hear_outcome()  # the last step's vote: committed, or that step again
                    continue
                step = Step(self, number, self.generation)
                self._begin(step)
                yield step
                self._end(step)
            if _finish:
                self.finish()
        except Stop as stop:
            handle_stop(self, stop)
        finally:
            self.busy = False
            self.watchdog.disarm()

    def commit(self, step: Step) -> None:
        """Reduces the gradients (unless done), votes for the step and applies it.

        With ``vote_overlap`` (by default on an accelerator) the vote is off the critical path:
        the step is applied as soon as this rank voted, and the script goes on with the next
        step while the vote travels. Without it (by default on the CPU) this waits for the
        outcome and applies the step once committed; a rollback raises StepRolledBack. Its outcome is heard
        before the next step's vote (or at the loop's end): a commit makes the step final
        (``committed_step``, ``on_commit``, checkpoints); an abort puts back the state of the
        step's start (kept until then, regroup.undo) and that step is yielded again.

        Raises:
            StepFailed: the step was not applied (absorbed by the step's ``with`` block): an
                abort, a failed collective, or the previous step's vote rolled back (then the
                loop yields that previous step again).
            UsageError: the step is not the one in flight, or was already committed.
        """
        if step._trainer is not self or step._closed or step.committed:
            raise UsageError(f"step {step.number} cannot be committed: it is not the step in flight")
        if step.failure is not None:
            raise step.failure
        timed = time.perf_counter()
        if not step.reduced:
            self.reduce(step)
        self.check_aborted(step)
        self.metrics["reduce_s"] += time.perf_counter() - timed
        if self.voted is not None:
            self._await_outcome(step)  # the previous step's: at most one vote in flight
            self.check_aborted(step)
        if self._checkpoint_due is not None:
            done, snapshot = self._checkpoint_due
            self._checkpoint_due = None
            checkpointing.maybe_checkpoint(self, done, snapshot)
        s = step.number
        interval = self.config.checksum_interval
        summed = time.perf_counter()
        # Of the committed state: every earlier step's outcome is heard by now.
        checksum = self.state.checksum() if interval and s % interval == 0 else 0
        voted = time.perf_counter()
        self.metrics["checksum_s"] += voted - summed
        if not self.managed:
            self.apply(step)
            self.finalize_vote(_Voted(s, self.membership.active, step.snapshot, None, step), None)
            return
        assert self.link is not None and step.snapshot is not None
        self.link.vote(step.generation.number, s, True, checksum)
        if not self.vote_overlap:
            self._await_own_outcome(step)
            return
        self._undo.take(self.state)
        self.voted = _Voted(s, self.membership.active, step.snapshot, self._undo, step)
        self._voted_at = time.perf_counter()
        self.metrics["undo_s"] += self._voted_at - voted
        self.apply(step)

    def _await_own_outcome(self, step: Step) -> None:
        """The vote on the critical path (``vote_overlap`` off): waits for the outcome of the step
        just voted for, and applies it only once committed. A rollback raises StepRolledBack (the
        step is done again). After an abort the step stays voted, not applied, with its reduced
        gradients: the next generation's plan applies it if it was committed after all, else
        puts back its start (regroup.forming.settle_vote)."""
        self.voted = _Voted(step.number, self.membership.active, step.snapshot, None, step, applied=False)
        self._voted_at = time.perf_counter()
        self.report_phase(pb.PHASE_VOTED, step.number)
        self._await_outcome(step)

    @property
    def applied_step(self) -> int:
        """The last step applied here: ``committed_step``, or the applied step whose vote is in
        flight."""
        return self.voted.step if self.voted is not None and self.voted.applied else self.committed_step

    def hear_outcome(self) -> None:
        """Between steps: waits for the outcome of the vote in flight, if any. A commit makes
        the step final; a rollback puts back its start (the loop yields it again); an abort or a
        newer generation leaves it to the next generation's plan (regroup.forming.settle_vote).

        Raises:
            TrainingStopped, AgentConnectionError: as ``steps()``.
        """
        if self.voted is None or not self.managed:
            return
        try:
            self._await_outcome(None)
        except NewStart as new:
            self.leave()
            forming.enter(self, new.start)

    def _await_outcome(self, step: Optional[Step]) -> None:
        """Waits for the outcome of ``self.voted``. With a step in flight (``step``) an abort
        of the generation raises GenerationAborted and a rollback StepRolledBack; between steps
        a rollback restores the voted step's start, and an abort returns (the plan settles it)."""
        voted = self.voted
        assert voted is not None and self.link is not None
        waited, applying = time.perf_counter(), self.metrics["apply_s"]
        limit = self.config.timeouts.outcome
        deadline = None if limit is None else time.monotonic() + limit
        try:
            while self.voted is voted:
                if step is None and (self.generation is None or self.membership.aborted()):
                    return  # its generation ended: the next one's plan says
                item = next_item(self, deadline, f"the outcome of step {voted.step}")
                if item is None:
                    if step is not None:
                        raise CollectiveFailed(step.number, f"no outcome for step {voted.step} within {limit} s")
                    log.warning("regroup: no outcome for step %d within %s s; leaving the generation",
                                voted.step, limit)
                    self.leave()
                    return
                if not self._take_outcome(item, step):
                    dispatch(self, item, step)
        finally:  # waiting, not a waited step's apply on its commit
            self.metrics["vote_s"] += time.perf_counter() - waited - (self.metrics["apply_s"] - applying)

    def _rollback_pending(self, item: Any) -> bool:
        """Whether ``item`` rolls back the vote in flight. Only taken where every rank of the
        generation takes it at the same point of its collectives: in the next step's commit,
        after its reduce (or between steps at the loop's or an epoch's end). Taken earlier, one
        rank would redo the step's reduce while its peers reduce the next step's."""
        if isinstance(item, LinkLost) or item.WhichOneof("body") != "outcome":
            return False
        o, voted = item.outcome, self.voted
        return voted is not None and not o.commit and o.generation == voted.mark[1] and o.step == voted.step

    def _take_outcome(self, item: Any, step: Optional[Step], defer_checkpoint: bool = False) -> bool:
        """Handles ``item`` if it is an outcome (returns whether it was one). ``defer_checkpoint``:
        a commit's checkpoint waits for the commit of ``step`` (_poll_outcome)."""
        if isinstance(item, LinkLost) or item.WhichOneof("body") != "outcome":
            return False
        o, voted = item.outcome, self.voted
        if voted is None or o.generation != voted.mark[1] or o.step != voted.step:
            return True  # an outcome of an earlier vote
        self.metrics["vote_round_trip_s"] += time.perf_counter() - self._voted_at
        if o.commit:
            self.heard_commit_step = max(self.heard_commit_step, voted.step)
            if not voted.applied:   # waited for (vote_overlap off): applied now that it committed
                assert voted.done is not None
                self.apply(voted.done)
                self.finalize_vote(voted, None)
                return True
            self.finalize_vote(voted, step, checkpoint=not defer_checkpoint)
            if defer_checkpoint and voted.done is not None and step is not None:
                assert step.snapshot is not None
                self._checkpoint_due = (voted.done, step.snapshot)
            return True
        self.voted = None
        if step is not None:
            # The step in flight was computed on a step that did not commit: both are undone
            # when the step's block is left (the voted step's start is put back), and the loop
            # yields the voted step again.
            step.rewind = voted
            raise StepRolledBack(voted.step, o.checksum_mismatch)
        self.restore_voted(voted)
        self.state.zero_grad()
        return True

    def outcome_arrived(self, o: Any) -> None:
        """On the link thread, as an outcome arrives (the training thread takes it later): a
        commit of the vote in flight is told in the heartbeats at once. The rank holds that step
        committed, and reports the step it computes, not the vote (a fault in it is that step's,
        for the poison-step guard)."""
        voted = self.voted
        if voted is None or not o.commit or o.step != voted.step or o.generation != voted.mark[1]:
            return
        self._commit_arrived = o.step
        link = self.link
        if link is not None and link.phase == pb.PHASE_VOTED and link.step == o.step:
            link.set_status(o.step + 1, pb.PHASE_COMPUTING, beat_now=True)

    def _poll_outcome(self, step: Step) -> None:
        """During the next step: takes the outcome if it already came (never waits).

        A checkpoint the commit makes is written at this step's commit, after its reduce, where
        every rank of the generation is at the same point: written here, in the middle of the
        step, FSDP's ``state_dict`` would reshard parameters that the step had gathered, so that
        rank alone would gather them again and its peers' collectives would no longer match (a
        hang). The parameters are still the committed step's there (this one is not applied)."""
        assert self.link is not None
        while self.voted is not None:
            item = self.link.get_nowait()
            if item is None:
                return
            if self._rollback_pending(item) or not self._take_outcome(item, step, defer_checkpoint=True):
                self.link.unget(item)  # a rollback is taken at the commit (see _rollback_pending)
                return
            if self.voted is None:
                self.report_phase(pb.PHASE_COMPUTING, step.number)

    def finalize_vote(self, voted: _Voted, in_flight: Optional[Step], checkpoint: bool = True) -> None:
        """Step ``voted.step`` was committed: it is final (its undo dropped)."""
        self.voted = None
        if voted.undo is not None:
            voted.undo.drop()
        self.committed_step = voted.step
        self.metrics["committed_steps"] += 1
        done = voted.done
        if done is not None and self.on_commit is not None:
            self.on_commit(done)
        if done is not None and checkpoint:
            # With a step in flight, the model's buffers and the RNG are that step's; its
            # snapshot holds them as they were at this commit.
            checkpointing.maybe_checkpoint(self, done, in_flight.snapshot if in_flight is not None else None)

    def restore_voted(self, voted: _Voted) -> None:
        """Puts back the state of the voted step's start (its apply undone)."""
        if voted.undo is not None and voted.undo.held:
            voted.undo.restore(self.state)
        self.state.restore(voted.snapshot)

    def drop_vote(self) -> None:
        """The vote in flight will not be heard (a stop): its step is undone."""
        if self.voted is not None:
            voted, self.voted = self.voted, None
            self.restore_voted(voted)

    def close(self) -> None:
        """Ends the link to the agent and destroys the process groups (idempotent)."""
        if self.closed:
            return
        self.closed = True
        self.watchdog.disarm()
        if self.voted is not None:
            # Left with a vote in flight (a script that broke out of its loop): the state it
            # keeps is the committed one.
            self.drop_vote()
        self.leave(forget=False)
        if self.link is not None:
            self.link.close()
            self.link = None

    def checkpoint_now(self) -> Optional[str]:
        """Writes this rank's shard of the committed state now (blocking); returns the path.

        Raises:
            CheckpointError: no checkpoint directory, or the write failed.
        """
        self.hear_outcome()
        if self.voted is not None:  # its generation ended first: write the committed state
            self.drop_vote()
        return checkpointing.checkpoint_now(self)

    # -- opening and finishing ------------------------------------------------------------------

    def open(self) -> None:
        if self._opened:
            return
        self._opened = True
        if self.checkpointer is not None:
            info = self.checkpointer.newest()
            if info is not None:
                self.resume_from = info
                self.committed_step = self.heard_commit_step = info.step
                log.info("regroup: resuming from checkpoint %s (step %d)", info.path, info.step)
        if not self.managed:
            forming.enter_standalone(self)
            return
        local_rank = int(os.environ.get("REGROUP_LOCAL_RANK", os.environ.get("LOCAL_RANK", "0")))
        self.link = AgentLink(self._socket_path or "", local_rank, self.config.timeouts,
                               functools.partial(on_urgent, self))
        hello = pb.TrainerHello(local_rank=local_rank, pid=os.getpid(), epoch=0, generation=0,
                                committed_step=self.committed_step,
                                heard_commit_step=self.heard_commit_step)
        self.link.connect(hello)

    def finish(self) -> None:
        """Training is done: the last checkpoint written, the agent told, the link closed."""
        if self.checkpointer is not None:
            try:
                self.checkpointer.wait(self.config.timeouts.checkpoint)
            except CheckpointError as e:
                log.warning("regroup: %s", e)
        if self.link is not None:
            try:
                self.link.set_status(self.committed_step, pb.PHASE_DONE, beat_now=True)
            except AgentConnectionError:
                pass
        self.close()

    # -- steps ----------------------------------------------------------------------------------

    def report_phase(self, phase: int, step: Optional[int] = None) -> None:
        """Tells the agent where this rank is (``step``: the step it works on, default the next)."""
        voted = self.voted
        if voted is not None and voted.step != self._commit_arrived and \
                phase in (pb.PHASE_COMPUTING, pb.PHASE_REDUCING, pb.PHASE_APPLYING):
            # A vote in flight: this rank holds the step before it committed, whatever it
            # computes (its agent takes a rank computing step s for one that holds step s - 1).
            phase, step = pb.PHASE_VOTED, voted.step
        if self.link is not None:
            # Leaving a step is told at once (the manager waits for it), and so is the first
            # moment of a new step: a rank that fails early in a step is then blamed on that step,
            # which the poison-step guard needs (one frame a step). The rest rides the beat.
            now = (phase == pb.PHASE_PAUSED and self.link.phase != pb.PHASE_PAUSED) or \
                (phase == pb.PHASE_COMPUTING and step is not None and step != self.link.step)
            if phase in (pb.PHASE_PAUSED, pb.PHASE_SYNCING):
                # Outside a step: no step (-1). A rank that dies while waiting for or forming a
                # generation did not fail the step the job resumes at; reporting that step would
                # make a second fault during a recovery look like "the same step failing twice"
                # (the engine's poison-step guard), and the job would be dumped, not recovered.
                step = -1
            try:
                self.link.set_status(self.committed_step + 1 if step is None else step, phase, beat_now=now)
            except AgentConnectionError:
                pass  # the link thread reports the loss

    def _begin(self, step: Step) -> None:
        step.snapshot = self.state.snapshot()
        self.busy = True
        if self.membership.aborted():
            # The abort came between two steps (the link thread saw no step to free, so it armed
            # no watchdog): this step runs in an aborted generation. Its first collective fails
            # at once; a body that reaches none is held to the same bound as an interrupted one.
            since = 0.0 if self.membership.abort_at is None else time.monotonic() - self.membership.abort_at
            self.watchdog.arm(max(0.0, self.config.timeouts.abort_exit - since), EXIT_ABORT_STUCK,
                               self.membership.abort_reason or "aborted before the step began")
        self.report_phase(pb.PHASE_COMPUTING, step.number)

    def _end(self, step: Step) -> None:
        step._closed = True
        if step.committed:
            self.busy = False
            return
        if step.stop is not None:
            self._rollback(step)  # and the vote in flight, if any, when the stop is handled
            self.busy = False
            raise step.stop
        if step.failure is None:
            self.busy = False
            raise UsageError(f"step {step.number} ended without a commit: call trainer.commit(step) "
                             "inside `with step:` (or let the block end normally)")
        self._recover(step)
        self.busy = False

    def check_aborted(self, step: Step) -> None:
        """Raises GenerationAborted when the step's generation was aborted (and takes the
        previous step's outcome if it came: a rollback raises StepRolledBack)."""
        self.membership.check(step.number)
        if self.voted is not None and self.link is not None:
            self._poll_outcome(step)

    def reduce(self, step: Step) -> None:
        """The step's gradient reduce (without DDP: summed over the replicas, divided by G)."""
        if step.reduced:
            return
        self.check_aborted(step)
        self.report_phase(pb.PHASE_REDUCING, step.number)
        grads = self.state.materialize_grads()
        groups = self.membership.groups
        try:
            if self.membership.ddp is None or self.config.sharding:  # sharded: across replicas here
                size = groups.layout.dp if groups is not None else 1
                reduce_gradients(grads, groups.dp_group if groups is not None else None, size,
                                 self.config.global_batch_size,
                                 wait=groups.sockets.wait if groups is not None and groups.backend == "gloo"
                                 else None)
            # A distributed optimizer (regroup.zero) steps its slices and all-gathers the new
            # parameters here, before the vote: the apply then runs no collective.
            self.state.prepare(groups)
        except RuntimeError as e:
            raise self.collective_failed(step, e) from None
        step.reduced = True

    def apply(self, step: Step) -> None:
        """Steps the optimizer (and scheduler) with the step's reduced gradients."""
        began = time.perf_counter()
        self.report_phase(pb.PHASE_APPLYING, step.number)
        self.state.step_optimizer(step.number)
        self.state.zero_grad()
        self.metrics["apply_s"] += time.perf_counter() - began
        step.committed = True
        self.busy = False  # an abort from here on concerns the next step, not this one
        self.report_phase(pb.PHASE_COMPUTING, step.number + 1)

    def _rollback(self, step: Step) -> None:
        if step.rewind is not None:
            self.restore_voted(step.rewind)  # the step before, which did not commit
        elif step.snapshot is not None:
            self.state.restore(step.snapshot)
        self.state.zero_grad()

    def collective_failed(self, step: Step, error: BaseException) -> StepFailed:
        """A collective raised: an abort (now or within the grace), else a fault to report."""
        if self.membership.aborted():
            return GenerationAborted(step.number, self.membership.active[1], self.membership.abort_reason)
        if not self.managed:
            raise error
        # At once, a sign for the manager of which peer is gone (its pod may be lost: its peers'
        # reports settle that sooner than its broken stream's grace); the fault itself follows.
        with contextlib.suppress(AgentConnectionError):
            assert self.link is not None
            self.link.fault(pb.FAULT_KIND_COLLECTIVE_ERROR, step.generation.number, step.number,
                            f"rank {step.generation.rank} at step {step.number}: {error}", early=True,
                            peer=failed_peer(error))
        deadline = time.monotonic() + self.config.timeouts.abort_grace
        while time.monotonic() < deadline and not self.membership.aborted():
            time.sleep(0.005)
        if self.membership.aborted():
            return GenerationAborted(step.number, self.membership.active[1], self.membership.abort_reason)
        detail = f"rank {step.generation.rank} at step {step.number}: {error}"
        log.warning("regroup: a collective failed without an abort; reporting it: %s", detail)
        try:
            assert self.link is not None
            self.link.fault(pb.FAULT_KIND_COLLECTIVE_ERROR, step.generation.number, step.number, detail)
        except AgentConnectionError:
            pass
        return CollectiveFailed(step.number, str(error))

    # -- failures and generations ---------------------------------------------------------------

    def _recover(self, step: Step) -> None:
        """After a failed step: restore its start, and leave the generation unless only the vote
        was rolled back (then the same generation continues, unless an abort follows)."""
        failure = step.failure
        # A step applied while its vote travels stays applied (held with its undo) until the
        # outcome, or the next generation's plan, settles it (regroup.forming.settle_vote); so
        # does a step whose outcome this rank waited for, with its gradients, not applied.
        voted = self.voted
        if voted is None or voted.applied or voted.done is not step:
            self._rollback(step)
        if isinstance(failure, StepRolledBack) and not self.membership.aborted():
            return
        # An abort, a fault, or a newer generation: this generation is over.
        self.leave()

    def leave(self, forget: bool = True) -> None:
        """Leaves the active generation (regroup.membership); none is active until the next
        one is entered (``forget=False``: closing, ``generation`` stays readable)."""
        # A checkpoint that waited for a step of this generation to commit is not written: the
        # next periodic one is (the committed state is the same; a dump writes it on demand).
        self._checkpoint_due = None
        since_abort = self.membership.leave(forget)
        if since_abort is not None:
            self.metrics["abort_to_unblocked_s"].append(since_abort)
        self.watchdog.disarm()

    # -- between steps --------------------------------------------------------------------------

    def _poll_boundary(self) -> None:
        """Between steps: handle what the agent sent (abort, stop, a newer generation)."""
        assert self.generation is not None
        if self.membership.aborted():
            self.leave()
        if not self.managed:
            return
        assert self.link is not None
        while True:
            item = self.link.get_nowait()
            if item is None:
                break
            if isinstance(item, LinkLost):
                raise AgentConnectionError(f"lost the agent: {item.reason}")
            if self._rollback_pending(item):
                self.link.unget(item)  # taken at the next step's commit (see _rollback_pending)
                break
            if self._take_outcome(item, None):
                continue
            try:
                dispatch(self, item, None)
            except NewStart as new:
                self.leave()
                forming.enter(self, new.start)
                return
        if self.pause_deadline is not None and self.generation is not None:
            # The manager is away: no new step until it forms a generation (or the pause ends).
            self.report_phase(pb.PHASE_PAUSED)
            self.leave()

    def await_generation(self) -> None:
        """Waits for a StartGeneration (handling stops and pauses) and enters it."""
        if not self.managed:
            raise UsageError("no generation without an agent")  # never: standalone has one
        deadline = None if self.config.timeouts.start is None else time.monotonic() + self.config.timeouts.start
        while self.generation is None:
            self.report_phase(pb.PHASE_PAUSED)
            item = next_item(self, deadline, "the next generation")
            if item is None:
                raise AgentConnectionError(f"no generation started within {self.config.timeouts.start} s")
            try:
                dispatch(self, item, None)
            except NewStart as new:
                forming.enter(self, new.start)
