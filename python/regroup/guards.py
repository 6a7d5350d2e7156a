# SPDX-License-Identifier: Apache-2.0
"""Mistakes a script can make under the step contract, caught where they happen with the fix.

- ``opt.step()`` or ``sched.step()`` called by the script while the trainer applies them on
  commit (:class:`Applied`): the step would be applied twice (a NaN, or a schedule run ahead).
- A mean loss where the contract sums over the samples (:func:`loss_reduction`): the gradients
  would be divided by the batch twice (training at ``1/m`` of the learning rate).
- A model wrapper or a process group kept from a generation that ended (:func:`retire_model`,
  :func:`retire_groups`, :func:`check_group`): its group is gone, and so is its place in the job.
"""

from __future__ import annotations

import threading
import types
import weakref
from typing import Any, Optional

from regroup.api import UsageError

_REDUCTIONS = {1: "mean", 2: "sum"}   # torch's loss functions save reduction as this enum


class Applied:
    """Lets an object's ``step`` run only inside :meth:`allow` (the trainer applying a commit).

    Args:
        obj: the optimizer or scheduler whose ``step`` is guarded (its bound ``step`` is
            replaced by one that checks first, as torch's schedulers replace the optimizer's).
        what: how the error names it ("opt.step()").
        fix: what the script should do instead.
    """

    def __init__(self, obj: Any, what: str, fix: str):
        self._local = threading.local()
        real = obj.step

        def step(_obj: Any, *args: Any, **kwargs: Any) -> Any:
            if not getattr(self._local, "allowed", False):
                raise UsageError(f"{what} was called by the script: {fix}")
            return real(*args, **kwargs)

        keep_scheduler_marks(real, step)
        obj.step = types.MethodType(step, obj)

    def allow(self) -> "_Allowed":
        return _Allowed(self._local)


class _Allowed:
    def __init__(self, local: threading.local):
        self._local = local

    def __enter__(self) -> None:
        self._local.allowed = True

    def __exit__(self, *exc: Any) -> None:
        self._local.allowed = False


def keep_scheduler_marks(real: Any, replacement: Any) -> None:
    """Carries over the marks torch's LR schedulers put on the optimizer's ``step`` they wrapped
    (1.13: ``_with_counter``; 2.x: ``_wrapped_by_lr_sched``), so they do not warn that it was
    replaced behind their back."""
    for mark in ("_with_counter", "_wrapped_by_lr_sched"):
        if hasattr(real, mark):
            setattr(replacement, mark, getattr(real, mark))


def loss_reduction(loss: Any) -> Optional[str]:
    """"mean" or "sum" when the loss's last operations say (torch's loss functions, ``.mean()``,
    ``.sum()``, through scaling by constants), else None."""
    node = getattr(loss, "grad_fn", None)
    for _ in range(4):
        if node is None:
            return None
        saved = getattr(node, "_saved_reduction", None)
        if saved in _REDUCTIONS:
            return _REDUCTIONS[saved]
        name = type(node).__name__
        if name.startswith("MeanBackward"):
            return "mean"
        if name.startswith("SumBackward"):
            return "sum"
        if not name.startswith(("MulBackward", "DivBackward")):
            return None
        node = node.next_functions[0][0] if node.next_functions else None
    return None


def check_sum_loss(loss: Any, step: int) -> None:
    """Raises UsageError when ``loss`` is visibly a mean (the step contract sums it)."""
    if loss_reduction(loss) == "mean":
        raise UsageError(f"step {step}: the loss is a mean over its batch, but the step contract sums "
                         "it over the samples and divides the reduced gradients by the global batch: "
                         "use reduction=\"sum\" (e.g. F.mse_loss(out, y, reduction=\"sum\") sums over "
                         "every element; divide by the elements per sample to keep a per-sample mean), "
                         "or adopt the drop-in (regroup.DDP and regroup.DataLoader), which keeps the "
                         "mean loss")


def retire_model(model: Any, generation: int) -> None:
    """Makes a wrapper of a generation that ended refuse to run."""

    def refuse(module: Any, inputs: Any) -> None:
        raise UsageError(f"the model wrapper of generation {generation} was used after the generation "
                         "ended: fetch step.model every step instead of keeping it")

    model.register_forward_pre_hook(refuse)


_ended: "weakref.WeakSet[Any]" = weakref.WeakSet()


def retire_groups(*groups: Any) -> None:
    """Notes process groups of a generation that ended."""
    for g in groups:
        if g is not None:
            try:
                _ended.add(g)
            except TypeError:
                pass  # not weakly referenceable: not checked


def check_group(group: Any) -> None:
    """Raises UsageError when ``group`` belongs to a generation that ended."""
    if group is not None and group in _ended:
        raise UsageError("a process group of a generation that ended was used: fetch "
                         "step.generation.tp_group / dp_group every step instead of keeping them")
