# SPDX-License-Identifier: Apache-2.0
"""The integration scenarios as tests (see scenarios.py): each must keep every promise.

Run with ``/usr/bin/python3 -m pytest -q integration``; ``REGROUP_NETWORK=loopback`` forces the
loopback fallback. Each test prints what its scenario measured (``-s`` shows it).
"""

import os
import time

import pytest

import scenarios

NETWORK = os.environ.get("REGROUP_NETWORK", "auto")
_started = time.monotonic()


@pytest.mark.parametrize("number", sorted(scenarios.SCENARIOS))
def test_scenario(number, tmp_path):
    result = scenarios.run(number, tmp_path, NETWORK, log=lambda m: None)
    print(result.report())
    print(f"(suite time so far {time.monotonic() - _started:.0f} s)")
    if result.skipped:
        pytest.skip(result.skipped)
    assert result.ok, result.report()
