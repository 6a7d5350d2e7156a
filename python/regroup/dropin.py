# SPDX-License-Identifier: Apache-2.0
"""The drop-in: a DistributedDataParallel script as users write it, protected in five lines.

::

    import regroup                                              # 1 (added)
    regroup.init_process_group("gloo")                          # 2 (was dist.init_process_group)
    model = regroup.DDP(net, find_unused_parameters=False)      # 3 (was DDP(...), same arguments)
    opt = regroup.optimizer(torch.optim.AdamW(model.parameters()))  # 4 (the optimizer, wrapped)
    loader = regroup.DataLoader(data, batch_size=32, sampler=DistributedSampler(data))  # 5

The loop stays as it is: ``sampler.set_epoch``, ``for x, y in loader``, a mean loss,
``loss.backward()`` (under ``model.no_sync()`` to accumulate), clipping, ``GradScaler``,
``opt.step()``, ``sched.step()``, ``opt.zero_grad()``.

How it maps onto the trainer (regroup.trainer, one implementation of recovery for both modes):

- A step is one optimizer step. ``opt.step()`` is its commit: it votes through the agent and
  applies the user's optimizer step at once, keeping what it changed (regroup.undo) until the
  outcome comes, which is heard before the next step's ``opt.step()`` (or at the epoch's end):
  the vote travels while the script computes the next step.
- The loader hands each rank its share of the step's samples. The samples of a step are those
  the unmodified script's ``DistributedSampler`` gives the job's full data-parallel size ``W``
  (``WORLD_SIZE``), so a fault-free run trains on exactly the batches of the unmodified script;
  the batch of original rank ``u`` is the unit moved between ranks. A generation of ``dp``
  replicas spreads the ``W`` units over its ranks as the manager spreads micro-batches (some get
  one more), and a rank's batch is the concatenation of its units' batches: the global batch
  never changes, and no sample is lost or repeated.
- Gradients are reduced by the generation's DDP wrapper, rebuilt with the script's own options
  and communication hooks for every generation, weighted so that the reduced gradient is the
  full-size job's: a rank holding ``n`` units contributes ``n / W`` of its mean-loss gradient.
- A failure in the step (an abort, a failed collective, a rolled-back vote) never raises into
  the script: DDP's reduce returns, ``opt.step()`` applies nothing, and the loader, asked for the
  next batch, restores the step's start (buffers, RNG, the schedulers', scalers' and learning
  rates' state), waits for the next generation and gives the same step's batches again. When it
  is the previous step's vote that was rolled back (heard at this step's ``opt.step()``), both
  are undone and the loader gives the previous step's batches again.

Without an agent (``REGROUP_AGENT_SOCKET`` unset: plain torchrun, or one process) every name
here is the plain torch one: the script trains exactly as before, which is the reference of the
exactness tests.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import gc
import logging
import math
import os
import sys
import types
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from regroup.api import ConfigError, StepFailed, TrainerConfig, UsageError
from regroup.state import Snapshot, TrainingState, without_callables
from regroup.step import Step, is_communication_error
from regroup.stops import Stop

__all__ = ["DataLoader", "DistributedDataParallel", "DDP", "init_process_group", "optimizer", "status"]

log = logging.getLogger("regroup")

_UNBOUNDED = 1 << 62  # the trainer's steps() bound: the drop-in ends each epoch itself

_LOADER_OPTIONS = ("num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn",
                   "multiprocessing_context", "generator", "prefetch_factor", "persistent_workers",
                   "pin_memory_device")


def _managed() -> bool:
    return bool(os.environ.get("REGROUP_AGENT_SOCKET"))


# ---------------------------------------------------------------------------------------------
# The five names a script uses
# ---------------------------------------------------------------------------------------------


def init_process_group(backend: Optional[str] = None, **kwargs: Any) -> None:
    """``torch.distributed.init_process_group`` for a script run by ``regroup-agent``.

    Without an agent it is the torch call. Under one, each generation has its own process
    group, formed when the loader starts its first step; until then ``torch.distributed`` holds a
    one-process placeholder, so read ``dist.get_rank()`` and ``dist.get_world_size()`` inside
    the loop or after it (they change with every generation anyway).

    Raises:
        UsageError: called twice.
    """
    if not _managed():
        dist.init_process_group(backend, **kwargs)
        return
    global _session
    if _session is not None:
        raise UsageError("regroup.init_process_group was called twice")
    _session = _Session(backend)
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


class DistributedDataParallel(torch.nn.Module):
    """``torch.nn.parallel.DistributedDataParallel`` with the same arguments, rebuilt for each
    generation. ``module``, ``no_sync()``, ``register_comm_hook()``, ``state_dict()`` (keys
    prefixed ``module.``, as DDP's) work as on DDP; keep this object for the whole run.

    A communication hook is kept and registered on every generation's wrapper; like torch's own
    hooks it must average over its group (the library scales each rank's gradients so that the
    average is the full-size job's).

    Raises:
        UsageError: ``process_group`` given under an agent (each generation has its own).
    """

    def __init__(self, module: torch.nn.Module, *args: Any, **kwargs: Any):
        super().__init__()
        self.module = module
        object.__setattr__(self, "_ddp_args", (args, dict(kwargs)))
        object.__setattr__(self, "_hooks", [])
        object.__setattr__(self, "_ddp", None)
        if not _managed():
            from torch.nn.parallel import DistributedDataParallel as TorchDDP

            object.__setattr__(self, "_ddp", TorchDDP(module, *args, **kwargs))
            return
        if kwargs.get("process_group") is not None:
            raise UsageError("regroup.DDP: do not pass process_group: every generation has its own")
        _require_session("regroup.DDP").bind_model(self)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if _session is None:
            return self._ddp(*args, **kwargs)
        return _session.forward(self, args, kwargs)

    def no_sync(self) -> contextlib.AbstractContextManager:
        """DDP's ``no_sync``: accumulate the gradients of this backward without reducing them."""
        ddp = self._ddp if _session is None else _session.live_ddp()
        return ddp.no_sync() if ddp is not None else contextlib.nullcontext()

    def register_comm_hook(self, state: Any, hook: Callable[..., Any]) -> None:
        """DDP's ``register_comm_hook``, kept for every generation's wrapper."""
        self._hooks.append((state, hook))
        if _session is None:
            self._ddp.register_comm_hook(state, hook)

    def build(self, group: Any, hook: Callable[..., Any]) -> Any:
        """This generation's DDP wrapper over ``group``, reducing through ``hook``."""
        from torch.nn.parallel import DistributedDataParallel as TorchDDP

        args, kwargs = self._ddp_args
        ddp = TorchDDP(self.module, *args, **{**kwargs, "process_group": group})
        ddp.register_comm_hook(None, hook)
        return ddp


DDP = DistributedDataParallel


def optimizer(opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Makes ``opt.step()`` the step's commit and returns the same optimizer.

    Under an agent ``opt.step()`` votes and applies the step only once it is committed; when the
    step failed it applies nothing (the loader then gives the step again). Learning-rate
    schedulers and ``GradScaler`` s built on it work as usual and are kept with its state.

    Raises:
        UsageError: not a torch optimizer, or wrapped twice.
    """
    if not isinstance(opt, torch.optim.Optimizer):
        raise UsageError(f"regroup.optimizer takes a torch.optim.Optimizer, not {type(opt).__name__}")
    if not _managed():
        return opt
    if getattr(opt, "_regroup_wrapped", False):
        raise UsageError("regroup.optimizer was given the same optimizer twice")
    session = _require_session("regroup.optimizer")
    real = opt.step

    def step(_opt: Any, *args: Any, **kwargs: Any) -> Any:
        return session.optimizer_step(real, args, kwargs)

    # A bound method, as torch's schedulers expect when they wrap it in turn.
    opt.step = types.MethodType(step, opt)  # type: ignore[method-assign]
    opt._regroup_wrapped = True  # type: ignore[attr-defined]
    session.bind_optimizer(opt)
    return opt


class DataLoader:
    """``torch.utils.data.DataLoader`` over a ``DistributedSampler``, with the same arguments.

    Each pass (``for batch in loader``, after ``sampler.set_epoch(e)``) gives this rank's
    batches of epoch ``e``: the unmodified script's batches while the job has its full size,
    the concatenation of the batches of the ranks it stands in for after a scale-in. A rank that
    joins mid-run gets nothing for the epochs already done, then the rest of the current one.

    Raises:
        UsageError: the sampler is not a ``DistributedSampler``, or a ``batch_sampler`` is given.
    """

    def __init__(self, dataset: Any, batch_size: Optional[int] = 1, shuffle: Optional[bool] = None,
                 sampler: Any = None, batch_sampler: Any = None, drop_last: bool = False, **options: Any):
        self.dataset = dataset
        self.batch_size = batch_size
        self.sampler = sampler
        self.drop_last = drop_last
        self.options = options
        self._plain: Optional[torch.utils.data.DataLoader] = None
        if not _managed():
            self._plain = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=shuffle,
                                                      sampler=sampler, batch_sampler=batch_sampler,
                                                      drop_last=drop_last, **options)
            return
        if not isinstance(sampler, torch.utils.data.DistributedSampler):
            raise UsageError("regroup.DataLoader needs sampler=DistributedSampler(dataset, ...): the "
                             "samples of a step are those the sampler gives the job's full size "
                             f"(got sampler={type(sampler).__name__})")
        if batch_sampler is not None or shuffle:
            raise UsageError("regroup.DataLoader takes batch_size and a DistributedSampler, not "
                             "batch_sampler or shuffle (shuffle is the sampler's)")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise UsageError(f"regroup.DataLoader: batch_size={batch_size!r} must be an integer >= 1")
        unknown = sorted(set(options) - set(_LOADER_OPTIONS))
        if unknown:
            raise UsageError(f"regroup.DataLoader does not take {', '.join(unknown)}")
        self.order = SamplerOrder(len(dataset), sampler.shuffle, sampler.seed, sampler.drop_last,
                                  _full_replicas())
        _require_session("regroup.DataLoader").bind_loader(self)

    def __len__(self) -> int:
        """Batches per epoch on each rank (the unmodified script's count at full size)."""
        if self._plain is not None:
            return len(self._plain)
        return self.order.batches(self.batch_size, self.drop_last)

    def __iter__(self) -> Iterator[Any]:
        if self._plain is not None:
            return iter(self._plain)
        assert _session is not None
        return _session.epoch(self, int(getattr(self.sampler, "epoch", 0)))


def status() -> Dict[str, int]:
    """Where the run is: ``step`` (the optimizer step in flight, or the last committed),
    ``committed_step``, ``epoch`` (the manager's incarnation) and ``generation``, ``rank``,
    ``world_size``, ``dp``. Without an agent: the one generation of torch's own group."""
    if _session is None or _session.trainer is None or _session.trainer.generation is None:
        world = dist.get_world_size() if dist.is_initialized() else 1
        rank = dist.get_rank() if dist.is_initialized() else 0
        done = _session.trainer.committed_step if _session is not None and _session.trainer else -1
        return {"step": done, "committed_step": done, "epoch": 0, "generation": 0, "rank": rank,
                "world_size": world, "dp": world}
    t = _session.trainer
    g = t.generation
    step = _session.step.number if _session.step is not None else t.committed_step
    return {"step": step, "committed_step": t.committed_step, "epoch": g.epoch, "generation": g.number,
            "rank": g.rank, "world_size": g.world_size, "dp": g.dp}


# ---------------------------------------------------------------------------------------------
# The order of the samples
# ---------------------------------------------------------------------------------------------


def _full_replicas() -> int:
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise ConfigError(f"WORLD_SIZE={os.environ.get('WORLD_SIZE')!r} is not an integer") from None
    if world < 1:
        raise ConfigError(f"WORLD_SIZE={world} must be at least 1")
    return world


class SamplerOrder:
    """The indices ``DistributedSampler(dataset, num_replicas=W, rank=u, shuffle, seed,
    drop_last)`` yields for every ``u`` in an epoch, computed once for all of them (torch's
    rule: a permutation seeded with ``seed + epoch``, padded by repeating its head or cut to a
    multiple of ``W``, then every ``W``-th index from ``u``).

    ``sampler_order_test.py`` checks it against torch's sampler."""

    def __init__(self, size: int, shuffle: bool, seed: int, drop_last: bool, replicas: int):
        self.size = size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.replicas = replicas
        if drop_last and size % replicas:
            self.per_replica = math.ceil((size - replicas) / replicas)
        else:
            self.per_replica = math.ceil(size / replicas)
        self._epoch = -1
        self._indices = torch.empty(0, dtype=torch.long)

    def batches(self, batch_size: int, drop_last: bool) -> int:
        if drop_last:
            return self.per_replica // batch_size
        return math.ceil(self.per_replica / batch_size)

    def indices(self, epoch: int) -> torch.Tensor:
        """The padded or cut order of ``epoch``: unit ``u``'s samples are ``[u::W]``."""
        if epoch != self._epoch:
            if self.shuffle:
                g = torch.Generator()
                g.manual_seed(self.seed + epoch)
                order = torch.randperm(self.size, generator=g)
            else:
                order = torch.arange(self.size)
            total = self.per_replica * self.replicas
            if total > order.numel():
                pad = total - order.numel()
                reps = math.ceil(pad / order.numel())
                order = torch.cat([order, order.repeat(reps)[:pad]])
            self._indices = order[:total]
            self._epoch = epoch
        return self._indices

    def unit(self, epoch: int, unit: int) -> torch.Tensor:
        return self.indices(epoch)[unit::self.replicas]

    def item(self, epoch: int, units: Sequence[int], index: int, batch_size: int) -> List[int]:
        """Batch ``index`` of a rank standing in for ``units``: their batches, concatenated."""
        parts = [self.unit(epoch, u)[index * batch_size:(index + 1) * batch_size] for u in units]
        return torch.cat(parts).tolist() if parts else []


class _Items(torch.utils.data.Sampler):
    """A batch sampler over precomputed lists of indices (the inner DataLoader's)."""

    def __init__(self, items: Callable[[int], List[int]], begin: int, end: int):
        self._items = items
        self._begin = begin
        self._end = end

    def __iter__(self) -> Iterator[List[int]]:
        for q in range(self._begin, self._end):
            yield self._items(q)

    def __len__(self) -> int:
        return max(0, self._end - self._begin)


# ---------------------------------------------------------------------------------------------
# What the loop changes, kept with the state
# ---------------------------------------------------------------------------------------------


def _is_scheduler(obj: Any) -> bool:
    from torch.optim import lr_scheduler

    kinds = tuple(k for k in (getattr(lr_scheduler, "LRScheduler", None),
                              getattr(lr_scheduler, "_LRScheduler", None),
                              getattr(lr_scheduler, "ReduceLROnPlateau", None)) if k is not None)
    return issubclass(type(obj), kinds)  # type(): isinstance reads __class__, which some objects warn on


def _is_scaler(obj: Any) -> bool:
    kinds = tuple(k for k in (getattr(getattr(torch, "amp", None), "GradScaler", None),
                              getattr(getattr(torch.cuda, "amp", None), "GradScaler", None)) if k is not None)
    return issubclass(type(obj), kinds)  # type(): isinstance reads __class__, which some objects warn on


class LoopState:
    """What the script's loop changes besides the model and optimizer: its learning-rate
    schedulers and gradient scalers (found once, when training starts), the optimizer's
    hyper-parameters, and the batches per optimizer step. Part of the state sent to new ranks
    and checkpointed; snapshotted at every step's start."""

    def __init__(self, opt: torch.optim.Optimizer):
        self.optimizer = opt
        self.schedulers: List[Any] = []
        self.scalers: List[Any] = []
        self.batches_per_step = 0          # learned from the first step; 0: not yet known
        self.loaded: Optional[Dict[str, Any]] = None

    def find(self) -> None:
        """The schedulers built on the optimizer and the gradient scalers that exist now."""
        for obj in gc.get_objects():
            try:
                if _is_scheduler(obj) and getattr(obj, "optimizer", None) is self.optimizer:
                    self.schedulers.append(obj)
                elif _is_scaler(obj):
                    self.scalers.append(obj)
            except ReferenceError:
                continue
        if self.schedulers or self.scalers:
            log.info("regroup: keeping %d scheduler(s) and %d gradient scaler(s) with the state",
                     len(self.schedulers), len(self.scalers))

    def hyper(self) -> List[Dict[str, Any]]:
        return [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]

    def state_dict(self) -> Dict[str, Any]:
        return {"batches_per_step": self.batches_per_step,
                "schedulers": [copy.deepcopy(without_callables(s.state_dict())) for s in self.schedulers],
                "scalers": [copy.deepcopy(s.state_dict()) for s in self.scalers],
                "hyper": self.hyper()}

    def load_state_dict(self, state: Dict[str, Any], remember: bool = True) -> None:
        if len(state["schedulers"]) != len(self.schedulers) or len(state["scalers"]) != len(self.scalers):
            raise UsageError(f"this rank has {len(self.schedulers)} scheduler(s) and {len(self.scalers)} "
                             f"gradient scaler(s), its peer {len(state['schedulers'])} and "
                             f"{len(state['scalers'])}: every rank must build the same ones before its "
                             "first batch")
        self.batches_per_step = int(state["batches_per_step"])
        for s, sd in zip(self.schedulers, state["schedulers"]):
            s.load_state_dict(copy.deepcopy(sd))
        for s, sd in zip(self.scalers, state["scalers"]):
            if sd:
                s.load_state_dict(copy.deepcopy(sd))
        for g, h in zip(self.optimizer.param_groups, state["hyper"]):
            g.update(copy.deepcopy(h))
        if remember:
            # A rank that joins runs the script's per-epoch code of the epochs it skips (a
            # per-epoch scheduler's step): what it received is put back when its steps begin.
            self.loaded = copy.deepcopy(state)


class DropInState(TrainingState):
    """The training state of a drop-in script: the trainer's, plus the loop's (LoopState) in
    every snapshot, and the script's own ``opt.step()`` as what a commit applies."""

    def __init__(self, model: torch.nn.Module, opt: torch.optim.Optimizer, loop: LoopState):
        super().__init__(model, opt, None, loop)
        self.loop = loop
        self.pending: Optional[Callable[[], Any]] = None
        self.result: Any = None

    def snapshot(self) -> Snapshot:
        snap = super().snapshot()
        snap.loop = self.loop.state_dict()  # type: ignore[attr-defined]
        return snap

    def restore(self, snap: Snapshot) -> None:
        super().restore(snap)
        self.loop.load_state_dict(snap.loop, remember=False)  # type: ignore[attr-defined]

    def step_optimizer(self, step: int = -1) -> None:
        pending, self.pending = self.pending, None
        self.result = pending() if pending is not None else None

    def zero_grad(self) -> None:
        pass  # the script zeroes its gradients itself


# ---------------------------------------------------------------------------------------------
# The session: one trainer for the process
# ---------------------------------------------------------------------------------------------


class _Session:
    def __init__(self, backend: Optional[str]):
        self.backend = backend
        self.model: Optional[DistributedDataParallel] = None
        self.opt: Optional[torch.optim.Optimizer] = None
        self.loader: Optional[DataLoader] = None
        self.trainer: Any = None
        self.loop: Optional[LoopState] = None
        self.step: Optional[Step] = None
        self.fetched = 0                  # batches given in the step in flight
        self.stepped = False              # opt.step() (or scaler.step) called in the step in flight
        self.failed: Optional[BaseException] = None  # a failure seen where it could not be raised
        self._ddp: Any = None
        self._ddp_mark: Any = None
        self._feed: Optional[_Feed] = None

    # -- binding the script's objects ----------------------------------------------------------

    def bind_model(self, model: DistributedDataParallel) -> None:
        if self.model is not None:
            raise UsageError("regroup.DDP was built twice: wrap the model once")
        self.model = model

    def bind_optimizer(self, opt: torch.optim.Optimizer) -> None:
        if self.opt is not None:
            raise UsageError("regroup.optimizer: one optimizer per process is supported")
        self.opt = opt

    def bind_loader(self, loader: DataLoader) -> None:
        if self.loader is not None:
            raise UsageError("regroup.DataLoader: one training loader per process is supported "
                             "(evaluate with a plain torch DataLoader)")
        self.loader = loader

    def _start(self) -> Any:
        """The trainer, made when the first batch is asked for (every object then exists)."""
        if self.trainer is not None:
            return self.trainer
        from regroup.trainer import Trainer

        missing = [name for name, obj in (("regroup.DDP(model)", self.model),
                                          ("regroup.optimizer(opt)", self.opt)) if obj is None]
        if missing:
            raise UsageError(f"the drop-in needs {' and '.join(missing)} before the first batch")
        loader = self.loader
        assert loader is not None and self.model is not None and self.opt is not None
        order = loader.order
        self.loop = LoopState(self.opt)
        self.loop.find()
        for scaler in self.loop.scalers:
            self._watch_scaler(scaler)
        batches = loader.order.batches(loader.batch_size, loader.drop_last)
        config = TrainerConfig(dataset_size=max(order.per_replica * order.replicas, 1),
                               micro_batch_size=max(1, order.per_replica), microbatches_per_step=order.replicas,
                               seed=order.seed, checksum_interval=_checksum_interval(), backend=self.backend,
                               exit_on_stop=True)
        state = DropInState(self.model.module, self.opt, self.loop)
        self.trainer = Trainer(self.model.module, self.opt, config=config, _state=state)
        self.trainer.sampler = _Epochs(batches, self.loop)
        atexit.register(self._finish)
        return self.trainer

    def _watch_scaler(self, scaler: Any) -> None:
        real = scaler.step

        def step(_scaler: Any, opt: Any, *args: Any, **kwargs: Any) -> Any:
            self.stepped = True  # the step's end, even when the scaler skips opt.step (inf)
            return real(opt, *args, **kwargs)

        scaler.step = types.MethodType(step, scaler)

    def _finish(self) -> None:
        t = self.trainer
        if getattr(sys, "last_value", None) is not None:
            return  # the script died of an exception: its trainer is not done (the agent sees the exit)
        if t is not None and not t.closed:
            try:
                t.finish()
            except Exception as e:  # noqa: BLE001 - at exit: say it, do not mask the script's end
                log.warning("regroup: finishing: %s", e)

    # -- the epoch: steps and their batches ----------------------------------------------------

    def epoch(self, loader: DataLoader, epoch: int) -> Iterator[Any]:
        t = self._start()
        epochs: _Epochs = t.sampler
        t.open()
        if t.generation is None:
            t.await_generation()   # a joining rank learns here where the job is
        first, end = epochs.bounds(epoch)
        if t.committed_step + 1 < first:
            raise UsageError(f"epoch {epoch} began while step {t.committed_step + 1} of an earlier "
                             "epoch was not done: leaving an epoch early (break) and going on with the "
                             "next one is not supported; train whole epochs")
        if t.committed_step + 1 >= end:
            return  # done before (a rank that joined mid-run passes over the epochs it missed)
        # The epoch's length in steps is known once the first step told the batches per step.
        for step in t.steps(_UNBOUNDED, _finish=False):
            if step.number >= epochs.bounds(epoch)[1]:
                # The epoch's last step, its outcome cut off by an abort, was kept by the next
                # generation's plan: the next epoch's pass begins the step after it.
                return
            yield from self._step_batches(loader, step, epoch)
            self._end_step(step)
            if step.committed and t.applied_step + 1 >= epochs.bounds(epoch)[1]:
                # The epoch's last step: its outcome is heard before the script's per-epoch
                # code runs (a rollback gives that step's batches again, in this epoch).
                t.hear_outcome()
                if t.committed_step + 1 >= epochs.bounds(epoch)[1]:
                    return

    def _step_batches(self, loader: DataLoader, step: Step, epoch: int) -> Iterator[Any]:
        assert self.loop is not None
        t = self.trainer
        self.step, self.fetched, self.stepped, self.failed = step, 0, False, None
        if self.loop.loaded is not None:
            self.loop.load_state_dict(self.loop.loaded, remember=False)
            self.loop.loaded = None
        g = step.generation
        units = tuple(range(g.microbatch_begin, g.microbatch_begin + g.microbatch_count))
        k = self.loop.batches_per_step
        begin = (step.number - t.sampler.first_of(epoch)) * k
        feed = self._feed_from(loader, epoch, units, begin)
        while not (k and self.fetched == k):
            batch = next(feed.batches, _END)
            if batch is _END:
                break
            feed.next += 1
            self.fetched += 1
            yield batch
            if self.stepped:
                return

    def _feed_from(self, loader: DataLoader, epoch: int, units: Tuple[int, ...], begin: int) -> "_Feed":
        """This rank's batches of ``epoch`` from batch ``begin`` on, one torch DataLoader kept
        across steps: its workers start once per epoch and generation (and after a failed step),
        not once per step."""
        feed = self._feed
        if feed is None or feed.key != (epoch, units) or feed.next != begin:
            def items(q: int) -> List[int]:
                return loader.order.item(epoch, list(units), q, loader.batch_size)

            total = loader.order.batches(loader.batch_size, loader.drop_last)
            inner = torch.utils.data.DataLoader(loader.dataset, batch_sampler=_Items(items, begin, total),
                                                **loader.options)
            feed = self._feed = _Feed((epoch, units), begin, iter(inner))
        return feed

    def _end_step(self, step: Step) -> None:
        """The step's boundary: the next batch was asked for. A step whose optimizer step was
        never called (a scaler that skipped it) is committed without an update."""
        assert self.loop is not None
        if self.loop.batches_per_step == 0:
            self.loop.batches_per_step = self.fetched
        elif self.fetched != self.loop.batches_per_step and self.stepped:
            raise UsageError(f"step {step.number} took {self.fetched} batches before opt.step(), the "
                             f"earlier steps {self.loop.batches_per_step}: the drop-in needs the same "
                             "number of batches for every optimizer step")
        if not step.committed and step.failure is None and step.stop is None:
            self._commit(step, None)
        self.step = None

    # -- the step's work: forward, reduce, commit ----------------------------------------------

    def live_ddp(self) -> Any:
        """This generation's DDP wrapper, or None when the step in flight has failed."""
        step = self.step
        if step is None or self.trainer is None or self._failing(step):
            return None
        t = self.trainer
        if self._ddp is None or self._ddp_mark != t.membership.active:
            groups = t.membership.groups
            if groups is None:
                return None
            self._ddp = None
            try:
                assert self.model is not None
                self._ddp = self.model.build(groups.dp_group, self._hook(groups, step))
                self._ddp_mark = t.membership.active
            except RuntimeError as e:
                self._fail(step, e)
                return None
        return self._ddp

    def forward(self, model: DistributedDataParallel, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        if self.step is None:
            return model.module(*args, **kwargs)  # outside a training step (evaluation)
        ddp = self.live_ddp()
        if ddp is None:
            return model.module(*args, **kwargs)  # the step failed: finish it locally, cheaply
        try:
            return ddp(*args, **kwargs)
        except RuntimeError as e:
            if not (self.trainer.membership.aborted() or is_communication_error(e)):
                raise
            self._fail(self.step, e)
            return model.module(*args, **kwargs)

    def _hook(self, groups: Any, step: Step) -> Callable[..., Any]:
        """DDP's communication hook for a generation: each rank's gradients weighted by the
        units it holds, then the script's hook (which averages) or a sum divided by W."""
        assert self.model is not None and self.loader is not None
        g = step.generation
        full = self.loader.order.replicas
        weight = g.microbatch_count * g.dp / full   # the script's hook divides by dp
        user = self.model._hooks[-1] if self.model._hooks else None
        gloo = groups.backend == "gloo"
        sockets = groups.sockets
        session = self

        def failed_soft(tensor: torch.Tensor, error: BaseException) -> Any:
            session.failed = session.failed or error
            out = torch.futures.Future()
            out.set_result(tensor)
            return out

        def soften(fut: Any, tensor: torch.Tensor) -> Any:
            out = torch.futures.Future()

            def done(f: Any) -> None:
                try:
                    value = f.value()
                    out.set_result(value[0] if isinstance(value, list) else value)
                except Exception as e:  # noqa: BLE001 - a failed reduce fails the step, not backward
                    session.failed = session.failed or e
                    out.set_result(tensor)

            fut.add_done_callback(done)
            return out

        def hook(state, bucket):  # no annotations: DDP checks them against dist.GradBucket
            tensor = bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()
            if session.trainer.membership.aborted():
                return failed_soft(tensor, RuntimeError("the generation was aborted"))
            if user is not None:
                if weight != 1:
                    tensor.mul_(weight)
                return soften(user[1](user[0], bucket), tensor)
            tensor.div_(full / g.microbatch_count)
            work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=groups.dp_group, async_op=True)
            if gloo:  # an abort fails it at once (regroup.abort); the step fails, backward returns
                return soften(sockets.future(work, lambda t: t), tensor)
            return soften(work.get_future(), tensor)

        return hook

    def _failing(self, step: Step) -> bool:
        return step.failure is not None or self.failed is not None or self.trainer.membership.aborted()

    def _fail(self, step: Step, error: BaseException) -> None:
        if step.failure is None:
            step.failure = self.trainer.collective_failed(step, error)

    def optimizer_step(self, real: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        step = self.step
        if step is None:
            raise UsageError("opt.step() was called outside the loader's loop: the drop-in commits a "
                             "step when the script steps its optimizer after the step's batches")
        if self.stepped and step.committed:
            raise UsageError(f"opt.step() was called twice in step {step.number}: one optimizer step "
                             "per step (accumulate with model.no_sync())")
        self.stepped = True
        if self.loop is not None and self.loop.batches_per_step == 0:
            self.loop.batches_per_step = self.fetched
        self._commit(step, lambda: real(*args, **kwargs))
        return self.trainer.state.result if step.committed else None

    def _commit(self, step: Step, apply: Optional[Callable[[], Any]]) -> None:
        t = self.trainer
        if self.failed is not None and step.failure is None:
            self._fail(step, self.failed)
        if step.failure is not None or step.stop is not None:
            return
        t.state.pending, t.state.result = apply, None
        step.reduced = True  # DDP reduced the gradients in the backward pass
        try:
            t.commit(step)
        except StepFailed as e:
            step.failure = e
        except Stop as e:
            step.stop = e
        finally:
            t.state.pending = None


_END = object()


class _Feed:
    """The batches being given: for which (epoch, units), the next batch's index, the iterator."""

    def __init__(self, key: Tuple[int, Tuple[int, ...]], next_batch: int, batches: Iterator[Any]):
        self.key = key
        self.next = next_batch
        self.batches = batches


class _Epochs:
    """The trainer's view of the drop-in's epochs: steps of ``batches_per_step`` batches."""

    def __init__(self, batches: int, loop: LoopState):
        self.batches = batches
        self.loop = loop

    @property
    def steps_per_epoch(self) -> int:
        k = self.loop.batches_per_step
        if k == 0:
            return max(1, self.batches)  # not known before the first step: every batch a step
        return max(1, self.batches // k)

    def epoch_of(self, step: int) -> int:
        return step // self.steps_per_epoch

    def first_of(self, epoch: int) -> int:
        return epoch * self.steps_per_epoch

    def bounds(self, epoch: int) -> Tuple[int, int]:
        first = self.first_of(epoch)
        return first, first + self.steps_per_epoch


def _checksum_interval() -> int:
    value = os.environ.get("REGROUP_CHECKSUM_INTERVAL", "0")
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"REGROUP_CHECKSUM_INTERVAL={value!r} is not an integer") from None


def _require_session(what: str) -> _Session:
    if _session is None:
        raise UsageError(f"{what} under regroup-agent needs regroup.init_process_group(...) first "
                         "(in place of torch.distributed.init_process_group)")
    return _session


_session: Optional[_Session] = None
