# SPDX-License-Identifier: Apache-2.0
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

Shutting the sockets down is not always enough with gloo (measured with the training thread in
a plain ``dist.all_reduce``: in about one run in four of 8 ranks, one survivor stayed blocked;
see bench/trainer_results.md). gloo's TCP pair, when it fails, wakes the
waiters of its bound buffers and of its *pending* unbound sends and receives, but not the waiter
of an unbound-buffer send that already sits in its transmit queue (``Pair::signalException``
signals only ``op.buf`` of the ``tx_`` entries, never ``op.ubuf``). A send lands there when its
write was partial (the peer's window was full) or failed with EPIPE or ECONNRESET, which gloo's
asynchronous mode treats as "write later" -- exactly what happens once the socket has been shut
down and a receive-ready notice still queued in it is read. The gloo worker thread then sleeps in
``UnboundBuffer::waitSend`` until the collective timeout, though every socket of the group is
already closed: no descriptor is left to shut down. So the training thread never waits on gloo
directly: :meth:`GroupSockets.wait` (a collective's future), :meth:`GroupSockets.call` (a blocking
call, such as send and receive, run on a helper thread) and :meth:`GroupSockets.future` (a DDP
communication hook) return or raise :class:`Abandoned` as soon as the abort comes; a collective
left behind keeps its process group alive (:func:`park`) until its gloo thread comes out (at the
collective timeout), so that destroying the group never blocks the training thread.

The shutdown itself is ``libc.shutdown`` through ctypes, which releases the GIL for the call; it
runs on the agent link's thread, which needs the GIL only briefly (a training thread blocked in
a gloo or NCCL wait has released it). A training thread that does not come out within the bound
makes the process exit with ``EXIT_ABORT_STUCK`` (:class:`Watchdog`), and its agent restarts it
in place. A process that holds the GIL forever stops heartbeating instead, which the manager
detects as a frozen rank.
"""

from __future__ import annotations

import atexit
import ctypes
import errno
import faulthandler
import logging
import os
import select
import socket
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

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


def _tcp_socket(fd: int) -> Optional[socket.socket]:
    """A duplicate of ``fd`` as a socket object when it is a TCP socket, else None; the caller
    closes it (which closes the duplicate only)."""
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        return None
    if s.family in (socket.AF_INET, socket.AF_INET6) and s.type == socket.SOCK_STREAM:
        return s
    s.close()
    return None


def _describe(fd: int) -> Optional[Tuple[int, int, bool]]:
    """(local port, peer port, listening) of a TCP socket; None for anything else."""
    s = _tcp_socket(fd)
    if s is None:
        return None
    try:
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
        s.close()


def shutdown_fd(fd: int) -> bool:
    """``shutdown(fd, SHUT_RDWR)`` without the GIL held during the call. True on success."""
    if _libc.shutdown(fd, _SHUT_RDWR) == 0:
        return True
    err = ctypes.get_errno()
    if err not in (errno.ENOTCONN, errno.EBADF, errno.ENOTSOCK):
        log.debug("regroup: shutdown(%d) failed: %s", fd, os.strerror(err))
    return False


def _pipe_ends() -> Dict[int, Tuple[int, bool]]:
    """This process's pipe descriptors: fd -> (pipe inode, opened for writing)."""
    out: Dict[int, Tuple[int, bool]] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
            if not target.startswith("pipe:["):
                continue
            with open(f"/proc/self/fdinfo/{name}") as f:
                flags = next(int(line.split()[1], 8) for line in f if line.startswith("flags:"))
        except (OSError, StopIteration, ValueError):
            continue
        out[int(name)] = (int(target[6:-1]), flags & os.O_ACCMODE == os.O_WRONLY)
    return out


class Abandoned(RuntimeError):
    """The generation was aborted while this rank waited for a collective: the training thread
    left it; the collective itself may still be running in gloo (it ends at its timeout)."""


_current_lock = threading.Lock()
_current: Optional["GroupSockets"] = None


def current() -> Optional["GroupSockets"]:
    """The sockets of the generation whose groups are live in this process (None between)."""
    return _current


