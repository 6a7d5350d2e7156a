# SPDX-License-Identifier: Apache-2.0
"""A generation's process groups: its own store, the default group, tensor- and data-parallel groups.

Every generation gets a fresh store (a TCPStore on the port the manager named, hosted by the
generation's rank 0) and fresh groups; the previous ones are destroyed first, so descriptors and
threads do not pile up over many rebuilds. The sockets the groups open are noted as they are
built (``regroup.abort.GroupSockets``) so that an abort can shut exactly them down.

Ranks are laid out as the manager numbers them: replica ``k`` holds ranks ``[k*R, (k+1)*R)``
where ``R = tensor_parallel * pipeline_parallel``; a rank's position in its replica is
``rank % R``. The tensor-parallel group of a rank is its replica; its data-parallel group is
every rank at the same position (with ``R == 1``, the whole world).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import socket
import threading
import time
from typing import Any, List, Optional

import torch
import torch.distributed as dist

from regroup.abort import GroupSockets, park
from regroup.api import ConfigError

log = logging.getLogger("regroup")


@dataclasses.dataclass
class Layout:
    """Where a rank sits in a generation."""

    world_size: int
    rank: int
    replica_size: int

    def __post_init__(self) -> None:
        if self.replica_size < 1 or self.world_size % self.replica_size:
            raise ConfigError(f"a world of {self.world_size} ranks cannot hold replicas of "
                              f"{self.replica_size} ranks (tensor x pipeline parallel)")
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank {self.rank} is outside a world of {self.world_size}")

    @property
    def dp(self) -> int:
        return self.world_size // self.replica_size

    @property
    def replica(self) -> int:
        return self.rank // self.replica_size

    @property
    def position(self) -> int:
        return self.rank % self.replica_size

    def replica_ranks(self, replica: int) -> List[int]:
        return list(range(replica * self.replica_size, (replica + 1) * self.replica_size))

    def position_ranks(self, position: int) -> List[int]:
        return list(range(position, self.world_size, self.replica_size))


class ProcessGroups:
    """The groups of one generation. Build with :func:`build_groups`; end with :meth:`destroy`.

    Attributes:
        layout: this rank's place.
        backend: "gloo" or "nccl".
        tp_group: the group of this rank's replica (None when a replica is one rank).
        dp_group: the group of the ranks at this rank's position in every replica (the default
            group when a replica is one rank).
        sockets: the groups' sockets, for an abort.
    """

    def __init__(self, layout: Layout, backend: str, store: Any, sockets: GroupSockets):
        self.layout = layout
        self.backend = backend
        self.store = store
        self.sockets = sockets
        self.tp_group: Any = None
        self.dp_group: Any = None
        self.destroyed = False

    def abort_nccl(self) -> bool:
        """Aborts the NCCL communicators of these groups (torch 2.x), so a rank blocked in an
        NCCL collective comes out; True when torch had a way to. Untested here (no GPU in CI)."""
        if self.backend != "nccl" or self.destroyed:
            return False
        done = False
        for g in (self.tp_group, self.dp_group, dist.group.WORLD):
            if g is None or g is dist.GroupMember.NON_GROUP_MEMBER:
                continue
            abort_group = getattr(dist.distributed_c10d, "_abort_process_group", None)
            try:
                if abort_group is not None:  # torch >= 2.5
                    abort_group(g)
                    done = True
                elif hasattr(g, "_get_backend"):  # torch 2.0 .. 2.4: ProcessGroupNCCL.abort()
                    backend = g._get_backend(torch.device("cuda"))
                    if hasattr(backend, "abort"):
                        backend.abort()
                        done = True
            except Exception as e:  # noqa: BLE001 - best effort; the watchdog is the backstop
                log.warning("regroup: aborting an NCCL group failed: %s", e)
        return done

    def destroy(self) -> None:
        """Destroys the groups and the store (idempotent)."""
        if self.destroyed:
            return
        self.destroyed = True
        self.sockets.quiet_store()  # no thread of ours spins on the store once its host is gone
        self.sockets.release()
        left = list(self.sockets.left)
        if left:
            # A collective left behind by an abort still runs in gloo (until its timeout): keep
            # its groups alive past the destroy, or their destructors would wait for it here.
            park(_live_groups() + [self.tp_group, self.dp_group, self.store], left,
                 self.sockets.collective_s + 30.0)
            log.info("regroup: %d collective(s) left behind by the abort; their groups are "
                     "released when gloo gives up on them", len(left))
        _destroy_default()
        self.tp_group = None
        self.dp_group = None
        self.store = None


def _live_groups() -> List[Any]:
    """Every process group torch knows of (the default one and the subgroups)."""
    c10d = dist.distributed_c10d
    pg_map = getattr(c10d, "_pg_map", None)
    if pg_map is None and hasattr(c10d, "_world"):
        pg_map = getattr(c10d._world, "pg_map", None)
    return list(pg_map.keys()) if pg_map else []


def _destroy_default() -> None:
    if dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception as e:  # noqa: BLE001 - a broken group is still dropped below
            log.warning("regroup: destroying the process group failed: %s", e)


def _reset_group_names() -> None:
    """With no group left, names new groups from the start again, as a fresh process does.

    torch names each new group (the default one included) by a counter that only a successful
    destroy of the default group resets. A group that failed half-built (its rendezvous timed
    out or broke) leaves the counter raised: this rank's next groups would take names that its
    peers, fresh processes among them, do not use, and every rank would wait for the others'
    keys under its own name until the timeout, generation after generation. torch 1.13 keeps
    the counter in ``distributed_c10d._group_count``; torch 2.x behind ``_world.group_count``.
    """
    if dist.is_initialized():
        return
    c10d = dist.distributed_c10d
    world = getattr(c10d, "_world", None)
    holder = world if world is not None and hasattr(world, "group_count") else c10d
    name = "group_count" if holder is world else "_group_count"
    if getattr(holder, name, 0) != 0:
        log.info("regroup: group names restart at 0 (a group failed half-built before)")
        setattr(holder, name, 0)


def _connect_store(host: str, port: int, world_size: int, is_master: bool, deadline: float,
                   aborted: threading.Event) -> Any:
    """A TCPStore at host:port; workers retry (in short attempts, watching for an abort)."""
    if is_master:
        return dist.TCPStore(host, port, world_size, True,
                             datetime.timedelta(seconds=max(1.0, deadline - time.monotonic())),
                             wait_for_workers=False)
    # torch's client sleeps a whole second between connection attempts (1.13): wait for the
    # master's listening socket here, in 10 ms steps, then connect once it accepts.
    while True:
        if aborted.is_set():
            raise RuntimeError("aborted while waiting for the generation's store")
        if time.monotonic() >= deadline:
            raise RuntimeError(f"the generation's store at {host}:{port} did not come up")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                break
        except OSError:
            time.sleep(0.01)
    last: Optional[Exception] = None
    while True:
        if aborted.is_set():
            raise RuntimeError("aborted while connecting to the generation's store")
        left = deadline - time.monotonic()
        if left <= 0:
            raise RuntimeError(f"cannot reach the generation's store at {host}:{port}: {last}")
        try:
            return dist.TCPStore(host, port, world_size, False,
                                 datetime.timedelta(seconds=min(2.0, max(0.2, left))),
                                 wait_for_workers=False)
        except Exception as e:  # noqa: BLE001 - retried until the deadline
            last = e
            time.sleep(0.05)


def nccl_environment() -> None:
    """Before the first NCCL group: ask for non-blocking communicator setup and async error
    handling (torch 2.x), so an abort can interrupt NCCL."""
    os.environ.setdefault("TORCH_NCCL_USE_COMM_NONBLOCKING", "1")
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def build_groups(*, store_host: str, store_port: int, layout: Layout, backend: str,
                 rendezvous_s: float, collective_s: float, aborted: threading.Event,
                 sockets: Optional[GroupSockets] = None) -> ProcessGroups:
    """Forms a generation's groups: store, default group, tensor- and data-parallel groups.

    Args:
        store_host, store_port: the generation's store (hosted by rank 0).
        layout: this rank's place.
        backend: "gloo" or "nccl".
        rendezvous_s: how long forming the groups may take.
        collective_s: the collectives' timeout.
        aborted: set by an abort; a rank still connecting gives up.
        sockets: where to note the sockets (created here when None); the caller may hand it to
            the abort path before calling, so a rank stuck here can be freed.

    Returns:
        The groups.

    Raises:
        RuntimeError: the store or a group could not be formed (or an abort freed this rank).
    """
    _destroy_default()  # a leftover default group (never expected) would refuse a new one
    _reset_group_names()
    if backend == "nccl":
        nccl_environment()
    sockets = sockets or GroupSockets(store_port)
    sockets.collective_s = collective_s
    sockets.begin()
    deadline = time.monotonic() + rendezvous_s
    store = _connect_store(store_host, store_port, layout.world_size, layout.rank == 0, deadline, aborted)
    sockets.note_store(is_master=layout.rank == 0)
    try:
        store.set_timeout(datetime.timedelta(seconds=collective_s))
        timeout = datetime.timedelta(seconds=collective_s)
        dist.init_process_group(backend, store=store, rank=layout.rank,
                                world_size=layout.world_size, timeout=timeout)
        groups = ProcessGroups(layout, backend, store, sockets)
        if layout.replica_size == 1:
            groups.dp_group = dist.group.WORLD
        else:
            # Every rank creates every group, in the same order (torch requires it).
            for replica in range(layout.dp):
                g = dist.new_group(layout.replica_ranks(replica), timeout=timeout, backend=backend)
                if replica == layout.replica:
                    groups.tp_group = g
            for position in range(layout.replica_size):
                g = dist.new_group(layout.position_ranks(position), timeout=timeout, backend=backend)
                if position == layout.position:
                    groups.dp_group = g
        sockets.end()
        return groups
    except BaseException:
        sockets.release()
        _destroy_default()
        raise
