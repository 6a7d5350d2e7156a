# SPDX-License-Identifier: Apache-2.0
"""Healthy pods under CPU overload: does the default liveness timeout take them for faults?

Runs the chaos soak's job (4 pods x 2 ranks, recover-in-place, elastic-training, prefer-elastic)
with the default heartbeat (100 ms) and liveness (5 misses: 500 ms), with no fault injected, next
to a busy loop per core for the whole run: the 8 trainers, 4 agents and the manager share the
machine with as many spinning processes as it has cores. A healthy job must finish without a
single fault declared, and with the weights and the ledger of an uninterrupted run.

    /usr/bin/python3 integration/overload.py                  # one run, prints its figures
    /usr/bin/python3 integration/overload.py --runs 5 --json overload.json

It prints, per run, the faults declared (each one a healthy pod or rank taken for dead), the
manager's stalls, and the longest silences the manager heard from each pod and rank (the
`silence_peak_ms` of `/status`) against the timeout it applied to them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster import PYTHON, Cluster, JobSpec  # noqa: E402
from scenarios import Result, check_training, reference_weights  # noqa: E402

SPIN = "import sys, time\nt = time.time() + float(sys.argv[1])\nwhile time.time() < t: pass"


def overload_job(steps: int, misses: int, heartbeat_ms: int) -> JobSpec:
    return JobSpec(nodes=4, nproc=2, steps=steps, strategies="recover-in-place,elastic-training,exit",
                   prefer_elastic=True, liveness_misses=misses, dataset=128, micro_batch=4,
                   microbatches=8, extra_annotations={"regroup.io/heartbeat-interval-ms": str(heartbeat_ms)})


def run_once(workdir: Path, job: JobSpec, loops: int, network: str, log=print) -> dict:
    result = Result(0, f"no fault, {loops} busy loops")
    reference_weights(job)
    start = time.monotonic()
    with Cluster(workdir, job, network=network, log=lambda m: log(f"  {m}")) as c:
        spinners = [c._spawn([PYTHON, "-c", SPIN, "3600", str(c.dir)], c.dir / "spin.log") for _ in range(loops)]
        try:
            c.start()
            # The longest silences as the manager saw them, sampled each second while training
            # (they are halved every 30 s, so the end alone would understate them).
            peaks: Dict[str, List[int]] = {}
            deadline = time.monotonic() + 900
            while any(p.process.poll() is None for p in c.pods.values()) and time.monotonic() < deadline:
                try:
                    nodes = c.status(timeout=2).get("nodes", [])
                except OSError:
                    nodes = []
                for key in ("silence_peak_ms", "liveness_timeout_ms", "rank_silence_peak_ms",
                            "rank_liveness_timeout_ms"):
                    now = [int(n.get(key, 0)) for n in nodes]  # proto3 JSON leaves zeros out
                    old = peaks.get(key, [0] * len(now))
                    peaks[key] = [max(a, b) for a, b in zip(old, now)] if len(old) == len(now) else now
                time.sleep(1)
            codes = c.wait_pods_exit(timeout=60)
        finally:
            for p in spinners:
                p.kill()
                p.wait(timeout=10)
        events = c.events()
        faults = [e["message"] for e in events if e["kind"] == "fault"]
        result.promise("no fault declared", not faults, "; ".join(faults)[:2000])
        result.promise("every pod exited 0", set(codes.values()) == {0}, str(codes))
        check_training(c, result)
        return {"ok": result.ok, "seconds": round(time.monotonic() - start, 1), "loops": loops,
                "network": c.net.mode, "faults": faults,
                "manager_stalls": sum(e["kind"] == "manager_stall" for e in events),
                "agent_silence_peak_ms": peaks.get("silence_peak_ms"),
                "agent_timeout_ms": peaks.get("liveness_timeout_ms"),
                "trainer_silence_peak_ms": peaks.get("rank_silence_peak_ms"),
                "trainer_timeout_ms": peaks.get("rank_liveness_timeout_ms"),
                "promises": [(what, ok, detail) for what, ok, detail in result.promises if not ok]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--loops", type=int, default=os.cpu_count() or 2, help="busy loops beside the job")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--misses", type=int, default=5, help="regroup.io/liveness-misses (default: the job default)")
    p.add_argument("--heartbeat-ms", type=int, default=100, help="regroup.io/heartbeat-interval-ms")
    p.add_argument("--network", default="auto", choices=("auto", "netns", "loopback"))
    p.add_argument("--workdir", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    job = overload_job(args.steps, args.misses, args.heartbeat_ms)
    base = Path(args.workdir or tempfile.mkdtemp(prefix="regroup-overload-"))
    runs = []
    for i in range(args.runs):
        r = run_once(base / f"run{i}", job, args.loops, args.network)
        runs.append(r)
        print(json.dumps(r), flush=True)
    bad = sum(not r["ok"] for r in runs)
    print(f"{len(runs) - bad} of {len(runs)} runs kept every promise; faults declared: "
          f"{sum(len(r['faults']) for r in runs)}; manager stalls: {sum(r['manager_stalls'] for r in runs)}")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
