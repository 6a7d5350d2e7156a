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
        return len(os.listdir("/proc/self/fd")), len(os.listdir("/proc/self/task"))

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
        assert result["fds"][1] == result["fds"][0], result
        assert result["threads"][1] == result["threads"][0], result


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(HERE))
    _worker(int(sys.argv[1]), sys.argv[2])
