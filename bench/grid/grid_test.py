#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""bench/grid's comparison is of the same training: rank.py's plain variant (no Regroup) ends with
the weights of examples/train_grid.py's one-process reference (float64, norm-relative 1e-9), at
dp 2 x tp 2, and where the python has torch.distributed.pipelining ($REGROUP_PYTHON: torch 2.x)
at dp 2 x pp 2 too; and the recovery figures' arithmetic (bench.window_figures). Four processes
of a few seconds each; /usr/bin/python3 (torch 1.13: the pipeline case is skipped, saying why)."""

import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench  # noqa: E402

sys.path.insert(0, str(bench.REPO / "python"))
from regroup.testing import relative_error  # noqa: E402

PYTHON = bench.sharded_bench.PYTHON
DATA = ["--float64", "--optimizer", "adam", "--dataset", "64", "--micro-batch", "4", "--microbatches", "4",
        "--steps", "8", "--quiet", "--features", "8", "--hidden", "8", "--ffn", "16", "--blocks", "2"]


def has_pipelining() -> bool:
    probe = subprocess.run([PYTHON, "-c", "import torch.distributed.pipelining"], capture_output=True, timeout=120)
    return probe.returncode == 0


class PlainIsTheSameTraining(unittest.TestCase):
    def check(self, dp: int, tp: int, pp: int) -> None:
        import torch
        with tempfile.TemporaryDirectory() as d:
            ref, out = Path(d, "ref.pt"), Path(d, "plain.pt")
            subprocess.run([PYTHON, str(bench.REPO / "examples" / "train_grid.py"), *DATA, "--out", str(ref)],
                           check=True, timeout=300)
            bench.sharded_bench.run("plain", dp * tp * pp,
                                    [*DATA, "--tp", str(tp), "--pp", str(pp), "--warmup", "1", "--out", str(out)],
                                    bench.RANK)
            err = relative_error(torch.load(ref), torch.load(out))
            self.assertLess(err, 1e-9, f"dp {dp} x tp {tp} x pp {pp}: the plain variant's weights differ by {err}")

    def test_dp2_tp2(self):
        self.check(2, 2, 1)

    def test_dp2_pp2(self):
        if not has_pipelining():
            self.skipTest(f"{PYTHON}'s torch has no torch.distributed.pipelining (set REGROUP_PYTHON to torch 2.x's)")
        self.check(2, 1, 2)


def line(t, sent, committed=True):
    return {"t": t, "step": 0, "committed": committed, "rank": 0, "dp": 1, "world": 1, "sent": sent}


class WindowFigures(unittest.TestCase):
    def test_the_longest_gap_ending_in_the_window_and_the_bytes_sent_in_it(self):
        times = {
            # a survivor: a 3 s gap across the window's start (the fault's), a 5 s one across its
            # end (the next fault's, not this one's)
            "a": [line(0.0, 0), line(1.0, 0), line(4.0, 100), line(4.5, 100), line(9.5, 150)],
            # another survivor: its 9 s gap ends before the window
            "b": [line(-10.0, 0), line(-1.0, 0), line(2.0, 0), line(3.0, 40)],
            # a process killed in the window: what it sent before the window does not count
            "c": [line(0.5, 7), line(2.5, 9)],
            # an uncommitted step's end is no end of a stop
            "d": [line(1.5, 0), line(5.0, 0, committed=False), line(5.9, 0)],
        }
        got = bench.window_figures(times, 2.0, 6.0, ["a", "b", "d"])
        self.assertAlmostEqual(got["longest_stop_s"], 4.4)   # d's 1.5 .. 5.9
        self.assertEqual(got["state_bytes_sent"], 100 + 40 + 2)
        got = bench.window_figures(times, 2.0, 6.0, ["a", "b"])
        self.assertEqual(got["longest_stop_s"], 3.0)
        got = bench.window_figures(times, 6.0, 10.0, ["a", "b"])
        self.assertEqual(got, {"longest_stop_s": 5.0, "state_bytes_sent": 50})

if __name__ == "__main__":
    unittest.main()
