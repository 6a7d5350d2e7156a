# SPDX-License-Identifier: Apache-2.0
"""A generation's process groups: layout, and 100 rebuilds leave descriptors and threads flat."""

import json
import os
import sys
import threading
import time

import pytest

from regroup.api import ConfigError
from regroup.group import Layout
from regroup.testing import PYTHON, free_port

HERE = os.path.dirname(os.path.abspath(__file__))
REBUILDS = 100


def test_layout_numbers_replicas_as_the_manager_does():
    layout = Layout(world_size=8, rank=5, replica_size=2)
    assert (layout.dp, layout.replica, layout.position) == (4, 2, 1)
    assert layout.replica_ranks(2) == [4, 5]
    assert layout.position_ranks(1) == [1, 3, 5, 7]
    with pytest.raises(ConfigError, match="cannot hold replicas"):
        Layout(world_size=6, rank=0, replica_size=4)
    with pytest.raises(ConfigError, match="outside"):
        Layout(world_size=2, rank=2, replica_size=1)


def _worker(rank: int, directory: str) -> None:
    import gc
    import socket

    import torch
    import torch.distributed as dist

    from regroup.abort import GroupSockets
    from regroup.group import build_groups

    side = dist.FileStore(os.path.join(directory, "side"), 2)  # to agree on each generation's port

    def count():
        # The fewest over 0.2 s: a descriptor torch 2.x closes a moment after a destroy (seen on
        # the store client's side, once in a few runs) is not a leak; a leak grows every rebuild.
        # Nor is what a collection frees: a store connection retried (a timed-out attempt, 2 in
        # 80 rebuilds with torch 2.15) leaves a reference cycle that holds a group's descriptors
        # and threads until the collector runs.
        gc.collect()
        samples = []
        for _ in range(20):
            samples.append((len(os.listdir("/proc/self/fd")), len(os.listdir("/proc/self/task"))))
            time.sleep(0.01)
        return min(f for f, _ in samples), min(t for _, t in samples)

    seen = {}
    started = time.monotonic()
    for i in range(REBUILDS):
        if rank == 0:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            side.set(f"port{i}", str(port))
        else:
            port = int(side.get(f"port{i}"))
        sockets = GroupSockets(port)
        groups = build_groups(store_host="127.0.0.1", store_port=port, layout=Layout(2, rank, 1),
                              backend="gloo", rendezvous_s=60, collective_s=60,
                              aborted=threading.Event(), sockets=sockets)
        t = torch.ones(8)
        dist.all_reduce(t)
        assert t[0].item() == 2
        if i % 10 == 5:
            sockets.shutdown()  # an abort, as the agent link thread does it
        groups.destroy()
        side.add(f"done{i}", 1)
        while int(side.add(f"done{i}", 0)) < 2:  # both destroyed before the next port is picked
            time.sleep(0.001)
        if i in (9, REBUILDS - 1):
            seen[i] = count()
    with open(os.path.join(directory, f"result{rank}.json"), "w") as f:
        json.dump({"fds": [seen[9][0], seen[REBUILDS - 1][0]], "threads": [seen[9][1], seen[REBUILDS - 1][1]],
                   "per_rebuild_ms": (time.monotonic() - started) * 1000 / REBUILDS}, f)


def test_descriptors_and_threads_stay_flat_over_100_rebuilds(tmp_path, procs):
    env = {"PYTHONPATH": os.path.dirname(HERE), "OMP_NUM_THREADS": "1"}
    workers = [procs.start([PYTHON, __file__, str(r), str(tmp_path)], env, log=tmp_path / f"r{r}.log")
               for r in range(2)]
    for r, w in enumerate(workers):
        assert w.wait(timeout=400) == 0, (tmp_path / f"r{r}.log").read_text()[-3000:]
    for r in range(2):
        with open(tmp_path / f"result{r}.json") as f:
            result = json.load(f)
        print(f"rank {r}: fds {result['fds']}, threads {result['threads']}, "
              f"{result['per_rebuild_ms']:.1f} ms per rebuild")
        # torch 2.x keeps the process group of a collective left behind by an abort (parked, see
        # abort.park) and with it one connection, already shut down: at most one descriptor per
        # abort (every tenth rebuild here). A leak per rebuild would be 90.
        import torch

        aborts = sum(1 for i in range(10, REBUILDS) if i % 10 == 5)
        allowed = 0 if torch.__version__.startswith("1.") else aborts
        assert 0 <= result["fds"][1] - result["fds"][0] <= allowed, (result, f"at most {allowed}")
        assert result["threads"][1] == result["threads"][0], result


