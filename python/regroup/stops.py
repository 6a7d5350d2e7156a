# SPDX-License-Identifier: Apache-2.0
"""Stop handling: what a rank does when the manager stops training (StopTraining).

EXIT raises TrainingStopped; DUMP writes this rank's shard of the committed state, then exits 0;
LEAVE (a planned departure) exits 0. STANDBY (no place in the next generation) is not a stop of
the process: regroup.dispatch handles it where it arrives, and the rank keeps its state.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

from regroup.api import CheckpointError, StopMode, TrainingStopped

if TYPE_CHECKING:
    from regroup.trainer import Trainer

log = logging.getLogger("regroup")


class Stop(Exception):
    """Internal: a StopTraining was received; carries it to where it is handled."""

    def __init__(self, mode: StopMode, reason: str):
        super().__init__(reason)
        self.mode = mode
        self.reason = reason


def handle_stop(t: Trainer, stop: Stop) -> None:
    """StopTraining: EXIT raises; DUMP writes a checkpoint and exits 0; LEAVE exits 0;
    STANDBY is handled where it arrives."""
    log.warning("regroup: StopTraining %s: %s", stop.mode.name, stop.reason)
    t.drop_vote()  # a step applied whose vote is in flight: its start put back
    t.state.zero_grad()
    if stop.mode == StopMode.DUMP and t.committed_step >= 0:
        try:
            path = t.checkpoint_now()
            log.warning("regroup: dumped the state of step %d to %s", t.committed_step, path)
        except CheckpointError as e:
            log.error("regroup: the dump failed: %s", e)
            t.close()
            raise TrainingStopped(StopMode.EXIT, f"dump failed: {e}") from e
    t.close()
    error = TrainingStopped(stop.mode, stop.reason)
    if error.exit_code == 0 and t.config.exit_on_stop:
        sys.stdout.flush()
        sys.stderr.flush()
        raise SystemExit(0)
    raise error
