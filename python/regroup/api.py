# SPDX-License-Identifier: Apache-2.0
"""Public types of the Regroup trainer library: configuration, timeouts, errors, stop modes.

Everything a training script names comes from here (or from ``regroup`` itself, which re-exports
it). The classes that run training live in ``regroup.trainer`` (``Trainer``) and
``regroup.step`` (``Step``, ``MicroBatch``, ``Generation``).

Errors form one hierarchy under :class:`RegroupError`:

* :class:`ConfigError`: a configuration, timeout or plan that cannot work (also a ``ValueError``).
* :class:`UsageError`: the library was called the wrong way (a step not committed, ...).
* :class:`AgentError`: the link to ``regroup-agent`` failed (:class:`AgentConnectionError`) or it
  sent something that is not the protocol (:class:`ProtocolError`).
* :class:`StepFailed`: the step in flight cannot be committed and will be done again:
  :class:`GenerationAborted`, :class:`StepRolledBack`, :class:`CollectiveFailed`. Raised inside a
  step and absorbed by ``with step:``; a script never needs to catch these.
* :class:`TrainingStopped`: the manager stopped training (StopTraining EXIT, or any stop when
  ``exit_on_stop`` is off); raised out of ``Trainer.steps()``.
* :class:`StateSyncError`, :class:`CheckpointError`: state could not be moved or stored;
  :class:`StateLost`: part of it is held by no rank (only a checkpoint has it).

It also holds ``init_manager`` / ``start_manager`` (and MindCluster's names for them,
``init_taskd_manager`` / ``start_taskd_manager``), which run the ``regroup-manager`` binary, so a
``manager.py`` written for MindCluster needs only its import line changed.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

__all__ = [
    "AgentConnectionError",
    "AgentError",
    "CheckpointError",
    "CollectiveFailed",
    "ConfigError",
    "EXIT_ABORT_STUCK",
    "GenerationAborted",
    "ProtocolError",
    "RegroupError",
    "StateLost",
    "StateSyncError",
    "StepFailed",
    "StepRolledBack",
    "StopMode",
    "Timeouts",
    "TrainerConfig",
    "TrainingStopped",
    "UsageError",
    "find_binary",
    "init_manager",
    "init_taskd_manager",
    "start_manager",
    "start_taskd_manager",
]

# Exit codes the library itself uses (documented for the agent and for operators).
EXIT_ABORT_STUCK = 75
"""The training thread did not leave its step within ``Timeouts.abort_exit`` of an abort: the
process exits with this code (EX_TEMPFAIL) so that its agent restarts it in place."""


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


class RegroupError(Exception):
    """Base class of every error the library raises."""


class ConfigError(RegroupError, ValueError):
    """A configuration, a timeout or a generation plan the library cannot work with."""


class UsageError(RegroupError):
    """The library was used the wrong way, e.g. a step left without being committed."""


class AgentError(RegroupError):
    """The link to the pod's ``regroup-agent`` failed."""


class AgentConnectionError(AgentError):
    """The agent's socket could not be reached, or the connection broke."""


class ProtocolError(AgentError):
    """The agent sent something that is not the protocol (a bad frame or message)."""


class StepFailed(RegroupError):
    """The step in flight cannot be committed; it will be done again.

    Raised inside a step (by the library's collectives, ``Trainer.commit`` and the micro-batch
    iterator) and absorbed by the step's ``with`` block, which restores the step-start state.

    Attributes:
        step: the step that failed.
        reason: what happened, for logs.
    """

    def __init__(self, step: int, reason: str):
        super().__init__(f"step {step} failed: {reason}")
        self.step = step
        self.reason = reason


class GenerationAborted(StepFailed):
    """The manager aborted the generation; the step is done again in the next one."""

    def __init__(self, step: int, generation: int, reason: str):
        super().__init__(step, f"generation {generation} aborted: {reason}")
        self.generation = generation


class StepRolledBack(StepFailed):
    """The manager did not commit the step (a rank voted not ok, or checksums differ)."""

    def __init__(self, step: int, checksum_mismatch: bool):
        why = "replicas' parameter checksums differ" if checksum_mismatch else "not every rank could commit"
        super().__init__(step, f"rolled back: {why}")
        self.checksum_mismatch = checksum_mismatch


class CollectiveFailed(StepFailed):
    """A collective raised without an abort from the manager; reported as a fault."""


class StateSyncError(RegroupError):
    """Model, optimizer or RNG state could not be received from, or sent to, a peer."""


