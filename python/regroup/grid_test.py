# SPDX-License-Identifier: Apache-2.0
"""The dp x tp x pp grid: its layout, its groups rebuilt after a scale-in, and any backend.

The 8-rank test builds a generation of dp 2 x tp 2 x pp 2 over gloo, checks every group's
members by an all-gather over it, aborts it (the sockets shut down, as the agent link does),
then builds the next generation of the four ranks left (dp 1) and checks again.
"""

import json
import logging
import os
import sys
import threading

import pytest

from regroup.api import ConfigError
from regroup.group import Layout, resolve_backend
from regroup.testing import PYTHON

HERE = os.path.dirname(os.path.abspath(__file__))


def test_a_grid_numbers_tp_fastest_then_pipeline_stages_then_replicas():
    layout = Layout.grid(world_size=8, rank=5, tp=2, pp=2)
    # replica 1 is ranks 4..7: stage 0 is 4, 5 and stage 1 is 6, 7.
    assert (layout.dp, layout.tp, layout.pp) == (2, 2, 2)
    assert (layout.replica, layout.position, layout.stage, layout.tp_rank) == (1, 1, 0, 1)
    assert layout.mine("tp") == [4, 5]
    assert layout.mine("pp") == [5, 7]
    assert layout.mine("mp") == [4, 5, 6, 7]
    assert layout.mine("dp") == [1, 5]
    assert (layout.pp_prev, layout.pp_next) == (None, 7)
    last = Layout.grid(8, 7, 2, 2)
    assert (last.stage, last.pp_prev, last.pp_next) == (1, 5, None)
    kinds = [kind for kind, _ in layout.all_groups()]
    assert kinds.count("tp") == 4 and kinds.count("pp") == 4 and kinds.count("mp") == 2
    assert kinds.count("dp") == 4
    # Without pipeline stages, the tensor-parallel group is the replica, as before.
    flat = Layout(world_size=8, rank=5, replica_size=2)
    assert (flat.tp, flat.pp, flat.mine("tp"), flat.mine("dp")) == (2, 1, [4, 5], [1, 3, 5, 7])
    with pytest.raises(ConfigError, match="cannot hold 3 pipeline stages"):
        Layout(world_size=8, rank=0, replica_size=4, pipeline_parallel=3)


def test_plan_layout_takes_the_grid_from_the_job_and_refuses_a_disagreement():
    from regroup._proto import wire_pb2 as pb
    from regroup.api import TrainerConfig
    from regroup.forming import plan_layout

    start = pb.StartGeneration()
    start.plan.world_size, start.plan.tensor_parallel, start.plan.pipeline_parallel = 8, 2, 2
    start.assignment.rank = 6
    grid = TrainerConfig(dataset_size=64, micro_batch_size=2, microbatches_per_step=4,
                         tensor_parallel=2, pipeline_parallel=2)
    layout, begin, count = plan_layout(grid, start)
    assert (layout.tp, layout.pp, layout.stage, layout.replica, begin, count) == (2, 2, 1, 1, 2, 2)
    # tensor_parallel alone is still the whole replica, one group (its meaning before).
    legacy = TrainerConfig(dataset_size=64, micro_batch_size=2, microbatches_per_step=4,
                           tensor_parallel=4)
    layout, _, _ = plan_layout(legacy, start)
    assert (layout.tp, layout.pp, layout.mine("tp")) == (4, 1, [4, 5, 6, 7])
    wrong = TrainerConfig(dataset_size=64, micro_batch_size=2, microbatches_per_step=4,
                          tensor_parallel=4, pipeline_parallel=1)
    with pytest.raises(ConfigError, match=r"tensor parallel 2 x pipeline parallel 2 .* "
                                          r"tensor_parallel=4 x pipeline_parallel=1"):
        plan_layout(wrong, start)


def test_any_backend_torch_knows_is_taken_and_an_unknown_one_is_named():
    assert resolve_backend("gloo") == "gloo"
    with pytest.raises(ConfigError, match="'nosuch' is not known to torch.distributed"):
        resolve_backend("nosuch")
    import torch.distributed as dist

    if not dist.is_mpi_available():
        with pytest.raises(ConfigError, match="'mpi': this torch .* was built without it"):
            resolve_backend("mpi")
    import importlib.util

    if importlib.util.find_spec("torch_npu") is None:
        # Not refused by name: refused because torch does not know it without torch_npu.
        with pytest.raises(ConfigError, match="torch_npu"):
            resolve_backend("hccl")
    else:
        assert resolve_backend("hccl") == "hccl"


def run_workers(procs, tmp_path, ranks: int, script: str = __file__, what: str = "") -> None:
    """Runs ``ranks`` workers, ``script [what] RANK TMP_PATH``, to their end (each exits 0)."""
    env = {"PYTHONPATH": os.path.dirname(HERE), "OMP_NUM_THREADS": "1"}
    workers = [procs.start([PYTHON, script, *([what] if what else []), str(r), str(tmp_path)], env,
                           log=tmp_path / f"r{r}.log") for r in range(ranks)]
    for r, w in enumerate(workers):
        assert w.wait(timeout=240) == 0, (tmp_path / f"r{r}.log").read_text()[-3000:]


