# SPDX-License-Identifier: Apache-2.0
"""The state that must survive a fault: model, optimizer, LR scheduler, extra state, RNG.

Three things are done with it:

* a step-start :class:`Snapshot` of what a step changes before its commit (the model's buffers,
  such as batch-norm statistics, and the random generators), restored before the step is done
  again; parameters, optimizer and scheduler change only when a step is committed, so they
  need no snapshot;
* the whole state as one picklable tree of tensors and plain values (:meth:`TrainingState.state_dict`),
  for checkpoints and for sending it to a rank that needs it (:func:`send_state`,
  :func:`recv_state`), always loaded with ``weights_only=True`` where torch supports it;
* the gradient reduction of the step contract: gradients summed over the data-parallel replicas,
  then divided by the global batch size (:func:`reduce_gradients`).
"""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import random
import sys
from collections import OrderedDict
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from regroup.api import StateSyncError
from regroup.contract import checksum

_WEIGHTS_ONLY = "weights_only" in inspect.signature(torch.load).parameters


def safe_load(source: Any) -> Any:
    """``torch.load`` to CPU with ``weights_only=True`` when this torch has it."""
    if _WEIGHTS_ONLY:
        return torch.load(source, map_location="cpu", weights_only=True)
    return torch.load(source, map_location="cpu")  # torch < 1.13: no restricted unpickler


# A state tree (state_dicts: dicts with int keys, floats, tuples, OrderedDicts with metadata)
# is stored as its tensors plus a JSON skeleton, so that torch 1.13's weights_only unpickler
# (which refuses Python floats, among others) can load it: nothing in the file is code.
_FORMAT = "regroup-state-1"