def _after_a_failed_generation(rank: int, directory: str) -> None:
    """Rank 0 first fails to form a generation inside torch's init_process_group (its peer
    never comes), then forms the next one with a fresh rank 1, which never saw the failure."""
    import torch
    import torch.distributed as dist

    from regroup.group import build_groups
    from regroup.testing import free_port

    side = dist.FileStore(os.path.join(directory, "side"), 2)
    if rank == 0:
        try:
            build_groups(store_host="127.0.0.1", store_port=free_port(), layout=Layout(2, 0, 1),
                         backend="gloo", rendezvous_s=2, collective_s=1, aborted=threading.Event())
            raise SystemExit("a generation without its peer was formed")
        except RuntimeError as e:
            print(f"the first generation failed as it should: {e}", flush=True)
        port = free_port()
        side.set("port", str(port))
    else:
        port = int(side.get("port"))
    groups = build_groups(store_host="127.0.0.1", store_port=port, layout=Layout(2, rank, 1),
                          backend="gloo", rendezvous_s=30, collective_s=20, aborted=threading.Event())
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t[0].item() == 2
    groups.destroy()


def test_a_rank_that_failed_to_form_a_generation_forms_the_next_with_fresh_ranks(tmp_path, procs):
    """torch names each new group by a counter that only a successful destroy resets. A group
    that failed half-built (a rendezvous that timed out, or broke) left it raised: the rank's
    next default group got a name its fresh peers did not use, and both waited for each other's
    keys for good. Seen in e2e: a rank restarted in place waited forever for the survivors."""
    env = {"PYTHONPATH": os.path.dirname(HERE), "OMP_NUM_THREADS": "1"}
    workers = [procs.start([PYTHON, __file__, "after-failure", str(r), str(tmp_path)], env,
                           log=tmp_path / f"r{r}.log") for r in range(2)]
    for r, w in enumerate(workers):
        assert w.wait(timeout=120) == 0, (tmp_path / f"r{r}.log").read_text()[-3000:]


def _forming_with_a_peer_lost(rank: int, directory: str, how: str) -> None:
    """Three ranks form a generation; rank 1 is lost (``how``: killed, or frozen as a node cut
    off) the moment it has published its address, before it connects to anyone. Ranks 0 (the
    store's host) and 2 get an abort a second later, as the manager sends it; each writes
    whether and when it left the rendezvous."""
    import signal

    import torch.distributed as dist

    from regroup import group as regroup_group
    from regroup.abort import GroupSockets
    from regroup.testing import free_port

    side = dist.FileStore(os.path.join(directory, "side"), 3)
    if rank == 0:
        port = free_port()
        side.set("port", str(port))
    else:
        port = int(side.get("port"))
    if rank == 1:
        connect_store = regroup_group._connect_store

        class LostOnceItPublishes(dist.Store):
            """The generation's store, through which this rank is lost at its first set inside
            init_process_group: gloo's address of this rank."""

            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def set(self, key, value):
                self.inner.set(key, value)
                if forming[0]:
                    os.kill(os.getpid(), signal.SIGKILL if how == "killed" else signal.SIGSTOP)

            def get(self, key):
                return self.inner.get(key)

            def add(self, key, n):
                return self.inner.add(key, n)

            def wait(self, keys, timeout=None):
                return self.inner.wait(keys) if timeout is None else self.inner.wait(keys, timeout)

            def check(self, keys):
                return self.inner.check(keys)

            def set_timeout(self, timeout):
                return self.inner.set_timeout(timeout)

        forming = [False]
        init = dist.init_process_group

        def init_then_lost(*args, **kwargs):
            forming[0] = True
            return init(*args, **kwargs)

        regroup_group._connect_store = lambda *args: LostOnceItPublishes(connect_store(*args))
        regroup_group.dist.init_process_group = init_then_lost
    sockets = GroupSockets(port)
    aborted = threading.Event()
    if rank != 1:
        def abort() -> None:
            time.sleep(RENDEZVOUS_S / 4)
            sockets.shutdown(include_store=True)  # what the abort does (regroup.dispatch)
            aborted.set()

        threading.Thread(target=abort, daemon=True).start()
    started = time.monotonic()
    result = {"left": "formed"}
    try:
        regroup_group.build_groups(store_host="127.0.0.1", store_port=port, layout=Layout(3, rank, 1),
                                   backend="gloo", rendezvous_s=RENDEZVOUS_S, collective_s=600,
                                   aborted=aborted, sockets=sockets)
    except RuntimeError as e:
        result["left"] = f"raised: {e}"[:300]
    result["after_s"] = time.monotonic() - started
    with open(os.path.join(directory, f"result{rank}.json"), "w") as f:
        json.dump(result, f)
    os._exit(0)  # not through torch's teardown of a half-built group


