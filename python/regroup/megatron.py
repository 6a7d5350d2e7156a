# SPDX-License-Identifier: Apache-2.0
"""A Megatron-core adapter: ``megatron.core.parallel_state`` rebuilt for every generation.

A Megatron-core script builds its parallel groups once, with
``parallel_state.initialize_model_parallel``, and every layer finds them there
(``get_tensor_model_parallel_group()``, ...). Under Regroup each generation has a new world (after
a scale-in, fewer ranks, renumbered), a new store and a new default group, so those groups are
rebuilt too: once Regroup has formed the generation's own groups, :func:`activate`'s builder
calls ``destroy_model_parallel()`` then ``initialize_model_parallel(tp, pp,
order="tp-cp-ep-pp-dp")`` on the new default group, inside the window whose sockets an abort
shuts down (``regroup.group.on_build``); when the generation ends, ``destroy_model_parallel()``
runs before Regroup destroys the groups. The order is Regroup's grid, tp fastest, then pipeline
stages, then replicas (``regroup.group``), which Megatron-core supports beside its default
``tp-cp-ep-dp-pp``: a replica is then a contiguous block of ranks that lines up with pods, so
parallel_state's tensor-, pipeline- and data-parallel groups are Regroup's own.

Activation follows the seed's flags: with ``--enable-elastic-training`` or
``--enable-high-availability`` on the script's command line :func:`activate` registers the
builder and returns the :class:`Adapter`; without them it returns None and changes nothing. The
parallel sizes are read once, from the script's own arguments (``--tensor-model-parallel-size``,
``--pipeline-model-parallel-size``, 1 when absent); :meth:`Adapter.config` makes the
``TrainerConfig`` with them, so the manager's plan (the job's ``regroup.io/tensor-parallel`` and
``regroup.io/pipeline-parallel``) must agree, and a disagreement is refused naming both
(:meth:`Adapter.check`, also run on every generation). A script's flags this adapter cannot keep
(context or expert parallelism, virtual pipeline stages) are refused by name.

What this does not do: Megatron-LM's ``pretrain()`` loop is not wrapped; the script's loop runs
Regroup's steps (``regroup.Trainer``) around Megatron-core's model and forward-backward
function. See python/README.md, "Megatron-core".
"""

from __future__ import annotations

import logging
import math
import sys
from typing import Any, List, Optional, Sequence, Tuple

from regroup.api import ConfigError, TrainerConfig
from regroup.group import ProcessGroups, on_build, remove_builder

log = logging.getLogger("regroup")

FLAGS = ("--enable-elastic-training", "--enable-high-availability")
ORDER = "tp-cp-ep-pp-dp"   # Regroup's grid (regroup.group): tp fastest, then stages, then replicas
_UNSUPPORTED = ("--context-parallel-size", "--expert-model-parallel-size",
                "--virtual-pipeline-model-parallel-size", "--num-layers-per-virtual-pipeline-stage")


def _flag_value(argv: Sequence[str], flag: str) -> Optional[str]:
    """The value of ``flag`` (``--flag V`` or ``--flag=V``; the last one wins), None when absent."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag:
            if i + 1 >= len(argv):
                raise ConfigError(f"{flag} needs a value")
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1:]
    return value


def _size(argv: Sequence[str], flag: str) -> int:
    value = _flag_value(argv, flag)
    if value is None:
        return 1
    try:
        size = int(value)
    except ValueError:
        raise ConfigError(f"{flag} {value!r} is not a whole number") from None
    if size < 1:
        raise ConfigError(f"{flag} {size} must be at least 1")
    return size


def parse_sizes(argv: Sequence[str]) -> Tuple[int, int]:
    """(tensor, pipeline) parallel sizes from a Megatron script's arguments.

    Raises:
        ConfigError: a size is not a positive whole number, or the script asks for a kind of
            parallelism the adapter does not rebuild.
    """
    for flag in _UNSUPPORTED:
        value = _flag_value(argv, flag)
        if value is not None and value not in ("1", "None"):
            raise ConfigError(f"{flag} {value}: the Regroup adapter rebuilds tensor, pipeline and "
                              "data parallel groups only (docs/design.md, \"What is not supported (yet)\")")
    return _size(argv, "--tensor-model-parallel-size"), _size(argv, "--pipeline-model-parallel-size")


def enabled(argv: Sequence[str]) -> bool:
    """Whether the seed's flags ask for elastic training or high availability."""
    return any(arg in FLAGS for arg in argv)


