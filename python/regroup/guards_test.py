# SPDX-License-Identifier: Apache-2.0
"""The mistakes regroup.guards catches, each where it happens, in one standalone process."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import regroup
from regroup.api import TrainerConfig, UsageError
from regroup.guards import loss_reduction


@pytest.fixture(autouse=True)
def _standalone(monkeypatch):
    for name in ("REGROUP_AGENT_SOCKET", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def _trainer(ddp: bool = False, scheduler_interval: str = "step"):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    config = TrainerConfig(dataset_size=8, micro_batch_size=2, microbatches_per_step=2, ddp=ddp,
                           scheduler_interval=scheduler_interval, checksum_interval=0)
    return regroup.Trainer(model, opt, sched, config=config), opt, sched


X = torch.randn(8, 3)


def _loss(step, mb, reduction="sum"):
    return F.mse_loss(step.model(X[mb.indices]), torch.zeros(len(mb.indices), 1), reduction=reduction)


def _train(t, steps, reduction="sum", then=lambda: None):
    """The step contract's loop over ``steps`` steps; ``then`` runs after each step's backward."""
    for step in t.steps(steps):
        with step:
            for mb in step.microbatches():
                step.backward(_loss(step, mb, reduction))
            then()


def test_a_scripts_own_opt_step_is_refused_with_the_fix():
    t, opt, _ = _trainer()
    with pytest.raises(UsageError, match=r"opt.step\(\) was called by the script.*trainer.commit"):
        _train(t, 1, then=opt.step)
    t.close()


def test_a_scripts_own_sched_step_is_refused_with_the_fix():
    t, _, sched = _trainer()
    with pytest.raises(UsageError, match=r"sched.step\(\) was called by the script.*scheduler_interval"):
        _train(t, 1, then=sched.step)
    t.close()


@pytest.mark.parametrize("interval,expected", [("step", 4), ("epoch", 2)])
def test_the_trainer_steps_the_scheduler_per_step_or_per_epoch(interval, expected):
    t, _, sched = _trainer(scheduler_interval=interval)   # 2 steps an epoch
    _train(t, 4)
    assert sched.last_epoch == expected
    t.close()


def test_a_mean_loss_is_refused_with_the_fix():
    t, _, _ = _trainer()
    with pytest.raises(UsageError, match=r"the loss is a mean.*reduction=\"sum\""):
        _train(t, 1, reduction="mean")
    t.close()


@pytest.mark.parametrize("make,expected", [
    (lambda x: F.mse_loss(x, torch.zeros_like(x)), "mean"),
    (lambda x: F.mse_loss(x, torch.zeros_like(x), reduction="sum"), "sum"),
    (lambda x: F.cross_entropy(x, torch.zeros(len(x), dtype=torch.long)), "mean"),
    (lambda x: x.pow(2).mean() / 4, "mean"),
    (lambda x: 2 * x.pow(2).sum(), "sum"),
    (lambda x: x.pow(2).sum(dim=0).max(), None),
])
def test_the_losss_reduction_is_read_from_its_last_operations(make, expected):
    x = torch.randn(4, 3, requires_grad=True)
    assert loss_reduction(make(x)) == expected


def test_a_model_wrapper_kept_from_an_ended_generation_refuses_to_run():
    t, _, _ = _trainer(ddp=True)
    for step in t.steps(1):
        kept = step.model
        with step:
            for mb in step.microbatches():
                with mb:
                    step.backward(_loss(step, mb))
    t.open()
    t.leave()
    with pytest.raises(UsageError, match="fetch step.model every step"):
        kept(X)
    t.close()


def test_a_process_group_kept_from_an_ended_generation_is_refused():
    t, _, _ = _trainer()
    for step in t.steps(1):
        kept = step.generation.dp_group
        with step:
            for mb in step.microbatches():
                step.backward(_loss(step, mb))
    t.leave()
    with pytest.raises(UsageError, match="fetch step.generation.tp_group / dp_group every step"):
        regroup.all_reduce(torch.ones(1), group=kept)
    t.close()