def _encode(obj: Any, tensors: List[torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return {"t": len(tensors) - 1}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj if not isinstance(obj, float) else {"f": repr(obj)}
    if isinstance(obj, dict):
        out = {"d": [[_encode(k, tensors), _encode(v, tensors)] for k, v in obj.items()]}
        if isinstance(obj, OrderedDict):
            out["o"] = 1
            meta = getattr(obj, "_metadata", None)
            if meta is not None:
                out["m"] = _encode(dict(meta), tensors)
        return out
    if isinstance(obj, tuple):
        return {"u": [_encode(v, tensors) for v in obj]}
    if isinstance(obj, list):
        return [_encode(v, tensors) for v in obj]
    raise StateSyncError(f"a value of type {type(obj).__name__} cannot be part of the training state: "
                         "use tensors, numbers, strings, lists, tuples and dicts")


def _decode(obj: Any, tensors: List[torch.Tensor]) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "t" in obj:
        return tensors[obj["t"]]
    if "f" in obj:
        return float(obj["f"])
    if "u" in obj:
        return tuple(_decode(v, tensors) for v in obj["u"])
    items = [(_decode(k, tensors), _decode(v, tensors)) for k, v in obj["d"]]
    if "o" in obj:
        out: Any = OrderedDict(items)
        if "m" in obj:
            out._metadata = OrderedDict(_decode(obj["m"], tensors))
        return out
    return dict(items)


def save_tree(tree: Any, target: Any) -> None:
    """Writes a state tree (to a path or a binary file object) as tensors + a JSON skeleton."""
    tensors: List[torch.Tensor] = []
    skeleton = json.dumps(_encode(tree, tensors), separators=(",", ":"))
    torch.save({"format": _FORMAT, "tree": skeleton, "tensors": tensors}, target)


def load_tree(source: Any) -> Any:
    """Reads what :func:`save_tree` wrote, with ``weights_only=True`` where torch has it.

    Raises:
        StateSyncError: it is not a state tree.
    """
    data = safe_load(source)
    if not isinstance(data, dict) or data.get("format") != _FORMAT:
        raise StateSyncError("not a regroup state (format tag missing)")
    return _decode(json.loads(data["tree"]), list(data["tensors"]))


def without_callables(state: Dict[str, Any]) -> Dict[str, Any]:
    """A scheduler's state without the callables kept in its ``__dict__`` (torch 1.13's
    OneCycleLR, a guarded ``step``): they are the object's, rebuilt by its constructor."""
    return {k: v for k, v in state.items() if not callable(v)}


def map_tensors(tree: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """A state tree (dicts, lists, tuples) with ``fn`` applied to every tensor in it."""
    if isinstance(tree, torch.Tensor):
        return fn(tree)
    if isinstance(tree, dict):
        return type(tree)((k, map_tensors(v, fn)) for k, v in tree.items())
    if isinstance(tree, list):
        return [map_tensors(v, fn) for v in tree]
    if isinstance(tree, tuple):
        return tuple(map_tensors(v, fn) for v in tree)
    return tree


def cpu_clone(tree: Any) -> Any:
    """A copy of a state tree with every tensor cloned to CPU (safe to write in the background)."""
    return map_tensors(tree, lambda t: t.detach().to("cpu", copy=True))


def local_tensor(t: Any) -> Any:
    """A DTensor's local shard (regroup.sharded, regroup.tensor_parallel), a plain tensor as is:
    what this rank holds, moves, compares and checkpoints."""
    return t.to_local() if hasattr(t, "to_local") else t


def localize(tree: Any) -> Any:
    """A state tree with every DTensor replaced by its local shard (detached)."""
    return map_tensors(tree, lambda t: local_tensor(t).detach())


def as_param_shard(value: Any, param: Any) -> Any:
    """An optimizer state tensor shaped like a DTensor ``param``'s local shard, as a DTensor like
    it (its mesh and placements); any other value, or any value of a plain parameter, as is."""
    if not isinstance(value, torch.Tensor) or value.dim() == 0 or not hasattr(param, "placements"):
        return value
    local = local_tensor(value)
    if local.shape != local_tensor(param).shape:
        return value
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(local, param.device_mesh, param.placements, run_check=False,
                              shape=param.shape, stride=param.stride())


def rng_state() -> Dict[str, Any]:
    """The random generators' state: torch CPU (and CUDA when in use), Python, NumPy if loaded."""
    out: Dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    np = sys.modules.get("numpy")
    if np is not None:
        kind, keys, pos, has_gauss, gauss = np.random.get_state()
        out["numpy"] = [kind, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss), float(gauss)]
    return out


def set_rng_state(state: Dict[str, Any]) -> None:
    """Puts back what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    np = sys.modules.get("numpy")
    if np is not None and "numpy" in state:
        kind, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, gauss))


class Snapshot:
    """A step-start copy of the model's buffers and of the random generators."""

    def __init__(self, buffers: Dict[str, torch.Tensor], rng: Dict[str, Any]):
        self.buffers = buffers
        self.rng = rng


class TrainingState:
    """The model, optimizer, scheduler and extra state of a trainer.

    Args:
        model: the module (never a DistributedDataParallel wrapper: the library builds that).
        optimizer: its optimizer, or None.
        scheduler: an LR scheduler (anything with ``state_dict``/``load_state_dict``/``step``),
            or None.
        extra: more state to keep and move: an object with ``state_dict``/``load_state_dict``,
            or a dict (updated in place on load). Its values must be tensors or plain values.
            Change it only after a step is committed: it is not part of the step snapshot.
    """

    def __init__(self, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
                 scheduler: Any = None, extra: Any = None):
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.extra = extra
        self.scheduler_every = 1
        self._optimizer_guard: Any = None
        self._scheduler_guard: Any = None

    # -- snapshots ------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        buffers = {name: b.detach().clone() for name, b in self.model.named_buffers() if b is not None}
        return Snapshot(buffers, rng_state())

    def restore(self, snap: Snapshot) -> None:
        with torch.no_grad():
            for name, b in self.model.named_buffers():
                if b is not None and name in snap.buffers:
                    b.copy_(snap.buffers[name])
        set_rng_state(snap.rng)

    # -- a generation (regroup.sharded overrides these) ---------------------------------------

    def regroup(self, groups: Any) -> None:
        """Called when a generation's groups are built, before its state sync: a sharded state
        rebuilds its sharding on them. The plain state has nothing to do."""

    def live_model(self) -> Any:
        """The generation's model wrapper, when the state makes one (else None)."""
        return None

    def share(self, indices: torch.Tensor) -> torch.Tensor:
        """This rank's part of a micro-batch of its replica (all of it unless sharded)."""
        return indices

    def after_sync(self, layout: Any, groups: Any, holders: Sequence[bool], committed_step: int,
                   device: torch.device) -> int:
        """Called at the end of a generation's state sync (``holders``: the census, which ranks
        held the state at ``committed_step``): a distributed optimizer (regroup.zero)
        repartitions its slices. Returns the bytes sent. The plain state has nothing to do."""
        return 0

    def load_checkpoint(self, checkpointer: Any, info: Any, position: int) -> None:
        """Loads this rank's part of checkpoint ``info`` (the shard of its ``position``)."""
        self.load_state_dict(checkpointer.load(info, position))

    def checkpoint_files(self, generation: Any, dump: bool, position: int, count: int) -> List[Tuple[int, int, Any]]:
        """The shard files this rank writes, as ``(index, count, part)``: at a periodic
        checkpoint replica 0's rank at each position writes that position's; at a dump every rank
        writes its position's (``part`` is given back to :meth:`checkpoint_state`)."""
        if not dump and generation.replica != 0:
            return []
        return [(position, count, None)]

    def checkpoint_state(self, committed_step: int, part: Any) -> Dict[str, Any]:
        """What shard file ``part`` (from :meth:`checkpoint_files`) holds."""
        return self.state_dict(committed_step)

    # -- a step's apply and its undo (regroup.undo) ----------------------------------------------

    def prepare(self, groups: Any) -> None:
        """After the gradient reduce, before the vote: a distributed optimizer computes its step
        here (with its collectives), so that the apply runs none. The plain state has nothing to do."""

    def apply_optimizer(self) -> None:
        """The optimizer's part of applying a committed step."""
        if self.optimizer is not None:
            self.optimizer.step()

    def undo_take(self) -> Any:
        """What the undo of a step keeps beyond the parameters and the optimizer's own state."""
        return None

    def undo_restore(self, held: Any) -> None:
        """Puts back what :meth:`undo_take` returned."""

    # -- gradients ------------------------------------------------------------------------------

    def parameters(self) -> List[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def guard(self, optimizer_fix: str, scheduler_fix: str) -> None:
        """From now on the script's own ``opt.step()`` / ``sched.step()`` raise UsageError with
        the fix: only :meth:`step_optimizer` applies them (regroup.guards)."""
        from regroup.guards import Applied

        if self.optimizer is not None:
            self._optimizer_guard = Applied(self.optimizer, "opt.step()", optimizer_fix)
        if self.scheduler is not None:
            self._scheduler_guard = Applied(self.scheduler, "sched.step()", scheduler_fix)

    def step_optimizer(self, step: int = -1) -> None:
        """What applying committed step ``step`` does: the optimizer's step, then the
        scheduler's when it is due (every ``scheduler_every`` steps: 1, or an epoch's)."""
        with contextlib.ExitStack() as allowed:
            for g in (self._optimizer_guard, self._scheduler_guard):
                if g is not None:
                    allowed.enter_context(g.allow())
            self.apply_optimizer()
            if self.scheduler is not None and (step + 1) % self.scheduler_every == 0:
                self.scheduler.step()

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.grad = None

    def materialize_grads(self) -> List[torch.Tensor]:
        """Every trainable parameter's gradient, zeros where none was computed."""
        grads = []
        for p in self.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        return grads

    def checksum(self) -> int:
        """A checksum of the parameters (this rank's shard)."""
        return checksum([p.detach() for p in self.model.parameters()])

    # -- the whole state ------------------------------------------------------------------------

    def state_dict(self, committed_step: int) -> Dict[str, Any]:
        out: Dict[str, Any] = {"committed_step": committed_step, "model": self.model.state_dict(),
                               "rng": rng_state()}
        if self.optimizer is not None:
            out["optimizer"] = self.optimizer.state_dict()
        if self.scheduler is not None:
            out["scheduler"] = without_callables(self.scheduler.state_dict())
        if self.extra is not None:
            out["extra"] = self.extra.state_dict() if hasattr(self.extra, "state_dict") else dict(self.extra)
        return out

    def load_state_dict(self, state: Dict[str, Any]) -> int:
        """Loads a tree from :meth:`state_dict`; returns its committed step.

        Raises:
            StateSyncError: the tree holds ZeRO-1 optimizer slices (a job without them would
                lose the optimizer's state).
        """
        if "zero1" in state:
            raise StateSyncError("the state holds ZeRO-1 optimizer slices: load it with "
                                 "TrainerConfig(optimizer_sharding='zero1')")
        self.model.load_state_dict(state["model"])
        if self.optimizer is not None and "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and "scheduler" in state:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.extra is not None and "extra" in state:
            if hasattr(self.extra, "load_state_dict"):
                self.extra.load_state_dict(state["extra"])
            else:
                self.extra.clear()
                self.extra.update(state["extra"])
        if "rng" in state:
            set_rng_state(state["rng"])
        return int(state["committed_step"])

    def to_bytes(self, committed_step: int) -> bytes:
        buffer = io.BytesIO()
        save_tree(self.state_dict(committed_step), buffer)
        return buffer.getvalue()

    def load_bytes(self, data: bytes) -> int:
        return self.load_state_dict(load_tree(io.BytesIO(data)))


# ---------------------------------------------------------------------------------------------
# Moving state between ranks
# ---------------------------------------------------------------------------------------------


def send_state(state: TrainingState, committed_step: int, receivers: Iterable[int],
               device: torch.device, call: Any = None) -> int:
    """Sends the whole state to each receiver (global ranks, default group); returns bytes sent.

    ``call(fn, *args)``, when given, runs the transfer (not the serialisation), so that an abort
    can free the caller (``GroupSockets.call``).

    Raises:
        RuntimeError: a send failed (the caller tells an abort from a fault).
    """
    data = bytearray(state.to_bytes(committed_step))
    receivers = list(receivers)
    if call is not None:
        call(send_payload, data, receivers, device)
    else:
        send_payload(data, receivers, device)
    return len(data)


def send_payload(data: bytearray, receivers: Iterable[int], device: torch.device) -> None:
    """Sends ``data`` (its size, then its bytes) to each receiver."""
    payload = torch.frombuffer(data, dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    size = torch.tensor([len(data)], dtype=torch.int64)
    if device.type != "cpu":
        payload, size = payload.to(device), size.to(device)
    for r in receivers:
        dist.send(size, dst=r)
        if len(data):
            dist.send(payload, dst=r)


def recv_payload(source: int, device: torch.device) -> bytes:
    """Receives what :func:`send_payload` sent from ``source``."""
    size = torch.zeros(1, dtype=torch.int64, device=device)
    dist.recv(size, src=source)
    n = int(size.item())
    payload = torch.empty(n, dtype=torch.uint8, device=device)
    if n:
        dist.recv(payload, src=source)
    return payload.cpu().numpy().tobytes()


def recv_state(state: TrainingState, source: int, device: torch.device, call: Any = None) -> int:
    """Receives the whole state from ``source`` and loads it; returns its committed step.

    ``call(fn, *args)``, when given, runs the transfer (not the loading, which stays on the
    calling thread), so that an abort can free the caller (``GroupSockets.call``).

    Raises:
        RuntimeError: the receive failed.
        StateSyncError: what arrived is not a state.
    """
    data = call(recv_payload, source, device) if call is not None else recv_payload(source, device)
    try:
        return state.load_bytes(data)
    except Exception as e:  # noqa: BLE001 - anything unloadable is a sync error
        raise StateSyncError(f"the state received from rank {source} ({len(data)} bytes) cannot be "
                             f"loaded: {e}") from e


def reduce_gradients(grads: List[torch.Tensor], group: Any, group_size: int, divisor: int,
                     bucket_bytes: int = 32 << 20, wait: Any = None) -> None:
    """Sums gradients over ``group`` and divides them by ``divisor`` (the global batch size).

    Gradients are flattened into buckets of up to ``bucket_bytes`` per dtype and device, one
    all-reduce each. ``wait(work)``, when given, waits for each all-reduce (issued with
    ``async_op=True``), so that an abort can free the caller (``GroupSockets.wait``); the
    buckets are copies, so a collective left behind never writes into the gradients.
    """
    buckets: Dict[Any, List[List[torch.Tensor]]] = {}
    for g in grads:
        key = (g.dtype, g.device)
        lists = buckets.setdefault(key, [[]])
        current = lists[-1]
        if current and sum(t.numel() for t in current) * g.element_size() + g.numel() * g.element_size() > bucket_bytes:
            lists.append([])
            current = lists[-1]
        current.append(g)
    for lists in buckets.values():
        for bucket in lists:
            if not bucket:
                continue
            flat = torch.cat([t.reshape(-1) for t in bucket])
            if group_size > 1 and wait is not None:
                wait(dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group, async_op=True))
            elif group_size > 1:
                dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
            flat.div_(divisor)
            offset = 0
            for t in bucket:
                n = t.numel()
                t.copy_(flat[offset:offset + n].view_as(t))
                offset += n