class Adapter:
    """The active adapter: the script's sizes and the builder of parallel_state's groups.

    Attributes:
        tp, pp: the script's tensor- and pipeline-parallel sizes.
        generations: how many generations' groups were built.
    """

    def __init__(self, tp: int, pp: int, gloo_groups: Optional[bool] = None):
        self.tp, self.pp = tp, pp
        self.gloo_groups = gloo_groups
        self.generations = 0

    def config(self, **kwargs: Any) -> TrainerConfig:
        """A TrainerConfig with the script's sizes (the other fields from ``kwargs``)."""
        for name in ("tensor_parallel", "pipeline_parallel"):
            if name in kwargs:
                raise ConfigError(f"{name} comes from the script's Megatron arguments "
                                  f"(--tensor-model-parallel-size {self.tp}, "
                                  f"--pipeline-model-parallel-size {self.pp}); do not give it")
        return TrainerConfig(tensor_parallel=self.tp, pipeline_parallel=self.pp, **kwargs)

    def check(self, job_tp: int, job_pp: int) -> None:
        """Refuses a job whose sizes (its plan: ``regroup.io/tensor-parallel`` and
        ``regroup.io/pipeline-parallel``) disagree with the script's, naming both."""
        if (max(1, job_tp), max(1, job_pp)) != (self.tp, self.pp):
            raise ConfigError(
                f"the job has regroup.io/tensor-parallel={job_tp} and regroup.io/pipeline-parallel="
                f"{job_pp} but the script has --tensor-model-parallel-size {self.tp} and "
                f"--pipeline-model-parallel-size {self.pp}: give the job the script's sizes "
                "(absent annotations mean 1)")

    def build(self, groups: ProcessGroups) -> Any:
        """Rebuilds parallel_state on the generation's default group; returns the module."""
        from megatron.core import parallel_state as ps

        layout = groups.layout
        self.check(layout.tp, layout.pp)
        ps.destroy_model_parallel()
        gloo = self.gloo_groups if self.gloo_groups is not None else groups.backend != "gloo"
        minutes = max(1, math.ceil(groups.sockets.collective_s / 60)) if groups.sockets.collective_s else 30
        ps.initialize_model_parallel(tensor_model_parallel_size=self.tp,
                                     pipeline_model_parallel_size=self.pp, order=ORDER,
                                     distributed_timeout_minutes=minutes,
                                     create_gloo_process_groups=gloo)
        self.generations += 1
        log.info("regroup: megatron-core parallel_state rebuilt: tp %d x pp %d x dp %d (%s)",
                 self.tp, self.pp, layout.dp, ORDER)
        return ps

    @staticmethod
    def teardown(groups: ProcessGroups) -> None:
        from megatron.core import parallel_state as ps

        ps.destroy_model_parallel()


_active: Optional[Adapter] = None


def activate(argv: Optional[List[str]] = None, gloo_groups: Optional[bool] = None) -> Optional[Adapter]:
    """Turns the adapter on when the script's arguments carry the seed's flags.

    Args:
        argv: the script's arguments (``sys.argv[1:]`` when None).
        gloo_groups: build Megatron's gloo groups too (default: unless the backend is gloo).

    Returns:
        The adapter, or None when neither ``--enable-elastic-training`` nor
        ``--enable-high-availability`` is given (nothing is changed).

    Raises:
        ConfigError: bad sizes, an unsupported kind of parallelism, or no megatron-core.
    """
    global _active
    argv = list(sys.argv[1:] if argv is None else argv)
    if not enabled(argv):
        return None
    tp, pp = parse_sizes(argv)
    try:
        import importlib
        importlib.import_module("megatron.core.parallel_state")
    except ImportError as e:
        raise ConfigError(f"{' / '.join(FLAGS)} asks for Regroup's Megatron-core adapter, but "
                          f"megatron.core cannot be imported: {e}") from None
    adapter = Adapter(tp, pp, gloo_groups)
    on_build("megatron", adapter.build, adapter.teardown)
    _active = adapter
    log.info("regroup: Megatron-core adapter on (tp %d, pp %d)", tp, pp)
    return adapter


def deactivate() -> None:
    """Turns the adapter off (tests)."""
    global _active
    remove_builder("megatron")
    _active = None


def active() -> Optional[Adapter]:
    return _active
