# SPDX-License-Identifier: Apache-2.0
"""Training state: snapshots of buffers and RNG, the weights_only state format, gradient reduction."""

import io
import random
from collections import OrderedDict

import pytest
import torch

from regroup.api import StateSyncError
from regroup.state import (TrainingState, load_tree, reduce_gradients, rng_state, save_tree,
                           set_rng_state)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2)).double()


def test_restore_puts_back_the_buffers_and_rng_of_the_step_start():
    model = _model()
    state = TrainingState(model)
    snap = state.snapshot()
    expected_rand = torch.rand(3)
    set_rng_state(snap.rng)
    model(torch.randn(16, 4, dtype=torch.float64))  # training-mode forward: BN statistics move
    random.random()
    assert not torch.equal(model[1].running_mean, snap.buffers["1.running_mean"])
    state.restore(snap)
    assert torch.equal(model[1].running_mean, snap.buffers["1.running_mean"])
    assert int(model[1].num_batches_tracked) == 0
    assert torch.equal(torch.rand(3), expected_rand)


def test_the_state_format_loads_with_weights_only_and_keeps_every_type():
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(8, 4, dtype=torch.float64)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    tree = {"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
            "misc": (1, 2.5, float("inf"), None, True, "x", [3, {"k": torch.ones(2)}]), 7: "int key"}
    buffer = io.BytesIO()
    save_tree(tree, buffer)
    buffer.seek(0)
    back = load_tree(buffer)  # torch.load(..., weights_only=True) underneath
    assert isinstance(back["model"], OrderedDict)
    assert back["model"]._metadata == model.state_dict()._metadata
    assert back["misc"][:6] == (1, 2.5, float("inf"), None, True, "x")
    assert back[7] == "int key"
    assert back["optimizer"]["param_groups"] == opt.state_dict()["param_groups"]
    for k, v in opt.state_dict()["state"].items():
        assert torch.equal(back["optimizer"]["state"][k]["exp_avg"], v["exp_avg"])
    fresh = _model()
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=0.5)
    fresh.load_state_dict(back["model"])
    fresh_opt.load_state_dict(back["optimizer"])
    assert fresh_opt.param_groups[0]["lr"] == 0.01


def test_a_state_with_objects_is_refused_by_name():
    with pytest.raises(StateSyncError, match="type object"):
        save_tree({"bad": object()}, io.BytesIO())


def test_a_file_that_is_not_a_state_is_refused():
    buffer = io.BytesIO()
    torch.save({"tensor": torch.ones(1)}, buffer)
    buffer.seek(0)
    with pytest.raises(StateSyncError, match="not a regroup state"):
        load_tree(buffer)


def test_whole_state_round_trip_moves_model_optimizer_scheduler_extra_and_rng():
    a_model, b_model = _model(), _model()
    with torch.no_grad():
        for p in b_model.parameters():
            p.add_(1.0)
    a_opt = torch.optim.SGD(a_model.parameters(), lr=0.1, momentum=0.9)
    a_model(torch.randn(8, 4, dtype=torch.float64)).sum().backward()
    a_opt.step()
    a_extra = {"seen": torch.tensor(41)}
    a = TrainingState(a_model, a_opt, None, a_extra)
    b_extra = {}
    b = TrainingState(b_model, torch.optim.SGD(b_model.parameters(), lr=0.1, momentum=0.9), None, b_extra)
    torch.manual_seed(9)
    data = a.to_bytes(committed_step=12)
    expected = torch.rand(2)
    torch.manual_seed(1)
    assert b.load_bytes(data) == 12
    for pa, pb in zip(a_model.parameters(), b_model.parameters()):
        assert torch.equal(pa, pb)
    assert int(b_extra["seen"]) == 41
    assert torch.equal(torch.rand(2), expected)
    assert b.checksum() == a.checksum()


def test_reduce_gradients_divides_the_sum_by_the_global_batch():
    g = [torch.full((3,), 6.0, dtype=torch.float64), torch.arange(4, dtype=torch.float32)]
    reduce_gradients(g, None, 1, divisor=3, bucket_bytes=8)
    assert torch.equal(g[0], torch.full((3,), 2.0, dtype=torch.float64))
    assert torch.allclose(g[1], torch.arange(4, dtype=torch.float32) / 3)


def test_rng_state_includes_python_random():
    random.seed(3)
    s = rng_state()
    x = random.random()
    set_rng_state(s)
    assert random.random() == x
