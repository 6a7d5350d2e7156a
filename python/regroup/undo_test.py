# SPDX-License-Identifier: Apache-2.0
"""The undo of an applied step (regroup.undo): restoring it gives back the state before the apply
bit for bit (parameters, optimizer state and hyper-parameters, scheduler), for SGD with momentum
and Adam, from the first step on; dropping it keeps the step."""

from __future__ import annotations

import copy

import pytest
import torch

from regroup.state import TrainingState
from regroup.undo import Undo


def _setup(kind: str):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3)).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if kind == "sgd" \
        else torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return TrainingState(model, opt, sched)


def _grads(state: TrainingState, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in state.parameters():
        p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype)


def _apply(state: TrainingState, seed: int) -> None:
    _grads(state, seed)
    state.optimizer.step()
    state.scheduler.step()
    state.zero_grad()


def _everything(state: TrainingState) -> dict:
    return copy.deepcopy({"model": state.model.state_dict(), "opt": state.optimizer.state_dict(),
                          "sched": state.scheduler.state_dict()})


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_restoring_an_undo_gives_back_the_state_before_the_apply_bit_for_bit(kind):
    state, undo = _setup(kind), Undo()
    for step in range(5):
        before = _everything(state)
        undo.take(state)
        _apply(state, 100 + step)
        assert not _same(before, _everything(state))
        undo.restore(state)
        assert _same(before, _everything(state)), f"step {step}: the undo did not restore the state"
        _apply(state, step)  # the step again, as after a rolled-back vote; then it commits


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_a_run_with_undos_taken_dropped_and_restored_ends_where_a_plain_run_ends(kind):
    plain, undone, undo = _setup(kind), _setup(kind), Undo()
    for step in range(6):
        _apply(plain, step)
        undo.take(undone)
        _apply(undone, step)
        if step % 2:  # rolled back: put back and done again
            undo.restore(undone)
            undo.take(undone)
            _apply(undone, step)
        undo.drop()
    assert _same(_everything(plain), _everything(undone))


def test_the_undo_reuses_its_buffers_and_says_what_it_holds():
    state, undo = _setup("adam"), Undo()
    undo.take(state)
    _apply(state, 0)
    undo.drop()
    undo.take(state)
    held = undo.nbytes()
    params = sum(p.numel() * p.element_size() for p in state.parameters())
    # The parameters and Adam's two moments (and its step counters): about three times the model.
    assert set(held) == {"cpu"} and 3 * params <= held["cpu"] <= 3 * params + 64 * len(state.parameters())
    first = [b.data_ptr() for b in undo._buffers.values()]
    undo.drop()
    _apply(state, 1)
    undo.take(state)
    assert [b.data_ptr() for b in undo._buffers.values()] == first
    with pytest.raises(RuntimeError, match="no undo"):
        undo.drop()
        undo.restore(state)
