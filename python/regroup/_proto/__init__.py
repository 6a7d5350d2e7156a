"""The wire messages of proto/regroup/v1/wire.proto, generated with protoc on first use.

The .proto file in the repository is the one source of the messages. The generated module is
not committed: it is written here (``wire_pb2.py``) by ``protoc`` the first time the package
is imported, and again whenever the .proto changes (a stamp holds the hash of the .proto it was
made from). Several trainer processes may import the package at the same moment, so the module
is written under a temporary name and renamed into place.

An installed copy of the package (no repository around it) uses the generated module that was
put beside this file at build time; ``python -m regroup._proto`` regenerates it by hand.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_GENERATED = _HERE / "wire_pb2.py"
_STAMP = _HERE / "wire_pb2.stamp"
_PROTO_RELATIVE = Path("regroup") / "v1" / "wire.proto"


def proto_root() -> Path | None:
    """Returns the directory that holds ``regroup/v1/wire.proto``, or None when not found."""
    override = os.environ.get("REGROUP_PROTO_DIR")
    candidates = [Path(override)] if override else []
    candidates.append(_HERE.parents[2] / "proto")  # python/regroup/_proto -> <repo>/proto
    for root in candidates:
        if (root / _PROTO_RELATIVE).is_file():
            return root
    return None


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _protoc() -> str:
    found = os.environ.get("PROTOC") or shutil.which("protoc") or "/usr/bin/protoc"
    if not os.path.exists(found):
        raise RuntimeError(
            "regroup needs protoc to generate its wire messages from wire.proto: install "
            "protobuf-compiler (Debian) or set $PROTOC"
        )
    return found


def generate(force: bool = False) -> bool:
    """Writes wire_pb2.py from the repository's .proto when it is missing or stale.

    Args:
        force: regenerate even when the stamp says the module is current.

    Returns:
        True when the module was (re)written.

    Raises:
        RuntimeError: protoc is missing or failed.
    """
    root = proto_root()
    if root is None:
        if _GENERATED.exists():
            return False  # an installed package: use what was built
        raise RuntimeError(
            "regroup cannot find proto/regroup/v1/wire.proto to generate its wire messages: "
            "set $REGROUP_PROTO_DIR to the repository's proto/ directory"
        )
    source = root / _PROTO_RELATIVE
    digest = _digest(source)
    if not force and _GENERATED.exists() and _STAMP.exists():
        if _STAMP.read_text().strip() == digest:
            return False
    with tempfile.TemporaryDirectory(prefix=".protogen-", dir=_HERE) as out:
        result = subprocess.run(
            [_protoc(), f"--proto_path={root}", f"--python_out={out}", str(source)],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise RuntimeError(f"protoc failed on {source}: {result.stderr.strip()}")
        made = Path(out) / "regroup" / "v1" / "wire_pb2.py"
        stamp = Path(out) / "stamp"
        stamp.write_text(digest + "\n")
        os.replace(made, _GENERATED)
        os.replace(stamp, _STAMP)
    return True


generate()

from regroup._proto import wire_pb2  # noqa: E402  (generated just above)

__all__ = ["wire_pb2", "generate", "proto_root"]
