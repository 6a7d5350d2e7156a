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

Megatron's distributed optimizer (``--use-distributed-optimizer``: the optimizer's state sharded
over the data-parallel ranks) is Regroup's ZeRO-1 (regroup.zero), which recovers it in place:
:meth:`Adapter.config` sets ``optimizer_sharding="zero1"``. With ``--enable-high-availability``
too, each slice keeps a second copy on the rank half the data-parallel ring away
(``optimizer_copies=2``), as MindSpeed's replica optimizer keeps one, so that a lost rank's
slice comes from its copy instead of the checkpoint; without it a lost slice sends the job to
its newest checkpoint, naming the slice.

Megatron-core's modules keep the process groups they were built with (``self.tp_group``, the
``pg_collection`` of the attention and transformer layers), so a model built once would still
call a generation that ended. :meth:`Adapter.model` builds the script's model in a provisional
world of this rank's own position in its replica (torch's ``fake`` backend: the groups have the
right ranks and sizes and never communicate), and every generation's build then swaps each group
the model holds for the generation's group of the same kind (:func:`rebind`). A rank keeps its
position (tensor-parallel rank, stage) across generations; a plan that moves it is refused.

Megatron-core's tensor-parallel layers and cross-entropy call ``torch.distributed.all_reduce``
themselves, and its pipeline schedule ``torch.distributed.batch_isend_irecv``, and wait for them
in the training thread. On gloo a rank blocked in one when the generation is aborted may never
be woken (gloo's lost wake-up, regroup.abort), and only the abort watchdog's exit 75 and a
restart in place would free it. While the adapter is on, both, on a gloo group of the live
generation, are waited for as Regroup's own collectives are, and leave at once on an abort
(:func:`regroup.abort.leave_torch_collectives_on_abort`); the all-gathers and reduce-scatters
of sequence parallelism, which is refused on the CPU, and unbatched sends and receives
(``batch_p2p_comm=False``) are not covered.

Megatron-core 0.16.1 on a machine without CUDA: :func:`on_cpu` (see its notes: the RNG tracker,
the attention's buffer and the tensors the schedules make on "cuda").

What this does not do: Megatron-LM's ``pretrain()`` loop is not wrapped; the script's loop runs
Regroup's steps (``regroup.Trainer``) around Megatron-core's model and forward-backward
function. See python/README.md, "Megatron-core".
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from regroup.abort import leave_torch_collectives_on_abort, restore_torch_collectives
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


def optimizer_copies(argv: Sequence[str]) -> int:
    """0 without ``--use-distributed-optimizer``; else the copies of each optimizer slice
    Regroup's ZeRO-1 keeps: 2 with ``--enable-high-availability`` (MindSpeed's replica
    optimizer), else 1."""
    if "--use-distributed-optimizer" not in argv:
        return 0
    return 2 if "--enable-high-availability" in argv else 1


def enabled(argv: Sequence[str]) -> bool:
    """Whether the seed's flags ask for elastic training or high availability."""
    return any(arg in FLAGS for arg in argv)


class Adapter:
    """The active adapter: the script's sizes and the builder of parallel_state's groups.

    Attributes:
        tp, pp: the script's tensor- and pipeline-parallel sizes.
        optimizer_copies: 0 without Megatron's distributed optimizer, else the copies of each
            ZeRO-1 slice (:func:`optimizer_copies`).
        generations: how many generations' groups were built.
    """

    def __init__(self, tp: int, pp: int, gloo_groups: Optional[bool] = None, optimizer_copies: int = 0):
        self.tp, self.pp = tp, pp
        self.optimizer_copies = optimizer_copies
        self.gloo_groups = gloo_groups
        self.generations = 0
        self.cpu: Optional["CPU"] = None      # on_cpu(): prepared after every rebuild
        self._model: Any = None               # built by model(): its groups are rebound
        self._position: Optional[int] = None  # the position in its replica it was built for
        self._held: Any = None                # the ProcessGroupCollection it holds now

    def position(self) -> int:
        """This rank's position in its replica (``stage * tp + tp_rank``), from ``$RANK``: the
        ranks of a replica are contiguous (regroup.group), so ``RANK % (tp * pp)``."""
        return int(os.environ.get("RANK", "0")) % (self.tp * self.pp)

    def model(self, factory: Callable[[], Any]) -> Any:
        """Builds the script's model, ``factory()``, for this rank's position, and keeps it: every
        generation rebinds the process groups its modules hold (:func:`rebind`).

        Before the first generation there are no groups: ``factory()`` then runs in a
        provisional world of one replica (``tp * pp`` ranks of torch's ``fake`` backend, which
        never communicates) in which this rank has its position, with parallel_state built on
        it, so Megatron-core's constructors find the tensor-parallel rank and size and the
        pipeline stage they need; the world is destroyed after. Inside a generation, the
        generation's parallel_state is used.

        Raises:
            ConfigError: torch has no ``fake`` backend, or a model was built already (one model
                per script: virtual pipeline stages are refused).
        """
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        if self._model is not None:
            raise ConfigError("regroup.megatron: the adapter keeps one model; it was built already")
        if ps.model_parallel_is_initialized():
            built = factory()
            position = ps.get_pipeline_model_parallel_rank() * self.tp + ps.get_tensor_model_parallel_rank()
            held = _collection()
        else:
            try:
                from torch.testing._internal.distributed.fake_pg import FakeStore  # registers "fake"
            except ImportError as e:
                raise ConfigError("building a Megatron-core model before the first generation needs "
                                  f"torch's fake process group backend (torch 2.x): {e}") from None
            position = self.position()
            dist.init_process_group("fake", store=FakeStore(), rank=position, world_size=self.tp * self.pp)
            try:
                ps.initialize_model_parallel(tensor_model_parallel_size=self.tp,
                                             pipeline_model_parallel_size=self.pp, order=ORDER,
                                             create_gloo_process_groups=False)
                built = factory()
                held = _collection()
            finally:
                ps.destroy_model_parallel()
                dist.destroy_process_group()
        self._model, self._position, self._held = built, position, held
        return built

    def config(self, **kwargs: Any) -> TrainerConfig:
        """A TrainerConfig with the script's sizes and, with ``--use-distributed-optimizer``,
        Regroup's ZeRO-1 (the other fields from ``kwargs``)."""
        for name in ("tensor_parallel", "pipeline_parallel"):
            if name in kwargs:
                raise ConfigError(f"{name} comes from the script's Megatron arguments "
                                  f"(--tensor-model-parallel-size {self.tp}, "
                                  f"--pipeline-model-parallel-size {self.pp}); do not give it")
        if self.optimizer_copies:
            for name in ("optimizer_sharding", "optimizer_copies"):
                if name in kwargs:
                    raise ConfigError(f"{name} comes from the script's Megatron arguments "
                                      "(--use-distributed-optimizer, and --enable-high-availability for "
                                      "a second copy of each slice); do not give it")
            kwargs.update(optimizer_sharding="zero1", optimizer_copies=self.optimizer_copies)
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
        if self._model is not None and layout.position != self._position:
            raise ConfigError(
                f"this rank's model was built for position {self._position} of its replica (stage "
                f"{self._position // self.tp}, tensor-parallel rank {self._position % self.tp}) but "
                f"the generation's plan puts it at position {layout.position}: a Megatron-core model "
                "keeps its shard, so a rank must keep its position")
        ps.destroy_model_parallel()
        gloo = self.gloo_groups if self.gloo_groups is not None else groups.backend != "gloo"
        minutes = max(1, math.ceil(groups.sockets.collective_s / 60)) if groups.sockets.collective_s else 30
        ps.initialize_model_parallel(tensor_model_parallel_size=self.tp,
                                     pipeline_model_parallel_size=self.pp, order=ORDER,
                                     distributed_timeout_minutes=minutes,
                                     create_gloo_process_groups=gloo)
        if self.cpu is not None:
            self.cpu.prepare()
        self.generations += 1
        if self._model is not None:
            current = _collection()
            swapped = rebind(self._model, self._held, current)
            self._held = current
            log.info("regroup: the model's process groups rebound (%d references; this process's "
                     "build %d)", swapped, self.generations)
        log.info("regroup: megatron-core parallel_state rebuilt: tp %d x pp %d x dp %d (%s)",
                 self.tp, self.pp, layout.dp, ORDER)
        return ps

    @staticmethod
    def teardown(groups: ProcessGroups) -> None:
        from megatron.core import parallel_state as ps

        ps.destroy_model_parallel()


def _collection() -> Any:
    """parallel_state's groups now, by kind (Megatron-core's ``ProcessGroupCollection``)."""
    from megatron.core.process_groups_config import ProcessGroupCollection

    return ProcessGroupCollection.use_mpu_process_groups()


def rebind(model: Any, old: Any, new: Any) -> int:
    """Swaps every process group of ``old`` (a ProcessGroupCollection) that ``model``'s modules
    hold, as an attribute (alone, or in a list or tuple) or inside a ProcessGroupCollection, for
    the group of the same kind in ``new``; returns how many references were swapped. Groups kept
    anywhere else (a closure, a nested object) are not found.

    Raises:
        ConfigError: a module holds a process group that ``old`` does not have (the adapter
            cannot tell which of the new groups replaces it).
    """
    import torch.distributed as dist
    from megatron.core.process_groups_config import ProcessGroupCollection

    swap: Dict[int, Any] = {}
    for f in dataclasses.fields(old):
        before, after = getattr(old, f.name, None), getattr(new, f.name, None)
        if isinstance(before, dist.ProcessGroup) and isinstance(after, dist.ProcessGroup):
            swap.setdefault(id(before), after)
    for group in list(swap.values()):  # already the new ones (a second rebind of one collection)
        swap.setdefault(id(group), group)

    def swapped(value: Any, where: str) -> Any:
        if id(value) not in swap:
            raise ConfigError(f"regroup.megatron: {where} holds a process group that parallel_state "
                              "did not make: it cannot be rebuilt for the next generation")
        return swap[id(value)]

    count, done = 0, set()
    for path, module in model.named_modules():
        for name, value in list(vars(module).items()):
            where = f"{path or type(model).__name__}.{name}"
            if isinstance(value, dist.ProcessGroup):
                new_value = swapped(value, where)
                count += new_value is not value
                module.__dict__[name] = new_value
            elif isinstance(value, (list, tuple)) and any(isinstance(v, dist.ProcessGroup) for v in value):
                new_values = [swapped(v, f"{where}[{i}]") if isinstance(v, dist.ProcessGroup) else v
                              for i, v in enumerate(value)]
                count += sum(a is not b for a, b in zip(value, new_values))
                module.__dict__[name] = type(value)(new_values)
            elif isinstance(value, ProcessGroupCollection) and id(value) not in done:
                done.add(id(value))
                for f in dataclasses.fields(value):
                    group = getattr(value, f.name, None)
                    if isinstance(group, dist.ProcessGroup):
                        new_value = swapped(group, f"{where}.{f.name}")
                        count += new_value is not group
                        setattr(value, f.name, new_value)
    return count


def _cuda_to_cpu() -> Any:
    """A TorchFunctionMode (torch.overrides) in which a tensor asked for on "cuda" (a factory's
    ``device=``, ``Tensor.to``, ``Tensor.cuda``) is made on the CPU instead."""
    import torch
    from torch.overrides import TorchFunctionMode

    def cpu(device: Any) -> Any:
        if isinstance(device, (str, torch.device)) and torch.device(device).type == "cuda":
            return torch.device("cpu")
        if isinstance(device, int) and not isinstance(device, bool):
            return torch.device("cpu")  # a bare index names a CUDA device
        return device

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = dict(kwargs or {})
            if func is torch.Tensor.cuda:
                return args[0]
            if "device" in kwargs:
                kwargs["device"] = cpu(kwargs["device"])
            if func is torch.Tensor.to and len(args) > 1 and not isinstance(args[1], (torch.dtype, torch.Tensor)):
                args = (args[0], cpu(args[1]), *args[2:])
            return func(*args, **kwargs)

    return Mode()


@dataclasses.dataclass
class CPU:
    """What Megatron-core 0.16.1 needs to train on a machine without CUDA (made by
    :func:`on_cpu`). Three places ask CUDA for a device whatever the model's configuration
    (``use_cpu_initialization=True``, the local spec, no fusions):

    1. the RNG tracker (``tensor_parallel.random``): attention's dropout runs in
       ``get_cuda_rng_tracker().fork()``, which reads and sets the CUDA generator's state.
       :meth:`prepare` makes the tracker Megatron-core has for inference
       (``initialize_rng_tracker(inference_rng_tracker=True)``), whose ``fork()`` does nothing:
       dropout then draws from torch's CPU generator, not from a per-tensor-parallel-rank state
       (keep dropout 0, as the example does, for results independent of the layout);
    2. ``GlobalMemoryBuffer.get_tensor`` allocates attention's scores at
       ``torch.cuda.current_device()``: :meth:`prepare` puts a CPU tensor of the largest size
       attention asks for into the buffer (its own ``buffer`` dict), so it never allocates;
    3. tensors made on "cuda" by name: the schedules' token count
       (``forward_backward_no_pipelining``: ``torch.zeros(..., device="cuda")``) and the default
       causal mask: inside ``with cpu:`` a TorchFunctionMode (``torch.overrides``) makes them on
       the CPU;
    4. the pipeline schedule's receive buffers, made at ``torch.cuda.current_device()``, and
       its ``torch.cuda.synchronize()`` after the batched sends and receives: inside ``with
       cpu:`` torch's ``torch.cuda.current_device`` answers 0 (a device index the mode above
       makes the CPU) and ``torch.cuda.synchronize`` does nothing, and both are torch's again
       when the block ends. Nothing of Megatron-core's is edited or patched.

    Attributes:
        attention_elements: micro-batch x heads per tensor-parallel rank x sequence^2.
        dtype: the model's parameter dtype (attention's scores are in it).
    """

    attention_elements: int
    dtype: Any

    def __post_init__(self) -> None:
        self._modes: List[Any] = []

    def prepare(self) -> None:
        """After every ``initialize_model_parallel`` (the adapter calls it on every rebuild)."""
        import torch
        from megatron.core import parallel_state as ps
        from megatron.core.tensor_parallel import random as megatron_random

        megatron_random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
        ps.get_global_memory_buffer().buffer[("mpu", self.dtype)] = torch.empty(
            self.attention_elements, dtype=self.dtype)

    def __enter__(self) -> "CPU":
        import torch

        mode = _cuda_to_cpu()
        mode.__enter__()
        self._modes.append((mode, torch.cuda.current_device, torch.cuda.synchronize))
        torch.cuda.current_device = _no_cuda_device
        torch.cuda.synchronize = _no_cuda_sync
        return self

    def __exit__(self, *exc: Any) -> None:
        import torch

        mode, torch.cuda.current_device, torch.cuda.synchronize = self._modes.pop()
        mode.__exit__(*exc)


def _no_cuda_device() -> int:
    return 0   # inside ``with cpu:``, a device index is the CPU (_cuda_to_cpu)


def _no_cuda_sync(device: Any = None) -> None:
    return None


def on_cpu(config: Any, micro_batch_size: int, seq_length: int) -> CPU:
    """Megatron-core 0.16.1 on a machine without CUDA, for a model of ``config`` (a
    TransformerConfig) run on micro-batches of ``micro_batch_size`` sequences of ``seq_length``
    tokens: see :class:`CPU`. Run Megatron-core's forward-backward function inside
    ``with cpu:``. With the adapter active, every rebuild prepares it; otherwise it is prepared
    now when parallel_state is built (the script without Regroup).

    Raises:
        ConfigError: sequence parallelism (megatron-core allocates its buffers on CUDA).
    """
    if getattr(config, "sequence_parallel", False):
        raise ConfigError("on_cpu: sequence parallelism allocates its buffers on CUDA; turn it off")
    heads = config.num_attention_heads // max(1, config.tensor_model_parallel_size)
    cpu = CPU(micro_batch_size * heads * seq_length * seq_length, config.params_dtype)
    if _active is not None:
        _active.cpu = cpu
    from megatron.core import parallel_state as ps

    if ps.model_parallel_is_initialized():
        cpu.prepare()
    return cpu


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
    adapter = Adapter(tp, pp, gloo_groups, optimizer_copies(argv))
    on_build("megatron", adapter.build, adapter.teardown)
    # Megatron-core's tensor-parallel all-reduces and pipeline sends and receives are torch's,
    # waited for in the training thread: on gloo they now leave on an abort as Regroup's own do.
    leave_torch_collectives_on_abort()
    _active = adapter
    log.info("regroup: Megatron-core adapter on (tp %d, pp %d%s)", tp, pp,
             f", distributed optimizer: ZeRO-1 with {adapter.optimizer_copies} "
             f"cop{'ies' if adapter.optimizer_copies > 1 else 'y'} of each slice" if adapter.optimizer_copies else "")
    return adapter


def deactivate() -> None:
    """Turns the adapter off (tests)."""
    global _active
    remove_builder("megatron")
    restore_torch_collectives()
    _active = None


def active() -> Optional[Adapter]:
    return _active
