# SPDX-License-Identifier: Apache-2.0
"""End to end: examples/train_mlp.py under the real regroup-manager and regroup-agent.

Two nodes (agents) of two ranks each on this machine. A fault is injected once the ledger shows
training past a given step; the test then waits for the last step, checks that every process
ended as it should, that the final weights equal an uninterrupted single-process run (float64,
norm-relative 1e-9) and that the ledger holds every sample exactly once per epoch.

Timeouts of the job (annotations): the trainers' first heartbeat comes only after Python has
imported torch (seconds on a loaded 2-core machine) and the manager counts the silence from the
process start, so the liveness timeout is raised to 20 s (see the report on the agent/manager).
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest
import torch

from regroup.testing import (EXAMPLE, PYTHON, check_ledger, read_ledger, relative_error, trainers_of,
                             wait_for)

pytestmark = pytest.mark.e2e

TOLERANCE = 1e-9
_RUNS = itertools.count()  # one durable record per run of a job (Cluster)
DATA = {"dataset": 128, "micro_batch": 8, "microbatches": 4, "seed": 1234}
TRAIN = ["--float64", "--dataset", "128", "--micro-batch", "8", "--microbatches", "4", "--checksum-interval", "5"]
ANNOTATIONS = [
    "recover-strategy=retry,recover-in-place,recover,elastic-training,dump,exit",
    "regroup.io/prefer-elastic=true",
    "regroup.io/heartbeat-interval-ms=200",
    "regroup.io/liveness-misses=100",
    "regroup.io/global-batch-size=32",
    "regroup.io/micro-batch-size=8",
    "regroup.io/checksum-interval=5",
]

_references: Dict[tuple, Path] = {}


def reference(tmp_path_factory, steps: int, extra: Sequence[str]) -> Dict[str, torch.Tensor]:
    key = (steps, *extra)
    if key not in _references:
        out = tmp_path_factory.mktemp("reference") / "ref.pt"
        subprocess.run([PYTHON, str(EXAMPLE), *TRAIN, "--quiet", "--steps", str(steps), *extra, "--out", str(out)],
                       check=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
        _references[key] = out
    return torch.load(_references[key])


class Cluster:
    """A manager and its agents on this machine, every process owned by the test."""

    def __init__(self, tmp_path: Path, procs, binaries, steps: int, train: Sequence[str], tp: int = 1,
                 script: Path = EXAMPLE, annotations: Sequence[str] = ANNOTATIONS, python: str = PYTHON,
                 library: Optional[str] = str(Path(__file__).resolve().parents[1]), labels: Sequence[str] = (),
                 join_window_s: int = 60):
        """``python`` runs the trainers; ``library`` is put on their PYTHONPATH (None: the
        ``regroup`` installed into that python is the one they import); ``join_window_s`` is the
        manager's ``--join-window-s``."""
        self.tmp = tmp_path
        self.join_window_s = join_window_s
        self.python = python
        self.library = library
        self.script = script
        self.annotations = list(annotations)
        self.labels = ["fault-scheduling=force", *labels]
        self.procs = procs
        self.binaries = binaries
        self.steps = steps
        self.tp = tp
        self.ledger = tmp_path / "ledger"
        self.out = tmp_path / "out.pt"
        self.train = [*TRAIN, "--steps", str(steps), "--tp", str(tp), "--ledger", str(self.ledger),
                      "--out", str(self.out), *train]
        self.agents: Dict[str, subprocess.Popen] = {}
        # The job's credential, as in production: the manager, the agents and regroupctl read it.
        credential = tmp_path / "credential"
        credential.write_text(os.urandom(16).hex())
        credential.chmod(0o600)
        self.env = {"REGROUP_CREDENTIAL_FILE": str(credential)}
        self.port = 0
        self.manager: Optional[subprocess.Popen] = None
        # The job's durable record, as in production. Each Cluster is one run of the job: a job
        # restarted whole (every pod gone) starts a record of its own, since fresh pods never
        # make the majority of the pods on an earlier run's (docs/operations.md).
        self.record = tmp_path / f"record-{next(_RUNS)}.json"

    def start(self, nodes: int = 2, nproc: int = 2) -> None:
        port_file = self.tmp / "manager.port"
        if port_file.exists():
            port_file.unlink()  # a previous manager's
        argv = [self.binaries["manager"], "--job-id", "mlp", "--nodes", str(nodes), "--nproc-per-node", str(nproc),
                "--listen", "127.0.0.1:0", "--port-file", str(port_file), "--join-window-s", str(self.join_window_s),
                "--record", str(self.record),
                "--stay-after-done",  # the tests read the status once the job ended
                *[x for label in self.labels for x in ("--label", label)]]
        for a in self.annotations + [f"regroup.io/tensor-parallel={self.tp}"]:
            argv += ["--annotation", a]
        self.manager = self.procs.start(argv, self.env, log=self.tmp / "manager.log")
        wait_for(lambda: port_file.exists() or self.manager.poll() is not None, 30, "the manager's port")
        assert self.manager.poll() is None, (self.tmp / "manager.log").read_text()
        self.port = int(port_file.read_text())
        for n in range(nodes):
            self.start_agent(f"node{n}", n, nodes, nproc)

    def start_agent(self, name: str, node_rank: int, nodes: int = 2, nproc: int = 2) -> subprocess.Popen:
        argv = [self.binaries["agent"], "--manager", f"127.0.0.1:{self.port}", "--job-id", "mlp",
                "--nnodes", str(nodes), "--nproc-per-node", str(nproc), "--node-rank", str(node_rank),
                "--master-addr", "127.0.0.1", "--host", "127.0.0.1", "--socket-dir", str(self.tmp / f"sock-{name}"),
                "--stop-grace-s", "20", "--python", self.python, str(self.script), *self.train]
        # The library importable as an installed one would be (the agent's fork server needs it).
        p = self.procs.start(argv, {**self.env, "OMP_NUM_THREADS": "1", "PYTHONPATH": self.library or ""},
                             log=self.tmp / f"{name}.log",
                             cwd=None if self.library else str(self.tmp))
        self.agents[name] = p
        return p

    def trainers(self, name: str) -> List[int]:
        return sorted(trainers_of(self.agents[name].pid))

    def last_step(self) -> int:
        records = read_ledger(self.ledger) if self.ledger.exists() else []
        return max((r["step"] for r in records), default=-1)

    def wait_step(self, step: int, timeout: float = 120) -> None:
        wait_for(lambda: self.last_step() >= step or self.dead(), timeout, f"training to reach step {step}")
        assert not self.dead(), self.logs()

    def dead(self) -> bool:
        return self.manager is not None and self.manager.poll() is not None

    def status(self) -> str:
        ctl = shutil.which("regroupctl") or str(Path(self.binaries["manager"]).with_name("regroupctl"))
        if not os.path.exists(ctl):
            return ""
        r = subprocess.run([ctl, "status", "--manager", f"127.0.0.1:{self.port}"], capture_output=True,
                           text=True, timeout=30, env={**os.environ, **self.env})
        return r.stdout

    def logs(self) -> str:
        parts = []
        for f in sorted(self.tmp.glob("*.log")):
            parts.append(f"== {f.name}\n" + f.read_text()[-3000:])
        return "\n".join(parts)

    def finish(self, tmp_path_factory, ref_extra: Sequence[str], agents: Sequence[str],
               expected: Optional[Dict[str, torch.Tensor]] = None) -> str:
        """Waits for the named agents to exit 0; checks weights (against ``expected``, default
        the single-process reference) and ledger; returns the status."""
        for name in agents:
            try:
                code = self.agents[name].wait(timeout=240)
            except subprocess.TimeoutExpired:
                pytest.fail(f"agent {name} still running\n{self.status()}\n{self.logs()}")
            assert code == 0, f"agent {name} exited with {code}\n{self.status()}\n{self.logs()}"
        status = self.status()
        print(status)
        if expected is None:
            expected = reference(tmp_path_factory, self.steps, ref_extra)
        error = relative_error(expected, torch.load(self.out))
        assert error <= TOLERANCE, f"norm-relative error {error:.3e}\n{status}"
        check_ledger(self.ledger, self.steps, **DATA)
        return status


