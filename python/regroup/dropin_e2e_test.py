"""The drop-in end to end: examples/ddp_regroup.py (the plain DDP script with five lines changed)
under the real regroup-manager and regroup-agent, through a killed rank, a lost node and the
node's return.

What the drop-in keeps, each checked against the unmodified script (examples/ddp_plain.py, four
processes with torchrun's environment, no Regroup) trained without faults:

- every sample exactly once per epoch, and the global batch of every step is the unmodified
  script's (the ledger: the samples of each committed step are those its four ranks' batches
  hold in the reference);
- the same number of optimizer steps (the last committed step);
- the final weights (float64, norm-relative 1e-9), for this model (no dropout, no batch norm: its
  forward treats samples independently) and its mean loss, through a scale-in (two ranks stand in
  for four) and back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Dict, List, Sequence

import pytest
import torch

from regroup.e2e_test import Cluster
from regroup.testing import PYTHON, REPO, free_port, relative_error, wait_for

pytestmark = pytest.mark.e2e

PLAIN = REPO / "examples" / "ddp_plain.py"
DROPIN = REPO / "examples" / "ddp_regroup.py"
TOLERANCE = 1e-9
DATASET, WORLD, BATCH = 256, 4, 8
ANNOTATIONS = [
    "recover-strategy=retry,recover-in-place,recover,elastic-training,dump,exit",
    "regroup.io/prefer-elastic=true",
    "regroup.io/heartbeat-interval-ms=200",
    "regroup.io/liveness-misses=100",
]


def run_plain(out: Path, args: Sequence[str], world: int = WORLD, ledger: Path = None) -> None:
    """The unmodified script, ``world`` processes with torchrun's environment."""
    port = free_port()
    extra = ["--ledger", str(ledger)] if ledger else []
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        env.pop("REGROUP_AGENT_SOCKET", None)
        procs.append(subprocess.Popen([PYTHON, str(PLAIN), *args, "--out", str(out), *extra], env=env,
                                      stdout=subprocess.DEVNULL))
    codes = [p.wait(timeout=300) for p in procs]
    assert codes == [0] * world, f"the plain script exited with {codes}"


def committed_samples(ledger: Path) -> Dict[int, List[int]]:
    """Step -> the samples of its committed attempt (its highest generation's lines)."""
    by_step: Dict[int, Dict[int, List[int]]] = {}
    for line in ledger.read_text().splitlines():
        r = json.loads(line)
        by_step.setdefault(r["step"], {}).setdefault(r["g"], []).extend(r["samples"])
    return {s: sorted(set(gens[max(gens)])) for s, gens in by_step.items()}


class DropInJob:
    def __init__(self, tmp_path: Path, procs, binaries, train: Sequence[str], epochs: int = 2):
        self.epochs = epochs
        self.train = ["--epochs", str(epochs), *train]
        self.cluster = Cluster(tmp_path, procs, binaries, steps=0, train=[], script=DROPIN,
                               annotations=ANNOTATIONS)
        c = self.cluster
        c.train = [*self.train, "--ledger", str(c.ledger), "--out", str(c.out)]

    def check(self, tmp_path: Path, agents: Sequence[str]) -> str:
        c = self.cluster
        for name in agents:
            code = c.agents[name].wait(timeout=240)
            assert code == 0, f"agent {name} exited with {code}\n{c.status()}\n{c.logs()}"
        status = c.status()
        print(status)
        reference, ref_ledger = tmp_path / "plain.pt", tmp_path / "plain.ledger"
        run_plain(reference, self.train, ledger=ref_ledger)
        error = relative_error(torch.load(reference), torch.load(c.out))
        assert error <= TOLERANCE, f"final weights: norm-relative error {error:.3e}\n{status}"
        got, want = committed_samples(c.ledger), committed_samples(ref_ledger)
        assert sorted(got) == sorted(want), f"committed steps {sorted(got)} != the plain script's {sorted(want)}"
        for s in want:
            assert got[s] == want[s], f"step {s} used samples {got[s]}, the plain script {want[s]}"
        steps_per_epoch = len(want) // self.epochs
        for e in range(self.epochs):
            seen = [i for s in range(e * steps_per_epoch, (e + 1) * steps_per_epoch) for i in got[s]]
            assert sorted(seen) == list(range(DATASET)), f"epoch {e}: a sample lost or repeated"
        return status


@pytest.mark.parametrize("variant", [["--accum", "1"], ["--accum", "2", "--sched", "epoch", "--comm-hook"]],
                         ids=["plain", "accumulation+epoch-scheduler+comm-hook"])
def test_a_killed_rank_of_a_drop_in_script_is_restarted_and_the_weights_are_the_plain_scripts(
        tmp_path, procs, binaries, variant):
    # Long enough for the fork server to be ready while the job trains (torch 2.x imports slowly).
    job = DropInJob(tmp_path, procs, binaries, ["--step-sleep", "0.25", *variant], epochs=4)
    c = job.cluster
    c.start()
    log = tmp_path / "node1.log"
    wait_for(lambda: "fork server ready" in log.read_text() or c.dead(), 90, "node1's fork server")
    c.wait_step(3)
    assert c.last_step() < 28, "the job ended before the fault"
    os.kill(c.trainers("node1")[1], signal.SIGKILL)
    status = job.check(tmp_path, ["node0", "node1"])
    assert "restart_in_place" in status


def test_a_drop_in_script_scales_in_on_a_lost_node_and_out_on_its_return(tmp_path, procs, binaries):
    # Long enough for the replacement to import torch (12 s for 2.x here) and join before the end.
    job = DropInJob(tmp_path, procs, binaries, ["--step-sleep", "0.25"], epochs=10)
    c = job.cluster
    c.start()
    c.wait_step(3)
    lost = c.agents["node1"]
    for pid in [lost.pid, *c.trainers("node1")]:
        os.kill(pid, signal.SIGKILL)
    lost.wait(timeout=30)
    c.wait_step(c.last_step() + 4)       # two ranks stand in for four
    c.start_agent("node1-replacement", 1)
    status = job.check(tmp_path, ["node0", "node1-replacement"])
    assert "scale_in" in status and "scale_out" in status
