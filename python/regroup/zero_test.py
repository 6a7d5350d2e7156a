# SPDX-License-Identifier: Apache-2.0
"""The distributed optimizer (ZeRO-1, regroup.zero) without an agent.

- dp 2 (with DDP and second copies) and dp 4 gloo processes (torchrun's environment) train as one
  plain process: the same final weights (float64, Adam with an LR scheduler, norm-relative 1e-9),
  and each rank's slices are the plain optimizer's state cut at the partition;
- the repartition of a generation change, over real groups: dp 4 -> 3 (a rank lost) -> 4 (a new
  rank with nothing), every slice assembled exactly, the lost rank's own slice from its second
  copy; without a second copy the lost slice is named ("optimizer shard lost, no second copy");
- the checkpoint fallback: a dp 4 job's checkpoint (one file per slice) resumed by one process
  trains on to the uninterrupted run's weights, and so does a dump by one rank holding second
  copies;
- on a tp x pp grid, each position's slices over its own data-parallel group: the repartition
  tp 2 x dp 2 -> dp 1 -> dp 2 per position, a lost slice named with its position (pp 2), a
  hand-split tp 2 x dp 2 job's checkpoint (a file per position and slice) resumed at tp 2 x dp 1,
  and a hand-run dp 2 x pp 2 pipeline trained as one process and resumed at dp 1;
- the undo of an applied step whose vote is rolled back, and the configuration's refusals.

The recovery under the real manager and agents (a killed rank, a lost node, its return) is
integration scenario 50, and on a tp 2 grid zero_e2e_test.py.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest
import torch

import regroup
from regroup.api import StateSyncError
from regroup.sharded_test import make_model, train  # the same model and data as HSDP's test
from regroup.testing import free_port, relative_error
from regroup.pipeline_test import PIPELINING
from regroup.zero import LOST, ZeroState, choose_partition, plan_moves, slice_bounds, slices_of

STEPS = 6
CONFIG = dict(dataset_size=64, micro_batch_size=4, microbatches_per_step=4, seed=7, checksum_interval=0)


def make_optimizer(model: torch.nn.Module, kind: str = "adam") -> torch.optim.Optimizer:
    if kind == "adam":
        return torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=0.01)
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def plain_run(kind: str, steps: int = STEPS):
    model = make_model()
    opt = make_optimizer(model, kind)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    train(regroup.Trainer(model, opt, sched, config=regroup.TrainerConfig(**CONFIG)), steps)
    return model, opt


def flat_state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict:
    """The plain optimizer's per-parameter state, flattened in parameter order."""
    params = list(model.parameters())
    keys = [k for k, v in opt.state[params[0]].items() if isinstance(v, torch.Tensor) and v.dim() > 0]
    return {k: torch.cat([opt.state[p][k].reshape(-1) for p in params]) for k in keys}


def _env(rank: int, world: int, port: int) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)


def _train_rank(rank: int, world: int, port: int, out: str, copies: int, ddp: bool, ckpt: str,
                periodic: bool) -> None:
    """A rank of a ZeRO-1 job (Adam); with ``ckpt`` either checkpoints every 3 steps (``periodic``)
    or, at the end, a dump by rank 0 alone (its peers "lost")."""
    _env(rank, world, port)
    model = make_model()
    opt = make_optimizer(model)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    config = regroup.TrainerConfig(**CONFIG, optimizer_sharding="zero1", optimizer_copies=copies,
                                   checkpoint_dir=ckpt, ddp=ddp, checkpoint_interval=3 if periodic else 0)
    trainer = regroup.Trainer(model, opt, sched, config=config)
    train(trainer, STEPS)
    state = trainer.state
    if not periodic and rank == 0:
        trainer.checkpoint_now()   # every slice rank 0 holds: its own and its second copy
    torch.save({"params": {n: p.detach().clone() for n, p in model.named_parameters()},
                "held": state.held, "dp": state.dp, "lr": opt.param_groups[0]["lr"]},
               os.path.join(out, f"rank{rank}.pt"))


def _spawn(fn, world: int, *args) -> None:
    import torch.multiprocessing as mp

    mp.start_processes(fn, args=(world, free_port(), *args), nprocs=world, join=True, start_method="spawn")