def _form(side, key: str, layout: Layout, backend: str, collective_s: float):
    """A generation's groups on a fresh port that rank 0 picks and posts to ``side``."""
    from regroup.abort import GroupSockets
    from regroup.group import build_groups
    from regroup.testing import free_port

    if layout.rank == 0:
        side.set(key, str(free_port()))
    port = int(side.get(key))
    sockets = GroupSockets(port)
    groups = build_groups(store_host="127.0.0.1", store_port=port, layout=layout, backend=backend,
                          rendezvous_s=60, collective_s=collective_s, aborted=threading.Event(),
                          sockets=sockets)
    return groups, sockets


def _grid_worker(rank: int, directory: str) -> None:
    import torch
    import torch.distributed as dist

    side = dist.FileStore(os.path.join(directory, "side"), 8)
    out = {}
    for generation, world in ((1, 8), (2, 4)):
        if rank >= world:
            break  # this rank's node was lost: the scale-in leaves it out
        layout = Layout.grid(world, rank, tp=2, pp=2)
        groups, sockets = _form(side, f"port{generation}", layout, "gloo", 60)
        seen = {}
        for kind in ("tp", "pp", "mp", "dp"):
            group = getattr(groups, f"{kind}_group")
            size = dist.get_world_size(group)
            got = [torch.zeros(1, dtype=torch.int64) for _ in range(size)]
            dist.all_gather(got, torch.tensor([rank]), group=group)
            seen[kind] = [int(t.item()) for t in got]
        seen["expected"] = {kind: layout.mine(kind) for kind in ("tp", "pp", "mp", "dp")}
        seen["neighbours"] = [layout.pp_prev, layout.pp_next]
        out[generation] = seen
        dist.barrier()
        sockets.shutdown(include_store=True)  # the abort, as the agent link thread does it
        groups.destroy()
        side.add(f"done{generation}", 1)
        while int(side.add(f"done{generation}", 0)) < world:
            import time
            time.sleep(0.005)
    with open(os.path.join(directory, f"grid{rank}.json"), "w") as f:
        json.dump(out, f)


def test_an_8_rank_grid_builds_its_groups_and_rebuilds_them_after_a_scale_in(tmp_path, procs):
    run_workers(procs, tmp_path, 8, what="grid")
    for r in range(8):
        result = json.loads((tmp_path / f"grid{r}.json").read_text())
        assert sorted(result) == (["1", "2"] if r < 4 else ["1"])
        for seen in result.values():
            for kind in ("tp", "pp", "mp", "dp"):
                assert seen[kind] == seen["expected"][kind], (r, kind, seen)
    assert json.loads((tmp_path / "grid5.json").read_text())["1"]["pp"] == [5, 7]
    # After the scale-in, rank 1's data-parallel group is itself alone (dp 1).
    assert json.loads((tmp_path / "grid1.json").read_text())["2"]["dp"] == [1]


def _custom_worker(rank: int, directory: str) -> None:
    import torch
    import torch.distributed as dist

    def gloo_backed(store, rank, size, timeout):
        return dist.ProcessGroupGloo(store, rank, size, timeout)

    dist.Backend.register_backend("regroupfake", gloo_backed)
    assert resolve_backend("regroupfake") == "regroupfake"
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logging.getLogger("regroup").addHandler(Keep())
    side = dist.FileStore(os.path.join(directory, "side"), 2)
    groups, sockets = _form(side, "port", Layout(2, rank, 1), "regroupfake", 7)
    t = torch.ones(2)
    dist.all_reduce(t)
    assert t[0].item() == 2 and dist.get_backend() == "regroupfake"
    # An abort, twice (two generations' worth): no abort piece for this backend, logged once.
    from regroup.membership import Membership
    m = Membership()
    m.begin((0, 1), sockets)
    m.formed(groups)
    assert m.abort((0, 1), "a test") is True
    assert groups.abort_inflight() is False
    fallback = [r for r in records if "has no abort of a collective in flight" in r]
    with open(os.path.join(directory, f"custom{rank}.json"), "w") as f:
        json.dump(fallback, f)
    groups.destroy()


def test_a_backend_without_an_abort_falls_back_to_the_collective_timeout_logged_once(tmp_path, procs):
    run_workers(procs, tmp_path, 2, what="custom")
    for r in range(2):
        fallback = json.loads((tmp_path / f"custom{r}.json").read_text())
        assert len(fallback) == 1, fallback
        assert "'regroupfake'" in fallback[0] and "collective timeout (7 s)" in fallback[0]


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(HERE))
    {"grid": _grid_worker, "custom": _custom_worker}[sys.argv[1]](int(sys.argv[2]), sys.argv[3])