class StateLost(StateSyncError):
    """Part of the committed state is held by no rank of the generation (an optimizer slice
    without its second copy, a position no replica holds): only a checkpoint has it. The rank
    reports a ``state_lost`` fault, which takes the job to its newest checkpoint."""


class CheckpointError(RegroupError):
    """A checkpoint could not be written or read."""


class StopMode(enum.Enum):
    """How the manager asked training to stop (StopTraining.Mode)."""

    EXIT = 1  # stop with the reason: the process exits non-zero
    DUMP = 2  # write a checkpoint of the committed state, then exit 0
    STANDBY = 3  # stay alive without a rank until the next generation
    LEAVE = 4  # a planned departure at the step boundary: exit 0


class TrainingStopped(RegroupError):
    """The manager stopped training.

    Attributes:
        mode: the stop mode.
        reason: the manager's reason.
        exit_code: the code the process should exit with (0 for DUMP and LEAVE).
    """

    def __init__(self, mode: StopMode, reason: str):
        super().__init__(f"training stopped by the manager ({mode.name.lower()}): {reason}")
        self.mode = mode
        self.reason = reason
        self.exit_code = 0 if mode in (StopMode.DUMP, StopMode.LEAVE) else 1


# ---------------------------------------------------------------------------------------------
# Timeouts and configuration
# ---------------------------------------------------------------------------------------------


def _check_seconds(name: str, value: Optional[float], allow_none: bool) -> None:
    if value is None:
        if allow_none:
            return
        raise ConfigError(f"timeout {name} is None: give a positive number of seconds")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"timeout {name}={value!r} is not a number of seconds")
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"timeout {name}={value!r} must be a positive, finite number of seconds")