def _check_trained(out: Path, world: int, copies: int) -> None:
    """Every rank's weights are one plain process's, and its slices the plain Adam state's cut."""
    model, opt = plain_run("adam")
    expected = {n: p.detach() for n, p in model.named_parameters()}
    reference = flat_state(model, opt)
    numel = sum(p.numel() for p in model.parameters())
    for rank in range(world):
        got = torch.load(out / f"rank{rank}.pt")
        error = relative_error(expected, got["params"])
        assert error <= 1e-9, f"rank {rank}: norm-relative error {error:.3e}"
        assert got["lr"] == opt.param_groups[0]["lr"]
        assert got["dp"] == world and sorted(got["held"]) == sorted(slices_of(rank, world, copies))
        for k, st in got["held"].items():
            a, b = slice_bounds(numel, world, k)
            assert int(st["step"]) == STEPS
            for key, full in reference.items():
                assert relative_error({key: full[a:b]}, {key: st[key]}) <= 1e-9, (rank, k, key)


def _resume(ckpt: Path, steps: int) -> torch.nn.Module:
    """One process resuming a ZeRO-1 job from its newest checkpoint and training to ``steps``."""
    model = make_model()
    opt = make_optimizer(model)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    train(regroup.Trainer(model, opt, sched, config=regroup.TrainerConfig(
        **CONFIG, optimizer_sharding="zero1", checkpoint_dir=str(ckpt))), steps)
    return model


def _same_as_plain(model: torch.nn.Module, steps: int) -> None:
    expected, _ = plain_run("adam", steps)
    error = relative_error({n: p.detach() for n, p in expected.named_parameters()},
                           {n: p.detach() for n, p in model.named_parameters()})
    assert error <= 1e-9, f"norm-relative error {error:.3e}"


def test_zero1_at_dp_2_with_ddp_and_second_copies_trains_as_one_process_and_one_rank_dumps_it_whole(tmp_path):
    """dp 2 reduces the gradients with the DDP wrapper. Rank 0 alone dumps (rank 1 "lost"): with
    second copies it holds both slices, so the checkpoint is complete, and resumes exactly."""
    ckpt = tmp_path / "ckpt"
    _spawn(_train_rank, 2, str(tmp_path), 2, True, str(ckpt), False)
    _check_trained(tmp_path, 2, 2)
    from regroup.checkpoint import Checkpointer

    complete = Checkpointer(str(ckpt)).complete()   # no periodic checkpoint: the dump's only
    assert [(c.step, c.replica_size) for c in complete] == [(STEPS - 1, 2)], complete
    _same_as_plain(_resume(ckpt, STEPS + 2), STEPS + 2)


def test_zero1_at_dp_4_trains_as_one_process_and_its_checkpoint_resumes_at_dp_1(tmp_path):
    """dp 4 without second copies, the trainer's own reduce, a checkpoint every 3 steps (a file a
    slice): the job gone back to step 2's checkpoint, one process trains on to the same weights."""
    ckpt = tmp_path / "ckpt"
    _spawn(_train_rank, 4, str(tmp_path), 1, False, str(ckpt), True)
    _check_trained(tmp_path, 4, 1)
    from regroup.checkpoint import Checkpointer

    complete = Checkpointer(str(ckpt)).complete()
    assert [(c.step, c.replica_size) for c in complete] == [(2, 4), (5, 4)], complete
    shutil.rmtree(complete[1].path)   # the job goes back to step 2's checkpoint
    _same_as_plain(_resume(ckpt, STEPS), STEPS)
    # a job without optimizer sharding refuses it, and a ZeRO-1 job a plain checkpoint, naming why
    plain = make_model()
    with pytest.raises(StateSyncError, match="ZeRO-1 optimizer slices"):
        train(regroup.Trainer(plain, make_optimizer(plain), config=regroup.TrainerConfig(
            **CONFIG, checkpoint_dir=str(ckpt))), STEPS)
    plain_ckpt = tmp_path / "plain"
    plain_trainer = regroup.Trainer(plain, make_optimizer(plain), config=regroup.TrainerConfig(
        **CONFIG, checkpoint_dir=str(plain_ckpt), checkpoint_interval=2))
    train(plain_trainer, 2)
    with pytest.raises(regroup.CheckpointError, match="whole optimizer state, not ZeRO-1 slices"):
        _resume(plain_ckpt, STEPS)


def test_a_checkpoint_due_while_the_next_step_is_in_flight_writes_a_slice_file_without_the_model(tmp_path):
    """A commit heard during the next step (the vote off the critical path) checkpoints with that
    step's start snapshot for the buffers and RNG; a slice's file other than the first holds no
    model to put them in."""
    from regroup import checkpointing
    from regroup.state import load_tree

    steps = []
    model = make_model()
    trainer = regroup.Trainer(model, make_optimizer(model), config=regroup.TrainerConfig(
        **CONFIG, optimizer_sharding="zero1", checkpoint_dir=str(tmp_path), checkpoint_interval=1),
        on_commit=steps.append)
    train(trainer, 1)
    state = trainer.state
    state.rank, state.dp, state.held = 1, 2, {1: state.held[0]}   # as rank 1 of dp 2 holds it
    checkpointing.maybe_checkpoint(trainer, steps[-1], state.snapshot())
    trainer.checkpointer.wait(30)
    files = sorted(tmp_path.glob("step-*/shard-00001-of-00002.pt"))
    assert len(files) == 1, list(tmp_path.rglob("*"))
    written = load_tree(files[0])
    assert "model" not in written and sorted(written["zero1"]["slices"]) == [1]


