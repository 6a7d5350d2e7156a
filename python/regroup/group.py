# SPDX-License-Identifier: Apache-2.0
"""A generation's process groups: its own store, the default group, and the grid's groups.

Every generation gets a fresh store (a TCPStore on the port the manager named, hosted by the
generation's rank 0) and fresh groups; the previous ones are destroyed first, so descriptors and
threads do not pile up over many rebuilds. The sockets the groups open are noted as they are
built (``regroup.abort.GroupSockets``) so that an abort can shut exactly them down.

The grid, dp x tp x pp. Ranks are laid out as the manager numbers them: replica ``k`` (a
data-parallel replica, a whole tp x pp grid, the unit of failure) holds ranks ``[k*R, (k+1)*R)``
where ``R = tp * pp``. Inside a replica the tensor-parallel rank varies fastest, then the
pipeline stage: a rank's position is ``rank % R = stage * tp + tp_rank``. This is Megatron-core's
``order="tp-pp-dp"`` (its ``initialize_model_parallel`` takes it), not its default
``"tp-dp-pp"``: with dp inside pp a replica's ranks would be spread over the whole job, and a
pod could not hold whole replicas (docs/design.md, "Elastic sizing"). Each generation builds:

- the tensor-parallel group: the ``tp`` ranks of one stage of one replica;
- the pipeline-parallel group: the ``pp`` ranks of one tensor-parallel rank of one replica, in
  stage order (with the neighbours ``pp_prev``/``pp_next``, global ranks, None at the ends);
- the model-parallel group: the whole replica (tp x pp);
- the data-parallel group: the ranks at the same position in every replica.

A group of one rank is not built (None), except the data-parallel group (the default group
when a replica is one rank). Groups with the same ranks are one group.

The abort of an in-flight collective is per backend (:data:`ABORTS`): gloo's is the socket
shutdown of ``regroup.abort`` (and the training thread's waits that an abort ends), NCCL's is
torch's communicator abort. Any other backend torch.distributed knows (``hccl`` from torch_npu,
a registered custom one) has none: a collective in flight ends at the collective timeout, which
is logged once per process.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import socket
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from regroup.abort import GroupSockets, park
from regroup.api import ConfigError

log = logging.getLogger("regroup")


@dataclasses.dataclass
class Layout:
    """Where a rank sits in a generation's dp x tp x pp grid (see the module's docstring).

    Attributes:
        world_size: ranks in the generation.
        rank: this rank.
        replica_size: ranks per data-parallel replica (tp x pp).
        pipeline_parallel: pipeline stages per replica (it divides ``replica_size``); the
            tensor-parallel size is ``replica_size // pipeline_parallel``.
    """

    world_size: int
    rank: int
    replica_size: int
    pipeline_parallel: int = 1

    def __post_init__(self) -> None:
        if self.replica_size < 1 or self.world_size % self.replica_size:
            raise ConfigError(f"a world of {self.world_size} ranks cannot hold replicas of "
                              f"{self.replica_size} ranks (tensor x pipeline parallel)")
        if self.pipeline_parallel < 1 or self.replica_size % self.pipeline_parallel:
            raise ConfigError(f"replicas of {self.replica_size} ranks cannot hold "
                              f"{self.pipeline_parallel} pipeline stages")
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank {self.rank} is outside a world of {self.world_size}")

    @classmethod
    def grid(cls, world_size: int, rank: int, tp: int, pp: int) -> "Layout":
        """The layout of a dp x ``tp`` x ``pp`` grid."""
        if tp < 1 or pp < 1:
            raise ConfigError(f"tensor parallel {tp} and pipeline parallel {pp} must be positive")
        return cls(world_size, rank, tp * pp, pp)

    @property
    def dp(self) -> int:
        return self.world_size // self.replica_size

    @property
    def tp(self) -> int:
        return self.replica_size // self.pipeline_parallel

    @property
    def pp(self) -> int:
        return self.pipeline_parallel

    @property
    def replica(self) -> int:
        return self.rank // self.replica_size

    @property
    def position(self) -> int:
        """This rank's place in its replica: ``stage * tp + tp_rank``."""
        return self.rank % self.replica_size

    @property
    def tp_rank(self) -> int:
        return self.position % self.tp

    @property
    def stage(self) -> int:
        """This rank's pipeline stage (0 .. pp - 1)."""
        return self.position // self.tp

    def replica_ranks(self, replica: int) -> List[int]:
        """The ranks of a replica: its model-parallel group."""
        return list(range(replica * self.replica_size, (replica + 1) * self.replica_size))

    def position_ranks(self, position: int) -> List[int]:
        """The ranks at ``position`` of every replica: a data-parallel group."""
        return list(range(position, self.world_size, self.replica_size))

    def tp_ranks(self, replica: int, stage: int) -> List[int]:
        """The tensor-parallel group of a stage of a replica."""
        first = replica * self.replica_size + stage * self.tp
        return list(range(first, first + self.tp))

    def pp_ranks(self, replica: int, tp_rank: int) -> List[int]:
        """The pipeline-parallel group of a tensor-parallel rank of a replica, in stage order."""
        first = replica * self.replica_size + tp_rank
        return list(range(first, first + self.replica_size, self.tp))

    def all_groups(self) -> List[Tuple[str, List[int]]]:
        """Every group of the grid as ``(kind, ranks)``, in the order every rank builds them
        (groups of one rank, but data-parallel ones, left out)."""
        out: List[Tuple[str, List[int]]] = []
        for replica in range(self.dp):
            for stage in range(self.pp):
                out.append(("tp", self.tp_ranks(replica, stage)))
            for tp_rank in range(self.tp):
                out.append(("pp", self.pp_ranks(replica, tp_rank)))
            out.append(("mp", self.replica_ranks(replica)))
        for position in range(self.replica_size):
            out.append(("dp", self.position_ranks(position)))
        return [(kind, ranks) for kind, ranks in out if len(ranks) > 1 or kind == "dp"]

    def mine(self, kind: str) -> List[int]:
        """This rank's group of ``kind`` ("tp", "pp", "mp" or "dp")."""
        if kind == "tp":
            return self.tp_ranks(self.replica, self.stage)
        if kind == "pp":
            return self.pp_ranks(self.replica, self.tp_rank)
        if kind == "mp":
            return self.replica_ranks(self.replica)
        if kind == "dp":
            return self.position_ranks(self.position)
        raise ValueError(f"no group kind {kind!r}")

    @property
    def pp_prev(self) -> Optional[int]:
        """The global rank of the previous pipeline stage's rank (None at the first stage)."""
        return self.rank - self.tp if self.stage > 0 else None

    @property
    def pp_next(self) -> Optional[int]:
        """The global rank of the next pipeline stage's rank (None at the last stage)."""
        return self.rank + self.tp if self.stage < self.pp - 1 else None


