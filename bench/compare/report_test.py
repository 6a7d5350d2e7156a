#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Unit tests of part C's measures and table (bench/compare/common.py, report.py): what the
harness computes from the trainers' records, so a broken report fails CI without running the
comparison (which takes about an hour). /usr/bin/python3 (numpy, matplotlib), a second or two."""

import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import report  # noqa: E402


def rec(step, rank, world, indices, t):
    return {"kind": "samples", "step": step, "rank": rank, "world": world, "indices": indices, "t": t}


class Lineage(unittest.TestCase):
    def test_a_redone_step_replaces_its_first_attempt(self):
        events = [rec(0, 0, 2, [1, 2], 1.0), rec(0, 1, 2, [3, 4], 1.1),
                  rec(1, 0, 2, [5, 6], 2.0), rec(1, 1, 2, [7, 8], 2.1),
                  # a restart from the checkpoint of step 0 redoes step 1 at one rank
                  rec(1, 0, 1, [5, 6, 7, 8], 5.0)]
        steps, incomplete = common.lineage(events)
        self.assertEqual(sorted(steps[1]), [5, 6, 7, 8])
        self.assertEqual(incomplete, set())

    def test_a_step_missing_a_ranks_record_is_incomplete_and_left_out(self):
        ref = common.lineage([rec(0, 0, 2, [1, 2], 1), rec(0, 1, 2, [3, 4], 1), rec(1, 0, 2, [5, 6], 2),
                              rec(1, 1, 2, [7, 8], 2)])
        run = common.lineage([rec(0, 0, 2, [1, 2], 1), rec(1, 0, 2, [5, 6], 2), rec(1, 1, 2, [7, 8], 2)])
        self.assertEqual(run[1], {0})
        self.assertEqual(common.sample_diff(ref, run), {"lost": 0, "repeated": 0, "skipped": 1})

    def test_lost_and_repeated_samples_are_multiset_differences(self):
        ref = common.lineage([rec(0, 0, 1, [1, 2], 1), rec(1, 0, 1, [3, 4], 2)])
        # a smaller batch at step 0 (a group missing), and a replay of sample 1 at step 1
        run = common.lineage([rec(0, 0, 1, [1], 1), rec(1, 0, 1, [3, 4, 1], 2)])
        self.assertEqual(common.sample_diff(ref, run), {"lost": 1, "repeated": 1, "skipped": 0})


class Measures(unittest.TestCase):
    def test_changed_lines_count_code_only(self):
        plain = '"""doc"""\nimport a\n\n# comment\nx = 1\ny = 2\n'
        adopted = '"""another doc,\nlonger"""\nimport a\nimport b  \nx = 1\n# a new comment\ny = 3\n'
        self.assertEqual(common.changed_lines(plain, adopted), {"added": 2, "removed": 1})
        with self.assertRaises(ValueError):
            common.changed_lines(plain, "def (")

    def test_steady_step_is_the_median_gap_after_the_first_steps(self):
        tl = [[0.0, 0, 4], [5.0, 1, 4], [5.5, 2, 4], [6.0, 3, 4], [6.7, 4, 4], [7.0, 5, 4]]
        self.assertAlmostEqual(common.steady_step_s(tl, skip=2), 0.5)

    def test_weights_diff(self):
        import numpy as np
        with tempfile.TemporaryDirectory() as d:
            a, b, c = Path(d, "a"), Path(d, "b"), Path(d, "c")
            np.array([1.0, 2.0], dtype=np.float32).tofile(a)
            np.array([1.0, 2.5], dtype=np.float32).tofile(b)
            np.array([1.0], dtype=np.float32).tofile(c)
            w = common.weights_diff(a, b)
            self.assertAlmostEqual(w["max_abs"], 0.5)
            self.assertAlmostEqual(w["rel_l2"], 0.5 / 5 ** 0.5)
            with self.assertRaisesRegex(ValueError, "1 parameters"):
                common.weights_diff(a, c)
            self.assertIsNone(common.weights_diff(a, Path(d, "missing")))


class Table(unittest.TestCase):
    def run_row(self, system, baseline, resume, **kw):
        faults = [] if baseline else [
            {"fault": "trainer", "resume_s": resume, "pause_s": resume, "redone": 0},
            {"fault": "node", "resume_s": resume * 2, "pause_s": resume * 2, "redone": 1},
            dict({"fault": "return", "redone": 0}, **({"unsupported": "cannot grow"} if system == "nvrx"
                                                      else {"at_s": 20.0} if system == "torchft"
                                                      else {"resume_s": 3.0, "pause_s": 0.5}))]
        return dict({"system": system, "baseline": baseline, "ok": True, "steps": 60, "job_s": 30.0,
                     "steady_step_s": 0.25, "loadavg_before": "3.5 2 1", "faults": faults}, **kw)

    def test_the_peers_table_has_every_system_ratios_and_says_why_a_cell_is_empty(self):
        rows = [self.run_row("regroup", True, 0), self.run_row("regroup", False, 0.5, samples_lost=0, samples_repeated=0,
                                                               weights_vs_fault_free={"rel_l2": 1e-7, "max_abs": 1e-8}),
                self.run_row("torchft", True, 0), self.run_row("torchft", False, 2.0, samples_lost=48, samples_repeated=0),
                self.run_row("nvrx", False, 5.0),
                {"system": "nvrx", "baseline": False, "ok": False, "error": "TimeoutError: the last step"},
                self.run_row("torchrun-ckpt10", True, 0),
                {"system": "torchrun-ckpt10", "baseline": False, "ok": False, "error": "TimeoutError: recovery"}]
        text = report.peers_table(rows)
        self.assertIn("torchft 0.2.0", text)
        self.assertIn("| a trainer process killed | fault -> next committed step (s) | 0.50 | failed (1) | 2.00 | 5.00 | - | 0.25 | 0.10 |", text)
        self.assertIn("(1) torchrun, ckpt every 10 steps: every run with faults failed (1): TimeoutError: recovery.", text)
        self.assertIn("not supported (3)", text)
        self.assertIn("(3) cannot grow.", text)
        self.assertIn("not back by the end (2)", text)
        self.assertIn("(2) torchft 0.2.0: the job ended 10 to 10 s after the fault", text)
        self.assertIn("| 0 / 0 | failed (1) / failed (1) | 48 / 0 | n/a / n/a |", text)
        self.assertIn("1.0e-07 / 1.0e-08", text)
        self.assertIn("1 failed (TimeoutError: the last step)", text)
        with tempfile.TemporaryDirectory() as d:
            report.peers_plot(rows, Path(d))
            self.assertGreater(Path(d, "peers.png").stat().st_size, 1000)
        # the script cost is computed from the scripts themselves
        self.assertRegex(text, r"\| \+\d+ / -\d+ \| \+\d+ / -\d+ \(the same script as Regroup's\) \| "
                               r"\+\d+ / -\d+ \| \+\d+ / -\d+ \|")


if __name__ == "__main__":
    unittest.main()
