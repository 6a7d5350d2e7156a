# SPDX-License-Identifier: Apache-2.0
"""Sharded data parallelism that recovers in place: HSDP with FSDP2 (``TrainerConfig(sharding="hsdp")``).

A replica is ``tensor_parallel`` ranks (the shard group): its model is sharded over them with
FSDP2's ``fully_shard`` and replicated across the replicas. Gradients are reduce-scattered
within the replica, summed across the replicas, and divided by the global batch (the step
contract: never averaged); every collective on gloo is waited for so that an abort frees the
rank at once (a rank stuck until the watchdog would lose its shard). Every rank of a replica takes its own contiguous part of each of the
replica's micro-batches (:meth:`HSDPState.share`), so every rank of a replica runs as many
forward and backward passes as the others, as FSDP's collectives need.

Recovery is the ordinary one of regroup.sync, position by position: the rank at position ``p``
of every replica holds the same local shards (dim-0 shard ``p`` of every parameter, and its
optimizer state), so a replacement replica receives each local shard from the rank at the same
position in a replica that holds it. A replica is the unit that leaves and returns: losing any
rank loses its replica's shard of that rank, which only a peer replica holds. With one replica
(plain FSDP) nothing can be recovered from a peer: the job goes to its newest checkpoint
(regroup.sync names why).

Each generation builds a fresh :class:`~torch.distributed.device_mesh.DeviceMesh` over its own
process groups (``DeviceMesh.from_group`` over the rank's replica: FSDP reduce-scatters the
gradients there; the sum across the replicas is the trainer's own reduce over the position's
data-parallel group, with the division by the global batch), shards a fresh copy of the module on it
(from a meta-device template kept at construction: no memory but the structure), and moves the
local shards of the previous generation's module (or, on the first, the module's own values)
into it. The optimizer object stays the same: its parameters and state are re-keyed to the new
module's parameters, so an LR scheduler bound to it keeps working.

Needs FSDP2 (``torch.distributed.fsdp.fully_shard``, torch >= 2.6).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import logging
from typing import Any, Dict, Iterator, List, Optional

import torch

from regroup.api import ConfigError
from regroup.contract import checksum
from regroup.state import TrainingState, as_param_shard, local_tensor as _local, localize as _localize

log = logging.getLogger("regroup")

SHARDINGS = ("hsdp",)


def fsdp2_available() -> bool:
    """Whether this torch has FSDP2 (torch 1.13's fsdp package does not even import on Python
    3.11, so the version is looked at first)."""
    try:
        major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    except ValueError:
        return False
    if (major, minor) < (2, 6):
        return False
    try:
        fsdp = importlib.import_module("torch.distributed.fsdp")
        tensor = importlib.import_module("torch.distributed.tensor")
    except ImportError:
        return False
    return hasattr(fsdp, "fully_shard") and hasattr(tensor, "DTensor")


def require_fsdp2(what: str) -> None:
    """Raises ConfigError naming the torch needed when this torch has no FSDP2."""
    if not fsdp2_available():
        raise ConfigError(f"{what} needs FSDP2 (torch.distributed.fsdp.fully_shard, torch >= 2.6); "
                          f"this is torch {torch.__version__}")


class ShardedModel(torch.nn.Module):
    """One generation's FSDP2 module, as ``step.model``: calls it, and ``no_sync()`` defers the
    gradient reduction (every micro-batch of a step but the last, as DDP's)."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        self.module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self.module.set_requires_gradient_sync(True)


class LocalShardState(TrainingState):
    """A training state whose module is rebuilt on every generation's own mesh, each rank keeping
    its local shards (HSDP here, tensor parallelism in regroup.tensor_parallel).

    The subclass's :meth:`regroup` makes the generation's module (the first time from ``model``
    in place, later from a copy of the meta-device template) and hands it to :meth:`adopt`. What
    moves between ranks, is compared and is checkpointed is the local shards of the parameters
    and of the optimizer's state, tagged with :attr:`KIND`, this rank's position and the
    replica's size; a shard is only ever loaded at its own position.
    """

    KIND = ""    # the "sharding" tag of the state trees
    WHAT = ""    # how a script asks for it (for messages)

    def __init__(self, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
                 scheduler: Any = None, extra: Any = None):
        super().__init__(model, optimizer, scheduler, extra)
        # The structure only: parameters and buffers on the meta device.
        self._template = copy.deepcopy(model).to("meta")
        self._sharded = False
        self._params: List[torch.nn.Parameter] = list(model.parameters())  # sharded once sharded
        self.position = 0
        self.replica_size = 1

    def fresh_module(self) -> torch.nn.Module:
        """A copy of the template (meta device) to build the next generation's module from."""
        return copy.deepcopy(self._template)

    def move_into(self, new: torch.nn.Module) -> None:
        """Copies this rank's local shards of the current module's parameters (those noted when
        they were made: a step broken by an abort may leave the registered ones others) and its
        buffers into ``new``, a module of the same structure sharded the same way."""
        with torch.no_grad():
            for (name, p), q in zip(new.named_parameters(), self._params):
                _local(p).copy_(_local(q))
            olds = dict(self.model.named_buffers())
            for name, b in new.named_buffers():
                b.copy_(olds[name])

    def adopt(self, new: torch.nn.Module, layout: Any) -> None:
        """``new`` is the generation's module: the optimizer is re-keyed to its parameters."""
        old_params = self._params
        self._params = list(new.parameters())
        self._rekey_optimizer(old_params, self._params)
        self.model = new
        self._sharded = True
        self.position = layout.position
        self.replica_size = layout.replica_size

    def _rekey_optimizer(self, old: List[torch.nn.Parameter], new: List[torch.nn.Parameter]) -> None:
        """The optimizer's parameters become the new module's; its state follows them."""
        opt = self.optimizer
        if opt is None:
            return
        index = {id(p): i for i, p in enumerate(old)}
        state = opt.state
        moved: Dict[Any, Any] = {}
        for group in opt.param_groups:
            params = []
            for p in group["params"]:
                if id(p) not in index:
                    raise ConfigError("the optimizer holds a parameter that is not the model's: "
                                      f"under {self.WHAT} give it model.parameters()")
                q = new[index[id(p)]]
                params.append(q)
                if p in state:
                    moved[q] = {k: as_param_shard(v, q) for k, v in state[p].items()}
            group["params"] = params
        state.clear()
        state.update(moved)

    def materialize_grads(self) -> List[torch.Tensor]:
        """The local shards of the gradients, zeros where none was computed: what the trainer
        sums across the replicas and divides by G. A gradient whose placements are not its
        parameter's (a partial sum) is first brought to them."""
        grads = []
        for p in self._params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            g = p.grad
            if hasattr(g, "placements") and tuple(g.placements) != tuple(p.placements):
                g = p.grad = g.redistribute(p.device_mesh, p.placements)
            grads.append(_local(g))
        return grads

    # -- what moves and what is compared --------------------------------------------------------

    def checksum(self) -> int:
        return checksum([_local(p).detach() for p in self._params])

    def state_dict(self, committed_step: int) -> Dict[str, Any]:
        """This rank's local shards (model and optimizer state), and the rest as usual."""
        out = super().state_dict(committed_step)
        out["model"] = _localize(out["model"])
        if "optimizer" in out:
            out["optimizer"] = _localize(out["optimizer"])
        out["sharding"] = {"kind": self.KIND, "position": self.position, "replica_size": self.replica_size}
        return out

    def load_state_dict(self, state: Dict[str, Any]) -> int:
        meta = state.get("sharding")
        if meta is None or meta.get("kind") != self.KIND:
            raise ConfigError(f"the state is not a {self.KIND!r} one ({self.WHAT} loads its own local "
                              f"shards only; this one is {meta.get('kind') if meta else 'unsharded'})")
        if self._sharded and (meta["position"], meta["replica_size"]) != (self.position, self.replica_size):
            raise ConfigError(f"the state holds the shard of position {meta['position']} of "
                              f"{meta['replica_size']}, not this rank's ({self.position} of "
                              f"{self.replica_size})")
        names = [n for n, _ in self.model.named_parameters()]
        own = {**dict(zip(names, self._params)), **dict(self.model.named_buffers())}
        if set(own) != set(state["model"]):
            raise ConfigError(f"the state holds {sorted(state['model'])}, the model {sorted(own)}")
        with torch.no_grad():
            for name, value in state["model"].items():
                _local(own[name]).copy_(value)
        if self.optimizer is not None and "optimizer" in state:
            self._load_optimizer(state["optimizer"])
        rest = {k: v for k, v in state.items() if k not in ("model", "optimizer")}
        rest["model"] = {}
        saved, self.model = self.model, _NoModel()
        try:
            return super().load_state_dict(rest)
        finally:
            self.model = saved

    def _load_optimizer(self, sd: Dict[str, Any]) -> None:
        opt = self.optimizer
        params = [p for g in opt.param_groups for p in g["params"]]
        if len(sd["param_groups"]) != len(opt.param_groups):
            raise ConfigError("the optimizer state has another number of parameter groups")
        for group, saved in zip(opt.param_groups, sd["param_groups"]):
            group.update({k: v for k, v in saved.items() if k != "params"})
        opt.state.clear()
        for i, st in sd["state"].items():
            p = params[int(i)]
            opt.state[p] = {k: as_param_shard(v.clone() if isinstance(v, torch.Tensor) else v, p)
                            for k, v in st.items()}


class HSDPState(LocalShardState):
    """The training state of an HSDP job: the module sharded over each replica's ranks.

    ``model`` is the plain (unsharded) module as the script built it; it is sharded in place by
    the first generation, and replaced by a fresh sharded copy at every later one.

    Raises:
        ConfigError: this torch has no FSDP2.
    """

    KIND = "hsdp"
    WHAT = "sharding='hsdp'"

    def __init__(self, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
                 scheduler: Any = None, extra: Any = None, *, global_batch: int):
        require_fsdp2("sharding='hsdp'")
        super().__init__(model, optimizer, scheduler, extra)
        self.global_batch = global_batch
        self.wrapper: Optional[ShardedModel] = None

    # -- a generation ---------------------------------------------------------------------------

    def regroup(self, groups: Any) -> None:
        """Shards the model over the new generation's groups, keeping this rank's local shards."""
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        layout = groups.layout
        if layout.replica_size < 2:
            raise ConfigError("sharding='hsdp' shards a replica over its ranks: give it at least 2 "
                              "(tensor_parallel, regroup.io/tensor-parallel)")
        if layout.replica_size != self.replica_size and self._sharded:
            raise ConfigError(f"the replicas changed size ({self.replica_size} -> "
                              f"{layout.replica_size}): HSDP resizes by whole replicas")
        device = "cuda" if groups.backend == "nccl" else "cpu"
        # FSDP shards over the replica only; the sum across replicas is the trainer's own reduce
        # (regroup.state.reduce_gradients over the position's data-parallel group, divided by G),
        # which an abort frees at once, as FSDP's own waits on its collectives would not be.
        mesh = DeviceMesh.from_group(groups.tp_group, device, mesh=layout.replica_ranks(layout.replica),
                                     mesh_dim_names=("shard",))
        if not self._sharded:
            new = self.model
            fully_shard(new, mesh=mesh)
        else:
            new = self.fresh_module()
            fully_shard(new, mesh=mesh)
            new.to_empty(device=device)
            self.move_into(new)
        new.set_gradient_divide_factor(1.0)          # summed only: the trainer divides by G
        new.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM/AVG
        if groups.backend == "gloo":
            _abortable_comms(new, groups.sockets)
        self.adopt(new, layout)
        self.wrapper = ShardedModel(new)

    def live_model(self) -> Any:
        return self.wrapper

    def share(self, indices: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous part of a micro-batch of its replica."""
        if self.replica_size < 2:
            return indices
        return torch.tensor_split(indices, self.replica_size)[self.position].clone()


def _abortable_comms(module: Any, sockets: Any) -> None:
    """FSDP's all-gather and reduce-scatter issued asynchronously and waited for with
    ``GroupSockets.wait``, so that an abort frees a rank blocked in one at once (FSDP's own
    ``work.wait()`` may miss gloo's wake-up when the abort shuts the sockets down, and a peer lost
    without a reset, a node cut off, never ends it: the watchdog would exit the rank, losing its
    shard). Left as FSDP's defaults, with a warning, where this torch lacks the hooks."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter
    except ImportError:
        log.warning("regroup: this torch has no FSDP custom collectives: an abort frees a rank "
                    "blocked in FSDP's all-gather only through the watchdog")
        return

    class AllGather(DefaultAllGather):
        def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, async_op: bool = False) -> Any:
            sockets.wait(super().__call__(output_tensor, input_tensor, group, async_op=True), "FSDP's all-gather")
            return None

    class ReduceScatter(DefaultReduceScatter):
        def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, op: Any, async_op: bool = False) -> Any:
            # gloo's reduce-scatter has no future: run it on a helper thread instead
            sockets.call(super().__call__, output_tensor, input_tensor, group, op, False,
                         what="FSDP's reduce-scatter")
            return None

    module.set_custom_all_gather(AllGather())
    module.set_custom_reduce_scatter(ReduceScatter())