def test_zero1_sgd_with_momentum_in_one_process_equals_the_plain_optimizer():
    model, opt = plain_run("sgd")
    zmodel = make_model()
    zopt = make_optimizer(zmodel, "sgd")
    sched = torch.optim.lr_scheduler.StepLR(zopt, step_size=2, gamma=0.5)
    trainer = regroup.Trainer(zmodel, zopt, sched, config=regroup.TrainerConfig(**CONFIG, optimizer_sharding="zero1"))
    train(trainer, STEPS)
    assert relative_error({n: p.detach() for n, p in model.named_parameters()},
                          {n: p.detach() for n, p in zmodel.named_parameters()}) <= 1e-9
    assert torch.equal(trainer.state.held[0]["momentum_buffer"], flat_state(model, opt)["momentum_buffer"])


# -- the repartition ----------------------------------------------------------------------------


def _reference_state(numel: int, seed: int = 5) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"exp_avg": torch.randn(numel, generator=g, dtype=torch.float64),
            "exp_avg_sq": torch.rand(numel, generator=g, dtype=torch.float64), "step": torch.tensor(5.0)}


def _slice(full: dict, numel: int, dp: int, k: int) -> dict:
    a, b = slice_bounds(numel, dp, k)
    return {key: (v[a:b].clone() if v.dim() else v.clone()) for key, v in full.items()}


def _groups(rank: int, world: int, port: int, tp: int = 1, pp: int = 1):
    """A real generation's groups (regroup.group) of ``world`` ranks (a dp x ``tp`` x ``pp`` grid)."""
    from regroup.abort import GroupSockets
    from regroup.group import Layout, build_groups

    return build_groups(store_host="127.0.0.1", store_port=port, layout=Layout.grid(world, rank, tp, pp),
                        backend="gloo", rendezvous_s=60, collective_s=60, aborted=threading.Event(),
                        sockets=GroupSockets(port))


def _generation(rank: int, world: int, port: int, state: ZeroState, holds: bool, tp: int = 1, pp: int = 1):
    """Forms a real generation of ``world`` ranks (a dp x ``tp`` x ``pp`` grid) and repartitions
    ``state``; without ``holds``, the last replica is new (holds nothing)."""
    groups = _groups(rank, world, port, tp, pp)
    holders = [holds] * world   # every survivor holds the committed state; the new ranks do not
    if not holds:
        holders = [r < world - tp * pp for r in range(world)]
    try:
        return state.after_sync(groups.layout, groups, holders, 5, torch.device("cpu")), None
    except StateSyncError as e:
        return 0, str(e)
    finally:
        groups.destroy()


def _repartition_rank(rank: int, world: int, port: int, out: str) -> None:
    """4 processes. With second copies: dp 4, old rank 1 lost (it sits out dp 3 and comes back with
    nothing), dp 4 again. Then without: dp 4, old rank 2 lost, the survivors fail to form dp 3."""
    torch.set_num_threads(1)
    report = {"copies2": _lose_and_return(rank, port + 1, 2, 1), "copies1": _lose_and_return(rank, port + 3, 1, 2)}
    torch.save(report, os.path.join(out, f"rank{rank}.pt"))


def _lose_and_return(rank: int, port: int, copies: int, lost: int) -> dict:
    state = _zero_state(copies)
    numel = state.numel
    full = _reference_state(numel)
    state.dp, state.rank = 4, rank
    state.held = {k: _slice(full, numel, 4, k) for k in slices_of(rank, 4, copies)}
    report = {}
    if rank != lost:
        new_rank = rank if rank < lost else rank - 1
        sent, error = _generation(new_rank, 3, port, state, True)
        report["dp3"] = {"error": error, "sent": sent, "held": state.held, "rank": state.rank, "dp": state.dp}
        if error is not None:
            return report
    elif copies == 1:
        return report                   # the survivors cannot form dp 3: no return to wait for
    else:
        state = _zero_state(copies)     # the returning rank: a fresh process, no slice
        new_rank = 3
    sent, error = _generation(new_rank, 4, port + 1, state, rank != lost)
    report["dp4"] = {"error": error, "sent": sent, "held": state.held, "rank": state.rank, "dp": state.dp,
                     "received": state.bytes_received}
    return report