class ProcessGroups:
    """The groups of one generation. Build with :func:`build_groups`; end with :meth:`destroy`.

    Attributes:
        layout: this rank's place.
        backend: the torch.distributed backend ("gloo", "nccl", "hccl", ...).
        tp_group: this rank's tensor-parallel group (None when tp is 1).
        pp_group: this rank's pipeline-parallel group, in stage order (None when pp is 1).
        mp_group: this rank's model-parallel group, its whole replica (None when a replica is
            one rank; the tensor-parallel group when pp is 1, the pipeline one when tp is 1).
        dp_group: the group of the ranks at this rank's position in every replica (the default
            group when a replica is one rank).
        extra: what the builders of :func:`on_build` returned, by name (a framework's groups).
        sockets: the groups' sockets, for an abort.
    """

    def __init__(self, layout: Layout, backend: str, store: Any, sockets: GroupSockets):
        self.layout = layout
        self.backend = backend
        self.store = store
        self.sockets = sockets
        self.tp_group: Any = None
        self.pp_group: Any = None
        self.mp_group: Any = None
        self.dp_group: Any = None
        self.extra: Dict[str, Any] = {}
        self.destroyed = False

    def subgroups(self) -> List[Any]:
        """The generation's groups other than the default one (each once)."""
        out: List[Any] = []
        for g in (self.tp_group, self.pp_group, self.mp_group, self.dp_group):
            if g is not None and not any(g is o for o in out):
                out.append(g)
        return out

    def abort_inflight(self) -> bool:
        """Ends the collectives in flight on these groups, the backend's way (:data:`ABORTS`);
        True when the backend has a way. Without one a collective ends at the collective
        timeout, which is logged once per process. Called by the abort, after the groups'
        sockets were shut down."""
        if self.destroyed:
            return False
        piece = ABORTS.get(self.backend)
        if piece is None:
            _no_abort_once(self.backend, self.sockets.collective_s)
            return False
        return piece(self)

    def abort_nccl(self) -> bool:
        """Aborts the NCCL communicators of these groups (torch 2.x), so a rank blocked in an
        NCCL collective comes out; True when torch had a way to. Untested here (no GPU in CI;
        ``bench/gpu/nccl_check.py`` runs it on a GPU machine)."""
        if self.backend != "nccl" or self.destroyed:
            return False
        done = False
        for g in self.subgroups() + [dist.group.WORLD]:
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
            park(_live_groups() + self.subgroups() + [self.store], left,
                 self.sockets.collective_s + 30.0)
            log.info("regroup: %d collective(s) left behind by the abort; their groups are "
                     "released when gloo gives up on them", len(left))
        for name, fn in _teardowns:
            try:
                fn(self)
            except Exception as e:  # noqa: BLE001 - the groups go below all the same
                log.warning("regroup: tearing down %s failed: %s", name, e)
        _destroy_default()
        self.tp_group = self.pp_group = self.mp_group = self.dp_group = None
        self.extra = {}
        self.store = None