RENDEZVOUS_S = 4.0


@pytest.mark.parametrize("how", ["killed", "frozen"])
def test_a_peer_lost_while_the_groups_are_built_holds_no_rank_past_the_rendezvous(tmp_path, procs, how):
    """Found by scenario 40 under CI's load: a node killed 36 ms after a generation started.
    Its ranks had published their gloo addresses and died before connecting; the survivors
    waited in torch's group constructor for connections that never came, under the collective
    timeout, where no abort reaches (the store's sockets shut down free only a wait on the
    store). Their abort watchdog then exited them, every copy of the state went with them, and
    the job stopped. Now the groups are built under the rendezvous bound (then given the
    collective timeout): the survivors leave by then, state intact."""
    from regroup.group import formation_is_bounded

    if not formation_is_bounded():
        pytest.skip("torch 1.13 cannot change a group's timeout once built: its groups are built under "
                    "the collective timeout")
    env = {"PYTHONPATH": os.path.dirname(HERE), "OMP_NUM_THREADS": "1"}
    workers = [procs.start([PYTHON, __file__, "peer-lost", str(r), str(tmp_path), how], env,
                           log=tmp_path / f"r{r}.log") for r in range(3)]
    for r in (0, 2):
        # Left at all is the claim: under the collective timeout the wait would last 600 s x 5.
        # (Formed is fair too: a pair whose connection the lost rank's kernel accepted before it
        # died; its first collective then fails at once and names the peer.)
        assert workers[r].wait(timeout=60) == 0, (tmp_path / f"r{r}.log").read_text()[-3000:]
        with open(tmp_path / f"result{r}.json") as f:
            print(f"rank {r}: {json.load(f)}")


def test_an_abort_while_the_groups_are_built_leaves_the_rank_until_the_rendezvous_bound():
    """The abort watchdog of a rank building its groups under a bound waits for that bound (the
    rank comes out by itself then, holding its state); otherwise it keeps ``abort_exit``."""
    import types

    from regroup._proto import wire_pb2 as pb
    from regroup.abort import GroupSockets
    from regroup.api import Timeouts
    from regroup.dispatch import FORMING_GRACE_S, on_urgent
    from regroup.membership import Membership

    armed = []
    for building_s in (None, 30.0):
        m = Membership()
        sockets = GroupSockets(free_port())
        m.begin((1, 1), sockets)
        if building_s is not None:
            sockets.building_until = time.monotonic() + building_s
        t = types.SimpleNamespace(membership=m, busy=True, metrics={"aborts": 0},
                                  config=types.SimpleNamespace(timeouts=Timeouts()),
                                  watchdog=types.SimpleNamespace(arm=lambda s, code, why: armed.append(s)))
        on_urgent(t, pb.AgentReply(abort=pb.AbortGeneration(epoch=1, generation=1, reason="pod lost")))
    assert armed[0] == Timeouts().abort_exit, armed
    assert 30.0 < armed[1] <= 30.0 + FORMING_GRACE_S, armed


def test_an_abort_that_came_before_the_store_existed_ends_the_forming_at_once():
    """An abort that came while this rank was still leaving its previous step (before its
    connection to the new generation's store existed) shut nothing down; the rank hosting the
    store then waited in torch's init_process_group for a peer that was gone: on torch 1.13 up to
    the collective timeout (issue 37: a pod lost a moment after a generation started stopped the
    demo's job). The abort is looked at once the connection exists."""
    import torch.distributed as dist

    from regroup.group import build_groups

    aborted = threading.Event()
    aborted.set()
    with pytest.raises(RuntimeError, match="aborted while forming the generation's groups"):
        build_groups(store_host="127.0.0.1", store_port=free_port(), layout=Layout(2, 0, 1),
                     backend="gloo", rendezvous_s=3, collective_s=3, aborted=aborted)
    assert not dist.is_initialized()


