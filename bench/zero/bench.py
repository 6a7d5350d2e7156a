#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""ZeRO-1 under Regroup: steady-state step against torch's own ZeRO-1 and against Regroup without
optimizer sharding, and the optimizer state a rank holds and a recovery moves.

    /usr/bin/python3 bench/zero/bench.py --runs 3         (REGROUP_PYTHON: another torch)

Starts bench/zero/steady_zero.py on ``--world`` ranks (torchrun's environment, gloo, CPU) for each
variant, alternating runs so the machine's drift spreads over all, and prints each variant's
median step time (the median of its runs' medians, with the spread) and the bytes rank 0 holds
and would move. The recovery figures (time to the next committed step through a killed rank, a
lost node and its return) come from integration scenarios 50 and 51 (bench/README.md). Every
process started here is waited for (bounded) and killed if it outlives its bound (bench/sharded).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("sharded_bench", HERE.parent / "sharded" / "bench.py")
sharded_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sharded_bench)

VARIANTS = ("torch", "regroup", "zero1", "zero1x2")


def main() -> int:
    a = argparse.ArgumentParser()
    a.add_argument("--runs", type=int, default=3)
    a.add_argument("--world", type=int, default=4)
    a.add_argument("--steps", type=int, default=40)
    a.add_argument("--json", default=None)
    args = a.parse_args()
    extra = ["--steps", str(args.steps)]
    results = {v: [] for v in VARIANTS}
    for _ in range(args.runs):
        for variant in VARIANTS:
            results[variant].append(sharded_bench.run(variant, args.world, extra, HERE / "steady_zero.py"))
    summary = {}
    for variant, runs in results.items():
        steps = [r["step_s"] for r in runs]
        last = runs[-1]
        summary[variant] = {"step_ms": statistics.median(steps) * 1000, "min_ms": min(steps) * 1000,
                            "max_ms": max(steps) * 1000, "optimizer_state_bytes": last["optimizer_state_bytes"],
                            **{k: last[k] for k in ("sync_bytes", "slices_bytes") if k in last}}
        extras = "".join(f", {k} {summary[variant][k]}" for k in ("sync_bytes", "slices_bytes") if k in summary[variant])
        print(f"{variant:8s} median step {summary[variant]['step_ms']:.1f} ms "
              f"(runs {summary[variant]['min_ms']:.1f}..{summary[variant]['max_ms']:.1f}); rank 0 holds "
              f"{last['optimizer_state_bytes']} bytes of optimizer state{extras}")
    for variant, base in (("zero1", "torch"), ("zero1", "regroup"), ("zero1x2", "zero1")):
        print(f"{variant} over {base}: {(summary[variant]['step_ms'] / summary[base]['step_ms'] - 1) * 100:+.1f} % per step")
    print(f"parameters: {results['regroup'][-1]['param_bytes']} bytes ({args.world} ranks)")
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "runs": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
