# SPDX-License-Identifier: Apache-2.0
"""The abort helper: shutting down a generation's own sockets unblocks a stuck gloo collective.

Two real processes in a real gloo group. Rank 1 stops taking part (frozen with SIGSTOP, or alive
and busy elsewhere, never entering the collective); rank 0 is blocked in an all-reduce that would
otherwise wait for the whole collective timeout (120 s). Another thread of rank 0 calls
GroupSockets.shutdown(), as the agent link thread does on an abort, and rank 0 must come out at
once; the store's listening socket and a socket of the user's must be untouched. (A killed peer
is no such case: its connections close and gloo fails the all-reduce without any abort.)
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest


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
    returned = threading.Event()

    def abort_later():
        time.sleep(1.0)  # rank 0 is blocked by then (rank 1 is frozen or elsewhere)
        timing["blocked"] = not returned.is_set()
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
    returned.set()
    groups.store.set("after", "abort")  # rank 0 hosts the store: still serving
    user_a.sendall(b"x")
    result = {"latency_ms": (unblocked - timing.get("abort", unblocked)) * 1000, "error": error,
              "shut": timing.get("count"), "blocked_at_abort": timing.get("blocked"),
              "store": groups.store.get("after").decode(),
              "user": user_b.recv(1).decode(), "listener_open": listener.fileno() >= 0,
              "group_fds": sockets.fds}
    groups.destroy()
    with open(out, "w") as f:
        json.dump(result, f)


def _run(tmp_path, procs, how=None):
    """Forms the group, stops rank 1 with signal `how` (None: leaves it running, outside the
    all-reduce), and returns what rank 0 saw of the abort."""
    port = free_port()
    out = str(tmp_path / "result.json")
    env = {"PYTHONPATH": os.path.dirname(HERE), "OMP_NUM_THREADS": "1"}
    r0 = procs.start([PYTHON, __file__, "0", str(port), out], env, log=tmp_path / "r0.log")
    r1 = procs.start([PYTHON, __file__, "1", str(port), out], env, log=tmp_path / "r1.log")
    wait_for(lambda: os.path.exists(out + ".ready") and b"ready" in (tmp_path / "r1.log").read_bytes(), 90,
             "both ranks to form the group")
    if how is not None:
        os.kill(r1.pid, how)
    open(out + ".go", "w").close()
    try:
        code = r0.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("rank 0 was still in the all-reduce 59 s after the abort")
    assert code == 0, (tmp_path / "r0.log").read_text()[-2000:]
    with open(out) as f:
        return json.load(f)


def _assert_the_abort_unblocked_it(result):
    print(f"abort -> unblocked: {result['latency_ms']:.2f} ms ({result['error'][:80]})")
    assert result["blocked_at_abort"] is True, "the all-reduce ended before the abort: nothing to unblock"
    assert result["error"], "the all-reduce returned instead of failing"
    # Well within the collective timeout (120 s); the latency itself is a figure to print, not a
    # bound to assert (it read 100.6 ms once under CI's load).
    assert 0 <= result["latency_ms"] < 10_000, result
    assert result["shut"] == 1 and len(result["group_fds"]) == 1  # one peer, one connection
    assert result["store"] == "abort" and result["user"] == "x" and result["listener_open"]


def test_shutdown_unblocks_an_allreduce_whose_peer_is_frozen(tmp_path, procs):
    _assert_the_abort_unblocked_it(_run(tmp_path, procs, signal.SIGSTOP))


def test_shutdown_unblocks_an_allreduce_that_a_live_peer_never_enters(tmp_path, procs):
    # A stalled step: rank 1 runs and its connections stay open, so nothing fails on its own.
    _assert_the_abort_unblocked_it(_run(tmp_path, procs))


# -- gloo's lost wake-up: a send already in the pair's transmit queue is never woken --------------


def _stuck_send_worker(rank: int, port: int, out: str) -> None:
    """Rank 1 posts a receive and is frozen by the test; rank 0 then sends 64 MB, which stays
    half-written in gloo's transmit queue. An abort shuts the group's one socket down: gloo
    closes the pair but never wakes the send's waiter (it would sleep until the collective
    timeout); GroupSockets.call must leave it at once, and the group is released (its threads
    joined) once gloo gives up."""
    import torch
    import torch.distributed as dist

    from regroup import abort
    from regroup.group import Layout, build_groups

    torch.set_num_threads(1)
    sockets = abort.GroupSockets(port)
    groups = build_groups(store_host="127.0.0.1", store_port=port, layout=Layout(2, rank, 1), backend="gloo",
                          rendezvous_s=60, collective_s=20, aborted=threading.Event(), sockets=sockets)
    n = 16 << 20
    if rank == 1:
        buf = torch.empty(n)
        dist.irecv(buf, src=0)  # its receive-ready notice reaches rank 0
        groups.store.set("posted", "1")
        print("ready", flush=True)
        time.sleep(300)
        return
    groups.store.get("posted")
    threads_before = len(os.listdir("/proc/self/task"))  # gloo's threads included
    with open(out + ".ready", "w"):
        pass
    wait_for(lambda: os.path.exists(out + ".go"), 60, "the test to freeze rank 1")

    def abort_later():
        time.sleep(1.0)  # rank 0's send is stuck by then: rank 1 reads nothing
        sockets.shutdown()

    threading.Thread(target=abort_later, daemon=True).start()
    error = ""
    try:
        sockets.call(dist.send, torch.ones(n), 1, what="a send")
    except RuntimeError as e:
        error = f"{type(e).__name__}: {e}"
    left = len(sockets.left)
    groups.destroy()  # must not wait for the send left in gloo: parked instead
    parked_after_destroy = abort.parked()
    # gloo gives up on the send at its timeout (20 s); then the reaper drops the groups
    wait_for(lambda: abort.parked() == 0, 90, "the parked group to be released")
    wait_for(lambda: len(os.listdir("/proc/self/task")) <= threads_before, 30, "gloo's threads to end")
    with open(out, "w") as f:
        json.dump({"error": error, "left": left, "parked": parked_after_destroy,
                   "threads": [threads_before, len(os.listdir("/proc/self/task"))]}, f)


def test_a_send_stuck_in_gloos_transmit_queue_is_left_at_once(tmp_path, procs):
    port = free_port()
    out = str(tmp_path / "result.json")
    env = {"PYTHONPATH": os.path.dirname(HERE), "OMP_NUM_THREADS": "1"}
    r0 = procs.start([PYTHON, __file__, "stuck", "0", str(port), out], env, log=tmp_path / "r0.log")
    r1 = procs.start([PYTHON, __file__, "stuck", "1", str(port), out], env, log=tmp_path / "r1.log")
    wait_for(lambda: os.path.exists(out + ".ready") and b"ready" in (tmp_path / "r1.log").read_bytes(), 90,
             "both ranks to form the group")
    os.kill(r1.pid, signal.SIGSTOP)
    open(out + ".go", "w").close()
    assert r0.wait(timeout=150) == 0, (tmp_path / "r0.log").read_text()[-2000:]
    with open(out) as f:
        result = json.load(f)
    print(result)
    assert result["error"].startswith("Abandoned"), result  # not gloo's timeout
    assert result["left"] == 1 and result["parked"] == 1


# -- the waits themselves, with stand-in works ------------------------------------------------


class _Work:
    """A stand-in for a torch Work: a future completed by the test."""

    def __init__(self):
        import torch

        self.fut = torch.futures.Future()

    def get_future(self):
        return self.fut

    def is_completed(self):
        return self.fut.done()


def _in_thread(fn):
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def test_wait_returns_the_result_or_leaves_on_an_abort():
    from regroup.abort import Abandoned, GroupSockets

    s = GroupSockets(0)
    s.begin()
    done = _Work()
    done.fut.set_result([1])
    s.wait(done)  # completed: returns
    failed = _Work()
    failed.fut.set_exception(RuntimeError("peer closed"))
    try:
        s.wait(failed)
        raise AssertionError("the collective's error was not raised")
    except RuntimeError as e:
        assert "peer closed" in str(e) and not isinstance(e, Abandoned)
    stuck = _Work()
    t, box = _in_thread(lambda: s.wait(stuck))
    wait_for(lambda: s._on_abort, 30, "the waiter to register")
    s.shutdown()
    t.join(timeout=30)
    assert isinstance(box.get("error"), Abandoned), box
    assert len(s.left) == 1 and not s.left[0]()
    stuck.fut.set_result([1])
    assert s.left[0]()
    late = _Work()  # after the abort: left at once
    try:
        s.wait(late)
        raise AssertionError("a wait after the abort did not leave")
    except Abandoned:
        pass
    s.release()


def test_call_and_future_leave_on_an_abort():
    import torch

    from regroup.abort import Abandoned, GroupSockets

    s = GroupSockets(0)
    s.begin()
    assert s.call(lambda a, b: a + b, 2, 3) == 5
    gate = threading.Event()
    t, box = _in_thread(lambda: s.call(gate.wait, 60))
    wait_for(lambda: s._on_abort, 30, "the waiter to register")
    work = _Work()
    fut = s.future(work, lambda t: t * 2)
    s.shutdown()
    t.join(timeout=30)
    assert isinstance(box.get("error"), Abandoned), box
    try:
        fut.wait()
        raise AssertionError("the hook's future did not fail")
    except RuntimeError as e:
        assert "aborted" in str(e)
    assert len(s.left) == 2 and not any(check() for check in s.left)
    gate.set()  # the helper thread's call ends
    work.fut.set_result([torch.ones(1)])  # the hook's collective ends; its future stays failed
    wait_for(lambda: all(check() for check in s.left), 30, "the calls left behind to end")
    s2 = GroupSockets(0)
    s2.begin()
    work = _Work()
    fut = s2.future(work, lambda t: t * 2)
    work.fut.set_result([torch.ones(1)])
    assert fut.wait().item() == 2
    s.release()
    s2.release()


def test_parked_objects_are_dropped_once_their_collective_ends():
    import weakref

    from regroup import abort

    class Thing:
        pass

    thing = Thing()
    ref = weakref.ref(thing)
    ended = threading.Event()
    abort.park([thing], [ended.is_set], 60)
    del thing
    assert ref() is not None and abort.parked() >= 1
    ended.set()
    wait_for(lambda: ref() is None, 30, "the parked object to be dropped")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(HERE))
    if sys.argv[1] == "stuck":
        _stuck_send_worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    else:
        _worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])


# A store client whose server dies: its polling thread (torch 1.13) must not keep a core busy.
STORE_CLIENT = r"""
import os, signal, subprocess, sys, time
import torch.distributed as dist
from regroup.abort import GroupSockets
port, quiet = int(sys.argv[1]), sys.argv[2] == "quiet"
server = subprocess.Popen([sys.executable, "-c",
    "import sys, time, torch.distributed as d; s = d.TCPStore('127.0.0.1', %d, 2, True, wait_for_workers=False); "
    "print('up', flush=True); time.sleep(600)" % port], stdout=subprocess.PIPE, text=True)
