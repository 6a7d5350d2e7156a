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
- the undo of an applied step whose vote is rolled back, and the configuration's refusals.

The recovery under the real manager and agents (a killed rank, a lost node, its return) is
integration scenario 50.
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


def _reference_state(numel: int) -> dict:
    g = torch.Generator().manual_seed(5)
    return {"exp_avg": torch.randn(numel, generator=g, dtype=torch.float64),
            "exp_avg_sq": torch.rand(numel, generator=g, dtype=torch.float64), "step": torch.tensor(5.0)}


def _slice(full: dict, numel: int, dp: int, k: int) -> dict:
    a, b = slice_bounds(numel, dp, k)
    return {key: (v[a:b].clone() if v.dim() else v.clone()) for key, v in full.items()}


def _generation(rank: int, world: int, port: int, state: ZeroState, holds: bool):
    """Forms a real generation (regroup.group) of ``world`` ranks and repartitions ``state``."""
    from regroup.abort import GroupSockets
    from regroup.group import Layout, build_groups

    sockets = GroupSockets(port)
    groups = build_groups(store_host="127.0.0.1", store_port=port, layout=Layout(world, rank, 1), backend="gloo",
                          rendezvous_s=60, collective_s=60, aborted=threading.Event(), sockets=sockets)
    holders = [holds] * world   # every survivor holds the committed state; the new rank does not
    if not holds:
        holders = [r != world - 1 for r in range(world)]
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
    with pytest.raises(regroup.ConfigError, match="tensor_parallel=2 x pipeline_parallel=None must be 1"):
        regroup.TrainerConfig(**CONFIG, optimizer_sharding="zero1", tensor_parallel=2)
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