class GroupSockets:
    """The sockets of one generation's process groups, noted while they are built.

    Call :meth:`begin` before creating the store and groups and :meth:`end` after. An abort may
    call :meth:`shutdown` from another thread at any time, including between the two (a rank
    stuck in the rendezvous): then every TCP socket created since :meth:`begin` is shut down,
    our connection to the store included, but never the store's listening socket nor the
    connections it accepted. :meth:`release` before destroying the groups: after it, shutdown
    does nothing (the descriptor numbers may be reused).

    It is also where the training thread waits for the groups' collectives (:meth:`wait`,
    :meth:`call`, :meth:`future`): :meth:`shutdown` wakes every such wait, and the collectives
    left behind are listed in ``left`` (the groups' destroy then parks them, see :func:`park`).

    Args:
        store_port: the generation store's port.
    """

    def __init__(self, store_port: int):
        self.store_port = store_port
        self._lock = threading.Lock()
        self._before: Optional[Dict[int, int]] = None
        self._group: List[Tuple[int, int]] = []      # (fd, inode) of the groups' connections
        self._store_client: List[Tuple[int, int]] = []  # our connections to the store
        self._pipes_before: Dict[int, Tuple[int, bool]] = {}
        self._store_control: Optional[Tuple[int, int]] = None  # (fd, inode): see quiet_store
        self._ended = False
        self._released = False
        self.shut_down = False
        self._on_abort: Dict[int, Callable[[], None]] = {}  # woken by shutdown()
        self._next_waiter = 0
        self.left: List[Callable[[], bool]] = []  # collectives left behind: "has it ended?"
        self.collective_s = 0.0  # the groups' collective timeout (how long a left one may run)
        # While the groups are built under a bound (regroup.group.formation_is_bounded): when it
        # ends. An abort meanwhile leaves the rank that long (regroup.dispatch.on_urgent).
        self.building_until: Optional[float] = None

    def begin(self) -> None:
        global _current
        with self._lock:
            self._before = _socket_inodes()
            self._pipes_before = _pipe_ends()
        with _current_lock:
            _current = self

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
            wake = list(self._on_abort.values())
            self._on_abort.clear()
        for fn in wake:  # outside the lock: a waker may call back into this object
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - one waiter must not keep the others asleep
                log.warning("regroup: waking a collective's waiter failed: %s", e)
        return count

    def note_store(self, is_master: bool) -> None:
        """Notes the control pipe of the store client just constructed (call right after it).

        torch 1.13's TCPStore client runs a thread that polls its connection to the store
        together with that pipe. Once the store's server is gone (the rank hosting it left the
        generation, or died) the connection reads as closed and the thread goes round its loop
        at once, again and again: one core busy for as long as the store object lives, which a
        generation's groups parked past an abort (:func:`park`) stretch to the collective
        timeout. The pipe hanging up is the thread's way out (:meth:`quiet_store`). The rank
        hosting the store made two pipes: its server's first, then its client's (the one with
        the higher descriptors). torch versions without the thread make no pipe, and nothing is
        noted.
        """
        with self._lock:
            new: Dict[int, List[Tuple[int, bool]]] = {}
            for fd, (inode, writes) in _pipe_ends().items():
                if self._pipes_before.get(fd, (None,))[0] != inode:
                    new.setdefault(inode, []).append((fd, writes))
            pipes = sorted(((max(fd for fd, _ in ends), inode, ends)
                            for inode, ends in new.items() if len(ends) == 2))
            if len(pipes) != (2 if is_master else 1):
                return
            _, inode, ends = pipes[-1]
            write_end = [fd for fd, writes in ends if writes]
            if len(write_end) == 1:
                self._store_control = (write_end[0], inode)

    def quiet_store(self) -> bool:
        """Ends the polling thread of our store client (see :meth:`note_store`), even one already
        spinning; True when it was told to. Call when leaving the generation, before its groups
        are destroyed or parked. The pipe's write end is replaced, in place, by /dev/null: the
        thread sees the hang-up and ends, and the store's destructor later closes the number
        it still owns and finds the thread ended."""
        with self._lock:
            noted, self._store_control = self._store_control, None
        if noted is None or _pipe_ends().get(noted[0], (None,))[0] != noted[1]:
            return False
        null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.dup2(null, noted[0], inheritable=False)
            return True
        except OSError as e:
            log.debug("regroup: cannot end the store client's polling thread: %s", e)
            return False
        finally:
            os.close(null)

    def release(self) -> None:
        """Forget the descriptors: call before destroying the groups."""
        global _current
        with self._lock:
            self._released = True
            self._group = []
            self._store_client = []
        with _current_lock:
            if _current is self:
                _current = None

    # -- leaving a collective at once ----------------------------------------------------------

    def _register(self, wake: Callable[[], None]) -> Optional[int]:
        """Calls ``wake`` on an abort; None (and no call) when the abort already happened."""
        with self._lock:
            if self.shut_down:
                return None
            key = self._next_waiter
            self._next_waiter += 1
            self._on_abort[key] = wake
            return key

    def _unregister(self, key: Optional[int]) -> None:
        if key is not None:
            with self._lock:
                self._on_abort.pop(key, None)

    def _leave(self, ended: Callable[[], bool]) -> None:
        with self._lock:
            self.left.append(ended)

    def _wait_or_abort(self, done: threading.Event, finished: Callable[[], bool]) -> bool:
        """Waits for ``done``, set when the call ends or on an abort; True when it ended."""
        key = self._register(done.set)
        try:
            if key is not None and not finished():
                done.wait()  # bounded: the collective's own timeout ends it, an abort sets it
        finally:
            self._unregister(key)
        return finished()

    def wait(self, work: Any, what: str = "a collective") -> None:
        """Waits for an asynchronous gloo collective (``async_op=True``; one with a future: every
        collective, not send or receive), or leaves it when the generation is aborted.

        Raises:
            Abandoned: the generation was aborted first.
            RuntimeError: the collective failed.
        """
        fut = work.get_future()
        done = threading.Event()
        fut.add_done_callback(lambda _f: done.set())
        if not self._wait_or_abort(done, fut.done):
            self._leave(work.is_completed)
            raise Abandoned(f"{what} was left: the generation was aborted")
        fut.wait()  # at once: raises the collective's error, if any

    def call(self, fn: Callable[..., Any], *args: Any, what: str = "a collective") -> Any:
        """Runs ``fn(*args)``, a blocking call into the groups (send, receive, or a collective
        without a future), on a helper thread, and returns its result; leaves it on an abort.

        Raises:
            Abandoned: the generation was aborted first.
            BaseException: what ``fn`` raised.
        """
        box: Dict[str, Any] = {}
        done = threading.Event()

        def run() -> None:
            try:
                box["value"] = fn(*args)
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                box["error"] = e
            finally:
                box["ended"] = True
                done.set()

        helper = threading.Thread(target=run, name="regroup-collective", daemon=True)
        helper.start()
        if not self._wait_or_abort(done, lambda: "ended" in box):
            self._leave(lambda: not helper.is_alive())
            raise Abandoned(f"{what} was left: the generation was aborted")
        helper.join()
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def future(self, work: Any, then: Callable[[Any], Any]) -> Any:
        """A future for a DDP communication hook: ``then(result tensor)`` when the collective
        ends, or failed with :class:`Abandoned` when the generation is aborted first (DDP's wait
        at the end of backward then raises in the training thread)."""
        import torch

        out = torch.futures.Future()
        settle_lock = threading.Lock()
        settled = [False]

        def settle(value: Any = None, error: Optional[BaseException] = None) -> bool:
            with settle_lock:
                if settled[0]:
                    return False
                settled[0] = True
            if error is not None:
                out.set_exception(error)
            else:
                out.set_result(value)
            return True

        def on_abort() -> None:
            if settle(error=Abandoned("a gradient all-reduce was left: the generation was aborted")):
                self._leave(work.is_completed)

        key = self._register(on_abort)
        if key is None:
            on_abort()
            return out

        def on_done(f: Any) -> None:
            self._unregister(key)
            try:
                value = then(f.value()[0])
            except Exception as e:  # noqa: BLE001 - handed to DDP
                settle(error=e)
            else:
                settle(value=value)

        work.get_future().add_done_callback(on_done)
        return out