def test_the_stores_host_names_the_ranks_that_have_not_arrived_until_they_come():
    """Rank 0, the store's host, names every half second the ranks of the generation that have not
    reached its store (a node that died a moment after the plan never comes, and no connection of
    the waiting ranks to it fails to say so); a rank that comes late ends the wait, and an abort
    or the rendezvous bound ends it too."""
    import datetime

    import torch.distributed as dist

    from regroup.group import MISSING_REPORT_S, _all_arrived

    for how in ("comes late", "never comes", "aborted"):
        port = free_port()
        host = dist.TCPStore("127.0.0.1", port, 4, True, timeout=datetime.timedelta(seconds=10),
                             wait_for_workers=False)
        aborted = threading.Event()
        named = []
        started = time.monotonic()

        def arrive(rank):  # a rank of its own, with its own connection to the store
            peer = dist.TCPStore("127.0.0.1", port, 4, False, timeout=datetime.timedelta(seconds=10))
            _all_arrived(peer, Layout(4, rank, 1), started + 10, threading.Event())

        def missing(ranks):
            named.append((round(time.monotonic() - started, 2), ranks))
            if how == "comes late" and len(named) == 2:
                arrivals.append(threading.Thread(target=arrive, args=(3,)))
                arrivals[-1].start()
            if how == "aborted" and len(named) == 2:
                aborted.set()

        arrivals = [threading.Thread(target=arrive, args=(r,)) for r in (1, 2)]
        for a in arrivals:
            a.start()
        bound = started + (3 if how == "never comes" else 10)
        if how == "comes late":
            _all_arrived(host, Layout(4, 0, 1), bound, aborted, missing)
        else:
            with pytest.raises(RuntimeError, match="aborted while waiting" if how == "aborted"
                               else "1 of the generation's 4 ranks did not reach its store"):
                _all_arrived(host, Layout(4, 0, 1), bound, aborted, missing)
            arrive(3)  # frees the others
        for a in arrivals:
            a.join(timeout=10)
            assert not a.is_alive()
        print(how, named)
        assert named and all(ranks == [3] for _, ranks in named), named
        # Not before half a second, nor more often than every half second (times rounded to 10
        # ms); how late a report comes on a loaded machine is not asserted.
        assert named[0][0] >= MISSING_REPORT_S - 0.01, named
        assert all(b - a >= MISSING_REPORT_S - 0.01 for (a, _), (b, _) in zip(named, named[1:])), named
        if how == "never comes":    # until the bound, 3 s: at most 5, from 0.5 s on
            assert 2 <= len(named) <= 5, named
        elif how == "aborted":      # the abort, set as the second report was made, ends the wait
            assert len(named) == 2, named
        else:                       # named until rank 3, started at the second report, arrives
            assert len(named) >= 2, named
        del host


def _formed_under_a_short_rendezvous(rank: int, directory: str) -> None:
    import torch
    import torch.distributed as dist

    from regroup.group import build_groups
    from regroup.testing import free_port

    side = dist.FileStore(os.path.join(directory, "side"), 2)
    if rank == 0:
        side.set("port", str(free_port()))
    port = int(side.get("port"))
    groups = build_groups(store_host="127.0.0.1", store_port=port, layout=Layout(2, rank, 1),
                          backend="gloo", rendezvous_s=3,
                          collective_s=60, aborted=threading.Event())
    if rank == 1:
        time.sleep(6)  # past the rendezvous bound: the group waits under the collective timeout
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t[0].item() == 2
    groups.destroy()


def test_groups_built_under_the_rendezvous_bound_then_wait_the_collective_timeout(tmp_path, procs):
    env = {"PYTHONPATH": os.path.dirname(HERE), "OMP_NUM_THREADS": "1"}
    workers = [procs.start([PYTHON, __file__, "short-rendezvous", str(r), str(tmp_path)], env,
                           log=tmp_path / f"r{r}.log") for r in range(2)]
    for r, w in enumerate(workers):
        assert w.wait(timeout=120) == 0, (tmp_path / f"r{r}.log").read_text()[-3000:]


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(HERE))
    if sys.argv[1] == "after-failure":
        _after_a_failed_generation(int(sys.argv[2]), sys.argv[3])
    elif sys.argv[1] == "peer-lost":
        _forming_with_a_peer_lost(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    elif sys.argv[1] == "short-rendezvous":
        _formed_under_a_short_rendezvous(int(sys.argv[2]), sys.argv[3])
    else:
        _worker(int(sys.argv[1]), sys.argv[2])
