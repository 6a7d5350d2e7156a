# SPDX-License-Identifier: Apache-2.0
"""Helpers for tests of scripts trained with Regroup: a scripted stand-in for ``regroup-agent``,
process launching, weight comparison and ledger checks.

Every wait here is bounded, and every process started is tracked so a test can stop them all.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from regroup._proto import wire_pb2 as pb
from regroup.wire import FrameReader, decode_payload, encode_frame

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_mlp.py"
PYTHON = sys.executable


def free_port() -> int:
    """A TCP port free on 127.0.0.1 a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.02) -> Any:
    """Polls ``predicate`` until it returns something true; raises AssertionError at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class Processes:
    """Started processes, all stopped by :meth:`stop_all` (SIGKILL to the process group)."""

    def __init__(self) -> None:
        self.started: List[subprocess.Popen] = []

    def start(self, argv: Sequence[str], env: Optional[Dict[str, str]] = None, log: Optional[Path] = None,
              cwd: Optional[str] = None) -> subprocess.Popen:
        out = open(log, "ab") if log is not None else subprocess.DEVNULL
        full_env = dict(os.environ)
        full_env.update(env or {})
        p = subprocess.Popen(list(argv), env=full_env, stdout=out, stderr=subprocess.STDOUT,
                             cwd=cwd, start_new_session=True)
        if log is not None:
            out.close()
        self.started.append(p)
        return p

    def stop_all(self) -> None:
        for p in self.started:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for p in self.started:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def children_of(pid: int) -> List[int]:
    """The direct children of a process (Linux /proc)."""
    out: List[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def trainers_of(agent: int) -> List[int]:
    """The trainer processes of a regroup-agent: its children but its fork server (warm.py),
    which names itself ``regroup-warm`` once Python has started (a second or so after it was
    spawned, as ``python3 -m regroup.warm``). Trainers forked from it keep that command line,
    but none is forked before the server named itself: while no child bears the name, a child
    with that command line is the server starting."""
    kids = []
    for pid in children_of(agent):
        try:
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().split(b"\0")
        except OSError:
            continue  # gone
        kids.append((pid, comm, b"regroup.warm" in cmdline))
    named = any(comm == "regroup-warm" for _, comm, _ in kids)
    return [pid for pid, comm, warm in kids if comm != "regroup-warm" and (named or not warm)]


def descendants(pid: int) -> List[int]:
    """``pid`` and every process below it (Linux /proc), parents before children."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children_of(p))
    return out


# ---------------------------------------------------------------------------------------------
# Weights and ledgers
# ---------------------------------------------------------------------------------------------


def relative_error(a: Dict[str, Any], b: Dict[str, Any]) -> float:
    """``||a - b|| / ||a||`` over every tensor of two parameter dicts with the same names."""
    if set(a) != set(b):
        raise AssertionError(f"different parameters: {sorted(a)} vs {sorted(b)}")
    num = sum(float(((a[k].double() - b[k].double()) ** 2).sum()) for k in a)
    den = sum(float((a[k].double() ** 2).sum()) for k in a)
    return (num / den) ** 0.5 if den else num ** 0.5


def read_ledger(path: Path) -> List[dict]:
    lines = []
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                lines.append(json.loads(line))
    return lines


def committed_ledger(records: Iterable[dict]) -> Dict[int, Dict[int, List[int]]]:
    """Step -> micro-batch -> samples of the committed attempt of each step.

    A replica's line is written before its vote, so a step has a line per attempt. The committed
    attempt is in the highest generation that has lines for the step (a step is never voted on
    after its commit), and within it each replica's last line (a rolled-back vote is redone in
    the same generation).
    """
    records = list(records)
    best: Dict[int, Tuple[int, int]] = {}
    for r in records:
        g = tuple(r["g"])
        if r["step"] not in best or g > best[r["step"]]:
            best[r["step"]] = g  # type: ignore[assignment]
    # Under sharding (examples/train_mlp.py --shard) each rank of a replica computes a part of
    # each micro-batch and writes its own line, with "part": its position; the parts are joined
    # in position order.
    last: Dict[Tuple[int, int, int], dict] = {}
    for r in records:
        if tuple(r["g"]) == best[r["step"]]:
            last[(r["step"], r["replica"], r.get("part", 0))] = r
    out: Dict[int, Dict[int, List[int]]] = {}
    owner: Dict[Tuple[int, int], int] = {}
    for (step, replica, _), r in sorted(last.items()):
        mbs = out.setdefault(step, {})
        for j, samples in r["mb"].items():
            if owner.setdefault((step, int(j)), replica) != replica:
                raise AssertionError(f"micro-batch {j} of step {step} computed by two replicas in generation {r['g']}")
            mbs.setdefault(int(j), []).extend(samples)
    return out