# -- the abort of a collective in flight, per backend ---------------------------------------------


def _abort_gloo(groups: ProcessGroups) -> bool:
    # The abort already shut the groups' sockets down (regroup.abort.GroupSockets.shutdown), and
    # the training thread waits on gloo only through GroupSockets, which that shutdown wakes.
    return True


def _abort_nccl(groups: ProcessGroups) -> bool:
    return groups.abort_nccl()


ABORTS: Dict[str, Callable[[ProcessGroups], bool]] = {"gloo": _abort_gloo, "nccl": _abort_nccl}
"""The per-backend abort of a collective in flight: backend name -> ``fn(groups)``, True when it
ended them. Add one with :func:`register_abort`."""

_warned_lock = threading.Lock()
_warned: set = set()


def register_abort(backend: str, fn: Callable[[ProcessGroups], bool]) -> None:
    """Registers how to abort ``backend``'s collectives in flight (``fn(groups)``; True when it
    did): an abort calls it after shutting the groups' sockets down."""
    ABORTS[backend] = fn


def _no_abort_once(backend: str, collective_s: float) -> None:
    with _warned_lock:
        if backend in _warned:
            return
        _warned.add(backend)
    log.warning("regroup: backend %r has no abort of a collective in flight: after an abort a rank "
                "waiting in one comes out at the collective timeout (%.0f s), or its abort watchdog "
                "restarts it (logged once)", backend, collective_s)


def resolve_backend(name: Optional[str]) -> str:
    """The backend to use: ``name``, or NCCL with CUDA, else gloo. Any backend torch.distributed
    knows is taken (``hccl`` once torch_npu is imported: it is imported here if need be).

    Raises:
        ConfigError: torch.distributed does not know the backend.
    """
    if name is None:
        return default_backend()
    if not isinstance(name, str) or not name:
        raise ConfigError(f"backend={name!r} must be the name of a torch.distributed backend")
    if not hasattr(dist.Backend, name.upper()) and name.lower() == "hccl":
        try:
            __import__("torch_npu")  # registers hccl with torch.distributed
        except ImportError:
            pass
    if not hasattr(dist.Backend, name.upper()):
        hint = " (install and import torch_npu for hccl)" if name.lower() == "hccl" else \
            " (register it with torch.distributed.Backend.register_backend first)"
        raise ConfigError(f"backend={name!r} is not known to torch.distributed{hint}")
    available = getattr(dist, f"is_{name.lower()}_available", None)  # gloo, nccl, mpi, ucc
    if available is not None and not available():
        raise ConfigError(f"backend={name!r}: this torch ({torch.__version__}) was built without it")
    return name


def backend_device(backend: str) -> torch.device:
    """Where a backend's tensors live: CUDA for NCCL, the NPU for hccl, else the CPU."""
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    npu = getattr(torch, "npu", None)
    if backend == "hccl" and npu is not None:
        return torch.device("npu", npu.current_device())
    return torch.device("cpu")