def _zero_state(copies: int) -> ZeroState:
    model = make_model()
    return ZeroState(model, make_optimizer(model), copies=copies)


def _check_held(held: dict, full: dict, numel: int, dp: int, rank: int, copies: int) -> None:
    assert sorted(held) == sorted(slices_of(rank, dp, copies))
    for k, st in held.items():
        want = _slice(full, numel, dp, k)
        assert st.keys() == want.keys()
        for key in want:
            assert torch.equal(st[key], want[key]), (dp, rank, k, key)


def test_repartition_dp4_to_3_to_4_restores_a_lost_slice_from_its_second_copy_and_names_one_without(tmp_path):
    _spawn(_repartition_rank, 4, str(tmp_path))
    numel = _zero_state(2).numel
    full = _reference_state(numel)
    reports = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(4)]
    for rank, report in enumerate(reports):
        r = report["copies2"]
        if rank != 1:
            assert r["dp3"]["error"] is None and r["dp3"]["dp"] == 3
            _check_held(r["dp3"]["held"], full, numel, 3, r["dp3"]["rank"], 2)
        assert r["dp4"]["error"] is None and r["dp4"]["dp"] == 4
        _check_held(r["dp4"]["held"], full, numel, 4, r["dp4"]["rank"], 2)
    # the returning rank received its two slices, point to point
    back = reports[1]["copies2"]["dp4"]
    assert back["rank"] == 3 and back["received"] > 0
    # without second copies the lost rank's slice is named on every survivor
    for rank in (0, 1, 3):
        error = reports[rank]["copies1"]["dp3"]["error"]
        assert error is not None and LOST in error and "slice [2]" in error and "newest checkpoint" in error, error


def _unrecoverable_rank(rank: int, world: int, port: int, out: str) -> None:
    """4 processes, dp 4 without second copies, committed step 5: rank 3 is a restarted process
    (nothing held), so slice [3] is lost. Two generations of the same ranks in a row, each through
    the whole state sync (regroup.sync.sync_state: the census, the model state sent to rank 3, the
    slices cut); what each rank raised and the step it then claims to hold."""
    from types import SimpleNamespace

    from regroup.sync import sync_state

    torch.set_num_threads(1)
    state = _zero_state(1)
    full = _reference_state(state.numel)
    held_before = None
    if rank < 3:
        state.dp, state.rank = 4, rank
        state.held = held_before = {rank: _slice(full, state.numel, 4, rank)}
    t = SimpleNamespace(state=state, committed_step=5 if rank < 3 else -1, synced=rank < 3, resume_from=None,
                        device=torch.device("cpu"), metrics={"state_bytes_sent": 0})
    report = {}
    for attempt in range(2):
        groups = _groups(rank, world, port + attempt, 1, 1)
        try:
            sync_state(t, SimpleNamespace(committed_step=5), groups.layout, groups)
            error = None
        except StateSyncError as e:
            error = f"{type(e).__name__}: {e}"
        finally:
            groups.destroy()
        report[attempt] = {"error": error, "committed_step": t.committed_step, "synced": t.synced,
                           "held": state.held, "dp": state.dp}
    report["held_before"] = held_before
    torch.save(report, os.path.join(out, f"rank{rank}.pt"))


def test_a_rank_whose_slices_could_not_be_cut_claims_no_step_and_the_next_generation_fails_alike(tmp_path):
    """Rank 3 received the model state of step 5, then the cut failed (slice [3] is lost): it must
    not claim to hold step 5. Integration scenario 51 once trained on with such ranks: in the next
    generation they claimed the step, and their fresh optimizer (an empty dp 1 partition) read as
    a whole partition to cut from, so every rank's Adam state silently started over."""
    _spawn(_unrecoverable_rank, 4, str(tmp_path))
    reports = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(4)]
    for rank, report in enumerate(reports):
        for attempt in (0, 1):
            r = report[attempt]
            assert r["error"] is not None and r["error"].startswith("StateLost:"), (rank, attempt, r["error"])
            assert LOST in r["error"] and "slice [3]" in r["error"], r["error"]
        if rank == 3:   # the model state arrived, the optimizer's did not: no claim to step 5
            assert report[0]["committed_step"] == report[1]["committed_step"] == -1
            assert not report[1]["synced"]
        else:           # the holders keep what they held, untouched
            assert report[1]["committed_step"] == 5 and report[1]["dp"] == 4
            assert report[1]["held"].keys() == report["held_before"].keys()
            for k, st in report[1]["held"].items():
                assert all(torch.equal(st[key], v) for key, v in report["held_before"][k].items())