def _resumed_ms(status: str) -> List[int]:
    out = []
    for line in status.splitlines():
        if "first step committed" in line:
            out.append(int(line.split("first step committed ")[1].split(" ms")[0]))
    return out


@pytest.mark.parametrize("optimizer,tp", [("sgd", 1), ("adam", 2)])
def test_a_killed_rank_is_restarted_in_place_and_rejoins_with_its_peers_state(tmp_path, tmp_path_factory, procs,
                                                                              binaries, optimizer, tp):
    c = Cluster(tmp_path, procs, binaries, steps=40, train=["--optimizer", optimizer, "--step-sleep", "0.1"], tp=tp)
    c.start()
    c.wait_step(10)
    # The fork server starts once the trainers said hello and imports torch meanwhile; a crash
    # before it is ready gets a plain start (tested by warm_test.py), so wait for it here.
    log = tmp_path / "node1.log"
    wait_for(lambda: "fork server ready" in log.read_text(), 60, "node1's fork server")
    victim = c.trainers("node1")[1]
    os.kill(victim, signal.SIGKILL)
    status = c.finish(tmp_path_factory, ["--optimizer", optimizer], ["node0", "node1"])
    assert "restart_in_place" in status
    text = log.read_text()
    assert "forked by the fork server" in text, "the new process is a warm start\n" + text[-3000:]
    print(f"abort -> first committed step: {_resumed_ms(status)} ms")


