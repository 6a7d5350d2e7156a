# SPDX-License-Identifier: Apache-2.0
"""End to end: a distributed optimizer (ZeRO-1) on a dp 2 x tp 2 grid under the real
regroup-manager and regroup-agent (``examples/train_grid.py --tp-impl hand --optimizer-sharding
zero1 --optimizer-copies 2``, Adam, torch 1.13 is enough): 2 nodes, each one replica of 2
tensor-parallel ranks.

One run goes through a killed rank (restarted in place: its position's slices come back from the
rank at the same position of the other replica), a lost node (scale-in to dp 1: each position's
survivor cuts its own slice and its second copy into the whole of its position's state) and the
node's return (scale-out to dp 2: each returning rank receives its position's slices, point to
point). The final weights must equal one plain process computing the whole model with the plain
(unsharded) Adam (float64, norm-relative 1e-9) and the ledger must hold every sample once.
Another, without second copies (``--optimizer-copies 1``), loses a killed rank's slice: the
fault names it with its position, and the job restarts from its newest checkpoint, exactly.
"""

from __future__ import annotations

import os
import signal

import pytest

from regroup.e2e_test import ANNOTATIONS, Cluster
from regroup.tensor_parallel_test import grid_through_faults
from regroup.testing import wait_for

pytestmark = pytest.mark.e2e


def test_zero1_on_a_tp2_grid_recovers_a_killed_rank_a_lost_node_and_its_return(tmp_path, tmp_path_factory, procs,
                                                                             binaries):
    grid_through_faults(tmp_path, tmp_path_factory, procs, binaries,
                        ["--tp-impl", "hand", "--optimizer-sharding", "zero1", "--optimizer-copies", "2",
                         "--step-sleep", "0.05"], lost=1)
    kept = (tmp_path / "node0.log").read_text()
    back = (tmp_path / "node1-replacement.log").read_text()
    # node0's rank at position 1 took its position's whole state at dp 1 (its own slice and its
    # second copy), and the returning rank at position 1 received its slices from it.
    for text, line in ((kept, "of dp 1 assembled from dp 2"), (back, "of dp 2 assembled from dp 1")):
        assert f"at position 1 (pipeline stage 0, tensor-parallel rank 1) {line}" in text, text[-3000:]
    assert "optimizer shard lost" not in kept + back


def test_zero1_on_a_tp2_grid_without_second_copies_names_the_lost_slice_and_its_position_and_resumes_from_a_checkpoint(
        tmp_path, tmp_path_factory, procs, binaries):
    """Without second copies a killed rank's slice (replica 1's at position 1) is held by no
    rank: forming the next generation fails on every rank naming the slice and the position,
    and with fault-retry-times and pod-level rescheduling every process restarts from the newest
    checkpoint (a file per position and slice) and trains on to one plain process's weights."""
    from regroup.tensor_parallel_test import GRID, grid_reference

    steps, optimizer = 40, ["--optimizer", "adam"]
    expected = grid_reference(tmp_path, steps, optimizer)
    ckpt = tmp_path / "ckpt"
    # As integration scenario 51: in-place recovery or exit; the lost slice is a state_lost fault,
    # which restarts the job from its checkpoint (with fault-retry-times).
    annotations = [a for a in ANNOTATIONS if not a.startswith(("recover-strategy=", "regroup.io/prefer-elastic="))]
    c = Cluster(tmp_path, procs, binaries, steps=steps, script=GRID, tp=2,
                annotations=[*annotations, "recover-strategy=recover-in-place,exit"],
                labels=["pod-rescheduling=on", "fault-retry-times=2"],
                train=["--tp-impl", "hand", *optimizer, "--optimizer-sharding", "zero1", "--optimizer-copies", "1",
                       "--step-sleep", "0.1", "--checkpoint-dir", str(ckpt), "--checkpoint-interval", "5"])
    c.start()
    c.wait_step(12)
    wait_for(lambda: "fork server ready" in (tmp_path / "node1.log").read_text(), 60, "node1's fork server")
    os.kill(c.trainers("node1")[1], signal.SIGKILL)   # rank 3: replica 1, position 1
    status = c.finish(tmp_path_factory, [], ["node0", "node1"], expected=expected)
    assert "optimizer shard lost, no second copy: slice [1] at position 1 (pipeline stage 0, tensor-parallel " \
           "rank 1)" in status, status
    assert "every process restarts from the newest checkpoint" in status, status
