# SPDX-License-Identifier: Apache-2.0
"""A generation's process groups: layout, and 200 rebuilds leave descriptors and threads flat."""

import json
import os
import sys
import threading
import time

import pytest

from regroup.api import ConfigError
from regroup.group import Layout
from regroup.testing import PYTHON

HERE = os.path.dirname(os.path.abspath(__file__))
REBUILDS = 200


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
    import socket

    import torch
    import torch.distributed as dist

    from regroup.abort import GroupSockets
    from regroup.group import build_groups

    side = dist.FileStore(os.path.join(directory, "side"), 2)  # to agree on each generation's port

    def count():
        # The fewest over 0.2 s: a descriptor torch 2.x closes a moment after a destroy (seen on
        # the store client's side, once in a few runs) is not a leak; a leak grows every rebuild.
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


def test_descriptors_and_threads_stay_flat_over_200_rebuilds(tmp_path, procs):
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
        # abort (every tenth rebuild here). A leak per rebuild would be 190.
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
                         backend="gloo", rendezvous_s=30, collective_s=1, aborted=threading.Event())
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


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(HERE))
    if sys.argv[1] == "after-failure":
        _after_a_failed_generation(int(sys.argv[2]), sys.argv[3])
    else:
        _worker(int(sys.argv[1]), sys.argv[2])