class _NoModel(torch.nn.Module):
    """Stands for the model while the base class loads the rest of a state (nothing to load)."""


def make_state(config: Any, model: torch.nn.Module, optimizer: Any, scheduler: Any, extra: Any) -> TrainingState:
    """The training state for ``config.tensor_parallel_plan``, ``config.sharding`` and
    ``config.optimizer_sharding`` (None: the plain one)."""
    if config.tensor_parallel_plan is not None and config.optimizer_sharding == "zero1":
        from regroup.tensor_parallel import ZeroTensorParallelState
        return ZeroTensorParallelState(model, optimizer, scheduler, extra, plan=config.tensor_parallel_plan,
                                       copies=config.optimizer_copies, replica_size=config.replica_size,
                                       tensor_parallel=config.tensor_parallel)
    if config.tensor_parallel_plan is not None:
        from regroup.tensor_parallel import TensorParallelState
        return TensorParallelState(model, optimizer, scheduler, extra, plan=config.tensor_parallel_plan)
    if config.optimizer_sharding == "zero1":
        from regroup.zero import ZeroState
        return ZeroState(model, optimizer, scheduler, extra, copies=config.optimizer_copies,
                         replica_size=config.replica_size, tensor_parallel=config.tensor_parallel)
    if config.sharding is None:
        return TrainingState(model, optimizer, scheduler, extra)
    if config.sharding == "hsdp":
        return HSDPState(model, optimizer, scheduler, extra, global_batch=config.global_batch_size)
    raise ConfigError(f"sharding={config.sharding!r} must be one of {SHARDINGS} or None")
