# SPDX-License-Identifier: Apache-2.0
"""pytest setup for the integration cluster: import paths."""

import signal
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "python"))

BUDGET_S = 1200  # the stage's budget in scripts/test; each scenario prints its time and the total


def pytest_report_header(config):
    return f"integration scenarios: time budget {BUDGET_S} s (scripts/test stops the stage there)"


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


# A stage timeout (SIGTERM) unwinds like Ctrl-C, so every cluster still stops its processes and
# deletes its namespaces.
signal.signal(signal.SIGTERM, _interrupt)
