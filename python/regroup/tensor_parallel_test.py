# SPDX-License-Identifier: Apache-2.0
"""DTensor tensor parallelism that recovers in place (regroup.tensor_parallel, torch 2.x).

End to end: ``examples/train_grid.py --tp-impl dtensor`` (every block's W1 ColwiseParallel, W2
RowwiseParallel, parallelized by the trainer) on dp 2 x tp 2 under the real regroup-manager and
regroup-agent, 2 nodes of one replica each, through a killed rank (restarted in place: its
position's shards come from the peer replica), the loss of node0 (replica 0: the survivors are
renumbered 2, 3 -> 0, 1, so their tensor-parallel group, its name and their mesh's ranks all
change, and their module must be re-homed on the new mesh) and node0's return (a new replica
receives each local shard from the survivor at its position). The final weights equal one
process computing the whole model (float64, norm-relative 1e-9) and every sample is committed
exactly once (the ledger).
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest
import torch

from regroup.api import ConfigError, TrainerConfig
from regroup.e2e_test import TRAIN, Cluster
from regroup.sharded_e2e_test import kill_lose_and_return
from regroup.tensor_parallel import tensor_parallel_available
from regroup.testing import PYTHON, REPO

GRID = REPO / "examples" / "train_grid.py"
needs_tp = pytest.mark.skipif(
    not tensor_parallel_available(),
    reason=f"DTensor tensor parallelism needs torch 2.x (parallelize_module, DeviceMesh.from_group); "
           f"this is torch {torch.__version__}")


@pytest.mark.skipif(tensor_parallel_available(), reason="this torch has DTensor tensor parallelism")
def test_without_dtensor_a_plan_is_refused_naming_the_torch():
    with pytest.raises(ConfigError, match=re.escape(f"torch 2.x); this is torch {torch.__version__}")):
        TrainerConfig(dataset_size=8, micro_batch_size=1, microbatches_per_step=2, tensor_parallel=2,
                      tensor_parallel_plan={"w": object()})


@needs_tp
def test_a_plan_is_refused_with_what_cannot_carry_it():
    from torch.distributed.tensor.parallel import ColwiseParallel

    def config(**kw):
        base = dict(dataset_size=8, micro_batch_size=1, microbatches_per_step=2, tensor_parallel=2)
        return TrainerConfig(**{**base, **kw})

    assert config(tensor_parallel_plan={"w": ColwiseParallel()}).tensor_parallel_plan
    with pytest.raises(ConfigError, match=r"tensor_parallel_plan\['w'\]=.*maps module names to ParallelStyles"):
        config(tensor_parallel_plan={"w": "colwise"})
    with pytest.raises(ConfigError, match="tensor_parallel=1 must be at least 2"):
        config(tensor_parallel=1, tensor_parallel_plan=ColwiseParallel())
    with pytest.raises(ConfigError, match="cannot be combined with ddp=True"):
        config(tensor_parallel_plan=ColwiseParallel(), ddp=True)


@needs_tp
def test_a_dtensor_collective_wait_is_left_at_once_on_an_abort():
    """DTensor's waits (torch's functional collectives) go through the generation's sockets on
    gloo: an abort leaves one that gloo's lost wake-up would hold (here a wait that never ends
    by itself), instead of the abort watchdog exiting the rank with its shard."""
    import threading

    import torch.distributed._functional_collectives as funcol

    from regroup import tensor_parallel
    from regroup.abort import Abandoned, GroupSockets

    sockets = GroupSockets(0)
    sockets.begin()
    sockets.end()
    stuck, saved = threading.Event(), tensor_parallel._torch_wait
    tensor_parallel.abortable_functional_waits(sockets)
    tensor_parallel._torch_wait = lambda t: (stuck.wait(60), t)[1]   # a wait gloo never wakes
    abort = threading.Timer(0.2, sockets.shutdown)
    abort.start()
    try:
        with pytest.raises(Abandoned, match="a DTensor collective was left: the generation was aborted"):
            funcol.wait_tensor(torch.ones(1))
    finally:
        stuck.set()
        abort.join()
        tensor_parallel._torch_wait = saved
        tensor_parallel.abortable_functional_waits(None)
    assert funcol.wait_tensor is tensor_parallel._wait_tensor


def grid_reference(tmp_path, steps: int, extra) -> dict:
    """One plain process computing the whole model (the hand split's script, no --tp)."""
    out = tmp_path / "ref.pt"
    subprocess.run([PYTHON, str(GRID), *TRAIN, "--quiet", "--steps", str(steps), *extra, "--out", str(out)],
                   check=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL)
    return torch.load(out)


def grid_through_faults(tmp_path, tmp_path_factory, procs, binaries, train, lost: int, steps: int = 40) -> None:
    """examples/train_grid.py (tp 2, Adam, ``train``'s flags) on 2 nodes of one replica each,
    through a killed rank, node ``lost`` lost and its return (sharded_e2e_test.kill_lose_and_return):
    the weights equal one plain process's and the ledger holds every sample once."""
    # Steps are slow (2 s) while scaled in, long enough for a replacement node's trainers to
    # import torch and join before training ends (about 30 s on a loaded 2-core machine); the
    # test waits for each recovery, it does not assume one.
    optimizer = ["--optimizer", "adam"]
    expected = grid_reference(tmp_path, steps, optimizer)
    c = Cluster(tmp_path, procs, binaries, steps=steps, script=GRID, tp=2,
                train=[*train, *optimizer, "--scaled-in-sleep", "2.0", "--verbose"])
    c.start()
    c.wait_step(5)
    kill_lose_and_return(c, tmp_path, lost=lost)
    status = c.finish(tmp_path_factory, [], [f"node{1 - lost}", f"node{lost}-replacement"], expected=expected)
    assert "scale_out" in status, status


@needs_tp
@pytest.mark.e2e
def test_dtensor_tp_recovers_a_killed_rank_a_lost_node_and_its_return(tmp_path, tmp_path_factory, procs, binaries):
    # node0 is replica 0's: losing it renumbers node1's ranks 2, 3 -> 0, 1.
    grid_through_faults(tmp_path, tmp_path_factory, procs, binaries, ["--tp-impl", "dtensor", "--step-sleep", "0.02"],
                        lost=0)
    text = (tmp_path / "node1.log").read_text()
    # node1's ranks went from 2, 3 to 0, 1 and back: their module moved onto each new mesh.
    assert "tensor-parallel module re-homed on the mesh of ranks [0, 1]" in text, text[-3000:]


@needs_tp
@pytest.mark.e2e
def test_dtensor_tp_with_zero1_recovers_a_killed_rank_a_lost_node_and_its_return(tmp_path, tmp_path_factory,
                                                                                 procs, binaries):
    """The same grid with a distributed optimizer (ZeRO-1 with second copies) over the DTensor
    local shards: each position's Adam state is sliced over its data-parallel group; node0's loss
    leaves replica 1 alone, which cuts its whole state from its own slice and its copy of the lost
    one; the returning replica (replica 0 again) receives its slices."""
    grid_through_faults(tmp_path, tmp_path_factory, procs, binaries,
                        ["--tp-impl", "dtensor", "--optimizer-sharding", "zero1", "--optimizer-copies", "2",
                         "--step-sleep", "0.02"], lost=0)
    text = (tmp_path / "node1.log").read_text()
    assert "tensor-parallel module re-homed on the mesh of ranks [0, 1]" in text, text[-3000:]
    for position in (0, 1):
        at = f"at position {position} (pipeline stage 0, tensor-parallel rank {position})"
        assert f"ZeRO-1 optimizer slices [0] {at} of dp 1 assembled from dp 2 (0 bytes received)" in text, text[-3000:]
    back = (tmp_path / "node0-replacement.log").read_text()
    got = re.findall(r"ZeRO-1 optimizer slices \[0, 1\] at position \d .* of dp 2 assembled from dp 1 "
                     r"\((\d+) bytes received\)", back)   # replica 0 again: slice 0 and the copy of 1
    assert len(got) == 2 and all(int(n) > 0 for n in got), back[-3000:]