@dataclasses.dataclass(frozen=True)
class Timeouts:
    """How long the library waits for each thing, in seconds. Validated on construction.

    Attributes:
        heartbeat: interval of the heartbeats to the agent (the manager's liveness check counts
            them; keep it at the job's ``regroup.io/heartbeat-interval-ms``).
        connect: how long to wait for the agent's socket to accept the connection.
        rendezvous: how long forming a generation's process groups may take (store and groups).
            With torch 2.x it also bounds a rank waiting there for a peer that died while the
            groups were built (no abort reaches that wait; ``regroup.group.formation_is_bounded``);
            keep it below the job's hang timeout floor (``regroup.io/hang-timeout-min-s``, 30 s).
        collective: the backstop of every collective (gloo/NCCL timeout); above any legitimately
            slow step, like ``regroup.io/collective-timeout-s``.
        abort_exit: after an abort, how long the training thread may take to leave its step
            before the process exits with ``EXIT_ABORT_STUCK`` (its agent restarts it in place).
        abort_grace: after a collective fails without an abort, how long to wait for the
            manager's abort before reporting the failure as a fault.
        outcome: how long to wait for a step's outcome after voting; None waits as long as the
            agent is connected (the manager aborts a generation that cannot finish a vote).
        start: how long to wait for the next generation; None waits as long as the agent is
            connected (a Pause's own timeout still applies).
        checkpoint: how long a checkpoint's background write may take before the next one (or
            the end of training) gives up waiting for it.
    """

    heartbeat: float = 0.1
    connect: float = 30.0
    rendezvous: float = 20.0
    collective: float = 600.0
    abort_exit: float = 10.0
    abort_grace: float = 0.5
    outcome: Optional[float] = None
    start: Optional[float] = None
    checkpoint: float = 600.0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            _check_seconds(field.name, getattr(self, field.name), field.name in ("outcome", "start"))
        if self.heartbeat > 10:
            raise ConfigError(f"timeout heartbeat={self.heartbeat} s is above 10 s: the manager would "
                              "declare the rank lost; use the job's heartbeat interval (0.1 s)")
        if self.abort_grace >= self.collective:
            raise ConfigError(f"timeout abort_grace={self.abort_grace} must be below "
                              f"collective={self.collective}")


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    """What the library needs to know about a training script. Validated on construction.

    The step contract (docs/design.md): step ``s`` of epoch ``e = s // steps_per_epoch`` is
    ``microbatches_per_step`` micro-batches of ``micro_batch_size`` global sample indices, taken
    in order from epoch ``e``'s permutation of ``range(dataset_size)``; the global batch is
    ``microbatches_per_step * micro_batch_size`` samples and never changes with the number of
    replicas.

    Attributes:
        dataset_size: samples in the dataset (indices ``0 .. dataset_size - 1``).
        micro_batch_size: samples per micro-batch.
        microbatches_per_step: micro-batches per step over all replicas. When the job sets
            ``regroup.io/global-batch-size`` and ``micro-batch-size`` the manager's count must
            equal this one.
        seed: the seed of the permutations and of the per-micro-batch random numbers.
        tensor_parallel: with ``pipeline_parallel`` None (the default, as before it existed):
            ranks per data-parallel replica (``regroup.io/tensor-parallel`` times
            ``pipeline-parallel``), one tensor-parallel group of the whole replica. With
            ``pipeline_parallel`` given: the tensor-parallel size alone. The manager's plan must
            agree.
        pipeline_parallel: pipeline stages per replica (``regroup.io/pipeline-parallel``): the
            generation builds tensor-, pipeline-, model- and data-parallel groups of the
            dp x tp x pp grid (regroup.group), and the plan's tensor and pipeline sizes must each
            equal the script's. None: the whole-replica meaning of ``tensor_parallel`` above.
        shuffle: permute samples each epoch (False: identity order, for tests).
        checksum_interval: compare a parameter checksum across replicas every this many steps
            (0: never). Keep it equal to ``regroup.io/checksum-interval``.
        checkpoint_dir: where checkpoints go (None: no checkpoints; a fresh start then begins
            at step 0).
        checkpoint_interval: write a checkpoint after every this many committed steps (0: only
            on a DUMP).
        keep_checkpoints: complete checkpoints kept; older ones are removed (0: keep all).
        ddp: wrap the model in DistributedDataParallel (sum hook, ``broadcast_buffers=False``),
            built after each state sync.
        backend: any backend torch.distributed knows ("gloo", "nccl", "hccl" with torch_npu, a
            registered one; checked when the trainer starts), or None for NCCL when CUDA is
            available, else gloo. gloo and NCCL collectives in flight are aborted at once; a
            backend without an abort (regroup.group.ABORTS) waits for the collective timeout.
        exit_on_stop: on DUMP and LEAVE, exit the process with code 0 (False: raise
            TrainingStopped from ``steps()`` instead).
        scheduler_interval: when the trainer steps the LR scheduler: "step" (after every
            committed step) or "epoch" (after an epoch's last step). The script never steps it.
        sharding: None (every replica holds the whole model), or "hsdp": the model is sharded
            with FSDP2 over each replica's ``tensor_parallel`` ranks and replicated across the
            replicas (regroup.sharded; torch >= 2.6).
        optimizer_sharding: None (every replica holds the whole optimizer state), or "zero1": a
            distributed optimizer; each data-parallel rank keeps the state of one contiguous
            slice of the flattened parameters, steps it, and the new parameters are all-gathered
            (regroup.zero). On a tp x pp grid every position (a tensor-parallel rank of a
            pipeline stage) slices its own local parameters (a hand-split shard, a stage) over
            its data-parallel group: the ranks at that position in every replica. Needs an
            elementwise optimizer (SGD, Adam, AdamW, RMSprop) of one parameter group over the
            rank's plain local parameters: not ``sharding`` nor ``tensor_parallel_plan``
            (DTensor parameters).
        tensor_parallel_plan: None, or a ``torch.distributed.tensor.parallel.parallelize_module``
            plan (``{"submodule.name": ColwiseParallel(), ...}``): the trainer parallelizes the
            plain model it is given over each generation's tensor-parallel group (a DeviceMesh
            built on it) and re-homes it on the next generation's, each rank keeping its local
            shards (regroup.tensor_parallel; torch 2.x). Needs ``tensor_parallel`` >= 2, and
            neither ``ddp``, ``sharding`` nor ``optimizer_sharding``.
        optimizer_copies: with "zero1", 1 (a lost rank's slice sends the job to its newest
            checkpoint) or 2 (every rank also keeps a second copy of the slice half the ring
            away, from which a lost rank's slice is restored in place).
        vote_overlap: whether a rank applies a step as it votes and computes the next one while
            the vote travels, keeping an exact undo (regroup.undo: for Adam three times the
            parameters, copied every step), or waits for the outcome before it applies (no copy,
            the vote's round trip on every step). None (the default): ``$REGROUP_VOTE_OVERLAP``
            (``1`` or ``0``) when set, else overlap when the backend's device is an accelerator
            (NCCL, HCCL: the copy is device memory traffic, microseconds) and wait on the CPU
            (gloo: the copy, a memory-bound pass on the cores that train, costs more than the
            round trip it hides; bench/README.md). Every rank of a job must resolve it alike.
        timeouts: see :class:`Timeouts`.
    """

    dataset_size: int
    micro_batch_size: int
    microbatches_per_step: int
    seed: int = 0
    tensor_parallel: int = 1
    pipeline_parallel: Optional[int] = None
    shuffle: bool = True
    checksum_interval: int = 100
    checkpoint_dir: Optional[str] = None
    checkpoint_interval: int = 0
    keep_checkpoints: int = 2
    ddp: bool = False
    backend: Optional[str] = None
    exit_on_stop: bool = True
    scheduler_interval: str = "step"
    timeouts: Timeouts = dataclasses.field(default_factory=Timeouts)
    sharding: Optional[str] = None
    optimizer_sharding: Optional[str] = None
    optimizer_copies: int = 1
    vote_overlap: Optional[bool] = None
    tensor_parallel_plan: Any = None

    def __post_init__(self) -> None:
        def positive(name: str) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}={value!r} must be a positive integer")

        def non_negative(name: str) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{name}={value!r} must be an integer >= 0")

        for name in ("dataset_size", "micro_batch_size", "microbatches_per_step", "tensor_parallel"):
            positive(name)
        for name in ("checksum_interval", "checkpoint_interval", "keep_checkpoints"):
            non_negative(name)
        if self.pipeline_parallel is not None:
            positive("pipeline_parallel")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"seed={self.seed!r} must be an integer")
        if self.global_batch_size > self.dataset_size:
            raise ConfigError(
                f"the global batch ({self.microbatches_per_step} micro-batches x "
                f"{self.micro_batch_size} samples = {self.global_batch_size}) is larger than the "
                f"dataset ({self.dataset_size} samples): not one step fits in an epoch")
        if self.backend is not None and (not isinstance(self.backend, str) or not self.backend):
            raise ConfigError(f"backend={self.backend!r} must be a torch.distributed backend's name or None")
        if self.checkpoint_interval and not self.checkpoint_dir:
            raise ConfigError(f"checkpoint_interval={self.checkpoint_interval} needs a checkpoint_dir")
        if not isinstance(self.timeouts, Timeouts):
            raise ConfigError(f"timeouts={self.timeouts!r} must be a regroup.Timeouts")
        if self.vote_overlap is not None and not isinstance(self.vote_overlap, bool):
            raise ConfigError(f"vote_overlap={self.vote_overlap!r} must be True, False or None (by the device)")
        if self.scheduler_interval not in ("step", "epoch"):
            raise ConfigError(f"scheduler_interval={self.scheduler_interval!r} must be 'step' or 'epoch'")
        if self.sharding not in (None, "hsdp"):
            raise ConfigError(f"sharding={self.sharding!r} must be 'hsdp' or None")
        if self.optimizer_sharding not in (None, "zero1"):
            raise ConfigError(f"optimizer_sharding={self.optimizer_sharding!r} must be 'zero1' or None")
        if self.optimizer_copies not in (1, 2) or isinstance(self.optimizer_copies, bool):
            raise ConfigError(f"optimizer_copies={self.optimizer_copies!r} must be 1 or 2")
        if self.optimizer_copies == 2 and self.optimizer_sharding is None:
            raise ConfigError("optimizer_copies=2 keeps a second copy of a sharded optimizer state: "
                              "set optimizer_sharding='zero1'")
        if self.optimizer_sharding is not None and self.sharding is not None:
            raise ConfigError(f"optimizer_sharding={self.optimizer_sharding!r} cannot be combined with "
                              f"sharding={self.sharding!r} (which shards the optimizer state with the model)")
        if self.sharding is not None:   # after the refusals of combinations, whatever the torch
            from regroup.sharded import require_fsdp2
            require_fsdp2(f"sharding={self.sharding!r}")
        if self.tensor_parallel_plan is not None:
            from regroup.tensor_parallel import check_plan
            check_plan(self)
        if self.sharding is not None and self.ddp:
            raise ConfigError(f"sharding={self.sharding!r} reduces the gradients itself: ddp=True "
                              "cannot be combined with it")

    @property
    def replica_size(self) -> int:
        """Ranks per data-parallel replica (tp x pp)."""
        return self.tensor_parallel * (self.pipeline_parallel or 1)

    @property
    def global_batch_size(self) -> int:
        """Samples per step, over all replicas."""
        return self.microbatches_per_step * self.micro_batch_size

    @property
    def steps_per_epoch(self) -> int:
        """Whole steps in one pass over the dataset (the remainder of each epoch is dropped)."""
        return self.dataset_size // self.global_batch_size


