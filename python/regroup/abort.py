"""Leaving a collective at once: shut down the failed generation's own sockets.

gloo has no abort. A rank blocked in a collective whose peer died or froze waits for the whole
collective timeout, except the dead rank's ring neighbours. Shutting down (``shutdown(2)``, not
``close``) the group's TCP connections makes every pending send and receive on them fail at
once, so the collective raises and the training thread comes out; the descriptors stay valid
until the group is destroyed, so nothing else can reuse their numbers meanwhile.

Which sockets: the ones that appeared in ``/proc/self/fd`` while the generation's groups were
built (:class:`GroupSockets`), less the store's (its listening socket and the connections it
accepted, which have the store's port as their local port) and any listening socket. A user
socket opened by another thread in that window could be mistaken for the group's; a socket
whose inode changed since it was noted (its number reused) is never touched.

The shutdown itself is ``libc.shutdown`` through ctypes, which releases the GIL for the call; it
runs on the agent link's thread, which needs the GIL only briefly (a training thread blocked in
a gloo or NCCL wait has released it). A training thread that does not come out within the bound
makes the process exit with ``EXIT_ABORT_STUCK`` (:class:`Watchdog`), and its agent restarts it
in place. A process that holds the GIL forever stops heartbeating instead, which the manager
detects as a frozen rank.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import socket
import sys
import threading
import time
from typing import Dict, List, Optional, Tuple

log = logging.getLogger("regroup")

_SHUT_RDWR = 2
_libc = ctypes.CDLL(None, use_errno=True)
_libc.shutdown.argtypes = [ctypes.c_int, ctypes.c_int]
_libc.shutdown.restype = ctypes.c_int


def _socket_inodes() -> Dict[int, int]:
    """This process's socket descriptors and their inodes."""
    out: Dict[int, int] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out[int(name)] = int(target[8:-1])
    return out


def _inode_of(fd: int) -> Optional[int]:
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    return int(target[8:-1]) if target.startswith("socket:[") else None


def _describe(fd: int) -> Optional[Tuple[int, int, bool]]:
    """(local port, peer port, listening) of a TCP socket; None for anything else."""
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        return None
    try:
        if s.family not in (socket.AF_INET, socket.AF_INET6) or s.type != socket.SOCK_STREAM:
            return None
        listening = bool(s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
        local = s.getsockname()[1]
        try:
            peer = s.getpeername()[1]
        except OSError:
            peer = 0
        return local, peer, listening
    except OSError:
        return None
    finally:
        s.close()  # closes the duplicate only


def shutdown_fd(fd: int) -> bool:
    """``shutdown(fd, SHUT_RDWR)`` without the GIL held during the call. True on success."""
    if _libc.shutdown(fd, _SHUT_RDWR) == 0:
        return True
    err = ctypes.get_errno()
    if err not in (errno.ENOTCONN, errno.EBADF, errno.ENOTSOCK):
        log.debug("regroup: shutdown(%d) failed: %s", fd, os.strerror(err))
    return False


class GroupSockets:
    """The sockets of one generation's process groups, noted while they are built.

    Call :meth:`begin` before creating the store and groups and :meth:`end` after. An abort may
    call :meth:`shutdown` from another thread at any time, including between the two (a rank
    stuck in the rendezvous): then every TCP socket created since :meth:`begin` is shut down,
    our connection to the store included, but never the store's listening socket nor the
    connections it accepted. :meth:`release` before destroying the groups: after it, shutdown
    does nothing (the descriptor numbers may be reused).

    Args:
        store_port: the generation store's port.
    """

    def __init__(self, store_port: int):
        self.store_port = store_port
        self._lock = threading.Lock()
        self._before: Optional[Dict[int, int]] = None
        self._group: List[Tuple[int, int]] = []      # (fd, inode) of the groups' connections
        self._store_client: List[Tuple[int, int]] = []  # our connections to the store
        self._ended = False
        self._released = False
        self.shut_down = False

    def begin(self) -> None:
        with self._lock:
            self._before = _socket_inodes()

    def _new_sockets(self) -> Tuple[List[Tuple[int, int]], List[Tuple[int, int]]]:
        assert self._before is not None
        group, store_client = [], []
        for fd, inode in _socket_inodes().items():
            if self._before.get(fd) == inode:
                continue
            info = _describe(fd)
            if info is None:
                continue
            local, peer, listening = info
            if listening or local == self.store_port:
                continue  # the store's server side, or a listener: never ours to shut
            (store_client if peer == self.store_port else group).append((fd, inode))
        return group, store_client

    def end(self) -> None:
        """Notes the groups' sockets (the construction finished)."""
        with self._lock:
            if self._before is None or self._released:
                return
            self._group, self._store_client = self._new_sockets()
            self._ended = True

    @property
    def fds(self) -> List[int]:
        """The group connections noted by :meth:`end`."""
        return [fd for fd, _ in self._group]

    def shutdown(self, include_store: bool = False) -> int:
        """Shuts the groups' connections down; returns how many. Safe from any thread.

        Args:
            include_store: also our connections to the generation's store (done anyway while
                the groups are still being built).
        """
        with self._lock:
            if self._released or self._before is None:
                return 0
            if self._ended:
                targets = list(self._group) + (list(self._store_client) if include_store else [])
            else:
                group, store_client = self._new_sockets()
                targets = group + store_client
            count = 0
            for fd, inode in targets:
                if _inode_of(fd) == inode and shutdown_fd(fd):
                    count += 1
            self.shut_down = True
            return count

    def release(self) -> None:
        """Forget the descriptors: call before destroying the groups."""
        with self._lock:
            self._released = True
            self._group = []
            self._store_client = []


class Watchdog:
    """Exits the process if the training thread does not leave its step in time after an abort.

    ``os._exit`` from a timer thread: the exit does not wait for the stuck thread. The code is
    ``EXIT_ABORT_STUCK``; the agent reports the exit and the manager restarts the rank in place.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._timer: Optional[threading.Timer] = None
        self.armed_at: Optional[float] = None

    def arm(self, seconds: float, code: int, why: str) -> None:
        with self._lock:
            if self._timer is not None:
                return
            self.armed_at = time.monotonic()

            def fire() -> None:
                try:
                    sys.stderr.write(f"regroup: the training thread did not leave its step within "
                                     f"{seconds} s of an abort ({why}); exiting with code {code} so "
                                     f"the agent restarts this rank\n")
                    sys.stderr.flush()
                finally:
                    os._exit(code)

            self._timer = threading.Timer(seconds, fire)
            self._timer.name = "regroup-abort-watchdog"
            self._timer.daemon = True
            self._timer.start()

    def disarm(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer.join(timeout=1.0)
                self._timer = None
            self.armed_at = None

    @property
    def armed(self) -> bool:
        return self._timer is not None
