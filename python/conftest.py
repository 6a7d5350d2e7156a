# SPDX-License-Identifier: Apache-2.0
"""pytest setup for the regroup package: import path, process cleanup, the Regroup binaries."""

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from regroup.testing import Processes  # noqa: E402


@pytest.fixture
def procs():
    """Processes a test starts; every one is killed when the test ends."""
    p = Processes()
    yield p
    p.stop_all()


def _find(name):
    candidates = []
    if os.environ.get("REGROUP_BIN_DIR"):
        candidates.append(Path(os.environ["REGROUP_BIN_DIR"]) / name)
    repo = HERE.parent
    for build in (repo / "build", Path("/tmp/pybuild")):
        candidates += [build / name, build / "manager" / "agent" / name, build / "manager" / "server" / name]
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    return None


@pytest.fixture(scope="session")
def binaries():
    """Paths of regroup-manager and regroup-agent; the test is skipped when either is missing."""
    manager, agent = _find("regroup-manager"), _find("regroup-agent")
    if not manager or not agent:
        pytest.skip("regroup-manager and regroup-agent are not built (set $REGROUP_BIN_DIR, or build "
                    "into build/): the end-to-end tests need both")
    return {"manager": manager, "agent": agent}