# -- builders of more groups (a framework's), run inside the noted window -------------------------

_builders: List[Tuple[str, Callable[[ProcessGroups], Any]]] = []
_teardowns: List[Tuple[str, Callable[[ProcessGroups], None]]] = []


def on_build(name: str, build: Callable[[ProcessGroups], Any],
             teardown: Optional[Callable[[ProcessGroups], None]] = None) -> None:
    """Runs ``build(groups)`` in every generation once the grid's groups are built, before the
    sockets are noted (so an abort shuts down the groups it makes too); what it returns is
    ``groups.extra[name]``. ``teardown(groups)`` runs when the generation's groups are destroyed,
    before the default group is. Registering a name again replaces it."""
    remove_builder(name)
    _builders.append((name, build))
    if teardown is not None:
        _teardowns.append((name, teardown))


def run_builders(groups: ProcessGroups) -> None:
    """Runs the builders of :func:`on_build` on a generation's groups (its grid is built)."""
    for name, build in list(_builders):
        groups.extra[name] = build(groups)


def remove_builder(name: str) -> None:
    _builders[:] = [(n, f) for n, f in _builders if n != name]
    _teardowns[:] = [(n, f) for n, f in _teardowns if n != name]


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


# Changes a built group's timeout: torch 2.x (``set_timeout``, or ``_set_pg_timeout`` before it);
# None on torch 1.13, whose groups keep the timeout they were built with.
_set_group_timeout: Optional[Callable[[datetime.timedelta, Any], None]] = \
    getattr(dist, "set_timeout", None) or getattr(dist.distributed_c10d, "_set_pg_timeout", None)


GLOO_CONNECT_ATTEMPTS = 5
"""How many of a group's timeouts gloo (torch 2.15) waits for one pair's connection before it gives
up: a peer frozen once it had published its address held its peers 20 s under a 4 s timeout, and
40 s under 8 s (``group_test.py``)."""


def formation_is_bounded() -> bool:
    """Whether :func:`build_groups` ends within its rendezvous bound whatever its peers do.

    gloo connects a group's pairs while the group is built, each under the group's timeout, and
    nothing ends that wait sooner: a peer that published its address and then died or froze
    (its node lost a moment after the generation started) leaves its peers waiting in torch's
    constructor, where no abort reaches them. With torch 2.x the groups are built under what is
    left of the rendezvous and get the collective timeout once built; torch 1.13 builds them
    under the collective timeout."""
    return _set_group_timeout is not None


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


# How often the store's host names the ranks that have not arrived while the others wait for
# them (TrainerFault.missing_ranks in proto/: the manager takes a report as current for twice this).
MISSING_REPORT_S = 0.5


def _all_arrived(store: Any, layout: Layout, deadline: float, aborted: threading.Event,
                 on_missing: Optional[Callable[[List[int]], None]] = None) -> None:
    """Waits, within the rendezvous, until every rank of the generation has reached its store:
    no group is built before (its construction holds the ranks where no abort reaches them, and
    with torch 2.x each group gets a share of the rendezvous, :func:`formation_is_bounded`, which a
    rank that arrives late, still leaving its previous step, must not use up). An abort ends the
    wait (it shuts the store's connections down).

    The store's host (rank 0) names, with ``on_missing``, the ranks that have not arrived, from
    :data:`MISSING_REPORT_S` on and every as long again while some are missing: a rank whose node
    died a moment after the generation was planned never comes, and its peers, waiting here, have
    no connection to it whose failure would tell anyone (the manager settles its pod's loss with
    this and its broken stream, docs/design.md "Timeouts").

    Raises:
        RuntimeError: a rank did not arrive in time, or the store's connection was shut down.
    """
    world_size = layout.world_size
    store.add(f"regroup/arrived/{layout.rank}", 1)
    if store.add("regroup/arrived", 1) == world_size:
        store.set("regroup/all-arrived", b"1")
    reporting = layout.rank == 0 and on_missing is not None and world_size > 1
    left = deadline - time.monotonic()
    first = min(left, MISSING_REPORT_S) if reporting else left
    try:
        store.wait(["regroup/all-arrived"], datetime.timedelta(seconds=max(0.001, first)))
        return
    except RuntimeError:
        if not reporting or time.monotonic() >= deadline:
            raise
    # Rank 0, half a second on: it polls the count (torch 2.x logs every wait that times out) and
    # names the missing ranks. Adding 0 reads a count without waiting for its key (torch 1.13's
    # store has no check()); a store shut down by an abort raises.
    report_at = 0.0
    while (arrived := store.add("regroup/arrived", 0)) < world_size:
        now = time.monotonic()
        if aborted.is_set():
            raise RuntimeError("aborted while waiting for the generation's ranks at its store")
        if now >= deadline:
            raise RuntimeError(f"{world_size - arrived} of the generation's {world_size} ranks did not "
                               f"reach its store within the rendezvous")
        if now >= report_at:
            missing = [r for r in range(world_size) if store.add(f"regroup/arrived/{r}", 0) == 0]
            if missing:
                on_missing(missing)
            report_at = now + MISSING_REPORT_S
        time.sleep(0.01)