assert server.stdout.readline().strip() == "up"
sockets = GroupSockets(port)
sockets.begin()
store = dist.TCPStore("127.0.0.1", port, 2, False)
sockets.note_store(is_master=False)
sockets.end()
server.kill()
server.wait()
time.sleep(0.3)  # the client's thread spins from here (torch 1.13)
if quiet:
    assert sockets.quiet_store()
time.sleep(0.1)
began = time.process_time()
time.sleep(1.0)
spent = time.process_time() - began
del store  # the destructor still ends (and joins) what is left of the client
print(spent)
"""


def _store_client_cpu(quiet: bool) -> float:
    # On a busy machine torch 1.13's client thread often throws instead of spinning when its
    # server dies ("Connection reset by peer": the killed server had not read the client's last
    # request, so the kernel resets the connection; std::terminate, SIGABRT), with or without
    # quiet_store (3 of 24 runs next to two busy loops, most runs with a test suite beside
    # them): such a run measures nothing, and the next one may.
    for _ in range(10):
        done = subprocess.run([PYTHON, "-c", STORE_CLIENT, str(free_port()), "quiet" if quiet else "plain"],
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(__file__))})
        if not (done.returncode == -signal.SIGABRT and "Connection reset by peer" in done.stderr):
            break
    else:
        pytest.skip("torch's store client thread threw on a reset connection in 10 runs out of 10 "
                    "(a busy machine): nothing was measured")
    assert done.returncode == 0, done.stderr
    return float(done.stdout.strip().splitlines()[-1])


def test_a_quieted_store_client_sleeps_once_its_server_is_gone():
    spinning = _store_client_cpu(quiet=False)
    if spinning < 0.3:
        pytest.skip(f"this torch's store client does not spin on a dead server ({spinning:.2f} s of "
                    "CPU in 1 s): nothing to quiet")
    quiet = _store_client_cpu(quiet=True)
    assert quiet < 0.1, f"{quiet:.2f} s of CPU in 1 s after quiet_store (unquieted: {spinning:.2f} s)"


def _connected_pair(peer_host: str = "127.0.0.1"):
    """Two ends of one TCP connection on loopback; the second's address is ``peer_host``."""
    listener = socket.create_server((peer_host, 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    return client, server


def test_a_peer_whose_process_is_gone_is_told_at_once_and_once():
    """PeerWatch: the peer's end closing (its process died: its kernel closed its sockets) is
    told once per peer host, without reading the connection, while data waiting tells nothing;
    the training thread is nowhere near a collective meanwhile. Each check waits for a later
    close to be told, so that what was not told by then never will be."""
    from regroup.abort import PeerWatch

    a, peer_a = _connected_pair()
    b, peer_b = _connected_pair()
    c, peer_c = _connected_pair("127.0.0.2")
    d, peer_d = _connected_pair("127.0.0.3")
    told = []
    changed = threading.Condition()

    def closed(host):
        with changed:
            told.append(host)
            changed.notify_all()

    def wait_told(count):
        with changed:
            assert changed.wait_for(lambda: len(told) >= count, 10), f"told only {told}"

    watch = PeerWatch([a.fileno(), b.fileno(), c.fileno(), d.fileno()], closed)
    try:
        peer_a.sendall(b"unread")  # data waiting is not a closed peer
        peer_c.close()
        wait_told(1)
        assert told == ["127.0.0.2"]
        peer_a.close()
        wait_told(2)
        peer_b.close()  # the same host as a's: told once
        peer_d.close()
        wait_told(3)
        assert told == ["127.0.0.2", "127.0.0.1", "127.0.0.3"]
        assert a.recv(16) == b"unread", "the watch read nothing"
    finally:
        watch.stop()
        for s in (a, b, c, d, peer_d):
            s.close()


def test_a_peer_watch_stops_at_once_and_over_nothing():
    from regroup.abort import PeerWatch

    for fds in ([], None):
        if fds is None:
            a, peer = _connected_pair()
            fds = [a.fileno()]
        watch = PeerWatch(fds, lambda host: None)
        watch.stop()
        assert not watch._thread.is_alive()


def test_torchs_own_all_reduce_and_batched_sends_leave_on_an_abort_once_turned_on():
    """Code that calls torch.distributed.all_reduce or batch_isend_irecv itself (Megatron-core's
    tensor-parallel layers, its pipeline schedule) leaves them on an abort once regroup.megatron
    turns this on, blocking or not; outside a generation, or on another backend, torch's call
    runs as it was asked."""
    import torch
    import torch.distributed as dist

    from regroup import abort
    from regroup.abort import Abandoned, GroupSockets, LeavableWork

    calls = []
    stuck = _Work()

    def torchs(tensor, op=None, group=None, async_op=False):
        calls.append((op, group, async_op))
        return stuck

    class P2PWork:   # a send or receive's handle: no future, a blocking wait
        def __init__(self):
            self.gate = threading.Event()

        def wait(self):
            self.gate.wait(60)
            return True

    p2p = P2PWork()

    def torchs_batch(ops):
        return [p2p for _ in ops]

    backend = {"now": "gloo"}
    original, original_batch = dist.all_reduce, dist.batch_isend_irecv
    dist.all_reduce, dist.batch_isend_irecv = torchs, torchs_batch
    try:
        abort.leave_torch_collectives_on_abort(lambda group: backend["now"])
        abort.leave_torch_collectives_on_abort(lambda group: backend["now"])   # idempotent
        assert dist.all_reduce.regroup_original is torchs
        assert dist.batch_isend_irecv.regroup_original is torchs_batch
        assert dist.all_reduce(torch.ones(1)) is stuck and calls[-1][2] is False   # no generation
        op = SimpleNamespace(group="g")
        assert dist.batch_isend_irecv([op]) == [p2p]
        s = GroupSockets(0)
        s.begin()
        backend["now"] = "nccl"
        assert dist.all_reduce(torch.ones(1), group="g") is stuck and calls[-1] == (dist.ReduceOp.SUM, "g", False)
        backend["now"] = "gloo"
        t, box = _in_thread(lambda: dist.all_reduce(torch.ones(1), group="g"))       # blocking
        wait_for(lambda: s._on_abort, 30, "the waiter to register")
        assert calls[-1][2] is True          # asked of torch asynchronously, waited for here
        handle = dist.all_reduce(torch.ones(1), group="g", async_op=True)
        assert isinstance(handle, LeavableWork) and not handle.is_completed()
        t2, box2 = _in_thread(handle.wait)
        wait_for(lambda: len(s._on_abort) == 2, 30, "the second waiter to register")
        (recv,) = dist.batch_isend_irecv([op])
        assert isinstance(recv, LeavableWork)
        t3, box3 = _in_thread(recv.wait)
        wait_for(lambda: len(s._on_abort) == 3, 30, "the receive's waiter to register")
        s.shutdown()
        for th in (t, t2, t3):
            th.join(timeout=30)
        assert all(isinstance(b.get("error"), Abandoned) for b in (box, box2, box3)), (box, box2, box3)
        p2p.gate.set()
        s.release()
        done = _Work()
        done.fut.set_result([torch.ones(1)])
        s2 = GroupSockets(0)
        s2.begin()
        calls.clear()
        stuck = done
        assert dist.all_reduce(torch.ones(1), group="g") is None and calls[-1][2] is True
        assert dist.all_reduce(torch.ones(1), group="g", async_op=True).wait() is True
        assert [w.wait() for w in dist.batch_isend_irecv([op, op])] == [True, True]
        s2.release()
        abort.restore_torch_collectives()
        assert (dist.all_reduce, dist.batch_isend_irecv) == (torchs, torchs_batch)
    finally:
        dist.all_reduce, dist.batch_isend_irecv = original, original_batch
        abort._current = None
