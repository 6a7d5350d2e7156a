# SPDX-License-Identifier: Apache-2.0
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

import os
import signal
from pathlib import Path
from typing import Sequence

import pytest
import torch

from regroup.e2e_test import Cluster
from regroup.testing import REPO, check_dropin_ledger, relative_error, run_plain_ddp, wait_for

pytestmark = pytest.mark.e2e

DROPIN = REPO / "examples" / "ddp_regroup.py"
TOLERANCE = 1e-9
DATASET, WORLD = 256, 4
ANNOTATIONS = [
    "recover-strategy=retry,recover-in-place,recover,elastic-training,dump,exit",
    "regroup.io/prefer-elastic=true",
    "regroup.io/heartbeat-interval-ms=200",
    "regroup.io/liveness-misses=100",
]


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
        run_plain_ddp(self.train, WORLD, reference, ledger=ref_ledger)
        error = relative_error(torch.load(reference), torch.load(c.out))
        assert error <= TOLERANCE, f"final weights: norm-relative error {error:.3e}\n{status}"
        check_dropin_ledger(c.ledger, ref_ledger, DATASET, self.epochs)
        return status


_AMP_ON_CPU = hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler")   # torch 2.x


@pytest.mark.parametrize("variant", [
    ["--accum", "1"],
    ["--accum", "2", "--sched", "epoch", "--comm-hook", "--workers", "2"],
    pytest.param(["--amp", "--clip", "0.5"], marks=pytest.mark.skipif(
        not _AMP_ON_CPU, reason="a GradScaler on the CPU needs torch 2.x (torch.amp.GradScaler)")),
], ids=["plain", "accumulation+epoch-scheduler+comm-hook+workers", "grad-scaler+clipping"])
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
