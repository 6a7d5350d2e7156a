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
"""

from __future__ import annotations

import pytest

from regroup.tensor_parallel_test import grid_through_faults

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