def check_ledger(path: Path, steps: int, dataset: int, micro_batch: int, microbatches: int,
                 seed: int, shuffle: bool = True) -> None:
    """Asserts the ledger holds every step's micro-batches exactly once, as the step contract
    says, and every sample exactly once per complete epoch."""
    from regroup.contract import Sampler

    sampler = Sampler(dataset, micro_batch, microbatches, seed, shuffle)
    ledger = committed_ledger(read_ledger(path))
    missing = [s for s in range(steps) if s not in ledger]
    assert not missing, f"steps without committed micro-batches in the ledger: {missing[:10]}"
    extra = [s for s in ledger if s >= steps]
    assert not extra, f"steps beyond the last in the ledger: {extra[:10]}"
    per_epoch: Dict[int, List[int]] = {}
    for s in range(steps):
        mbs = ledger[s]
        assert sorted(mbs) == list(range(microbatches)), \
            f"step {s} committed micro-batches {sorted(mbs)}, not 0..{microbatches - 1}"
        for j, samples in mbs.items():
            expected = sampler.microbatch(s, j).tolist()
            assert samples == expected, f"micro-batch {j} of step {s} held {samples}, not {expected}"
            per_epoch.setdefault(sampler.epoch_of(s), []).extend(samples)
    for epoch, samples in per_epoch.items():
        complete = (epoch + 1) * sampler.steps_per_epoch <= steps
        assert len(samples) == len(set(samples)), f"epoch {epoch}: a sample was committed twice"
        if complete and dataset % sampler.global_batch_size == 0:
            assert sorted(samples) == list(range(dataset)), f"epoch {epoch}: samples missing"


# ---------------------------------------------------------------------------------------------
# The drop-in: the unmodified DDP script, and what its ledger holds
# ---------------------------------------------------------------------------------------------

PLAIN_DDP = REPO / "examples" / "ddp_plain.py"