def build_grid(groups: ProcessGroups, timeout: Callable[[], datetime.timedelta]) -> None:
    """Builds the grid's groups (the default group is up): every rank creates every group, in
    the same order (torch requires it); a rank keeps its own. ``timeout()``: each group's."""
    layout = groups.layout
    if layout.replica_size == 1:
        groups.dp_group = dist.group.WORLD
        return
    made: Dict[Tuple[int, ...], Any] = {}
    for kind, ranks in layout.all_groups():
        key = tuple(ranks)
        if key not in made:
            made[key] = dist.new_group(ranks, timeout=timeout(), backend=groups.backend)
        if ranks == layout.mine(kind):
            setattr(groups, f"{kind}_group", made[key])


def build_groups(*, store_host: str, store_port: int, layout: Layout, backend: str,
                 rendezvous_s: float, collective_s: float, aborted: threading.Event,
                 sockets: Optional[GroupSockets] = None,
                 on_missing: Optional[Callable[[List[int]], None]] = None) -> ProcessGroups:
    """Forms a generation's groups: store, default group, the grid's groups, and those of the
    builders registered with :func:`on_build`.

    Args:
        store_host, store_port: the generation's store (hosted by rank 0).
        layout: this rank's place.
        backend: a torch.distributed backend (see :func:`resolve_backend`).
        rendezvous_s: how long forming the groups may take; with torch 2.x also the bound of
            each group's connection to its peers (:func:`formation_is_bounded`).
        collective_s: the collectives' timeout (the groups' once built).
        aborted: set by an abort; a rank still connecting gives up.
        sockets: where to note the sockets (created here when None); the caller may hand it to
            the abort path before calling, so a rank stuck here can be freed.
        on_missing: on rank 0, the store's host, called with the ranks that have not reached the
            store while the others wait for them (:func:`_all_arrived`).

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
    collective = datetime.timedelta(seconds=collective_s)
    bounded = formation_is_bounded()

    def forming() -> datetime.timedelta:
        # A group is built under its share of what is left of the rendezvous (gloo waits up to
        # GLOO_CONNECT_ATTEMPTS of its timeouts for a pair), then given the collective timeout;
        # a torch that cannot change a group's timeout builds them under the latter.
        if not bounded:
            return collective
        return datetime.timedelta(seconds=max(0.1, (deadline - time.monotonic()) / GLOO_CONNECT_ATTEMPTS))

    try:
        # An abort that came before the store's connection existed shut nothing down, and
        # nothing would end the waits below for a peer that is gone (with torch 1.13, the
        # collective timeout): it is looked at here, once the connection exists, so that an abort
        # either is seen now or finds the connection to shut down.
        if aborted.is_set():
            raise RuntimeError("aborted while forming the generation's groups")
        if bounded:
            sockets.building_until = deadline
        _all_arrived(store, layout, deadline, aborted, on_missing)
        store.set_timeout(forming())
        dist.init_process_group(backend, store=store, rank=layout.rank,
                                world_size=layout.world_size, timeout=forming())
        groups = ProcessGroups(layout, backend, store, sockets)
        build_grid(groups, forming)
        if bounded:
            for g in [dist.group.WORLD] + groups.subgroups():
                _set_group_timeout(collective, g)
            sockets.building_until = None
        store.set_timeout(collective)
        run_builders(groups)
        sockets.end()
        return groups
    except BaseException:
        sockets.release()
        _destroy_default()
        raise
