# SPDX-License-Identifier: Apache-2.0
"""Checkpoints: periodic, asynchronous, atomic, fenced by generation, loaded with weights_only.

Layout under the checkpoint directory::

    step-000000000041.e1717171717171.g3/      step 41, written in generation 3 of epoch 1717...
        shard-00000-of-00002.pt               position 0 of a replica of two ranks (tp x pp)
        shard-00001-of-00002.pt
        manifest.json                         written last: the checkpoint is complete

Every file is written under a temporary name and renamed into place. Each position's shard is
written by one rank of the replica that checkpoints (on a dump, by every survivor: the shards
of one position are identical, and renaming over one another is harmless). Whoever finds every
shard present after renaming its own writes the manifest (its content is the same whoever
writes it). A checkpoint is complete when its manifest exists and names shards that all exist
with the sizes it gives; a fresh start resumes from the newest complete one. The directory name
holds the generation that wrote it, so a writer of an older generation (a zombie) never writes
into a newer generation's checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import secrets
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from regroup.api import CheckpointError
from regroup.state import load_tree, save_tree

log = logging.getLogger("regroup")

_DIR = re.compile(r"^step-(\d{12})\.e(\d+)\.g(\d+)$")
_FORMAT = 1


def shard_name(position: int, replica_size: int) -> str:
    return f"shard-{position:05d}-of-{replica_size:05d}.pt"


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """A complete checkpoint."""

    path: Path
    step: int
    epoch: int
    generation: int
    replica_size: int
    meta: Dict[str, Any]

    def shard(self, position: int) -> Path:
        return self.path / shard_name(position, self.replica_size)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_atomic(path: Path, write) -> None:
    """Writes ``path`` through a new temporary file beside it, flushed and renamed into place.

    The temporary's name is random and it is created with O_CREAT|O_EXCL|O_NOFOLLOW, so a file or
    a symlink planted at any name is never opened (issue 40: a predictable name opened with
    ``open(..., "wb")`` truncated a planted symlink's target). The C++ programs' rule is the same
    (common/safe_file.h).
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = path.parent / f".{path.name}.tmp-{secrets.token_hex(8)}"
        try:
            fd = os.open(tmp, flags, 0o666)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free temporary name beside {path}")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _read_complete(path: Path) -> Optional[CheckpointInfo]:
    m = _DIR.match(path.name)
    if not m:
        return None
    try:
        manifest = json.loads((path / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("format") != _FORMAT:
        return None
    shards = manifest.get("shards", {})
    replica_size = int(manifest.get("replica_size", 0))
    if replica_size < 1 or len(shards) != replica_size:
        return None
    for name, size in shards.items():
        try:
            if (path / name).stat().st_size != size:
                return None
        except OSError:
            return None
    return CheckpointInfo(path, int(m.group(1)), int(m.group(2)), int(m.group(3)), replica_size,
                          manifest.get("meta", {}))


class Checkpointer:
    """Writes and finds the checkpoints of one directory.

    Args:
        directory: where checkpoints go (created when missing).
        keep: complete checkpoints kept (0: all); older ones are removed by the manifest writer.
    """

    def __init__(self, directory: str, keep: int = 2):
        self.directory = Path(directory)
        self.keep = keep
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self.last_written: Optional[Path] = None

    # -- finding --------------------------------------------------------------------------------

    def complete(self) -> List[CheckpointInfo]:
        """Every complete checkpoint, oldest first (by step, then epoch and generation)."""
        if not self.directory.is_dir():
            return []
        found = []
        for entry in self.directory.iterdir():
            if entry.is_dir():
                info = _read_complete(entry)
                if info is not None:
                    found.append(info)
        found.sort(key=lambda i: (i.step, i.epoch, i.generation))
        return found

    def newest(self) -> Optional[CheckpointInfo]:
        """The newest complete checkpoint, or None."""
        found = self.complete()
        return found[-1] if found else None

    @staticmethod
    def load(info: CheckpointInfo, position: int) -> Dict[str, Any]:
        """One position's shard of a checkpoint, loaded with ``weights_only=True``.

        Raises:
            CheckpointError: the shard is missing or cannot be loaded.
        """
        if not 0 <= position < info.replica_size:
            raise CheckpointError(f"checkpoint {info.path} has shards for positions 0..{info.replica_size - 1}, "
                                  f"not {position}: the job's tensor x pipeline size changed")
        path = info.shard(position)
        try:
            return load_tree(path)
        except Exception as e:  # noqa: BLE001
            raise CheckpointError(f"cannot load checkpoint shard {path}: {e}") from e

    # -- writing --------------------------------------------------------------------------------

    def path_for(self, step: int, epoch: int, generation: int) -> Path:
        return self.directory / f"step-{step:012d}.e{epoch}.g{generation}"

    def write(self, state: Dict[str, Any], *, step: int, epoch: int, generation: int, position: int,
              replica_size: int, meta: Optional[Dict[str, Any]] = None) -> Path:
        """Writes one shard now (blocking), and the manifest if every shard is there.

        Raises:
            CheckpointError: the write failed.
        """
        target = self.path_for(step, epoch, generation)
        try:
            target.mkdir(parents=True, exist_ok=True)
            name = shard_name(position, replica_size)
            _write_atomic(target / name, lambda f: save_tree(state, f))
            names = [shard_name(p, replica_size) for p in range(replica_size)]
            if all((target / n).exists() for n in names):
                manifest = {"format": _FORMAT, "step": step, "epoch": epoch, "generation": generation,
                            "replica_size": replica_size,
                            "shards": {n: (target / n).stat().st_size for n in names},
                            "meta": meta or {}, "written_at": time.time()}
                _write_atomic(target / "manifest.json",
                              lambda f: f.write(json.dumps(manifest, indent=1, sort_keys=True).encode()))
                _fsync_dir(target)
                self._prune()
        except OSError as e:
            raise CheckpointError(f"cannot write checkpoint shard {position} of step {step} under "
                                  f"{target}: {e}") from e
        self.last_written = target
        return target

    def write_async(self, state: Dict[str, Any], **kwargs: Any) -> None:
        """Writes in a background thread; ``state`` must already be a private CPU copy.

        Waits for the previous write first (one at a time).

        Raises:
            CheckpointError: the previous background write failed.
        """
        self.wait()

        def run() -> None:
            try:
                self.write(state, **kwargs)
            except BaseException as e:  # noqa: BLE001 - reported by the next wait()
                self._error = e

        self._thread = threading.Thread(target=run, name="regroup-checkpoint", daemon=True)
        self._thread.start()

    def wait(self, timeout: Optional[float] = None) -> None:
        """Waits for the background write.

        Raises:
            CheckpointError: it failed, or did not finish within ``timeout``.
        """
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise CheckpointError(f"a checkpoint write did not finish within {timeout} s")
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            if isinstance(error, CheckpointError):
                raise error
            raise CheckpointError(f"a checkpoint write failed: {error}") from error

    @property
    def writing(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _prune(self) -> None:
        if self.keep <= 0:
            return
        complete = self.complete()
        if len(complete) <= self.keep:
            return
        oldest_kept = complete[-self.keep].step
        for entry in self.directory.iterdir():
            m = _DIR.match(entry.name)
            if m and int(m.group(1)) < oldest_kept:
                shutil.rmtree(entry, ignore_errors=True)