def all_reduce(tensor: Any, op: Any = None, group: Any = None) -> None:
    """``torch.distributed.all_reduce`` that an abort can interrupt (gloo; with NCCL, or
    outside a generation, the plain call). Use it for a script's own collectives (tensor
    parallelism): a rank caught by gloo's lost wake-up in a plain ``dist.all_reduce`` is freed
    only by the abort watchdog (exit 75 and a restart in place).

    Raises:
        Abandoned: the generation was aborted while waiting.
        RuntimeError: the collective failed.
    """
    import torch.distributed as dist

    _all_reduce(getattr(dist.all_reduce, "regroup_original", dist.all_reduce), _backend_of, tensor, op, group, False)


def _backend_of(group: Any) -> str:
    import torch.distributed as dist

    return dist.get_backend(group) if group is not None else dist.get_backend()


class LeavableWork:
    """The handle of an asynchronous gloo collective, send or receive whose :meth:`wait` leaves
    on an abort (a collective through :meth:`GroupSockets.wait`; a send or receive, which has
    no future, through :meth:`GroupSockets.call`); anything else is the torch Work's."""

    def __init__(self, work: Any, sockets: "GroupSockets", what: str, point_to_point: bool = False):
        self._work, self._sockets, self._what, self._p2p = work, sockets, what, point_to_point

    def wait(self, *args: Any, **kwargs: Any) -> bool:
        if self._p2p:
            self._sockets.call(self._work.wait, what=self._what)
        else:
            self._sockets.wait(self._work, self._what)
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def _all_reduce(original: Callable[..., Any], backend_of: Callable[[Any], str], tensor: Any, op: Any,
                group: Any, async_op: bool) -> Any:
    """``original`` (torch's all-reduce), waited for through the generation's sockets on gloo."""
    import torch.distributed as dist

    from regroup.guards import check_group

    check_group(group)
    op = dist.ReduceOp.SUM if op is None else op
    sockets = current()
    if sockets is None or backend_of(group) != "gloo":
        return original(tensor, op=op, group=group, async_op=async_op)
    work = original(tensor, op=op, group=group, async_op=True)
    if async_op:
        return LeavableWork(work, sockets, "an all-reduce")
    sockets.wait(work, "an all-reduce")
    return None


