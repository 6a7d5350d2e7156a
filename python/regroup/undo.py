# SPDX-License-Identifier: Apache-2.0
"""The undo of an applied step whose vote is still in flight (the vote off the critical path).

A rank applies step ``s`` as soon as it voted for it and computes ``s + 1`` while the vote
travels; until the outcome comes it keeps, here, what applying ``s`` changed: the trainable
parameters, the optimizer's state (every tensor and value of ``optimizer.state``) and
hyper-parameters (``param_groups`` without their parameters), and the LR scheduler's state,
copied just before the apply. Restoring copies them back into the same tensors, bit for bit,
so the DDP wrapper and the optimizer keep their references. Buffers and random generators are
the step snapshot's (regroup.state.Snapshot), taken at the step's start.

The copies live where the state lives (a GPU model's on the GPU) in buffers kept from step to
step: at most one vote is in flight, so one set is enough, and no step allocates. What it holds
is :meth:`Undo.nbytes` (for Adam about three times the parameters: them and the two moments).
"""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Optional, Tuple

import torch

from regroup.state import as_param_shard, local_tensor, without_callables


class Undo:
    """A reusable copy of what applying one step changes."""

    def __init__(self) -> None:
        self._params: List[Tuple[torch.Tensor, torch.Tensor]] = []
        self._buffers: Dict[Tuple[int, Any], torch.Tensor] = {}
        # id(parameter) -> its optimizer state: (key, copy or value, whether a tensor)
        self._opt: Dict[int, List[Tuple[Any, Any, bool]]] = {}
        self._hyper: List[Dict[str, Any]] = []
        self._scheduler: Optional[Dict[str, Any]] = None
        self._state: Any = None          # the state's own (regroup.zero: its optimizer slices)
        self.held = False

    def _copy(self, key: Tuple[int, Any], value: torch.Tensor) -> torch.Tensor:
        buf = self._buffers.get(key)
        if buf is None or buf.shape != value.shape or buf.dtype != value.dtype or buf.device != value.device:
            buf = self._buffers[key] = torch.empty_like(value, memory_format=torch.preserve_format)
        buf.copy_(value)
        return buf

    def take(self, state: Any) -> None:
        """Copies what applying a step will change (``state``: a regroup.state.TrainingState)."""
        with torch.no_grad():
            # A DTensor (a tensor-parallel or FSDP2 parameter, its optimizer state) is copied by
            # its local shard: no collective, and nothing tied to the generation's mesh is kept.
            used = set()
            self._params = []
            for p in state.parameters():
                used.add((id(p), None))
                self._params.append((p, self._copy((id(p), None), local_tensor(p.detach()))))
            self._opt = {}
            self._hyper = []
            opt = state.optimizer
            if opt is not None:
                for p, st in opt.state.items():
                    saved = []
                    for k, v in st.items():
                        if isinstance(v, torch.Tensor):
                            used.add((id(p), k))
                            saved.append((k, self._copy((id(p), k), local_tensor(v.detach())), True))
                        else:
                            saved.append((k, copy.deepcopy(v), False))
                    self._opt[id(p)] = saved
                self._hyper = [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"}
                               for g in opt.param_groups]
            # The copies of tensors gone with an earlier generation's module are let go.
            for key in [key for key in self._buffers if key not in used]:
                del self._buffers[key]
        sched = getattr(state, "scheduler", None)
        self._scheduler = copy.deepcopy(without_callables(sched.state_dict())) if sched is not None else None
        self._state = state.undo_take()
        self.held = True

    def restore(self, state: Any) -> None:
        """Puts back what :meth:`take` copied (the step's apply is undone, exactly)."""
        if not self.held:
            raise RuntimeError("no undo is held")
        with torch.no_grad():
            for p, buf in self._params:
                local_tensor(p).copy_(buf)
            opt = state.optimizer
            if opt is not None:
                for p in list(opt.state):
                    saved = self._opt.get(id(p))
                    if saved is None:
                        del opt.state[p]  # no state before the step (its first apply)
                        continue
                    st = opt.state[p]
                    for k in [k for k in st if k not in {s[0] for s in saved}]:
                        del st[k]
                    for k, v, tensor in saved:
                        now = st.get(k)
                        local = local_tensor(now) if isinstance(now, torch.Tensor) else None
                        if tensor and local is not None and local.shape == v.shape \
                                and local.dtype == v.dtype and local.device == v.device:
                            local.copy_(v)
                        else:
                            st[k] = as_param_shard(v.clone(), p) if tensor else copy.deepcopy(v)
                for g, h in zip(opt.param_groups, self._hyper):
                    g.update(copy.deepcopy(h))
        sched = getattr(state, "scheduler", None)
        if sched is not None and self._scheduler is not None:
            sched.load_state_dict(copy.deepcopy(self._scheduler))
        state.undo_restore(self._state)
        self._state = None
        self.held = False

    def drop(self) -> None:
        """The step was committed: nothing to undo (the buffers are kept for the next step)."""
        self._state = None
        self.held = False

    def nbytes(self) -> Dict[str, int]:
        """Bytes held by the copies, by device type (``{"cpu": n}``, ``{"cuda": n}``)."""
        out: Dict[str, int] = {}
        for buf in self._buffers.values():
            out[buf.device.type] = out.get(buf.device.type, 0) + buf.numel() * buf.element_size()
        return out