# ---------------------------------------------------------------------------------------------
# The manager, MindCluster style
# ---------------------------------------------------------------------------------------------

_manager_args: Optional[list] = None


def find_binary(name: str) -> str:
    """Finds a Regroup executable: ``$REGROUP_BIN_DIR``, then ``PATH``, then the repository's build/.

    Args:
        name: "regroup-manager" or "regroup-agent".

    Returns:
        The executable's path.

    Raises:
        ConfigError: it was found nowhere.
    """
    bin_dir = os.environ.get("REGROUP_BIN_DIR")
    if bin_dir:
        candidate = Path(bin_dir) / name
        if os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(name)
    if found:
        return found
    repo_build = Path(__file__).resolve().parents[2] / "build" / name
    if os.access(repo_build, os.X_OK):
        return str(repo_build)
    raise ConfigError(f"cannot find {name}: set $REGROUP_BIN_DIR to the directory that holds it, "
                      "or put it on PATH")


def _as_pairs(value: Any, what: str) -> list:
    if value is None:
        return []
    if isinstance(value, Mapping):
        return [f"{k}={v}" for k, v in value.items()]
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    raise ConfigError(f"init_manager: {what} must be a mapping or a list of KEY=VALUE strings")


def init_manager(config: Mapping[str, Any]) -> None:
    """Records the job's manager configuration (MindCluster's ``init_taskd_manager``).

    Args:
        config: ``job_id`` (default ``$MINDX_TASK_ID`` / ``$REGROUP_JOB_ID``), ``node_nums``,
            ``proc_per_node``; optionally ``listen`` ("HOST:PORT", default
            ``$REGROUP_MANAGER_LISTEN``, else 0.0.0.0:9601),
            ``labels`` and ``annotations`` (mappings, the job's MindCluster and regroup.io keys),
            ``env`` (rank 0's environment, e.g. MINDIO_WAIT_MINDX_TIME; taken from this
            process's environment when absent), ``http``, ``port_file``, ``join_window_s``,
            ``credential_file`` (else ``$REGROUP_CREDENTIAL_FILE`` / ``$REGROUP_CREDENTIAL``: the
            manager refuses to start without one), ``insecure`` (True: run without a credential,
            accepting every client; for tests on a trusted machine, and logged at every start),
            ``coordinator`` ("HOST:PORT", else ``$REGROUP_COORDINATOR_ADDR``, else in a Kubernetes
            pod given ``coordinator_credential_file`` the coordinator's Service) and
            ``coordinator_credential_file`` (the job's token there; else
            ``$REGROUP_COORDINATOR_CREDENTIAL_FILE``): the decision maker, from which the manager
            also learns the job's labels and annotations when none are given. Without a
            coordinator the manager needs ``record`` (else ``$REGROUP_RECORD_FILE``), the job's
            durable record on storage every incarnation of the job reaches (it fences an older
            manager), or ``no_record`` (True: run without one, accepting that a second manager
            of the job would train beside this one; logged at every start): given neither, the
            manager refuses to start. Given none, in a
            Kubernetes pod they are first read from the API (the pod, then the Volcano Job or
            AscendJob that owns it: :mod:`regroup.kube`); the coordinator's copy replaces them.

    Raises:
        ConfigError: a value is missing or malformed.
    """
    global _manager_args
    if not isinstance(config, Mapping):
        raise ConfigError("init_manager takes a dict: {'job_id': ..., 'node_nums': ..., 'proc_per_node': ...}")
    known = {"job_id", "node_nums", "proc_per_node", "listen", "labels", "annotations", "env",
             "http", "port_file", "join_window_s", "credential_file", "insecure", "coordinator",
             "coordinator_credential_file", "record", "no_record"}
    unknown = sorted(set(config) - known)
    if unknown:
        raise ConfigError(f"init_manager: unknown key(s) {unknown}; known: {sorted(known)}")
    job_id = config.get("job_id") or os.environ.get("MINDX_TASK_ID") or os.environ.get("REGROUP_JOB_ID")
    if not job_id:
        raise ConfigError("init_manager: job_id is missing (and $MINDX_TASK_ID is not set)")
    args = ["--job-id", str(job_id)]
    for key, flag in (("node_nums", "--nodes"), ("proc_per_node", "--nproc-per-node")):
        value = config.get(key)
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"init_manager: {key}={value!r} must be a positive integer") from None
        if number < 1:
            raise ConfigError(f"init_manager: {key}={value!r} must be a positive integer")
        args += [flag, str(number)]
    if config.get("listen") is not None:  # else $REGROUP_MANAGER_LISTEN, else 0.0.0.0:9601
        args += ["--listen", str(config["listen"])]
    labels = _as_pairs(config.get("labels"), "labels")
    annotations = _as_pairs(config.get("annotations"), "annotations")
    if not labels and not annotations:
        # A manager.py gives none: in a pod, read them where the user wrote them (the coordinator's
        # copy, when one is reachable, still replaces them).
        from regroup import kube
        found = kube.job_keys_or_none(log=lambda m: print(m, file=sys.stderr, flush=True))
        if found is not None:
            labels = [f"{k}={v}" for k, v in sorted(found.labels.items())]
            annotations = [f"{k}={v}" for k, v in sorted(found.annotations.items())]
            args += ["--keys-source", found.source]
    for item in labels:
        args += ["--label", item]
    for item in annotations:
        args += ["--annotation", item]
    env = _as_pairs(config.get("env"), "env")
    if not env and os.environ.get("MINDIO_WAIT_MINDX_TIME"):
        env = [f"MINDIO_WAIT_MINDX_TIME={os.environ['MINDIO_WAIT_MINDX_TIME']}"]
    for item in env:
        args += ["--env", item]
    for key, flag in (("http", "--http"), ("port_file", "--port-file"),
                      ("join_window_s", "--join-window-s"), ("credential_file", "--credential-file"),
                      ("coordinator", "--coordinator"),
                      ("coordinator_credential_file", "--coordinator-credential-file"),
                      ("record", "--record")):
        if config.get(key) is not None:
            args += [flag, str(config[key])]
    if config.get("insecure"):
        args.append("--insecure")
    if config.get("no_record"):
        args.append("--no-record")
    _manager_args = args


