# SPDX-License-Identifier: Apache-2.0
"""HSDP with FSDP2 (regroup.sharded) without an agent: the configuration's checks, and 2 replicas
x 2 shards on 4 gloo processes (torchrun's environment) against one plain process: the same
final weights (float64, norm-relative 1e-9), a checkpoint of local shards that loads back, and a
rebuild of the sharding on a second generation's groups that keeps every shard.

The recovery itself (a killed rank, a lost replica and its return) runs under the real manager
and agents in sharded_e2e_test.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import regroup
from regroup.sharded import fsdp2_available
from regroup.testing import free_port, relative_error

NEEDS_FSDP2 = pytest.mark.skipif(not fsdp2_available(),
                                 reason=f"HSDP needs FSDP2 (torch >= 2.6); this is torch {torch.__version__}")
STEPS = 6
CONFIG = dict(dataset_size=64, micro_batch_size=4, microbatches_per_step=4, seed=7, checksum_interval=0)


def make_model() -> torch.nn.Module:
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Tanh(), torch.nn.Linear(10, 3)).double()


def make_data():
    g = torch.Generator().manual_seed(11)
    return torch.randn(64, 6, generator=g, dtype=torch.float64), torch.randn(64, 3, generator=g, dtype=torch.float64)


def train(trainer: regroup.Trainer, steps: int) -> None:
    x, y = make_data()
    for step in trainer.steps(steps):
        with step:
            for mb in step.microbatches():
                with mb:
                    step.backward(((step.model(x[mb.indices]) - y[mb.indices]) ** 2).sum())
            trainer.commit(step)


def full_parameters(model: torch.nn.Module) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_hsdp_is_refused_without_fsdp2_naming_the_torch_needed():
    if fsdp2_available():
        assert regroup.TrainerConfig(**CONFIG, tensor_parallel=2, sharding="hsdp").sharding == "hsdp"
    else:
        with pytest.raises(regroup.ConfigError, match=r"torch >= 2\.6.*this is torch"):
            regroup.TrainerConfig(**CONFIG, tensor_parallel=2, sharding="hsdp")


def test_a_bad_sharding_and_ddp_with_sharding_are_refused():
    with pytest.raises(regroup.ConfigError, match="sharding='zero9' must be"):
        regroup.TrainerConfig(**CONFIG, sharding="zero9")
    if fsdp2_available():
        with pytest.raises(regroup.ConfigError, match="ddp=True cannot be combined"):
            regroup.TrainerConfig(**CONFIG, tensor_parallel=2, sharding="hsdp", ddp=True)


def _rank(rank: int, port: int, out: str, optimizer: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="4", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01) if optimizer == "adam" else \
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    config = regroup.TrainerConfig(**CONFIG, tensor_parallel=2, sharding="hsdp",
                                   checkpoint_dir=os.path.join(out, "ckpt"), checkpoint_interval=STEPS)
    trainer = regroup.Trainer(model, opt, sched, config=config)
    train(trainer, STEPS)
    state = trainer.state
    shards = {n: p.to_local().clone() for n, p in trainer.module.named_parameters()}
    torch.save({"shards": shards, "position": state.position, "lr": opt.param_groups[0]["lr"],
                "opt": state.state_dict(STEPS - 1)["optimizer"]}, os.path.join(out, f"rank{rank}.pt"))


def _spawn(tmp_path: Path, optimizer: str) -> None:
    import torch.multiprocessing as mp

    mp.start_processes(_rank, args=(free_port(), str(tmp_path), optimizer), nprocs=4, join=True,
                       start_method="spawn")


@NEEDS_FSDP2
@pytest.mark.parametrize("optimizer", ["adam"])
def test_hsdp_2x2_trains_as_one_plain_process(tmp_path, optimizer):
    _spawn(tmp_path, optimizer)
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01) if optimizer == "adam" else \
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    train(regroup.Trainer(model, opt, sched, config=regroup.TrainerConfig(**CONFIG)), STEPS)
    expected = full_parameters(model)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(4)]
    for replica in (0, 1):
        parts = [ranks[2 * replica + p] for p in (0, 1)]
        assert [p["position"] for p in parts] == [0, 1]
        got = {n: torch.cat([p["shards"][n] for p in parts], 0).detach() for n in expected}
        error = relative_error(expected, got)
        assert error <= 1e-9, f"replica {replica}: norm-relative error {error:.3e}"
        assert parts[0]["lr"] == opt.param_groups[0]["lr"]
    # The replicas hold the same shards position by position, optimizer state included.
    for p in (0, 1):
        a, b = ranks[p]["opt"]["state"], ranks[2 + p]["opt"]["state"]
        assert a.keys() == b.keys() and a
        for i in a:
            for k in a[i]:
                assert torch.equal(torch.as_tensor(a[i][k]), torch.as_tensor(b[i][k])), (i, k)
    # The checkpoint holds local shards: position p's file loads into position p's state.
    from regroup.checkpoint import Checkpointer

    newest = Checkpointer(str(tmp_path / "ckpt")).newest()
    assert newest is not None and newest.step == STEPS - 1
    for p in (0, 1):
        saved = Checkpointer(str(tmp_path / "ckpt")).load(newest, p)
        assert saved["sharding"] == {"kind": "hsdp", "position": p, "replica_size": 2}
        for n, t in ranks[p]["shards"].items():
            assert torch.equal(saved["model"][n], t), n
