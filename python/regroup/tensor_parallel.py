# SPDX-License-Identifier: Apache-2.0
"""DTensor tensor parallelism that recovers in place: ``TrainerConfig(tensor_parallel_plan=...)``.

A script gives the trainer its plain model and a ``parallelize_module`` plan; the trainer does
the parallelizing, once per generation, over that generation's own tensor-parallel group::

    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    plan = {"mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel()}
    trainer = regroup.Trainer(model, opt, config=regroup.TrainerConfig(
        ..., tensor_parallel=2, pipeline_parallel=1, tensor_parallel_plan=plan))
    for step in trainer.steps(total):
        with step:
            for mb in step.microbatches():
                with mb:
                    step.backward(loss_fn(step.model(x[mb.indices]), y[mb.indices]))
            trainer.commit(step)

Regroup makes new process groups every generation (a new store, a new default group; after a
scale-in the ranks are renumbered), and a DTensor is bound to the DeviceMesh it was made on: its
placements' collectives run on the mesh's groups, and ``parallelize_module``'s input and output
hooks hold the mesh too. So each generation gets a mesh of its own (:func:`device_mesh`:
``DeviceMesh.from_group`` over the generation's tensor-parallel group, no collective), and the
module is re-homed on it (:class:`TensorParallelState`): the first generation parallelizes the
script's module in place; every later one parallelizes a fresh copy of a meta-device template
(the structure only) on the new mesh and moves each rank's local shards into it. A rank's shard
is its position's (``stage * tp + tp_rank``), which a generation change does not move; the
optimizer object stays, its parameters and state re-keyed to the new module's (an LR scheduler
bound to it keeps working).

What moves between ranks, is compared and is checkpointed is local: the local shards of the
parameters and of the optimizer's state (regroup.sharded.LocalShardState, shared with HSDP), so
a replacement rank receives its position's shard from a peer replica in the state sync, the
undo of a voted step (regroup.undo) copies local shards, and a checkpoint holds one file per
position. Gradients are summed across the replicas on their local shards by the trainer's own
reduce (no DDP wrapper).

The first generation parallelizes with ``src_data_rank=None``: no collective while the
generation forms, each rank cutting its shard from its own copy of the full model, so every
rank must build the same initial model (a fixed seed), as a hand-split script does. Until the
first commit the state sync hands replica 0's shards to the other replicas.

DTensor's own collectives (the all-reduce of a row-wise layer's output, of a column-wise
layer's input gradient) are torch's functional collectives, waited for when their result is
first used (``_functional_collectives.wait_tensor``). On gloo that wait is made one an abort
ends at once (:func:`abortable_functional_waits`: the wait runs on a helper thread through the
generation's ``GroupSockets.call``): left to torch, a rank caught in it by gloo's lost wake-up
after an abort stayed there until the abort watchdog exited it, and its shard went with it (with
the peer replica's rank at its position restarting at that moment, nobody held the position's
state and the job ended: seen in ``tensor_parallel_test.py``).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Optional

import torch

from regroup.api import ConfigError
from regroup.group import backend_device
from regroup.sharded import LocalShardState
from regroup.zero import ZeroState

log = logging.getLogger("regroup")


def tensor_parallel_available() -> bool:
    """Whether this torch has DTensor tensor parallelism (``parallelize_module`` and
    ``DeviceMesh.from_group``): torch 2.x. torch 1.13 has neither."""
    try:
        import torch.distributed.tensor.parallel as parallel
        from torch.distributed.device_mesh import DeviceMesh
    except ImportError:
        return False
    return hasattr(DeviceMesh, "from_group") and hasattr(parallel, "parallelize_module")


def require_tensor_parallel(what: str = "tensor_parallel_plan") -> None:
    """Raises ConfigError naming the torch needed when this torch has no DTensor tensor parallelism."""
    if not tensor_parallel_available():
        raise ConfigError(f"{what} needs DTensor tensor parallelism (torch.distributed.tensor.parallel "
                          f"and DeviceMesh.from_group, torch 2.x); this is torch {torch.__version__}")


def check_plan(config: Any) -> None:
    """Validates ``config.tensor_parallel_plan`` against the rest of a TrainerConfig.

    Raises:
        ConfigError: the plan is not one, this torch has no tensor parallelism, or the
            configuration cannot carry it.
    """
    require_tensor_parallel()
    from torch.distributed.tensor.parallel import ParallelStyle

    plan = config.tensor_parallel_plan
    if isinstance(plan, dict):
        if not plan:
            raise ConfigError("tensor_parallel_plan={} is empty: give None, or the modules to parallelize")
        for name, style in plan.items():
            if not isinstance(name, str) or not isinstance(style, ParallelStyle):
                raise ConfigError(f"tensor_parallel_plan[{name!r}]={style!r}: the plan maps module names "
                                  "to ParallelStyles (ColwiseParallel(), RowwiseParallel(), ...)")
    elif not isinstance(plan, ParallelStyle):
        raise ConfigError(f"tensor_parallel_plan={plan!r} must be a ParallelStyle or a dict of them by "
                          "module name (torch.distributed.tensor.parallel.parallelize_module's plan)")
    if config.tensor_parallel < 2:
        raise ConfigError(f"tensor_parallel_plan splits modules over the tensor-parallel group: "
                          f"tensor_parallel={config.tensor_parallel} must be at least 2")
    for name, value, why in (("ddp", config.ddp, "the trainer sums the local gradients across the replicas itself"),
                             ("sharding", config.sharding, "FSDP over the same ranks is not supported")):
        if value:
            raise ConfigError(f"tensor_parallel_plan cannot be combined with {name}={value!r}: {why}")


def device_mesh(groups: Any) -> Any:
    """The generation's one-dimensional DeviceMesh (dimension "tp") over this rank's
    tensor-parallel group, built once per generation (``DeviceMesh.from_group``: no collective)
    and kept in ``groups.extra["tp_mesh"]``; it dies with the generation.

    Raises:
        ConfigError: the generation has no tensor-parallel group (tensor parallel 1).
    """
    mesh = groups.extra.get("tp_mesh")
    if mesh is not None:
        return mesh
    require_tensor_parallel("a tensor-parallel DeviceMesh")
    from torch.distributed.device_mesh import DeviceMesh

    layout = groups.layout
    if groups.tp_group is None or layout.tp < 2:
        raise ConfigError(f"generation has tensor parallel {layout.tp}: no tensor-parallel group to "
                          "build a DeviceMesh on (regroup.io/tensor-parallel must be at least 2)")
    mesh = DeviceMesh.from_group(groups.tp_group, backend_device(groups.backend).type,
                                 mesh=layout.mine("tp"), mesh_dim_names=("tp",))
    groups.extra["tp_mesh"] = mesh
    return mesh


_waits_lock = threading.Lock()
_wait_sockets: Any = None      # the generation's GroupSockets (gloo), or None: torch's own wait
_torch_wait: Any = None        # torch's wait_tensor, once replaced


def abortable_functional_waits(sockets: Any) -> None:
    """From now on torch's functional collectives (DTensor's) are waited for through ``sockets``
    (a generation's ``GroupSockets``: an abort leaves the wait at once, raising ``Abandoned``), or
    as torch does when ``sockets`` is None (NCCL, whose abort ends its waits itself)."""
    global _wait_sockets, _torch_wait
    import torch.distributed._functional_collectives as funcol

    with _waits_lock:
        if _torch_wait is None:
            _torch_wait = funcol.wait_tensor
            funcol.wait_tensor = _wait_tensor  # AsyncCollectiveTensor's waits look it up here
        _wait_sockets = sockets


def _wait_tensor(tensor: torch.Tensor) -> torch.Tensor:
    sockets = _wait_sockets
    if sockets is None:
        return _torch_wait(tensor)
    return sockets.call(_torch_wait, tensor, what="a DTensor collective")


class TensorParallelState(LocalShardState):
    """The training state of a job whose model is parallelized with a ``parallelize_module``
    plan over each generation's tensor-parallel group (see the module).

    ``model`` is the plain module as the script built it (every rank the same); it is
    parallelized in place by the first generation and replaced by a re-homed copy at every
    later one: fetch it as ``step.model`` or ``trainer.module``, not the script's variable.

    Raises:
        ConfigError: this torch has no DTensor tensor parallelism.
    """

    KIND = "tp"
    WHAT = "tensor_parallel_plan"

    def __init__(self, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
                 scheduler: Any = None, extra: Any = None, *, plan: Any):
        require_tensor_parallel()
        super().__init__(model, optimizer, scheduler, extra)
        self.plan = plan
        self.tp = 0
        self.mesh: Any = None        # the generation's (device_mesh)
        self.rehomed = 0             # generations whose mesh the module was moved onto

    def regroup(self, groups: Any) -> None:
        """Parallelizes the module on the new generation's mesh, keeping this rank's local shards."""
        from torch.distributed.tensor.parallel import parallelize_module

        layout = groups.layout
        if self._sharded and layout.tp != self.tp:
            raise ConfigError(f"the tensor-parallel size changed ({self.tp} -> {layout.tp}): a "
                              "tensor-parallel job resizes by whole replicas")
        mesh = device_mesh(groups)
        abortable_functional_waits(groups.sockets if groups.backend == "gloo" else None)
        if not self._sharded:
            new = self.model
            parallelize_module(new, mesh, self.plan, src_data_rank=None)
        else:
            new = self.fresh_module()
            parallelize_module(new, mesh, self.plan, src_data_rank=None)
            new.to_empty(device=backend_device(groups.backend))
            self.move_into(new)
            self.rehomed += 1
        self.adopt(new, layout)
        self.tp = layout.tp
        self.mesh = mesh
        log.info("regroup: tensor-parallel module %s on the mesh of ranks %s (position %d)",
                 "re-homed" if self.rehomed else "parallelized", layout.mine("tp"), layout.position)


class ZeroTensorParallelState(ZeroState, TensorParallelState):
    """DTensor tensor parallelism with a distributed optimizer (ZeRO-1, regroup.zero): the
    module is parallelized per generation as :class:`TensorParallelState` does, and each rank's
    optimizer state is a slice of its local shards' (flattened in ``parameters()`` order) over
    its position's data-parallel group, as ZeRO-1 slices a hand-split shard. What moves to a new
    rank, is checkpointed and loaded is the local shards plus the slices (ZeroState's methods,
    over TensorParallelState's local ones)."""

    def __init__(self, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
                 scheduler: Any = None, extra: Any = None, *, plan: Any, copies: int = 1,
                 replica_size: int = 1, tensor_parallel: Optional[int] = None):
        TensorParallelState.__init__(self, model, optimizer, scheduler, extra, plan=plan)
        self._init_zero(optimizer, copies, replica_size, tensor_parallel)
