"""The abort helper: shutting down a generation's own sockets unblocks a stuck gloo collective.

Two real processes in a real gloo group. Rank 1 stops taking part (frozen with SIGSTOP, or
killed); rank 0 is blocked in an all-reduce that would otherwise wait for the whole collective
timeout. Another thread of rank 0 calls GroupSockets.shutdown(), as the agent link thread does on
an abort, and rank 0 must come out at once; the store's listening socket and a socket of the
user's must be untouched.
"""

import json
import os
import signal
import socket
import sys
import threading
import time


from regroup.testing import PYTHON, free_port, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))


def _worker(rank: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from regroup.abort import GroupSockets
    from regroup.group import Layout, build_groups

    user_a, user_b = socket.socketpair()  # a socket of the user's: must survive the abort
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    sockets = GroupSockets(port)
    groups = build_groups(store_host="127.0.0.1", store_port=port, layout=Layout(2, rank, 1), backend="gloo",
                          rendezvous_s=60, collective_s=120, aborted=threading.Event(), sockets=sockets)
    t = torch.ones(1 << 16)
    dist.all_reduce(t)  # the group works
    if rank == 1:
        print("ready", flush=True)
        time.sleep(300)
        return
    timing = {}

    def abort_later():
        time.sleep(1.0)  # rank 0 is blocked by then (rank 1 was frozen or killed)
        timing["abort"] = time.monotonic()
        timing["count"] = sockets.shutdown()

    with open(out + ".ready", "w"):
        pass
    wait_for(lambda: os.path.exists(out + ".go"), 60, "the test to stop rank 1")
    threading.Thread(target=abort_later, daemon=True).start()
    error = ""
    try:
        dist.all_reduce(t)
    except RuntimeError as e:
        error = str(e)
    unblocked = time.monotonic()
    groups.store.set("after", "abort")  # rank 0 hosts the store: still serving
    user_a.sendall(b"x")
    result = {"latency_ms": (unblocked - timing.get("abort", unblocked)) * 1000, "error": error,
              "shut": timing.get("count"), "store": groups.store.get("after").decode(),
              "user": user_b.recv(1).decode(), "listener_open": listener.fileno() >= 0,
              "group_fds": sockets.fds}
    groups.destroy()
    with open(out, "w") as f:
        json.dump(result, f)


def _run(tmp_path, procs, how):
    port = free_port()
    out = str(tmp_path / "result.json")
    env = {"PYTHONPATH": os.path.dirname(HERE), "OMP_NUM_THREADS": "1"}
    r0 = procs.start([PYTHON, __file__, "0", str(port), out], env, log=tmp_path / "r0.log")
    r1 = procs.start([PYTHON, __file__, "1", str(port), out], env, log=tmp_path / "r1.log")
    wait_for(lambda: os.path.exists(out + ".ready") and b"ready" in (tmp_path / "r1.log").read_bytes(), 90,
             "both ranks to form the group")
    os.kill(r1.pid, how)
    open(out + ".go", "w").close()
    assert r0.wait(timeout=60) == 0, (tmp_path / "r0.log").read_text()[-2000:]
    with open(out) as f:
        return json.load(f)


def test_shutdown_unblocks_an_allreduce_whose_peer_is_frozen(tmp_path, procs):
    result = _run(tmp_path, procs, signal.SIGSTOP)
    print(f"abort -> unblocked: {result['latency_ms']:.2f} ms ({result['error'][:80]})")
    assert result["shut"] == 1 and len(result["group_fds"]) == 1  # one peer, one connection
    assert result["error"], "the all-reduce returned instead of failing"
    assert result["latency_ms"] < 100
    assert result["store"] == "abort" and result["user"] == "x" and result["listener_open"]


def test_shutdown_unblocks_an_allreduce_whose_peer_died(tmp_path, procs):
    result = _run(tmp_path, procs, signal.SIGKILL)
    assert result["error"]
    assert result["latency_ms"] < 100


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(HERE))
    _worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
