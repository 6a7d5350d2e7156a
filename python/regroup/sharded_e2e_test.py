# SPDX-License-Identifier: Apache-2.0
"""End to end: HSDP (examples/train_mlp.py --shard hsdp, FSDP2) under the real regroup-manager
and regroup-agent: 2 nodes, each one replica of 2 shard ranks.

One run goes through a killed rank (its replica's shard comes back from the peer replica's rank
at the same position), a lost node (its replica leaves, the other trains on alone) and the
node's return (a new replica receives each local shard from the survivor at its position). The
final weights must equal the same layout's fault-free run (4 processes, no Regroup control plane;
float64, norm-relative 1e-9) and the ledger must hold every sample exactly once per epoch. The
reference is the layout's own run, not one process: each rank computes batch-norm statistics and
dropout over its part of a micro-batch.
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
import torch

from regroup.e2e_test import Cluster
from regroup.sharded import fsdp2_available
from regroup.testing import EXAMPLE, PYTHON, free_port, read_ledger, wait_for

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(not fsdp2_available(),
                                 reason=f"HSDP needs FSDP2 (torch >= 2.6); this is torch {torch.__version__}")]

SHARD = ["--shard", "hsdp", "--optimizer", "adam"]


_references: dict = {}


def layout_reference(tmp_path, steps: int) -> dict:
    """The fault-free run of the same layout: 2 replicas of 2 ranks with torchrun's environment,
    no agent. (One replica computes the same: a rank's part of a micro-batch depends only on its
    position, which replica computes the micro-batch does not matter.)"""
    if steps in _references:
        return _references[steps]
    out = tmp_path / "layout-ref.pt"
    port = free_port()
    argv = [PYTHON, str(EXAMPLE), "--float64", "--dataset", "128", "--micro-batch", "8", "--microbatches", "4",
            "--checksum-interval", "5", "--quiet", "--steps", str(steps), "--tp", "2", *SHARD, "--out", str(out)]
    ranks = [subprocess.Popen(argv, env={**os.environ, "OMP_NUM_THREADS": "1", "RANK": str(r), "WORLD_SIZE": "4",
                                         "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for r in range(4)]
    try:
        for r in ranks:
            _, err = r.communicate(timeout=300)
            assert r.returncode == 0, err.decode()[-3000:]
    finally:
        for r in ranks:
            if r.poll() is None:
                r.kill()
                r.wait(timeout=10)
    _references[steps] = torch.load(out)
    return _references[steps]


def newest_generation(c: Cluster) -> tuple:
    return max((tuple(r["g"]) for r in read_ledger(c.ledger)), default=(0, 0))


def wait_replica_back(c: Cluster, after: tuple, what: str) -> None:
    """Until replica 1 commits in a generation newer than ``after`` (or training ended)."""
    def back():
        return any(r["replica"] == 1 and tuple(r["g"]) > after for r in read_ledger(c.ledger)) or \
            c.last_step() >= c.steps - 1 or c.dead()
    wait_for(back, 180, what)
    assert c.last_step() < c.steps - 1 and not c.dead(), f"training ended before {what}\n{c.status()}\n{c.logs()}"


def kill_lose_and_return(c: Cluster, tmp_path, lost: int) -> None:
    """The faults of a two-node run: a rank of node1 killed (restarted in place), then node
    ``lost`` lost (its replica leaves, the other trains on alone), then its replacement
    ``node{lost}-replacement`` added (scale-out); each recovery waited for and checked."""
    log = tmp_path / "node1.log"
    wait_for(lambda: "fork server ready" in log.read_text(), 60, "node1's fork server")
    before = newest_generation(c)
    os.kill(c.trainers("node1")[1], signal.SIGKILL)        # a killed rank: restarted in place
    wait_replica_back(c, before, "the killed rank's replica to train again")
    assert "restart_in_place" in c.status()
    before = newest_generation(c)
    agent = c.agents[f"node{lost}"]
    for pid in [agent.pid, *c.trainers(f"node{lost}")]:    # a lost node: its replica leaves
        os.kill(pid, signal.SIGKILL)
    agent.wait(timeout=30)
    wait_for(lambda: newest_generation(c) > before or c.dead(), 60, "the other replica to train on alone")
    assert "scale_in" in c.status()
    before = newest_generation(c)
    c.start_agent(f"node{lost}-replacement", lost)         # the node's return: scale out
    wait_replica_back(c, before, "the replacement replica to train")


def test_hsdp_recovers_a_killed_rank_a_lost_node_and_its_return(tmp_path, tmp_path_factory, procs, binaries):
    # Long enough (0.15 s a step) for a replacement node's trainers to start (torch 2.x imports
    # take tens of seconds on a loaded 2-core machine) before training ends; the test waits for
    # each return, it does not assume one.
    steps = 200
    expected = layout_reference(tmp_path, steps)
    c = Cluster(tmp_path, procs, binaries, steps=steps, train=[*SHARD, "--step-sleep", "0.15"], tp=2)
    c.start()
    c.wait_step(8)
    kill_lose_and_return(c, tmp_path, lost=1)
    status = c.finish(tmp_path_factory, [], ["node0", "node1-replacement"], expected=expected)
    assert "scale_out" in status, status


def test_plain_fsdp_has_no_peer_replica_and_goes_to_its_newest_checkpoint(tmp_path, tmp_path_factory, procs,
                                                                         binaries):
    """One replica of 2 ranks (FSDP): a killed rank's shard is held by nobody else, so the job
    restarts from its newest checkpoint (of local shards) and trains on to the fault-free
    weights. A killed process is a fault of the training's own, so the job restarts only with
    fault-retry-times (here with MindCluster's pod-level rescheduling: no scheduler replaces pods
    in this test). Without them the manager ends the job, naming why: "no surviving rank holds
    the state of replica position [1]: a checkpoint is needed" (the engine's RestartDeadRanks)."""
    steps = 40
    expected = layout_reference(tmp_path, steps)
    ckpt = tmp_path / "ckpt"
    c = Cluster(tmp_path, procs, binaries, steps=steps, tp=2, labels=["pod-rescheduling=on", "fault-retry-times=2"],
                train=[*SHARD, "--step-sleep", "0.15", "--checkpoint-dir", str(ckpt), "--checkpoint-interval", "5"])
    c.start(nodes=1, nproc=2)
    c.wait_step(12)
    os.kill(c.trainers("node0")[1], signal.SIGKILL)
    status = c.finish(tmp_path_factory, [], ["node0"], expected=expected)
    assert "every process restarts from the newest checkpoint" in status, status
    assert "resuming at dp=1 from the newest checkpoint" in status, status
