# SPDX-License-Identifier: Apache-2.0
"""The pipeline schedule (torch 2.x): examples/train_grid.py on a tp 2 x pp 2 grid equals one
process computing the whole model (1F1B; GPipe runs in integration scenario 40), with its blocks
split by hand and with DTensor (``--tp-impl dtensor``: the schedule built on the trainer's
module); on torch 1.13 a clear ConfigError."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from regroup.api import ConfigError
from regroup.testing import PYTHON, free_port, relative_error

HERE = Path(__file__).resolve().parent
GRID = HERE.parents[1] / "examples" / "train_grid.py"
ARGS = ["--steps", "6", "--float64", "--dataset", "64", "--microbatches", "4", "--micro-batch", "4", "--quiet"]

try:
    import torch.distributed.pipelining  # noqa: F401
    PIPELINING = True
except ImportError:
    PIPELINING = False
needs_pipelining = pytest.mark.skipif(
    not PIPELINING, reason=f"torch.distributed.pipelining needs torch 2.4 or later; this is torch {torch.__version__}")


@pytest.mark.skipif(PIPELINING, reason="this torch has torch.distributed.pipelining")
def test_without_pipelining_a_pipeline_is_refused_naming_the_torch():
    from regroup.pipeline import Pipeline

    with pytest.raises(ConfigError, match=r"torch 2.4 or later\); this is torch " + re.escape(str(torch.__version__))):
        Pipeline(torch.nn.Linear(2, 2), lambda o, t: o.sum(), torch.zeros(1, 2), torch.zeros(1, 2))


@needs_pipelining
@pytest.mark.parametrize("tp_impl", ["hand", "dtensor"])
def test_a_tp2_pp2_grid_equals_one_process_computing_the_whole_model(tmp_path, procs, tp_impl, schedule="1f1b"):
    """1F1B here; GPipe (train_grid.py's default) in integration scenario 40."""
    env = {"OMP_NUM_THREADS": "1"}
    subprocess.run([PYTHON, str(GRID), *ARGS, "--out", str(tmp_path / "ref.pt")], check=True,
                   timeout=300, env={**os.environ, **env}, stdout=subprocess.DEVNULL)
    port = str(free_port())
    workers = [procs.start([PYTHON, str(GRID), *ARGS, "--tp", "2", "--pp", "2", "--schedule", schedule,
                            "--tp-impl", tp_impl,
                            "--out", str(tmp_path / "grid.pt"), "--verbose"],
                           {**env, "WORLD_SIZE": "4", "RANK": str(r), "MASTER_ADDR": "127.0.0.1",
                            "MASTER_PORT": port}, log=tmp_path / f"r{r}.log") for r in range(4)]
    for r, w in enumerate(workers):
        assert w.wait(timeout=300) == 0, (tmp_path / f"r{r}.log").read_text()[-3000:]
    assert "pipeline stage 1 of 2 rebuilt for generation 1" in (tmp_path / "r3.log").read_text()
    error = relative_error(torch.load(tmp_path / "ref.pt"), torch.load(tmp_path / "grid.pt"))
    assert error <= 1e-9, error


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
