# SPDX-License-Identifier: Apache-2.0
"""The drop-in with the vote off the critical path, under a scripted agent: examples/ddp_regroup.py
(SGD with momentum, a per-step LR schedule, clipping) on two ranks. ``opt.step()`` of step s
applies it as it votes; the outcome is heard in step s + 1's ``opt.step()``. When that outcome is
a rollback (same generation) or an abort came first (a new generation that resumes before s),
both steps are undone and the loader gives step s's batches again: the run ends with the plain
script's weights (float64, norm-relative 1e-9) and every step's samples those of the plain
script, every sample once per epoch."""

from __future__ import annotations

from typing import Dict, List, Sequence

import pytest
import torch

from regroup.testing import PYTHON, REPO, check_dropin_ledger, relative_error, run_plain_ddp
from regroup.trainer_test import FakeJob

DROPIN = REPO / "examples" / "ddp_regroup.py"
DATASET, EPOCHS = 64, 2
TRAIN = ["--epochs", str(EPOCHS), "--dataset", str(DATASET), "--batch-size", "4"]
STEPS = EPOCHS * DATASET // (2 * 4)  # 8 batches of 4 a rank per epoch, one step each


class DropInJob(FakeJob):
    def command(self, extra: Sequence[str]) -> List[str]:
        # A sleep after each opt.step(): the outcome sent then is heard in the next step's.
        return [PYTHON, str(DROPIN), *TRAIN, "--step-sleep", "0.2", "--ledger", str(self.ledger),
                "--out", str(self.out)]

    def environment(self, r: int) -> Dict[str, str]:
        return {**super().environment(r), "REGROUP_CHECKSUM_INTERVAL": "5"}


@pytest.mark.parametrize("late", ["rollback", "abort", "epoch-end-commit", "epoch-end-abort"])
def test_a_late_rollback_gives_the_earlier_steps_batches_again(tmp_path, procs, late):
    j = DropInJob(tmp_path, procs, steps=STEPS)
    try:
        j.launch(0), j.launch(1)
        j.form([0, 1])
        if late.startswith("epoch-end"):
            # The epoch's last step (7): its outcome is waited for before the epoch ends, and
            # an abort comes first. Kept (committed) or undone, the epochs stay whole.
            j.run_until(6)
            j.votes(7)
            if late == "epoch-end-commit":
                j.outcome(7)
            j.abort("a rank lost at the epoch's end")
            j.form([0, 1])
        else:
            j.run_until(2)
            j.votes(3)                      # step 3 applied by both; they sleep, then compute 4
            if late == "rollback":
                j.outcome(3, commit=False)  # heard in step 4's opt.step(): 4 dropped, 3 again
            else:
                j.abort("a rank lost while step 4 computes")
                j.form([0, 1])              # resumes after step 2
            j.votes(3)
            j.outcome(3)
        j.run_until(STEPS - 1)
        for r in range(2):
            assert j.processes[r].wait(timeout=120) == 0, j.log(r)
    finally:
        j.close()
    reference, ref_ledger = tmp_path / "plain.pt", tmp_path / "plain.ledger"
    run_plain_ddp(TRAIN, 2, reference, ledger=ref_ledger)
    error = relative_error(torch.load(reference), torch.load(j.out))
    assert error <= 1e-9, f"final weights: norm-relative error {error:.3e}"
    check_dropin_ledger(j.ledger, ref_ledger, DATASET, EPOCHS)
