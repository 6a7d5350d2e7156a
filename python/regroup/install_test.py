# SPDX-License-Identifier: Apache-2.0
"""``pip install`` as a user does it: a wheel built from ./python, installed into a fresh venv
that sees the system's packages, then a two-rank job trained with the installed copy.

What it proves: the wheel carries the generated wire messages (no protoc and no repository at run
time); the installed torch satisfies the requirement and is kept (Debian's 1.13.0a0 included:
the install runs with ``--no-index``, so a requirement it did not satisfy would fail rather than
download torch); and the installed library trains exactly (the drop-in example, copied out of the
repository, against the unmodified script's fault-free run).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import torch

from regroup.dropin_e2e_test import ANNOTATIONS
from regroup.e2e_test import Cluster
from regroup.testing import REPO, relative_error, run_plain_ddp

pytestmark = pytest.mark.e2e

PIP_TIMEOUT = 300


def _pip(*args: str, python: str = sys.executable) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "pip", "--disable-pip-version-check", *args],
                          capture_output=True, text=True, timeout=PIP_TIMEOUT)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> str:
    """The python of a fresh venv (system site packages) with regroup's wheel installed."""
    if sys.prefix != sys.base_prefix:
        pytest.skip("run from a venv, whose packages a new venv cannot see: the system python's stage runs it")
    if shutil.which("protoc") is None and not os.environ.get("PROTOC"):
        pytest.skip("building the wheel needs protoc (protobuf-compiler)")
    root = tmp_path_factory.mktemp("install")
    # What a fresh clone holds: no generated messages beside the package.
    source = root / "clone"
    generated = shutil.ignore_patterns("wire_pb2.py", "wire_pb2.stamp", "__pycache__", ".protogen-*")
    shutil.copytree(REPO / "python", source / "python", symlinks=True, ignore=generated)
    shutil.copytree(REPO / "proto", source / "proto")
    shutil.copyfile(REPO / "VERSION", source / "VERSION")
    built = _pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(root / "dist"), str(source / "python"))
    assert built.returncode == 0, built.stdout + built.stderr
    wheels = list((root / "dist").glob("regroup-*.whl"))
    assert len(wheels) == 1, wheels
    venv.EnvBuilder(system_site_packages=True, with_pip=True).create(root / "venv")
    python = str(root / "venv" / "bin" / "python")
    done = _pip("install", "--no-index", str(wheels[0]), python=python)
    assert done.returncode == 0, f"the wheel's requirements are not met by the installed packages:\n" \
                                 f"{done.stdout}{done.stderr}"
    return python


def test_the_wheel_ships_its_wire_messages_and_keeps_the_installed_torch(installed, tmp_path):
    probe = ("import regroup, torch, regroup._proto as p; "
             "print(regroup.__file__); print(p.wire_pb2.__file__); print(torch.__version__)")
    r = subprocess.run([installed, "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": "", "PROTOC": "/nonexistent/protoc"})
    assert r.returncode == 0, r.stderr
    library, messages, version = r.stdout.split()
    site = str(Path(installed).parents[1] / "lib")
    assert library.startswith(site) and messages.startswith(site), r.stdout
    assert version == torch.__version__, f"the venv's torch is {version}, the system's {torch.__version__}"


def test_a_two_rank_job_trains_with_the_installed_library(installed, tmp_path, procs, binaries):
    script = tmp_path / "train.py"                 # the user's script, outside the repository
    shutil.copyfile(REPO / "examples" / "ddp_regroup.py", script)
    shutil.copyfile(REPO / "examples" / "example_ledger.py", tmp_path / "example_ledger.py")
    train = ["--epochs", "2", "--dataset", "64"]
    c = Cluster(tmp_path, procs, binaries, steps=0, train=[], script=script, python=installed, library=None,
                annotations=ANNOTATIONS)
    c.train = [*train, "--out", str(c.out)]
    c.start(nodes=1, nproc=2)
    code = c.agents["node0"].wait(timeout=240)
    assert code == 0, f"the agent exited with {code}\n{c.logs()}"
    reference = tmp_path / "plain.pt"
    run_plain_ddp(train, 2, reference)
    error = relative_error(torch.load(reference), torch.load(c.out))
    assert error <= 1e-9, f"final weights: norm-relative error {error:.3e}"
