# SPDX-License-Identifier: Apache-2.0
"""The step contract (docs/design.md): which samples a micro-batch holds, and its RNG.

Micro-batch ``j`` of step ``s`` is a fixed set of global sample indices: samples
``[(s mod S) * G + j * m, ... + m)`` of epoch ``s // S``'s permutation, where ``S`` is the steps
per epoch, ``G`` the global batch and ``m`` the micro-batch size. Its random numbers come from a
generator seeded with ``(seed, s, j)``. So a micro-batch gives the same result on whichever
replica computes it, and a step's result does not depend on how many replicas share it.
"""

from __future__ import annotations

import contextlib
import hashlib
import struct
from typing import Iterator, List, Sequence, Tuple

import torch

_MASK63 = (1 << 63) - 1


def derive_seed(*parts: int) -> int:
    """A 63-bit seed from integers (stable across processes, platforms and Python versions)."""
    data = struct.pack(f"<{len(parts)}q", *parts)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") & _MASK63


_PERMUTATION = 1
_MICROBATCH = 2


def spread(microbatches: int, replicas: int) -> List[int]:
    """Micro-batches per replica, as even as possible, the first ones getting one more.

    The manager's rule (plugin/sizing.cc SpreadMicroBatches), used when the plan does not say.
    """
    if replicas <= 0:
        return []
    return [microbatches // replicas + (1 if i < microbatches % replicas else 0) for i in range(replicas)]


def replica_range(microbatches: int, replicas: int, replica: int) -> Tuple[int, int]:
    """(begin, count) of ``replica``'s micro-batches under :func:`spread`."""
    counts = spread(microbatches, replicas)
    return sum(counts[:replica]), counts[replica]


class Sampler:
    """Global sample indices of the step contract.

    Args:
        dataset_size: samples in the dataset.
        micro_batch_size: samples per micro-batch.
        microbatches_per_step: micro-batches per step, over all replicas.
        seed: seed of the per-epoch permutations.
        shuffle: False keeps the identity order in every epoch.
    """

    def __init__(self, dataset_size: int, micro_batch_size: int, microbatches_per_step: int,
                 seed: int, shuffle: bool = True):
        self.dataset_size = dataset_size
        self.micro_batch_size = micro_batch_size
        self.microbatches_per_step = microbatches_per_step
        self.seed = seed
        self.shuffle = shuffle
        self.global_batch_size = micro_batch_size * microbatches_per_step
        self.steps_per_epoch = dataset_size // self.global_batch_size
        self._epoch = -1
        self._permutation: torch.Tensor = torch.empty(0, dtype=torch.long)

    def epoch_of(self, step: int) -> int:
        return step // self.steps_per_epoch

    def permutation(self, epoch: int) -> torch.Tensor:
        """The order of the samples in ``epoch`` (cached for the latest epoch)."""
        if epoch != self._epoch:
            if self.shuffle:
                g = torch.Generator()
                g.manual_seed(derive_seed(_PERMUTATION, self.seed, epoch))
                self._permutation = torch.randperm(self.dataset_size, generator=g)
            else:
                self._permutation = torch.arange(self.dataset_size)
            self._epoch = epoch
        return self._permutation

    def microbatch(self, step: int, index: int) -> torch.Tensor:
        """Global sample indices of micro-batch ``index`` of ``step`` (a LongTensor)."""
        if step < 0:
            raise ValueError(f"step {step} is negative")
        if not 0 <= index < self.microbatches_per_step:
            raise ValueError(f"micro-batch {index} is outside 0..{self.microbatches_per_step - 1}")
        perm = self.permutation(self.epoch_of(step))
        start = (step % self.steps_per_epoch) * self.global_batch_size + index * self.micro_batch_size
        return perm[start:start + self.micro_batch_size].clone()

    def step_samples(self, step: int) -> torch.Tensor:
        """Every sample of ``step``, micro-batch by micro-batch."""
        return torch.cat([self.microbatch(step, j) for j in range(self.microbatches_per_step)])


def microbatch_seed(seed: int, step: int, index: int) -> int:
    """The seed of micro-batch ``index`` of ``step``."""
    return derive_seed(_MICROBATCH, seed, step, index)


def _cuda_devices() -> List[int]:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return [torch.cuda.current_device()]
    return []


@contextlib.contextmanager
def seeded_rng(seed: int) -> Iterator[None]:
    """Runs the block with torch's global generators (CPU, current CUDA device) seeded with
    ``seed``, and puts their previous state back afterwards."""
    devices = _cuda_devices()
    with torch.random.fork_rng(devices=devices, enabled=True):
        torch.manual_seed(seed)
        yield


def generator(seed: int, device: str = "cpu") -> torch.Generator:
    """A fresh generator seeded with ``seed``."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def checksum(tensors: Sequence[torch.Tensor]) -> int:
    """A 64-bit checksum of the tensors' bytes (never 0, which means "not taken")."""
    h = hashlib.blake2b(digest_size=8)
    for t in tensors:
        data = t.detach()
        if data.device.type != "cpu":
            data = data.cpu()
        data = data.contiguous().reshape(-1)
        h.update(struct.pack("<q", data.numel()))
        if data.numel():
            h.update(data.view(torch.uint8).numpy().tobytes())
    value = int.from_bytes(h.digest(), "little")
    return value or 1