def _leavable(original: Callable[..., Any], backend_of: Callable[[Any], str]) -> Callable[..., Any]:
    """torch's all-reduce replaced by :func:`_all_reduce` over ``original``."""

    def all_reduce(tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> Any:
        return _all_reduce(original, backend_of, tensor, op, group, async_op)

    all_reduce.regroup_original = original  # type: ignore[attr-defined]
    all_reduce.__doc__ = original.__doc__
    return all_reduce


def _leavable_batch(original: Callable[..., Any], backend_of: Callable[[Any], str]) -> Callable[..., Any]:
    """``original`` (torch's ``batch_isend_irecv``), its handles waited for through the
    generation's sockets on gloo."""

    def batch_isend_irecv(p2p_op_list: List[Any]) -> List[Any]:
        works = original(p2p_op_list)
        sockets = current()
        if sockets is None or not p2p_op_list or backend_of(p2p_op_list[0].group) != "gloo":
            return works
        return [LeavableWork(w, sockets, "a send or receive", point_to_point=True) for w in works]

    batch_isend_irecv.regroup_original = original  # type: ignore[attr-defined]
    batch_isend_irecv.__doc__ = original.__doc__
    return batch_isend_irecv


_WRAPPERS = {"all_reduce": _leavable, "batch_isend_irecv": _leavable_batch}


def leave_torch_collectives_on_abort(backend_of: Callable[[Any], str] = _backend_of) -> None:
    """Makes torch's own ``torch.distributed.all_reduce`` and ``batch_isend_irecv`` leave on an
    abort, as :func:`all_reduce` does, for code that calls them and cannot be changed:
    Megatron-core's tensor-parallel layers and cross-entropy, and its pipeline schedule's sends
    and receives (regroup.megatron turns it on). On a gloo group of the live generation a
    blocking all-reduce waits through :meth:`GroupSockets.wait`; an asynchronous one, and each
    batched send and receive, returns a :class:`LeavableWork`; anything else (NCCL, no
    generation) is torch's call unchanged. Idempotent; :func:`restore_torch_collectives` undoes it."""
    import torch.distributed as dist

    for name, wrap in _WRAPPERS.items():
        fn = getattr(dist, name)
        if not hasattr(fn, "regroup_original"):
            setattr(dist, name, wrap(fn, backend_of))


def restore_torch_collectives() -> None:
    import torch.distributed as dist

    for name in _WRAPPERS:
        fn = getattr(dist, name)
        setattr(dist, name, getattr(fn, "regroup_original", fn))


# -- collectives left behind: their groups live until they end -------------------------------

_parked_lock = threading.Lock()
_parked: List[list] = []          # [objects, ended-checks, deadline]
_leaked: List[Any] = []
_reaper: Optional[threading.Thread] = None


def park(objects: List[Any], left: List[Callable[[], bool]], seconds: float) -> None:
    """Keeps ``objects`` (a generation's process groups and store) referenced until every
    collective in ``left`` has ended, then drops them on a reaper thread, where their
    destructors join gloo's threads. Destroying a group whose collective still runs would block
    the caller until the collective timeout. After ``seconds`` they are leaked (logged)."""
    global _reaper
    with _parked_lock:
        _parked.append([list(objects), list(left), time.monotonic() + seconds])
        if _reaper is None or not _reaper.is_alive():
            _reaper = threading.Thread(target=_reap, name="regroup-reaper", daemon=True)
            _reaper.start()


def parked() -> int:
    """How many generations' groups wait for a collective left behind."""
    with _parked_lock:
        return len(_parked)


def _reap() -> None:
    global _reaper
    while True:
        with _parked_lock:
            if not _parked:
                _reaper = None
                return
            items = list(_parked)
        now = time.monotonic()
        for item in items:
            objects, left, deadline = item
            try:
                ended = all(check() for check in left)
            except Exception:  # noqa: BLE001 - a check that fails counts as ended
                ended = True
            if ended or now > deadline:
                with _parked_lock:
                    _parked.remove(item)
                if ended:
                    item[0] = []
                    del objects[:]  # the destructors run here, off the training thread
                else:
                    log.warning("regroup: a collective left behind did not end within its timeout; "
                                "its process group is kept until the process exits")
                    _leaked.append(objects)
            del objects
        time.sleep(0.05)


@atexit.register
def _keep_parked_at_exit() -> None:
    """At exit, a parked group's destructor could wait for its collective: leak them instead."""
    with _parked_lock:
        for item in _parked:
            for obj in item[0]:
                ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
        for objects in _leaked:
            for obj in objects:
                ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


class PeerWatch:
    """Tells at once of a peer whose connection to this rank closed: a thread polls the
    generation's group connections for the peer's end (``POLLRDHUP``, ``POLLHUP``, ``POLLERR``)
    without reading them, and calls ``closed(host)`` once per peer host.

    A process that dies has its kernel close its sockets: its peers' ends read as closed at
    once, while the training thread may be far from its next collective (in its forward, its
    backward, its sleep). So a survivor tells its agent which peer is gone within milliseconds
    of the death instead of at its next collective, and the manager settles a pod whose stream
    broke as lost that much sooner (``TrainerFault.early``; docs/design.md). ``closed`` must
    check itself that the generation is not over (an abort shuts our own connections down,
    which reads the same here). :meth:`stop` before the groups are destroyed or parked (their
    descriptor numbers may then be reused).
    """

    _CLOSED = select.POLLRDHUP | select.POLLHUP | select.POLLERR

    def __init__(self, fds: List[int], closed: Callable[[str], None]):
        self._closed = closed
        self._poll = select.poll()
        self._host: Dict[int, str] = {}
        for fd in fds:
            host = _peer_host(fd)
            if host is not None:
                self._host[fd] = host
                self._poll.register(fd, select.POLLRDHUP)
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC)
        self._poll.register(self._wake_r, select.POLLIN)
        self._told: set = set()
        self._thread = threading.Thread(target=self._run, name="regroup-peer-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while self._host:
                for fd, events in self._poll.poll():
                    if fd == self._wake_r:
                        return
                    host = self._host.pop(fd, None)
                    self._poll.unregister(fd)
                    if host is None or events & select.POLLNVAL or not events & self._CLOSED:
                        continue
                    if host not in self._told:
                        self._told.add(host)
                        try:
                            self._closed(host)
                        except Exception as e:  # noqa: BLE001 - a report must not end the watch
                            log.debug("regroup: reporting a closed peer failed: %s", e)
        finally:
            os.close(self._wake_r)

    def stop(self) -> None:
        """Ends the thread (at once) and waits for it."""
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        self._thread.join(timeout=1.0)
        os.close(self._wake_w)


def _peer_host(fd: int) -> Optional[str]:
    """The address of a connected TCP socket's peer; None for anything else."""
    s = _tcp_socket(fd)
    if s is None:
        return None
    try:
        return str(s.getpeername()[0])
    except OSError:
        return None
    finally:
        s.close()


class Watchdog:
    """Exits the process if the training thread does not leave its step in time after an abort.

    ``os._exit`` from a timer thread: the exit does not wait for the stuck thread. The code is
    ``EXIT_ABORT_STUCK``; the agent reports the exit and the manager restarts the rank in place.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._timer: Optional[threading.Timer] = None

    def arm(self, seconds: float, code: int, why: str) -> None:
        with self._lock:
            if self._timer is not None:
                return

            def fire() -> None:
                try:
                    sys.stderr.write(f"regroup: the training thread did not leave its step within "
                                     f"{seconds} s of an abort ({why}); exiting with code {code} so "
                                     f"the agent restarts this rank; where each thread was:\n")
                    sys.stderr.flush()
                    faulthandler.dump_traceback(all_threads=True)
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
