# SPDX-License-Identifier: Apache-2.0
"""A rank's place in the job's generations, owned in one place.

The trainer forms a generation (:meth:`Membership.begin`, :meth:`Membership.formed`,
:meth:`Membership.enter`), runs its steps in it, and leaves it (:meth:`Membership.leave`). The
agent link's thread aborts it (:meth:`Membership.abort`) while the training thread may be inside
one of its collectives: the lock guards what both threads touch (the marks, the sockets, the
groups). Everything else in the library asks this object, never the trainer's fields.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Optional, Tuple

from regroup.api import GenerationAborted
from regroup.guards import retire_groups, retire_model

log = logging.getLogger("regroup")

Mark = Tuple[int, int]  # (epoch, generation): compared as a pair
NO_GENERATION: Mark = (-1, -1)
LINK_LOST: Mark = (1 << 62, 1 << 62)  # above every generation: a lost link ends them all


class Membership:
    """The generation this rank is forming or running, and the aborts it heard.

    Attributes:
        lock: guards ``active``, ``abort_*``, ``sockets`` and ``groups`` against the link thread.
        active: the generation being formed or run (its mark stays after it is left).
        abort_mark: the highest generation aborted.
        abort_reason: why the last abort came.
        abort_at: when the last abort not yet left came (monotonic seconds).
        sockets: the active generation's group connections (regroup.abort.GroupSockets).
        groups: its process groups (regroup.group.ProcessGroups), once formed.
        ddp: its DistributedDataParallel wrapper, when the trainer builds one.
        generation: what the script sees of it (regroup.step.Generation), once entered.
        position: this rank's last position in a replica (a dump after the generation ended).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active: Mark = NO_GENERATION
        self.abort_mark: Mark = NO_GENERATION
        self.abort_reason = ""
        self.abort_at: Optional[float] = None
        self.sockets: Any = None
        self.peer_watch: Any = None  # regroup.abort.PeerWatch over the active generation's groups
        self.groups: Any = None
        self.ddp: Any = None
        self.generation: Any = None
        self.position = 0

    # -- the training thread ---------------------------------------------------------------------

    def begin(self, mark: Mark, sockets: Any) -> None:
        """Forming generation ``mark`` starts, over ``sockets``."""
        with self.lock:
            self.active = mark
            self.sockets = sockets
            self.abort_reason = ""

    def formed(self, groups: Any) -> None:
        """Its process groups exist."""
        with self.lock:
            self.groups = groups

    def enter(self, generation: Any, position: int) -> None:
        """Formed and synced: the script runs its steps in it."""
        self.generation = generation
        self.position = position

    def aborted(self) -> bool:
        """Whether the active generation was aborted."""
        return self.active != NO_GENERATION and self.abort_mark >= self.active

    def check(self, step: int) -> None:
        """Raises GenerationAborted when the active generation was aborted."""
        if self.aborted():
            raise GenerationAborted(step, self.active[1], self.abort_reason)

    def note_abort(self, mark: Mark, reason: str) -> bool:
        """An abort read by the training thread (the link thread already shut the sockets):
        recorded when it concerns the active generation or a newer one; returns whether."""
        with self.lock:
            if self.active == NO_GENERATION or mark < self.active:
                return False
            self.abort_mark = max(self.abort_mark, mark)
            self.abort_reason = reason
            return True

    def end_active(self) -> None:
        """The active generation is over without an abort message (a standby, a newer start)."""
        with self.lock:
            self.abort_mark = max(self.abort_mark, self.active)

    def leave(self, forget: bool = True) -> Optional[float]:
        """Leaves the active generation: its groups destroyed (or parked, see regroup.abort),
        its wrapper and groups retired (regroup.guards). ``forget=False`` (the trainer closing)
        keeps ``generation`` for the script to read where it ended. Returns the seconds since
        its abort, if one came."""
        with self.lock:
            groups, self.groups = self.groups, None
            self.sockets = None
            watch, self.peer_watch = self.peer_watch, None
        if watch is not None:
            watch.stop()  # before the groups' descriptors are closed (their numbers reused)
        if self.ddp is not None:
            retire_model(self.ddp, self.active[1])
        self.ddp = None
        if self.generation is not None:
            self.generation._groups = None
        if forget:
            self.generation = None
        since_abort = None
        if self.abort_at is not None:
            since_abort = time.monotonic() - self.abort_at
            self.abort_at = None
        if groups is not None:
            retire_groups(*groups.subgroups())
            started = time.monotonic()
            groups.destroy()
            log.info("regroup: left generation %d%s; its groups destroyed in %.1f ms", self.active[1],
                     "" if since_abort is None else f" {since_abort * 1000:.1f} ms after the abort",
                     (time.monotonic() - started) * 1000)
        return since_abort

    # -- the link thread -------------------------------------------------------------------------

    def abort(self, mark: Mark, reason: str) -> Optional[bool]:
        """Aborts generation ``mark`` (``LINK_LOST``: every one): the active generation's
        connections are shut down at once, freeing a training thread inside its collectives.
        Returns None when ``mark`` is older than the active generation (nothing to do), else
        whether the abort is a new one (for the count)."""
        with self.lock:
            if mark < self.active and mark != LINK_LOST:
                return None
            new = self.abort_mark < mark
            self.abort_mark = max(self.abort_mark, mark)
            self.abort_reason = reason
            self.abort_at = time.monotonic()
            if self.sockets is not None:
                self.sockets.shutdown(include_store=True)
            if self.groups is not None:
                self.groups.abort_inflight()  # the backend's own abort, if it has one
            return new

    def ended_by(self, mark: Mark) -> bool:
        """Whether a start of ``mark`` ends the active generation (it is a newer one, and the
        active one was neither left nor aborted)."""
        with self.lock:
            return self.active != NO_GENERATION and mark > self.active and self.abort_mark < self.active
