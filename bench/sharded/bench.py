#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""HSDP with Regroup: steady-state overhead against plain FSDP2, and the state a recovery moves.

    REGROUP_PYTHON=$(scripts/torch2) /usr/bin/python3 bench/sharded/bench.py --runs 3

Starts bench/sharded/steady_hsdp.py on ``--world`` ranks (torchrun's environment, gloo, CPU)
for each variant, alternating runs so the machine's drift spreads over both, and prints each
variant's median step time (the median of its runs' medians, with the spread), and the bytes of
one rank's state (what regroup.sync sends a replacement rank: its local shards of the parameters
and of Adam's two moments). The recovery figures (time to the next committed step, the longest
stop) come from integration scenario 30 (bench/sharded/README.md). Every process started here is
waited for (bounded) and killed if it outlives its bound.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PYTHON = os.environ.get("REGROUP_PYTHON", sys.executable)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(variant: str, world: int, extra, script: Path = HERE / "steady_hsdp.py") -> dict:
    """One run of ``script`` (``--variant``) on ``world`` ranks: rank 0's JSON line."""
    port = free_port()
    procs = [subprocess.Popen([PYTHON, str(script), "--variant", variant, *extra],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1", "RANK": str(r), "WORLD_SIZE": str(world),
                                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
             for r in range(world)]
    result = None
    try:
        for r, p in enumerate(procs):
            out, err = p.communicate(timeout=600)
            if p.returncode:
                raise SystemExit(f"{variant} rank {r} exited with {p.returncode}: {err[-2000:]}")
            if r == 0:
                result = json.loads(out.strip().splitlines()[-1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    return result


def main() -> int:
    a = argparse.ArgumentParser()
    a.add_argument("--runs", type=int, default=3)
    a.add_argument("--world", type=int, default=4)
    a.add_argument("--shard", type=int, default=2)
    a.add_argument("--steps", type=int, default=40)
    a.add_argument("--json", default=None)
    args = a.parse_args()
    extra = ["--shard", str(args.shard), "--steps", str(args.steps)]
    results = {"plain": [], "regroup": []}
    for _ in range(args.runs):
        for variant in results:
            results[variant].append(run(variant, args.world, extra))
    summary = {}
    for variant, runs in results.items():
        steps = [r["step_s"] for r in runs]
        summary[variant] = {"step_ms": statistics.median(steps) * 1000, "min_ms": min(steps) * 1000,
                            "max_ms": max(steps) * 1000}
        print(f"{variant:8s} median step {summary[variant]['step_ms']:.1f} ms "
              f"(runs {summary[variant]['min_ms']:.1f}..{summary[variant]['max_ms']:.1f})")
    overhead = summary["regroup"]["step_ms"] / summary["plain"]["step_ms"] - 1
    print(f"regroup over plain: {overhead * 100:+.1f} % per step ({args.world} ranks, replicas of {args.shard})")
    last = results["regroup"][-1]
    print(f"one rank's state (what a replacement rank receives): {last['state_bytes_per_rank']} bytes; "
          f"the full model's parameters and Adam moments: {last['full_model_state_bytes']} bytes")
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "runs": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
