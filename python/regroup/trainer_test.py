# SPDX-License-Identifier: Apache-2.0
"""The step loop, with real trainer processes (examples/train_mlp.py) and real gloo.

First without an agent: the step contract makes the final weights independent of the number of
replicas and of tensor parallelism. Then under a scripted agent (regroup.testing.FakeAgent), the
protocol as a trainer sees it: votes and commits, aborts (a step committed or not before the
abort), a rank frozen inside a collective, a restarted rank that receives its peer's state,
rollbacks, standby, pause and the stop modes. Each run checks its final weights against an
uninterrupted run (float64, norm-relative 1e-9) and its ledger of committed samples.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest
import torch

from regroup._proto import wire_pb2 as pb
from regroup.testing import (EXAMPLE, PYTHON, FakeAgent, check_ledger, free_port, relative_error,
                             wait_for)

TOLERANCE = 1e-9
DATA = {"dataset": 128, "micro_batch": 8, "microbatches": 4, "seed": 1234}
BASE = ["--float64", "--quiet", "--dataset", "128", "--micro-batch", "8", "--microbatches", "4",
        "--checksum-interval", "5"]

_references: Dict[tuple, Path] = {}


def reference(tmp_path_factory, steps: int, extra: Sequence[str] = ()) -> Dict[str, torch.Tensor]:
    """Final weights of an uninterrupted single-process run (cached per argument list)."""
    key = (steps, *extra)
    if key not in _references:
        out = tmp_path_factory.mktemp("reference") / "ref.pt"
        result = subprocess.run([PYTHON, str(EXAMPLE), *BASE, "--steps", str(steps), *extra, "--out", str(out)],
                                capture_output=True, text=True, timeout=300,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert result.returncode == 0, result.stderr[-3000:]
        _references[key] = out
    return torch.load(_references[key])


# ---------------------------------------------------------------------------------------------
# Without an agent: exactness across data- and tensor-parallel sizes
# ---------------------------------------------------------------------------------------------


def run_standalone(tmp_path: Path, procs, world: int, steps: int, extra: Sequence[str]) -> Path:
    port = free_port()
    out = tmp_path / f"w{world}.pt"
    ledger = tmp_path / f"w{world}.ledger"
    workers = []
    for rank in range(world):
        env = {"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        workers.append(procs.start([PYTHON, str(EXAMPLE), *BASE, "--steps", str(steps), *extra,
                                    "--out", str(out), "--ledger", str(ledger)], env,
                                   log=tmp_path / f"w{world}.r{rank}.log"))
    for rank, w in enumerate(workers):
        assert w.wait(timeout=300) == 0, (tmp_path / f"w{world}.r{rank}.log").read_text()[-3000:]
    check_ledger(ledger, steps, **DATA)
    return out


@pytest.mark.parametrize("world,extra", [
    (2, ["--optimizer", "sgd"]),
    (3, ["--optimizer", "adam"]),          # 4 micro-batches over 3 replicas: 2, 1, 1
    (4, ["--optimizer", "sgd"]),
    (2, ["--optimizer", "adam", "--tp", "2"]),   # one replica of two tensor-parallel ranks
    (4, ["--optimizer", "sgd", "--tp", "2"]),    # two replicas of two
    (2, ["--optimizer", "sgd", "--ddp"]),        # the DistributedDataParallel wrapper
], ids=["dp2-sgd", "dp3-adam", "dp4-sgd", "tp2-adam", "tp2xdp2-sgd", "dp2-ddp"])
def test_final_weights_do_not_depend_on_the_parallel_layout(tmp_path, tmp_path_factory, procs, world, extra):
    steps = 20
    optimizer = extra[extra.index("--optimizer") + 1]
    ref = reference(tmp_path_factory, steps, ["--optimizer", optimizer])
    got = torch.load(run_standalone(tmp_path, procs, world, steps, extra))
    error = relative_error(ref, got)
    assert error <= TOLERANCE, f"norm-relative error {error:.3e} against the single-process run"


# ---------------------------------------------------------------------------------------------
# Under a scripted agent
# ---------------------------------------------------------------------------------------------


class FakeJob:
    """Trainer processes of the example under a FakeAgent, driven step by step by the test."""

    def __init__(self, tmp_path: Path, procs, steps: int = 20, nproc: int = 2, extra: Sequence[str] = (),
                 overlap: bool = True):
        self.tmp = tmp_path
        self.overlap = overlap   # the vote off the critical path (TrainerConfig.vote_overlap)
        self.procs = procs
        self.steps = steps
        self.agent = FakeAgent(tmp_path, nproc)
        self.nproc = nproc
        self.epoch = 1
        self.generation = 0
        self.directive = 0
        self.out = tmp_path / "out.pt"
        self.ledger = tmp_path / "ledger"
        self.extra = list(extra)
        self.processes: Dict[int, subprocess.Popen] = {}
        self.ranks: List[int] = []  # local ranks in the current generation, by global rank
        self.committed = -1
        self.launches = 0

    def launch(self, r: int, extra: Sequence[str] = ()) -> subprocess.Popen:
        self.launches += 1
        before = len(self.agent.hellos[r])
        p = self.procs.start(self.command(extra), self.environment(r),
                             log=self.tmp / f"rank{r}.{self.launches}.log")
        self.processes[r] = p
        wait_for(lambda: len(self.agent.hellos[r]) > before or p.poll() is not None, 120, f"rank {r}'s hello")
        assert p.poll() is None, self.log(r)
        return p

    def command(self, extra: Sequence[str]) -> List[str]:
        """The trainer's command line (the example, with this job's arguments)."""
        return [PYTHON, str(EXAMPLE), *BASE, "--steps", str(self.steps), "--out", str(self.out),
                "--ledger", str(self.ledger), *self.extra, *extra]

    def environment(self, r: int) -> Dict[str, str]:
        return {**self.agent.env(r, r, self.nproc), "REGROUP_VOTE_OVERLAP": "1" if self.overlap else "0"}

    def log(self, r: int) -> str:
        logs = sorted(self.tmp.glob(f"rank{r}.*.log"))
        return logs[-1].read_text()[-4000:] if logs else ""

    def form(self, ranks: Sequence[int], committed: Optional[int] = None) -> None:
        """A new generation over these local ranks (global rank = position in the list)."""
        self.generation += 1
        self.directive += 1
        self.ranks = list(ranks)
        if committed is not None:
            self.committed = committed
        port = free_port()
        for rank, local in enumerate(ranks):
            self.agent.send(local, FakeAgent.start(self.directive, self.epoch, self.generation, len(ranks),
                                                   rank, port, self.committed, local_rank=local))

    def votes(self, step: int, timeout: float = 120) -> Dict[int, pb.TrainerVote]:
        out = {}
        for local in self.ranks:
            v = self.agent.next(local, ["vote"], timeout).vote
            # A vote of an earlier generation that the test did not read (sent before an abort:
            # the vote is off the critical path) is that generation's, as a real agent takes it.
            while v.generation < self.generation:
                v = self.agent.next(local, ["vote"], timeout).vote
            assert (v.generation, v.step) == (self.generation, step), (v, self.log(local))
            out[local] = v
        return out

    def outcome(self, step: int, commit: bool = True, mismatch: bool = False) -> None:
        for local in self.ranks:
            self.agent.send(local, FakeAgent.outcome(self.generation, step, commit, mismatch))
        if commit:
            self.committed = step

    def run_until(self, last: int) -> None:
        """Commits every step up to ``last`` as each is voted."""
        while self.committed < last:
            step = self.committed + 1
            votes = self.votes(step)
            sums = {v.checksum for v in votes.values()}
            if step % 5 == 0:
                assert len(sums) == 1 and 0 not in sums, f"checksums at step {step}: {votes}"
            self.outcome(step)

    def abort(self, reason: str = "test") -> None:
        self.directive += 1
        for local in self.ranks:
            if self.agent.connected(local):
                self.agent.send(local, FakeAgent.abort(self.directive, self.epoch, self.generation,
                                                       self.committed, reason))

    def finish(self, tmp_path_factory, ref_extra: Sequence[str] = ()) -> None:
        self.run_until(self.steps - 1)
        for r, p in self.processes.items():
            if r in self.ranks:
                assert p.wait(timeout=120) == 0, self.log(r)
        ref = reference(tmp_path_factory, self.steps, ref_extra)
        error = relative_error(ref, torch.load(self.out))
        assert error <= TOLERANCE, f"norm-relative error {error:.3e} against the uninterrupted run"
        check_ledger(self.ledger, self.steps, **DATA)

    def close(self) -> None:
        self.agent.close()


@pytest.fixture
def job(tmp_path, procs):
    jobs = []

    def make(**kwargs) -> FakeJob:
        j = FakeJob(tmp_path, procs, **kwargs)
        jobs.append(j)
        return j

    yield make
    for j in jobs:
        j.close()


def test_every_step_is_voted_and_applied_only_on_commit(job, tmp_path_factory):
    j = job()
    for r in range(2):
        j.launch(r)
        hello = j.agent.hellos[r][0]
        assert (hello.local_rank, hello.epoch, hello.generation, hello.committed_step,
                hello.heard_commit_step) == (r, 0, 0, -1, -1)
        assert hello.pid == j.processes[r].pid
    j.form([0, 1])
    assert j.agent.next(0, ["ack"], 60).ack.directive_id == j.directive
    j.run_until(3)
    # No commit: step 4 is applied and step 5 computed, but nobody votes for step 5, and every
    # rank reports the vote of step 4 (it holds step 3 committed, not 4).
    votes = j.votes(4)
    time.sleep(0.5)
    assert all(j.agent.last_phase(r) == pb.PHASE_VOTED for r in range(2))
    assert all(j.agent.heartbeats[r][-1][1].step == 4 for r in range(2))
    with pytest.raises(AssertionError):
        j.agent.next(0, ["vote"], 0.3)
    j.outcome(4)
    beats = [t for t, _ in j.agent.heartbeats[0]]
    gaps = sorted(b - a for a, b in zip(beats, beats[1:]))
    assert 0.05 < gaps[len(gaps) // 2] < 0.2, "heartbeats are not about 100 ms apart"
    j.finish(tmp_path_factory)


def test_a_waited_vote_applies_the_step_only_once_it_commits(job, tmp_path_factory):
    """The vote on the critical path (vote_overlap off, the CPU's default): a rank that voted
    for step 4 computes nothing more until the outcome; then it applies step 4 and goes on."""
    j = job(overlap=False, extra=["--step-sleep", "0.05", "--verbose"])
    j.launch(0), j.launch(1)
    j.form([0, 1])
    j.run_until(3)
    j.votes(4)
    time.sleep(0.5)
    assert all(j.agent.last_phase(r) == pb.PHASE_VOTED for r in range(2))
    assert all(j.agent.heartbeats[r][-1][1].step == 4 for r in range(2))
    assert not any("step=5 sleeping" in j.log(r) for r in range(2)), "a rank computed step 5 before step 4's outcome"
    j.outcome(4)
    j.votes(5)
    j.outcome(5)
    j.finish(tmp_path_factory)


OVERLAP = pytest.mark.parametrize("overlap", [True, False], ids=["overlapped", "waited"])


@OVERLAP
def test_a_step_committed_before_the_abort_is_applied_after_it(job, tmp_path_factory, overlap):
    j = job(overlap=overlap)
    j.launch(0), j.launch(1)
    j.form([0, 1])
    j.run_until(5)
    j.votes(6)          # both voted for step 6; the manager committed it, then the abort came
    j.abort("a fault right after the commit")
    j.form([0, 1], committed=6)
    j.finish(tmp_path_factory)


@OVERLAP
def test_a_step_not_committed_before_the_abort_is_done_again(job, tmp_path_factory, overlap):
    j = job(overlap=overlap)
    j.launch(0), j.launch(1)
    j.form([0, 1])
    j.run_until(5)
    j.votes(6)
    j.abort("a fault before the commit")
    j.form([0, 1])      # committed stays 5: step 6 is redone
    j.finish(tmp_path_factory)


@OVERLAP
def test_a_rolled_back_step_is_restored_and_done_again(job, tmp_path_factory, overlap):
    j = job(overlap=overlap)
    j.launch(0), j.launch(1)
    j.form([0, 1])
    j.run_until(2)
    j.votes(3)
    j.outcome(3, commit=False)
    j.votes(3)
    j.outcome(3, commit=False, mismatch=True)
    j.finish(tmp_path_factory)


# The vote off the critical path: a rank applies step s when it votes for it and computes s + 1
# while the vote travels. An outcome heard late, while s + 1 computes, must leave the run exactly
# where an uninterrupted run is, with each step's samples committed once.


def _in_next_step(j: FakeJob, step: int) -> None:
    """Waits until every rank of the generation computes ``step`` (inside its --step-sleep),
    the vote of ``step - 1`` unanswered."""
    for r in j.ranks:
        wait_for(lambda: f"step={step} sleeping" in j.log(r), 60, f"rank {r} to compute step {step}")


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("late", ["abort", "commit-then-abort", "rollback"])
def test_an_outcome_heard_while_the_next_step_computes_leaves_the_run_exact(job, tmp_path_factory, late, optimizer):
    """Step 6 is applied by both ranks when they vote; the outcome comes while step 7 computes:
    an abort before the commit (step 6 undone, done again in the next generation), a commit with
    the abort right behind it (step 6 kept, step 7 done again), or a rollback in the same
    generation (step 7's work dropped, step 6 done again)."""
    j = job(extra=["--optimizer", optimizer, "--step-sleep", "0.3", "--verbose"])
    j.launch(0), j.launch(1)
    j.form([0, 1])
    j.run_until(5)
    j.votes(6)
    _in_next_step(j, 7)
    if late == "rollback":
        j.outcome(6, commit=False)
    else:
        if late == "commit-then-abort":
            j.outcome(6)
        j.abort("a rank lost while step 7 computes")
        j.form([0, 1])              # resumes after step 5 (abort) or 6 (commit-then-abort)
    if late != "commit-then-abort":
        j.votes(6)                  # step 6 again, not step 7
        j.outcome(6)
    j.finish(tmp_path_factory, ["--optimizer", optimizer])


def test_a_checkpoint_written_while_the_next_step_computes_holds_the_committed_state(
        job, tmp_path, procs, tmp_path_factory):
    ckpt = tmp_path / "ckpt"
    j = job(extra=["--optimizer", "adam", "--checkpoint-dir", str(ckpt), "--checkpoint-interval", "4"])
    j.launch(0), j.launch(1)
    j.form([0, 1])
    j.run_until(8)                  # step 7's commit is heard during step 8: the checkpoint of 7
    j.votes(9)
    for r in range(2):
        j.agent.send(r, FakeAgent.stop(pb.StopTraining.MODE_EXIT, "end here"))
    for r in range(2):
        j.processes[r].wait(timeout=60)
    from regroup.checkpoint import Checkpointer

    assert Checkpointer(str(ckpt)).newest().step == 7
    out = tmp_path / "resumed.pt"
    p = procs.start([PYTHON, str(EXAMPLE), *BASE, "--optimizer", "adam", "--steps", "20",
                     "--checkpoint-dir", str(ckpt), "--out", str(out)], {"OMP_NUM_THREADS": "1"},
                    log=tmp_path / "resume.log")
    assert p.wait(timeout=120) == 0, (tmp_path / "resume.log").read_text()[-3000:]
    error = relative_error(reference(tmp_path_factory, 20, ["--optimizer", "adam"]), torch.load(out))
    assert error <= TOLERANCE, f"norm-relative error {error:.3e}: the checkpoint held another state"


@pytest.mark.parametrize("ddp", [False, True], ids=["library-reduce", "ddp"])
def test_an_abort_frees_a_rank_blocked_in_a_collective_and_a_restarted_rank_gets_its_peers_state(
        job, tmp_path_factory, ddp):
    j = job(extra=["--step-sleep", "0.05"] + (["--ddp"] if ddp else []))
    j.launch(0), j.launch(1)
    j.form([0, 1])
    j.run_until(4)
    os.kill(j.processes[1].pid, signal.SIGSTOP)          # frozen: its sockets stay open
    # The library reduces after the micro-batches; DDP inside the last backward pass. The vote is
    # off the critical path: when the stop came after step 5's reduce, rank 0 voted for 5 and is
    # held in step 6 (its reduce, or its wait for 5's outcome), its beats saying "voted, step 5"
    # until the outcome comes, which it never does here.
    held = (pb.PHASE_COMPUTING if ddp else pb.PHASE_REDUCING, pb.PHASE_VOTED)
    wait_for(lambda: j.agent.heartbeats[0][-1][1].step == 5 and j.agent.last_phase(0) in held, 30,
             "rank 0 to be held at step 5")
    time.sleep(0.5)
    assert j.agent.heartbeats[0][-1][1].step == 5 and j.agent.last_phase(0) in held
    sent = time.monotonic()
    j.abort("rank 1 froze")
    paused = wait_for(lambda: next((t for t, b in j.agent.heartbeats[0] if t > sent and b.phase == pb.PHASE_PAUSED),
                                   None), 10, "rank 0 to leave the collective")
    print(f"abort -> rank 0 out of its collective and paused: {(paused - sent) * 1000:.1f} ms")
    assert paused - sent < 1.0
    os.kill(j.processes[1].pid, signal.SIGKILL)            # the agent restarts it in place
    j.processes[1].wait(timeout=30)
    j.launch(1)
    hello = j.agent.hellos[1][-1]
    assert (hello.generation, hello.committed_step) == (0, -1)
    formed = time.monotonic()
    j.form([0, 1])
    j.votes(j.committed + 1)
    print(f"new generation -> first vote: {(time.monotonic() - formed) * 1000:.0f} ms")
    j.outcome(j.committed + 1)
    j.finish(tmp_path_factory)


def test_a_collective_failure_without_an_abort_is_reported_as_a_fault(job):
    j = job(extra=["--step-sleep", "0.05"])
    j.launch(0), j.launch(1)
    j.form([0, 1])
    j.run_until(2)
    os.kill(j.processes[1].pid, signal.SIGKILL)
    # First the early signs of which peer is gone (its connection closed: PeerWatch; the failed
    # collective), then, with no abort within the grace, the fault itself.
    faults = [j.agent.next(0, ["fault"], 30).fault]
    while faults[-1].early:
        faults.append(j.agent.next(0, ["fault"], 30).fault)
    assert len(faults) > 1, "an early sign came first"
    fault = faults[-1]
    assert fault.kind == pb.FAULT_KIND_COLLECTIVE_ERROR
    assert (fault.generation, fault.step) == (1, 3)
    assert "rank 0" in fault.detail
    assert j.processes[0].poll() is None  # still alive, waiting for the manager


def test_a_rank_that_does_not_leave_its_step_after_an_abort_exits_with_the_distinctive_code(job):
    j = job(extra=["--step-sleep", "30", "--abort-exit", "1", "--verbose"])
    j.launch(0), j.launch(1)
    j.form([0, 1])
    # Into the step's 30 s sleep, which the example announces with --verbose. An abort before the
    # sleep is seen at once and the rank leaves its step in time (CI once aborted 15 ms after the
    # step began: the rank left, as it should, and waited for the next generation).
    wait_for(lambda: "sleeping 30" in j.log(0), 60, "rank 0 to enter its step's sleep")
    sent = time.monotonic()
    j.abort("test")
    try:
        code = j.processes[0].wait(timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail(f"rank 0 is still in its step 20 s after the abort:\n{j.log(0)}")
    assert code == 75, j.log(0)  # regroup.EXIT_ABORT_STUCK
    assert 0.9 < time.monotonic() - sent < 10


def test_standby_keeps_the_state_and_a_later_generation_catches_the_rank_up(job, tmp_path_factory):
    j = job()
    j.launch(0), j.launch(1)
    j.form([0, 1])
    j.run_until(4)
    j.votes(5)
    j.abort("scale in")
    j.agent.send(1, FakeAgent.stop(pb.StopTraining.MODE_STANDBY, "no place in generation 2"))
    j.form([0])                      # one replica: it computes all four micro-batches
    j.run_until(9)
    assert j.processes[1].poll() is None
    j.votes(10)
    j.abort("scale out")
    j.form([0, 1])  # rank 1 is behind: it receives the state of step 9
    j.finish(tmp_path_factory)


def test_a_pause_holds_new_steps_until_the_next_generation(job, tmp_path_factory):
    j = job()
    j.launch(0), j.launch(1)
    j.form([0, 1])
    j.run_until(3)
    pause = pb.AgentReply()
    pause.pause.reason, pause.pause.timeout_ms = "the manager is unreachable", 30000
    votes = j.votes(4)
    for r in range(2):
        j.agent.send(r, pause)
    j.outcome(4)
    wait_for(lambda: all(j.agent.last_phase(r) == pb.PHASE_PAUSED for r in range(2)), 10, "both ranks to pause")
    # The vote is off the critical path: step 5 may have begun while step 4's vote travelled,
    # before the pause came, and then ends with its vote. No step begins after the pause.
    for r in range(2):
        try:
            voted = j.agent.next(r, ["vote"], 1.0).vote.step
        except AssertionError:
            voted = None
        assert voted in (None, 5), f"rank {r} voted for step {voted} after the pause"
        with pytest.raises(AssertionError):
            j.agent.next(r, ["vote"], 1.0)
    j.form([0, 1])  # a new manager epoch would do this; same epoch here, next generation
    j.finish(tmp_path_factory)


def test_leave_exits_0_at_the_step_boundary(job):
    j = job()
    j.launch(0), j.launch(1)
    j.form([0, 1])
    j.run_until(3)
    j.votes(4)
    j.outcome(4)
    j.abort("pod 0 leaves")
    j.agent.send(0, FakeAgent.stop(pb.StopTraining.MODE_LEAVE, "planned departure"))
    assert j.processes[0].wait(timeout=30) == 0
    assert j.processes[1].poll() is None


def test_exit_stops_with_a_non_zero_code_and_the_reason(job):
    j = job()
    j.launch(0), j.launch(1)
    j.form([0, 1])
    j.run_until(2)
    for r in range(2):
        j.agent.send(r, FakeAgent.stop(pb.StopTraining.MODE_EXIT, "poison step 3"))
    for r in range(2):
        assert j.processes[r].wait(timeout=30) != 0
    assert "poison step 3" in j.log(0)


def test_dump_writes_a_checkpoint_that_a_fresh_start_resumes_from(job, tmp_path, procs, tmp_path_factory):
    ckpt = tmp_path / "ckpt"
    j = job(extra=["--checkpoint-dir", str(ckpt)])
    j.launch(0), j.launch(1)
    j.form([0, 1])
    j.run_until(6)
    j.votes(7)
    j.abort("fault")
    for r in range(2):
        j.agent.send(r, FakeAgent.stop(pb.StopTraining.MODE_DUMP, "no replacement in time"))
    for r in range(2):
        assert j.processes[r].wait(timeout=60) == 0, j.log(r)
    from regroup.checkpoint import Checkpointer

    assert Checkpointer(str(ckpt)).newest().step == 6
    # A fresh start of the whole job (no agent here) resumes from the dump.
    out = tmp_path / "resumed.pt"
    p = procs.start([PYTHON, str(EXAMPLE), *BASE, "--steps", "20", "--checkpoint-dir", str(ckpt),
                     "--out", str(out)], {"OMP_NUM_THREADS": "1"}, log=tmp_path / "resume.log")
    assert p.wait(timeout=120) == 0, (tmp_path / "resume.log").read_text()[-3000:]
    assert relative_error(reference(tmp_path_factory, 20), torch.load(out)) <= TOLERANCE


def test_an_abort_frees_a_rank_waiting_for_its_generations_store(job, tmp_path_factory):
    j = job()
    j.launch(0), j.launch(1)
    # Only rank 1 hears of generation 1: its store (hosted by rank 0) never comes up.
    j.generation, j.directive, j.ranks = 1, 1, [0, 1]
    j.agent.send(1, FakeAgent.start(1, j.epoch, 1, 2, 1, free_port(), -1, local_rank=1))
    wait_for(lambda: j.agent.last_phase(1) == pb.PHASE_SYNCING, 30, "rank 1 to start forming generation 1")
    time.sleep(0.3)
    sent = time.monotonic()
    j.abort("rank 0 is gone")
    wait_for(lambda: any(t > sent and b.phase == pb.PHASE_PAUSED for t, b in j.agent.heartbeats[1]), 10,
             "rank 1 to give up generation 1")
    assert j.processes[1].poll() is None
    # Outside a step a rank reports no step (-1): a fault while it waits for or forms a
    # generation is not "the resumed step failing again" to the engine's poison-step guard.
    outside = [b.step for _, b in j.agent.heartbeats[1] if b.phase in (pb.PHASE_PAUSED, pb.PHASE_SYNCING)]
    assert outside and set(outside) == {-1}, outside
    j.form([0, 1])
    j.finish(tmp_path_factory)


def test_a_newer_generation_frees_a_rank_stuck_in_the_rendezvous_of_an_older_one(job, tmp_path_factory):
    """A start for a newer generation ends the one a rank is in, abort or no abort: rank 0 hosts
    generation 1's store and waits in its rendezvous for rank 1, which never hears of it. Without
    the start freeing it, rank 0 would wait there for the collective timeout (600 s)."""
    j = job(extra=["--verbose"])
    j.launch(0), j.launch(1)
    j.generation, j.directive, j.ranks = 1, 1, [0, 1]
    j.agent.send(0, FakeAgent.start(1, j.epoch, 1, 2, 0, free_port(), -1, local_rank=0))
    wait_for(lambda: j.agent.last_phase(0) == pb.PHASE_SYNCING, 30, "rank 0 to start forming generation 1")
    time.sleep(0.5)  # inside torch's rendezvous by now
    j.form([0, 1])  # generation 2, with no abort of generation 1
    j.finish(tmp_path_factory)
    assert "generation 1 aborted while forming" in j.log(0), j.log(0)


def test_a_rank_that_never_finished_a_state_sync_receives_the_state_before_the_first_commit(job, tmp_path_factory):
    j = job(extra=["--verbose"])
    j.launch(0), j.launch(1)
    # Generation 1 never forms: only rank 1 hears of it, and its store (rank 0's) never comes up.
    j.generation, j.directive, j.ranks = 1, 1, [0, 1]
    j.agent.send(1, FakeAgent.start(1, j.epoch, 1, 2, 1, free_port(), -1, local_rank=1))
    wait_for(lambda: j.agent.last_phase(1) == pb.PHASE_SYNCING, 30, "rank 1 to start forming generation 1")
    sent = time.monotonic()
    j.abort("rank 0 is gone")
    wait_for(lambda: any(t > sent and b.phase == pb.PHASE_PAUSED for t, b in j.agent.heartbeats[1]), 10,
             "rank 1 to give up generation 1")
    # The agent records a rank as in generation 1 once it delivered the start, so a manager
    # judging from its records would list nobody as needing the state. Rank 1 holds only its own
    # initialisation all the same (the example's is the same on every rank, so the weights alone
    # would not show it).
    j.form([0, 1])
    j.finish(tmp_path_factory)
    assert "received the state of step -1 from rank 0" in j.log(1)