# -- on a tp x pp grid: every position slices its own local parameters over its dp group ----------


def _position_state(position: int, copies: int, replica_size: int = 2, tp: int = 2) -> ZeroState:
    """A rank's state at ``position``: each position's local parameters differ in size (a
    shard, a stage), so the slices of one position are not another's."""
    torch.manual_seed(position)
    model = torch.nn.Sequential(torch.nn.Linear(3 + position, 2 + position, dtype=torch.float64))
    return ZeroState(model, make_optimizer(model), copies=copies, replica_size=replica_size, tensor_parallel=tp)


def _grid_rank(rank: int, world: int, port: int, out: str) -> None:
    """4 processes, 2 replicas of 2 ranks. With second copies, on tp 2: dp 2, replica 1 lost
    (dp 1: each position's survivor holds its whole state), replica 1 back with nothing (dp 2).
    Without, on pp 2: replica 1 lost; the survivors cannot form dp 1, naming both positions."""
    torch.set_num_threads(1)
    report = {}
    for case, copies, tp, pp, base in (("copies2", 2, 2, 1, port + 1), ("copies1", 1, 1, 2, port + 4)):
        position, replica = rank % 2, rank // 2
        state = _position_state(position, copies, tp=tp)
        full = _reference_state(state.numel, seed=10 + position)
        state.dp, state.rank, state.position = 2, replica, position
        state.held = {k: _slice(full, state.numel, 2, k) for k in slices_of(replica, 2, copies)}
        r = report[case] = {}
        if replica == 0:
            sent, error = _generation(rank, 2, base, state, True, tp, pp)
            r["dp1"] = {"error": error, "held": state.held, "rank": state.rank, "dp": state.dp, "sent": sent}
            if error is not None:
                continue
        elif copies == 1:
            continue                          # the survivors cannot form dp 1: no return
        else:
            state = _position_state(position, copies, tp=tp)   # back as a fresh process
        sent, error = _generation(rank, 4, base + 1, state, replica == 0, tp, pp)
        r["dp2"] = {"error": error, "held": state.held, "rank": state.rank, "dp": state.dp,
                    "position": state.position, "received": state.bytes_received}
    torch.save(report, os.path.join(out, f"rank{rank}.pt"))