def test_a_lost_node_scales_in_and_its_replacement_scales_out(tmp_path, tmp_path_factory, procs, binaries):
    c = Cluster(tmp_path, procs, binaries, steps=60, train=["--optimizer", "adam", "--step-sleep", "0.1"])
    c.start()
    c.wait_step(10)
    lost = c.agents["node1"]
    victims = [lost.pid, *c.trainers("node1")]
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    lost.wait(timeout=30)
    c.wait_step(c.last_step() + 5)       # training goes on, scaled in
    c.start_agent("node1-replacement", 1)
    status = c.finish(tmp_path_factory, ["--optimizer", "adam"], ["node0", "node1-replacement"])
    assert "scale_in" in status and "scale_out" in status
    print(f"abort -> first committed step: {_resumed_ms(status)} ms")


# A trainer held before it joins a generation: `forming.enter` (where a rank leaves for the new
# generation's store) first writes DIR/held.PID and sleeps, as a rank does that is slow to get
# there; the example runs unchanged behind it.
_HELD_BEFORE_THE_STORE = """
import os, runpy, sys, time
import regroup.forming as forming
def held(t, start):
    with open(os.path.join({hold!r}, f"held.{{os.getpid()}}"), "w"):
        pass
    time.sleep(120)
forming.enter = held
sys.argv = [{example!r}, *sys.argv[1:]]
runpy.run_path({example!r}, run_name="__main__")
"""


def test_a_node_lost_before_its_ranks_reached_the_generations_store_is_settled_by_the_stores_host(
        tmp_path, tmp_path_factory, procs, binaries):
    """Issue 37: a node dies a moment after a generation that holds it was planned, before its
    ranks reached the generation's store. Its peers wait there: none of their connections to it
    fails, and its broken stream has its grace (20 s here). The store's host names the ranks that
    have not arrived, and with the broken stream the manager declares the pod lost two heartbeat
    intervals after it went (the scale-in) instead of at the end of that grace."""
    # Scaled in, a step takes 0.3 s more: the replacement's trainers import torch (seconds on a
    # loaded machine) before the survivors finish.
    c = Cluster(tmp_path, procs, binaries, steps=60,
                train=["--optimizer", "adam", "--step-sleep", "0.1", "--scaled-in-sleep", "0.3"])
    c.start()
    c.wait_step(10)
    for pid in [c.agents["node1"].pid, *c.trainers("node1")]:   # first the node is lost for good
        os.kill(pid, signal.SIGKILL)
    c.agents["node1"].wait(timeout=30)
    c.wait_step(c.last_step() + 3)                               # scaled in
    hold = tmp_path / "hold"
    hold.mkdir()
    c.script = tmp_path / "held_before_the_store.py"
    c.script.write_text(_HELD_BEFORE_THE_STORE.format(hold=str(hold), example=str(EXAMPLE)))
    back = c.start_agent("node1-replacement", 1)                 # its return: a scale-out planned
    wait_for(lambda: len(list(hold.glob("held.*"))) == 2 or c.dead(), 120,
             "the replacement's ranks to be given the scale-out's generation")
    for pid in [back.pid, *trainers_of(back.pid)]:               # and it dies before the store
        os.kill(pid, signal.SIGKILL)
    back.wait(timeout=30)
    status = c.finish(tmp_path_factory, ["--optimizer", "adam"], ["node0"])
    lost = [line for line in status.splitlines() if "fault: pod_lost" in line]
    assert len(lost) == 1 and "its ranks have not reached the store of generation" in lost[0], status
    print("\n".join(line for line in status.splitlines() if "disconnect" in line or "fault" in line))
    print(f"abort -> first committed step: {_resumed_ms(status)} ms")


