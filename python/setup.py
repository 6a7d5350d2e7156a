# SPDX-License-Identifier: Apache-2.0
"""The wheel's one generation step: wire_pb2.py from the repository's proto/, made at build time.

An installed regroup needs no protoc and no repository: the generated messages ship in the
wheel. Building needs protoc (Debian's protobuf-compiler, or $PROTOC) and the repository around
this directory (``../proto``); the metadata is in pyproject.toml.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent / "proto"
PROTO = Path("regroup") / "v1" / "wire.proto"


def _protoc() -> str:
    found = os.environ.get("PROTOC") or shutil.which("protoc")
    if not found:
        sys.exit("building regroup needs protoc to generate its wire messages from "
                 f"{PROTO_ROOT / PROTO}: install protobuf-compiler (Debian) or set $PROTOC")
    return found


def generate_into(package_dir: Path) -> None:
    """Writes ``package_dir/_proto/wire_pb2.py`` from ../proto, or exits naming what is missing."""
    source = PROTO_ROOT / PROTO
    if not source.is_file():
        sys.exit(f"building regroup needs the repository's {source} (build from a clone: "
                 "pip install <repo>/python)")
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([_protoc(), f"--proto_path={PROTO_ROOT}", f"--python_out={out}", str(source)],
                       check=True)
        target = package_dir / "_proto"
        target.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(out) / "regroup" / "v1" / "wire_pb2.py", target / "wire_pb2.py")


class BuildWithMessages(build_py):
    def run(self) -> None:
        super().run()
        generate_into(Path(self.build_lib) / "regroup")


setup(cmdclass={"build_py": BuildWithMessages})
