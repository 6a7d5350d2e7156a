# SPDX-License-Identifier: Apache-2.0
"""Regroup's trainer library: a PyTorch training process that survives faults elsewhere in the job.

A script keeps its own loop and wraps each step::

    import regroup
    trainer = regroup.Trainer(model, optimizer, config=regroup.TrainerConfig(
        dataset_size=len(data), micro_batch_size=8, microbatches_per_step=4))
    for step in trainer.steps(total_steps):
        with step:
            for mb in step.microbatches():
                with mb:
                    loss = loss_fn(step.model(inputs[mb.indices]), targets[mb.indices])  # summed
                    step.backward(loss)
            trainer.commit(step)

See python/README.md (the drop-in first, then the step contract) and docs/design.md.
"""

import importlib as _importlib
import pathlib as _pathlib


def _version() -> str:
    """The release, from the repository's VERSION (python/VERSION links to it; a wheel carries
    it as its metadata)."""
    here = _pathlib.Path(__file__).resolve().parent.parent / "VERSION"
    if here.is_file():
        return here.read_text().strip()
    from importlib import metadata

    return metadata.version("regroup")


__version__ = _version()

# torch-free: a MindCluster manager.py (`from regroup.api import init_taskd_manager, ...`) and
# torchrun's hand-over run where torch is slow to import or absent; the names that need torch are
# imported on first use.
from regroup.api import (EXIT_ABORT_STUCK, AgentConnectionError, AgentError, CheckpointError,
                         CollectiveFailed, ConfigError, GenerationAborted, ProtocolError, RegroupError,
                         StateLost, StateSyncError, StepFailed, StepRolledBack, StopMode, Timeouts,
                         TrainerConfig, TrainingStopped, UsageError, init_manager, start_manager)

_NEEDS_TORCH = {"DataLoader": "regroup.dropin", "DDP": "regroup.dropin",
                "DistributedDataParallel": "regroup.dropin", "init_process_group": "regroup.dropin",
                "optimizer": "regroup.dropin", "status": "regroup.dropin",
                "Abandoned": "regroup.abort", "all_reduce": "regroup.abort", "Generation": "regroup.step",
                "MicroBatch": "regroup.step", "Step": "regroup.step", "Trainer": "regroup.trainer"}


def __getattr__(name: str):
    module = _NEEDS_TORCH.get(name)
    if module is None:
        raise AttributeError(f"module 'regroup' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "DataLoader", "DDP", "DistributedDataParallel", "init_process_group", "optimizer", "status",
    "Abandoned", "all_reduce", "AgentConnectionError", "AgentError", "CheckpointError", "CollectiveFailed", "ConfigError",
    "EXIT_ABORT_STUCK", "GenerationAborted", "Generation", "MicroBatch", "ProtocolError",
    "RegroupError", "StateLost", "StateSyncError", "Step", "StepFailed", "StepRolledBack", "StopMode",
    "Timeouts", "Trainer", "TrainerConfig", "TrainingStopped", "UsageError", "init_manager",
    "start_manager",
]