def test_a_sigtermed_agent_leaves_at_a_step_boundary(tmp_path, tmp_path_factory, procs, binaries):
    c = Cluster(tmp_path, procs, binaries, steps=40, train=["--optimizer", "sgd", "--step-sleep", "0.1"])
    c.start()
    c.wait_step(10)
    c.agents["node1"].send_signal(signal.SIGTERM)
    assert c.agents["node1"].wait(timeout=60) == 0, c.logs()
    status = c.finish(tmp_path_factory, ["--optimizer", "sgd"], ["node0"])
    assert "planned departure" in status
    assert "killed" not in (tmp_path / "node1.log").read_text()


def test_a_frozen_rank_is_detected_and_replaced(tmp_path, tmp_path_factory, procs, binaries):
    # Detection takes the liveness timeout (20 s here, see the module's docstring).
    c = Cluster(tmp_path, procs, binaries, steps=40, train=["--optimizer", "sgd", "--step-sleep", "0.1"])
    c.start()
    c.wait_step(8)
    os.kill(c.trainers("node1")[0], signal.SIGSTOP)
    status = c.finish(tmp_path_factory, ["--optimizer", "sgd"], ["node0", "node1"])
    assert "hang" in status and "restart_in_place" in status


def test_a_restarted_job_resumes_from_its_newest_periodic_checkpoint(tmp_path, tmp_path_factory, procs, binaries):
    ckpt = tmp_path / "ckpt"
    train = ["--optimizer", "adam", "--step-sleep", "0.1", "--checkpoint-dir", str(ckpt), "--checkpoint-interval", "5"]
    first = Cluster(tmp_path, procs, binaries, steps=30, train=train)
    first.start()
    first.wait_step(13)
    for name in ("node0", "node1"):  # the whole job dies: every trainer, agent and the manager
        for pid in [first.agents[name].pid, *first.trainers(name)]:
            os.kill(pid, signal.SIGKILL)
    first.manager.kill()
    for p in procs.started:
        p.wait(timeout=30)
    from regroup.checkpoint import Checkpointer

    newest = Checkpointer(str(ckpt)).newest()
    assert newest is not None and newest.step >= 9
    second = Cluster(tmp_path, procs, binaries, steps=30, train=train)
    second.start()
    second.finish(tmp_path_factory, ["--optimizer", "adam"], ["node0", "node1"])
    records = read_ledger(tmp_path / "ledger")
    resumed = min(r["step"] for r in records if r["g"][0] == max(x["g"][0] for x in records))
    assert resumed == newest.step + 1, f"the restarted job began at step {resumed}, not {newest.step + 1}"


@pytest.mark.parametrize("second", ["source", "receiver"])
def test_a_fault_during_state_sync(tmp_path, tmp_path_factory, procs, binaries, second):
    """A rank is killed and restarted in place; while its peer is sending it the state (held
    there by the example's --hold-sync, so that the fault lands inside the sync whatever the
    machine's speed), a second rank dies: the sender itself, or the restarted receiver. The
    job must still finish with the uninterrupted run's weights and an exactly-once ledger."""
    hold = tmp_path / "hold"
    hold.mkdir()
    train = ["--optimizer", "adam", "--step-sleep", "0.1", "--hold-sync", str(hold)]
    c = Cluster(tmp_path, procs, binaries, steps=60, train=train)
    c.start()
    c.wait_step(10)
    # A warm start, so that the restarted rank is back before the survivors, training on, finish
    # (a plain start imports torch: 6 s for torch 2.x on this machine, longer than the steps left).
    wait_for(lambda: "fork server ready" in (tmp_path / "node1.log").read_text(), 60, "node1's fork server")
    before = set(c.trainers("node1"))
    first = c.trainers("node1")[1]
    os.kill(first, signal.SIGKILL)
    held = wait_for(lambda: sorted(hold.glob("held.*")) or c.dead(), 120,
                    "a rank to begin sending its state to the restarted one")
    assert not c.dead(), c.logs()
    sender = int(held[0].name.split(".")[1])
    if second == "source":
        victim = sender
    else:
        fresh = wait_for(lambda: sorted(set(c.trainers("node1")) - before), 30, "the restarted trainer")
        victim = fresh[0]
    assert victim != first
    os.kill(victim, signal.SIGKILL)
    (hold / "release").write_text("")  # later syncs (and the sender, if it lives) go on
    status = c.finish(tmp_path_factory, ["--optimizer", "adam"], ["node0", "node1"])
    assert "restart_in_place" in status
    for name in ("node0", "node1"):  # every survivor left the sync on the abort, not by the watchdog
        assert "exited with code 75" not in (tmp_path / f"{name}.log").read_text(), c.logs()
    print(f"abort -> first committed step: {_resumed_ms(status)} ms")