def manager_elsewhere(environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """The job's manager address when this pod's environment names one that is not this pod.

    ``regroupctl convert`` gives a job a manager task and its training pods
    ``REGROUP_MANAGER_ADDR=<job>-manager-0.<job>:9601``; a MindCluster ``manager.py`` that their
    script still starts on rank 0 must then not start a second manager of the job (it would take
    the job over at the coordinator from the one its agents talk to)."""
    addr = (environ.get("REGROUP_MANAGER_ADDR") or "").strip()
    if not addr:
        return None
    host = addr.rsplit(":", 1)[0].strip("[]") if ":" in addr else addr
    here = {"", "localhost", "0.0.0.0", "::", "::1", socket.gethostname(),
            environ.get("POD_IP", ""), environ.get("REGROUP_HOST", ""), environ.get("HOSTNAME", "")}
    if host in here or host.startswith("127."):
        return None
    return addr


def start_manager(wait: bool = True, extra_args: Sequence[str] = ()) -> Any:
    """Runs ``regroup-manager`` with what ``init_manager`` recorded (MindCluster's ``start_taskd_manager``).

    In a pod whose ``REGROUP_MANAGER_ADDR`` names another pod's manager (a job converted by
    ``regroupctl convert``, which runs the manager in a task of its own) it starts none, says so
    on stderr, and returns 0 (``None`` with ``wait=False``): a job has one manager.

    Args:
        wait: block until the manager exits and return its exit code (MindCluster's behaviour);
            False returns the running ``subprocess.Popen`` instead.
        extra_args: more command-line flags for the manager.

    Returns:
        The exit code, or the Popen when ``wait`` is False.

    Raises:
        UsageError: ``init_manager`` was not called first.
        ConfigError: the binary cannot be found.
    """
    if _manager_args is None:
        raise UsageError("start_manager() needs init_manager({...}) first")
    elsewhere = manager_elsewhere()
    if elsewhere is not None:
        print(f"regroup: the job's manager runs at {elsewhere} ($REGROUP_MANAGER_ADDR): this pod "
              "starts no second one", file=sys.stderr, flush=True)
        return 0 if wait else None
    process = subprocess.Popen([find_binary("regroup-manager"), *_manager_args, *extra_args])
    if not wait:
        return process
    try:
        return process.wait()
    except KeyboardInterrupt:
        process.terminate()
        return process.wait()


# MindCluster (TaskD) names, so `from taskd.api import ...` becomes `from regroup.api import ...`.
init_taskd_manager = init_manager
start_taskd_manager = start_manager