def test_on_a_tp2_grid_each_position_repartitions_its_own_slices_and_a_lost_one_is_named_with_its_position(tmp_path):
    _spawn(_grid_rank, 4, str(tmp_path))
    reports = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(4)]
    for rank, report in enumerate(reports):
        position = rank % 2
        numel = _position_state(position, 2).numel
        full = _reference_state(numel, seed=10 + position)
        r = report["copies2"]
        if rank < 2:   # replica 0: dp 1 holds its position's every slice, its own and its copy's
            assert r["dp1"]["error"] is None and r["dp1"]["dp"] == 1 and r["dp1"]["sent"] == 0
            _check_held(r["dp1"]["held"], full, numel, 1, 0, 2)
        assert r["dp2"]["error"] is None and (r["dp2"]["dp"], r["dp2"]["position"]) == (2, position)
        _check_held(r["dp2"]["held"], full, numel, 2, rank // 2, 2)
        if rank >= 2:  # the returning replica received its position's slices from position's survivor
            assert r["dp2"]["received"] > 0
    assert _position_state(0, 2).numel != _position_state(1, 2).numel
    # without second copies (pp 2: positions are stages): every survivor names both positions
    for rank in (0, 1):
        error = reports[rank]["copies1"]["dp1"]["error"]
        assert error is not None and error.startswith(LOST), error
        for position in (0, 1):
            named = f"slice [1] at position {position} (pipeline stage {position}, tensor-parallel rank 0)"
            assert named in error, error
        assert "newest checkpoint" in error


def _grid_ckpt_rank(rank: int, world: int, port: int, argv: list) -> None:
    import runpy
    import sys

    _env(rank, world, port)
    sys.argv = [str(GRID), *argv]
    try:
        runpy.run_path(str(GRID), run_name="__main__")
    except SystemExit as e:
        assert not e.code, e.code


GRID = Path(__file__).resolve().parents[2] / "examples" / "train_grid.py"
GRID_ARGS = ["--float64", "--dataset", "64", "--microbatches", "4", "--micro-batch", "4", "--quiet",
             "--optimizer", "adam", "--checksum-interval", "0"]


@pytest.mark.parametrize("layout", [["--tp", "2", "--tp-impl", "hand"], ["--tp", "2", "--tp-impl", "dtensor"],
                                    ["--tp", "1", "--pp", "2"]], ids=["tp2-hand", "tp2-dtensor", "pp2-schedule"])
def test_a_checkpoint_of_a_2_rank_replica_at_dp2_holds_a_file_per_position_and_slice_and_resumes_at_dp1(
        tmp_path, layout):
    """examples/train_grid.py (tp 2 split by hand, or DTensor's local shards, or 2 pipeline
    stages run by torch.distributed.pipelining's schedule; Adam) at dp 2 checkpoints every 3
    steps: 4 files, file ``position * 2 + slice``. The job gone back to step 2's checkpoint
    resumes at dp 1 (2 ranks) and trains on to one plain process's weights."""
    import subprocess

    from regroup.checkpoint import Checkpointer
    from regroup.state import load_tree
    from regroup.tensor_parallel import tensor_parallel_available
    from regroup.testing import PYTHON

    if "dtensor" in layout and not tensor_parallel_available():
        pytest.skip(f"DTensor tensor parallelism needs torch 2.x; this is torch {torch.__version__}")
    if "--pp" in layout and not PIPELINING:
        pytest.skip(f"torch.distributed.pipelining needs torch 2.4; this is torch {torch.__version__}")
    ckpt, steps = tmp_path / "ckpt", 6
    zero = [*GRID_ARGS, *layout, "--optimizer-sharding", "zero1", "--checkpoint-dir", str(ckpt)]
    _spawn(_grid_ckpt_rank, 4, [*zero, "--steps", str(steps), "--checkpoint-interval", "3"])
    complete = Checkpointer(str(ckpt)).complete()
    assert [(c.step, c.replica_size) for c in complete] == [(2, 4), (5, 4)], complete
    for f in range(4):
        written = load_tree(complete[0].shard(f))
        meta = written["zero1"]
        assert (meta["position"], sorted(meta["slices"]), meta["dp"]) == (f // 2, [f % 2], 2), f
        assert ("model" in written) == (f % 2 == 0), f   # a position's first file holds its model shard
    shutil.rmtree(complete[1].path)    # the job goes back to step 2's checkpoint, at dp 1
    ledger = tmp_path / "ledger"
    _spawn(_grid_ckpt_rank, 2, [*zero, "--steps", str(steps + 2), "--out", str(tmp_path / "resumed.pt"),
                                "--ledger", str(ledger)])
    from regroup.testing import read_ledger
    assert sorted({r["step"] for r in read_ledger(ledger)}) == list(range(3, steps + 2))  # from the checkpoint
    ref = tmp_path / "ref.pt"
    subprocess.run([PYTHON, str(GRID), *GRID_ARGS, "--steps", str(steps + 2), "--out", str(ref)], check=True,
                   timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    error = relative_error(torch.load(ref), torch.load(tmp_path / "resumed.pt"))
    assert error <= 1e-9, f"norm-relative error {error:.3e}"


def _stages(whole: bool):
    """The two pipeline stages of a tiny model (each drawn from its own seed), or both in one."""
    torch.manual_seed(1)
    first = torch.nn.Sequential(torch.nn.Linear(5, 6, dtype=torch.float64), torch.nn.Tanh())
    torch.manual_seed(2)
    last = torch.nn.Linear(6, 2, dtype=torch.float64)
    return torch.nn.Sequential(first, last) if whole else (first, last)


def _pipeline_data():
    g = torch.Generator().manual_seed(3)
    return torch.randn(64, 5, generator=g, dtype=torch.float64), torch.randn(64, 2, generator=g, dtype=torch.float64)


def _pipeline_rank(rank: int, world: int, port: int, out: str, steps: int, ckpt: str, interval: int) -> None:
    """A rank of a dp x pp 2 job (ZeRO-1, Adam, second copies) whose 2-stage pipeline is run by
    hand (torch 1.13 has no torch.distributed.pipelining): activations and their gradients sent
    point to point between the stages, micro-batch by micro-batch."""
    import torch.distributed as dist

    _env(rank, world, port)
    x, y = _pipeline_data()
    stage = rank % 2
    model = _stages(False)[stage]
    trainer = regroup.Trainer(model, make_optimizer(model), config=regroup.TrainerConfig(
        **CONFIG, tensor_parallel=1, pipeline_parallel=2, optimizer_sharding="zero1", optimizer_copies=2,
        checkpoint_dir=ckpt, checkpoint_interval=interval))
    first = None
    for step in trainer.steps(steps):
        first = step.number if first is None else first
        layout = step.generation.groups.layout
        with step:
            for mb in step.microbatches():
                with mb:
                    if stage == 0:
                        h = model(x[mb.indices])
                        dist.send(h.detach().contiguous(), layout.pp_next)
                        grad = torch.empty_like(h)
                        dist.recv(grad, layout.pp_next)
                        h.backward(grad)
                    else:
                        h = torch.empty(len(mb.indices), 6, dtype=torch.float64)
                        dist.recv(h, layout.pp_prev)
                        h.requires_grad_()
                        step.backward(((model(h) - y[mb.indices]) ** 2).sum())
                        dist.send(h.grad, layout.pp_prev)
            trainer.commit(step)
    if step.generation.replica == 0:
        torch.save({"params": {n: p.detach() for n, p in model.named_parameters()},
                    "first": first},
                   os.path.join(out, f"stage{stage}.pt"))


def _pipeline_reference(steps: int) -> dict:
    """One plain process: both stages as one model, one plain Adam."""
    x, y = _pipeline_data()
    model = _stages(True)
    trainer = regroup.Trainer(model, make_optimizer(model), config=regroup.TrainerConfig(**CONFIG))
    for step in trainer.steps(steps):
        with step:
            for mb in step.microbatches():
                with mb:
                    step.backward(((model(x[mb.indices]) - y[mb.indices]) ** 2).sum())
            trainer.commit(step)
    return {f"{i}.{n}": p.detach() for i, stage in enumerate(model) for n, p in stage.named_parameters()}


def _pipeline_weights(out: Path, first: int) -> dict:
    saved = [torch.load(out / f"stage{i}.pt") for i in range(2)]
    assert [s["first"] for s in saved] == [first] * 2   # the first step trained (after a checkpoint's)
    return {f"{i}.{n}": p for i, s in enumerate(saved) for n, p in s["params"].items()}


def test_zero1_on_a_dp2_x_pp2_pipeline_trains_as_one_process_and_its_checkpoint_resumes_at_dp1(tmp_path):
    """Each stage's parameters are sliced over the stage's own data-parallel group; the job's
    checkpoint (a file per stage and slice) resumed at dp 1 x pp 2 trains on to the same weights."""
    from regroup.checkpoint import Checkpointer

    ckpt = tmp_path / "ckpt"
    _spawn(_pipeline_rank, 4, str(tmp_path), STEPS, str(ckpt), 3)
    error = relative_error(_pipeline_reference(STEPS), _pipeline_weights(tmp_path, 0))
    assert error <= 1e-9, f"dp 2 x pp 2: norm-relative error {error:.3e}"
    complete = Checkpointer(str(ckpt)).complete()
    assert [(c.step, c.replica_size) for c in complete] == [(2, 4), (5, 4)], complete
    shutil.rmtree(complete[1].path)
    _spawn(_pipeline_rank, 2, str(tmp_path), STEPS + 2, str(ckpt), 0)
    error = relative_error(_pipeline_reference(STEPS + 2), _pipeline_weights(tmp_path, 3))
    assert error <= 1e-9, f"resumed at dp 1 x pp 2: norm-relative error {error:.3e}"


def test_plan_moves_names_every_lost_slice_and_takes_own_pieces_locally():
    with pytest.raises(StateSyncError, match=r"optimizer shard lost, no second copy: slices \[2, 3\]"):
        plan_moves([{0}, {1}], 4, 2, 100, 1)
    moves = plan_moves([{0, 2}, {1, 3}, set()], 4, 3, 100, 2)
    assert all(m.source == m.dest for m in moves if m.dest == 0 and m.old in (0,))
    covered = {}
    for m in moves:
        covered.setdefault((m.dest, m.new), 0)
        covered[(m.dest, m.new)] += m.hi - m.lo
    for (r, j), n in covered.items():
        a, b = slice_bounds(100, 3, j)
        assert n == b - a, (r, j)
    assert {j for r, j in covered if r == 2} == set(slices_of(2, 3, 2))


def test_second_copies_survive_the_loss_of_any_block_of_half_the_ranks():
    for dp in range(2, 9):
        for size in range(1, dp // 2 + 1):
            for first in range(dp):
                lost = {(first + i) % dp for i in range(size)}
                held = set().union(*[slices_of(r, dp, 2) for r in range(dp) if r not in lost])
                assert held == set(range(dp)), (dp, sorted(lost))
    # one more than that can lose a slice: 3 consecutive of 5
    assert set().union(*[slices_of(r, 5, 2) for r in (3, 4)]) != set(range(5))


def test_a_generation_that_failed_while_cutting_leaves_a_whole_partition_to_cut_from():
    """Ranks 0 and 2 cut dp 4 into dp 3 (keeping their dp 4 slices), rank 1 did not: dp 4 is whole
    (and held by every rank), so it is the one taken; where only the new cut is whole, that one."""
    assert choose_partition([[(3, {0, 2}), (4, {0, 2})], [(4, {1, 3})], [(3, {2, 1}), (4, {2, 0})]]) == \
        (4, [{0, 2}, {1, 3}, {2, 0}])
    assert choose_partition([[(3, {0, 2})], [(3, {1, 0})], [(4, {3})]]) == (3, [{0, 2}, {1, 0}, set()])
    dp, held_by = choose_partition([[(4, {0})], [(4, {1})], []])
    with pytest.raises(StateSyncError, match=r"slices \[2, 3\] .* dp 4"):
        plan_moves(held_by, dp, 3, 100, 1)
    with pytest.raises(StateSyncError, match="no rank holds the optimizer state"):
        choose_partition([[], []])


# -- the configuration --------------------------------------------------------------------------


def test_the_configuration_refuses_what_cannot_work():
    with pytest.raises(regroup.ConfigError, match="optimizer_sharding='zero2' must be"):
        regroup.TrainerConfig(**CONFIG, optimizer_sharding="zero2")
    with pytest.raises(regroup.ConfigError, match="optimizer_copies=3 must be 1 or 2"):
        regroup.TrainerConfig(**CONFIG, optimizer_sharding="zero1", optimizer_copies=3)
    with pytest.raises(regroup.ConfigError, match="set optimizer_sharding='zero1'"):
        regroup.TrainerConfig(**CONFIG, optimizer_copies=2)
    # a tp x pp grid is sharded per position (its local parameters: a hand split's, or DTensor
    # tensor parallelism's local shards, tensor_parallel_test.py); HSDP shards the state itself
    regroup.TrainerConfig(**CONFIG, optimizer_sharding="zero1", tensor_parallel=2, pipeline_parallel=2)
    with pytest.raises(regroup.ConfigError, match="optimizer_sharding='zero1' cannot be combined with "
                                                  "sharding='hsdp'"):
        regroup.TrainerConfig(**CONFIG, optimizer_sharding="zero1", sharding="hsdp", tensor_parallel=2)
    model = make_model()
    config = regroup.TrainerConfig(**CONFIG, optimizer_sharding="zero1")
    with pytest.raises(regroup.ConfigError, match="elementwise optimizer.*this is LBFGS"):
        regroup.Trainer(model, torch.optim.LBFGS(model.parameters()), config=config)
    with pytest.raises(regroup.ConfigError, match="one parameter group"):
        regroup.Trainer(model, torch.optim.SGD([{"params": [model[0].weight]},
                                                 {"params": [model[0].bias]}], lr=0.1), config=config)
    with pytest.raises(regroup.ConfigError, match="model.parameters()"):
        regroup.Trainer(model, torch.optim.SGD([model[0].weight], lr=0.1), config=config)
    with pytest.raises(regroup.ConfigError, match="give the trainer the optimizer"):
        regroup.Trainer(model, None, config=config)


# -- the undo of an applied step whose vote is rolled back ---------------------------------------


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_the_undo_of_an_applied_step_puts_back_the_slices_and_parameters_bit_for_bit(kind):
    from regroup.undo import Undo
    from regroup.undo_test import _same

    model = make_model()
    opt = make_optimizer(model, kind)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    state = ZeroState(model, opt, sched)
    undo = Undo()

    def step(seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        for p in state.parameters():
            p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype)
        state.prepare(None)
        state.step_optimizer()
        state.zero_grad()

    step(1)  # the first step's state exists
    before = (copy_of(state.held), {n: p.detach().clone() for n, p in model.named_parameters()},
              sched.state_dict()["last_epoch"])
    for _ in range(2):   # voted, applied, rolled back; then the same again from the restored state
        for p in state.parameters():
            p.grad = torch.ones_like(p)
        state.prepare(None)
        undo.take(state)
        state.step_optimizer()
        assert not _same(state.held, before[0])
        undo.restore(state)
        assert _same(state.held, before[0])
        assert _same({n: p.detach() for n, p in model.named_parameters()}, before[1])
        assert sched.state_dict()["last_epoch"] == before[2]
    with pytest.raises(RuntimeError, match="without its prepared update"):
        state.step_optimizer()  # the undo dropped the prepared update too


def copy_of(held: dict) -> dict:
    return {k: {key: (v.clone() if isinstance(v, torch.Tensor) else v) for key, v in st.items()} for k, st in held.items()}
