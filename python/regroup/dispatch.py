# SPDX-License-Identifier: Apache-2.0
"""Message dispatch: what the agent sends a trainer, and where each message is handled.

Two paths. Urgent items (an abort, a newer generation's start, a lost link) are handled on the
link's own thread by :func:`on_urgent`, which frees the training thread at once (it shuts the generation's
sockets down). Everything else is read by the training thread with :func:`next_item` where it waits
(for a step's outcome, or for the next generation) and handed to :func:`dispatch`, which either
handles it (a pause, an abort, a standby) or raises to where it is handled: a newer generation
(:class:`NewStart`) or a stop (:class:`regroup.stops.Stop`).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Optional

from regroup.agent import LinkLost
from regroup.api import EXIT_ABORT_STUCK, AgentConnectionError, GenerationAborted, StopMode
from regroup.membership import LINK_LOST
from regroup.stops import Stop

if TYPE_CHECKING:
    from regroup.step import Step
    from regroup.trainer import Trainer

log = logging.getLogger("regroup")

FORMING_GRACE_S = 2.0
"""After the rendezvous bound, how long a rank aborted while building its groups has to leave."""


class NewStart(Exception):
    """Internal: a StartGeneration arrived while a generation was running."""

    def __init__(self, start: Any):
        super().__init__("a new generation started")
        self.start = start


def on_urgent(t: Trainer, item: Any) -> None:
    """On the link thread: an abort, a newer generation's start or a lost link. Free the
    training thread at once. (An outcome is only noted: see Trainer.outcome_arrived.)

    A start ends the generation this rank is in as an abort does (the manager has moved on:
    that generation can commit nothing more), even when no abort came before it: a rank stuck
    in that generation's rendezvous would otherwise wait there until the collective timeout.
    The start itself is queued and handled by the training thread.
    """
    m = t.membership
    if not isinstance(item, LinkLost) and item.WhichOneof("body") == "outcome":
        t.outcome_arrived(item.outcome)  # noted for the heartbeats; taken by the training thread
        return
    if isinstance(item, LinkLost):
        mark, reason = LINK_LOST, item.reason
    elif item.WhichOneof("body") == "start":
        plan = item.start.plan
        if not m.ended_by((plan.epoch, plan.generation)):
            return  # nothing to end: between generations, this one's start, or aborted
        mark, reason = m.active, f"generation {plan.generation} started"
    else:
        mark, reason = (item.abort.epoch, item.abort.generation), item.abort.reason
    new = m.abort(mark, reason)
    if new is None:
        return  # an abort of an older generation
    if new:
        t.metrics["aborts"] += 1
    if t.busy:
        seconds = t.config.timeouts.abort_exit
        sockets = m.sockets
        until = sockets.building_until if sockets is not None else None
        if until is not None:
            # Building its groups, a rank may wait in torch for a peer that died (regroup.group.
            # formation_is_bounded), where no abort reaches it; it comes out by itself at the
            # rendezvous bound, holding its state, which an exit now would lose.
            seconds = max(seconds, until - time.monotonic() + FORMING_GRACE_S)
        t.watchdog.arm(seconds, EXIT_ABORT_STUCK, reason)


def next_item(t: Trainer, deadline: Optional[float], waiting_for: str) -> Any:
    """The next item from the agent (None at the deadline). A lost link raises."""
    assert t.link is not None
    while True:
        timeout = None if deadline is None else deadline - time.monotonic()
        if t.pause_deadline is not None:
            left = t.pause_deadline - time.monotonic()
            if left <= 0:
                raise AgentConnectionError(f"the manager was away longer than the agent's pause "
                                           f"timeout while waiting for {waiting_for}")
            timeout = left if timeout is None else min(timeout, left)
        if timeout is not None and timeout <= 0:
            return None
        item = t.link.get(timeout if timeout is None else max(0.0, timeout))
        if item is None:
            if deadline is not None and time.monotonic() >= deadline:
                return None
            continue
        if isinstance(item, LinkLost):
            raise AgentConnectionError(f"lost the agent while waiting for {waiting_for}: {item.reason}")
        return item


def dispatch(t: Trainer, item: Any, step: Optional[Step]) -> None:
    """Handles an agent reply that is not the one being waited for."""
    kind = item.WhichOneof("body")
    if kind == "welcome":
        return
    if kind == "pause":
        p = item.pause
        t.pause_deadline = time.monotonic() + p.timeout_ms / 1000.0 if p.timeout_ms > 0 else None
        log.warning("regroup: paused by the agent: %s", p.reason)
        return
    if kind == "abort":
        a = item.abort
        if t.membership.note_abort((a.epoch, a.generation), a.reason):
            if step is not None:
                raise GenerationAborted(step.number, a.generation, a.reason)
            t.leave()
        return
    if kind == "start":
        plan = item.start.plan
        if (plan.epoch, plan.generation) <= t.membership.active:
            return  # the one we are in (replayed), or older
        t.pause_deadline = None
        if step is not None:
            t.link.unget(item)
            t.membership.end_active()
            raise GenerationAborted(step.number, t.membership.active[1], "a newer generation started")
        raise NewStart(item.start)
    if kind == "stop":
        mode = StopMode(item.stop.mode) if item.stop.mode in (1, 2, 3, 4) else StopMode.EXIT
        if mode != StopMode.STANDBY:
            raise Stop(mode, item.stop.reason)
        # No rank in the next generation: keep the state, wait for a start.
        log.info("regroup: standing by: %s", item.stop.reason)
        t.membership.end_active()
        if step is not None:
            raise GenerationAborted(step.number, t.membership.active[1], f"standby: {item.stop.reason}")
        t.leave()
        return
    if kind == "outcome":
        return  # late outcome of a step no longer in flight