def run_plain_ddp(args: Sequence[str], world: int, out: Path, ledger: Optional[Path] = None,
                  timeout: float = 600) -> None:
    """The unmodified DDP script (examples/ddp_plain.py) on ``world`` processes with torchrun's
    environment and no Regroup: the drop-in's reference."""
    port = free_port()
    extra = ["--ledger", str(ledger)] if ledger else []
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        env.pop("REGROUP_AGENT_SOCKET", None)
        procs.append(subprocess.Popen([PYTHON, str(PLAIN_DDP), *args, "--out", str(out), *extra], env=env,
                                      stdout=subprocess.DEVNULL))
    try:
        codes = [p.wait(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert codes == [0] * world, f"the plain DDP script exited with {codes}"


def committed_samples(path: Path) -> Dict[int, List[int]]:
    """From a drop-in ledger (examples/example_ledger.py): step -> the samples of its
    committed attempt, those of its highest generation's lines."""
    by_step: Dict[int, Dict[tuple, List[int]]] = {}
    for r in read_ledger(path):
        by_step.setdefault(r["step"], {}).setdefault(tuple(r["g"]), []).extend(r["samples"])
    return {s: sorted(set(gens[max(gens)])) for s, gens in by_step.items()}


def check_dropin_ledger(path: Path, reference: Path, dataset: int, epochs: int) -> None:
    """Asserts the drop-in committed the unmodified script's samples in every step (its ledger
    ``reference``) and every sample exactly once in each of the ``epochs``."""
    got, want = committed_samples(path), committed_samples(reference)
    assert sorted(got) == sorted(want), f"committed steps {sorted(got)[:10]}... != the plain script's"
    for s in want:
        assert got[s] == want[s], f"step {s} used samples {got[s]}, the plain script {want[s]}"
    steps_per_epoch = len(want) // epochs
    for e in range(epochs):
        seen = [i for s in range(e * steps_per_epoch, (e + 1) * steps_per_epoch) for i in got[s]]
        assert sorted(seen) == list(range(dataset)), f"epoch {e}: a sample lost or repeated"


# ---------------------------------------------------------------------------------------------
# A scripted agent
# ---------------------------------------------------------------------------------------------


class _Conn:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.lock = threading.Lock()
        self.local_rank: Optional[int] = None
        self.hello: Optional[pb.TrainerHello] = None


class FakeAgent:
    """The trainer side of ``regroup-agent``, scripted by a test.

    Listens on ``socket_path``; each trainer connection's first message is its hello. Messages
    from trainers are recorded per local rank (``messages(r)``) and queued (``next(r, kinds)``);
    ``send(r, reply)`` answers. Heartbeats are recorded but not queued.
    """

    def __init__(self, directory: Path, nproc: int):
        self.socket_path = str(directory / "agent.sock")
        self.nproc = nproc
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.socket_path)
        self._server.listen(16)
        self._conns: Dict[int, _Conn] = {}
        self._queues: Dict[int, "queue.Queue[pb.TrainerMessage]"] = {r: queue.Queue() for r in range(nproc)}
        self.heartbeats: Dict[int, List[Tuple[float, pb.TrainerHeartbeat]]] = {r: [] for r in range(nproc)}
        self.hellos: Dict[int, List[pb.TrainerHello]] = {r: [] for r in range(nproc)}
        self.log: List[Tuple[float, int, pb.TrainerMessage]] = []
        self._lock = threading.Lock()
        self._stop = False
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def close(self) -> None:
        self._stop = True
        try:
            self._server.close()
        except OSError:
            pass
        with self._lock:
            for c in self._conns.values():
                try:
                    c.sock.close()
                except OSError:
                    pass

    def env(self, local_rank: int, rank: int, world: int) -> Dict[str, str]:
        return {"REGROUP_AGENT_SOCKET": self.socket_path, "REGROUP_LOCAL_RANK": str(local_rank),
                "LOCAL_RANK": str(local_rank), "RANK": str(rank), "WORLD_SIZE": str(world),
                "REGROUP_JOB_ID": "fake", "REGROUP_POD_UID": "fake-pod", "OMP_NUM_THREADS": "1"}

    def _accept(self) -> None:
        while not self._stop:
            try:
                sock, _ = self._server.accept()
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(_Conn(sock),), daemon=True)
            t.start()

    def _serve(self, conn: _Conn) -> None:
        reader = FrameReader()
        while not self._stop:
            try:
                data = conn.sock.recv(1 << 16)
            except OSError:
                return
            if not data:
                return
            reader.feed(data)
            while (payload := reader.next()) is not None:
                m = decode_payload(payload, pb.TrainerMessage)
                kind = m.WhichOneof("body")
                now = time.monotonic()
                if kind == "hello":
                    r = m.hello.local_rank
                    conn.local_rank, conn.hello = r, m.hello
                    with self._lock:
                        self._conns[r] = conn
                        self.hellos[r].append(m.hello)
                    welcome = pb.AgentReply()
                    welcome.welcome.local_rank = r
                    welcome.welcome.epoch = 1
                    self._send(conn, welcome)
                    continue
                r = conn.local_rank
                if r is None:
                    continue
                if kind == "heartbeat":
                    self.heartbeats[r].append((now, m.heartbeat))
                    continue
                self.log.append((now, r, m))
                self._queues[r].put(m)

    def _send(self, conn: _Conn, reply: pb.AgentReply) -> None:
        with conn.lock:
            conn.sock.sendall(encode_frame(reply))

    def connected(self, r: int) -> bool:
        return r in self._conns

    def send(self, r: int, reply: pb.AgentReply) -> None:
        with self._lock:
            conn = self._conns[r]
        self._send(conn, reply)

    def next(self, r: int, kinds: Sequence[str], timeout: float) -> pb.TrainerMessage:
        """The next queued message of rank ``r`` of one of ``kinds`` (others are dropped)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"local rank {r} sent no {'/'.join(kinds)} within {timeout} s")
            try:
                m = self._queues[r].get(timeout=left)
            except queue.Empty:
                continue
            if m.WhichOneof("body") in kinds:
                return m

    def last_phase(self, r: int) -> Optional[int]:
        beats = self.heartbeats[r]
        return beats[-1][1].phase if beats else None

    # -- replies --------------------------------------------------------------------------------

    @staticmethod
    def start(directive_id: int, epoch: int, generation: int, world: int, rank: int, port: int,
              committed_step: int, tp: int = 1, microbatches: int = 0, begin: int = 0, count: int = 0,
              local_rank: int = 0) -> pb.AgentReply:
        """A StartGeneration for one rank. The plan carries no state sync: the trainers decide it
        (regroup.sync)."""
        reply = pb.AgentReply()
        s = reply.start
        s.directive_id = directive_id
        p = s.plan
        p.epoch, p.generation, p.world_size = epoch, generation, world
        p.tensor_parallel, p.pipeline_parallel, p.data_parallel = tp, 1, world // tp
        p.store_host, p.store_port = "127.0.0.1", port
        p.committed_step = committed_step
        p.microbatches_per_step = microbatches
        p.agents = 1
        a = s.assignment
        a.local_rank, a.rank, a.replica = local_rank, rank, rank // tp
        a.microbatch_begin, a.microbatch_count = begin, count
        return reply

    @staticmethod
    def outcome(generation: int, step: int, commit: bool, mismatch: bool = False) -> pb.AgentReply:
        reply = pb.AgentReply()
        reply.outcome.generation, reply.outcome.step = generation, step
        reply.outcome.commit, reply.outcome.checksum_mismatch = commit, mismatch
        return reply

    @staticmethod
    def abort(directive_id: int, epoch: int, generation: int, committed_step: int, reason: str) -> pb.AgentReply:
        reply = pb.AgentReply()
        a = reply.abort
        a.directive_id, a.epoch, a.generation, a.committed_step, a.reason = \
            directive_id, epoch, generation, committed_step, reason
        return reply

    @staticmethod
    def stop(mode: int, reason: str, directive_id: int = 99) -> pb.AgentReply:
        reply = pb.AgentReply()
        reply.stop.directive_id, reply.stop.mode, reply.stop.reason = directive_id, mode, reason
        return reply
