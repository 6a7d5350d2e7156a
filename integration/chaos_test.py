# SPDX-License-Identifier: Apache-2.0
"""The chaos soak as a test (see chaos.py): three fixed seeds, each a random schedule of faults
on real training, must keep every promise.

    /usr/bin/python3 -m pytest -q integration/chaos_test.py       # ~3.5 min on 2 cores

``REGROUP_NETWORK=loopback`` forces the loopback fallback (link faults are then skipped with a
notice); ``REGROUP_CHAOS_SEEDS=1,2,3`` and ``REGROUP_CHAOS_FAULTS=4`` choose other runs.
"""

import os
import time

import pytest

import chaos

NETWORK = os.environ.get("REGROUP_NETWORK", "auto")
SEEDS = [int(s) for s in os.environ.get("REGROUP_CHAOS_SEEDS", "1,2,3").split(",") if s.strip()]
FAULTS = int(os.environ.get("REGROUP_CHAOS_FAULTS", "4"))
_started = time.monotonic()


@pytest.mark.parametrize("seed", SEEDS)
def test_chaos_seed(seed, tmp_path):
    result = chaos.run_seed(seed, FAULTS, tmp_path, NETWORK, log=lambda m: None)
    print(result.report())
    print(f"(chaos time so far {time.monotonic() - _started:.0f} s)")
    assert result.ok, result.report()


def test_a_seed_draws_the_same_schedule_every_time():
    a = chaos.draw_schedule(11, 6, 4, 2)
    assert a == chaos.draw_schedule(11, 6, 4, 2)
    assert a != chaos.draw_schedule(12, 6, 4, 2)
    assert {f["kind"] for f in a} <= set(chaos.KINDS)
    for f in a:
        low, high = chaos.DURATIONS.get(f["kind"], (0.0, 0.0))
        assert low <= f["duration_s"] <= high and 0 <= f["pod"] < 4 and 0 <= f["local"] < 2
