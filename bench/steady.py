#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""What fault tolerance costs when nothing fails: plain DDP against regroup.Trainer (issue 15, 2).

    /usr/bin/python3 bench/steady.py                      # 2 and 4 ranks, 5 runs of each variant
    /usr/bin/python3 bench/steady.py --worlds 4 --runs 7 --steps 100
    /usr/bin/python3 bench/steady.py --smoke --json out.json   # tiny, once each (bench/smoke)
    /usr/bin/python3 bench/steady.py --pad-ms 450 --steps 30 --warmup 5   # a ~500 ms step
    /usr/bin/python3 bench/steady.py --before /tmp/old   # also the library of another tree

The same job (bench/steady_train.py: the comparison's MLP, 2.1 M parameters, global batch 64 in 8
micro-batches) three ways, runs alternated so that the machine's drift spreads over all of them:

  ddp          plain torch.nn.parallel.DistributedDataParallel under torchrun (--standalone)
  regroup-ddp  regroup.Trainer(ddp=True) under regroup-manager + regroup-agent: the same DDP
               wrapper, plus the library's step (snapshot, vote, commit through agent and manager)
  regroup      regroup.Trainer reducing the gradients itself after the backward (its default)

With ``--before DIR`` (a tree holding an earlier python/regroup, e.g. ``git archive COMMIT python |
tar -x -C DIR``) two more variants run the regroup ones with that library, alternated with the
rest: ``regroup-ddp@before`` and ``regroup@before``. ``--pad-ms`` makes every step longer by a sleep
after the backward (in every variant), standing in for an accelerator's compute.

Each run's step time is the median gap between consecutive step ends on rank 0, after --warmup
steps; a variant's figure is the median of its runs' medians, with their spread (min..max). The
regroup variants also report where a step's time goes, from the trainer's own timings summed over
the steps (Trainer.metrics): the vote (vote sent to outcome heard: the agent and manager's round
trip plus waiting for the slowest rank), the reduce (without DDP) and the checksums. Every process
started here is killed at the end of its run; every wait is bounded.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BUILD = Path(os.environ.get("REGROUP_BIN_DIR") or os.environ.get("BUILD_DIR") or REPO / "build")
# Debian's python3 with torch 1.13, or $REGROUP_PYTHON (scripts/torch2's venv: torch 2.x).
PYTHON = os.environ.get("REGROUP_PYTHON") or "/usr/bin/python3"
TRAIN = HERE / "steady_train.py"
VARIANTS = ("ddp", "regroup-ddp", "regroup")

sys.path.insert(0, str(HERE / "compare"))
from common import free_port, loadavg  # noqa: E402


def start(argv: List[str], env: Dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "w") as f:
        return subprocess.Popen(argv, env={**os.environ, **env}, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)


def kill(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        pass


def one_run(variant: str, world: int, args, work: Path) -> dict:
    """One training run; returns rank 0's result (step gaps, trainer metrics)."""
    work.mkdir(parents=True)
    out = work / "result.json"
    mode, _, library = variant.partition("@")
    train = [str(TRAIN), "--mode", mode, "--steps", str(args.steps), "--out", str(out),
             "--checksum-interval", str(args.checksum_interval), "--pad-ms", str(args.pad_ms)]
    env = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    if library:
        env["REGROUP_LIBRARY"] = str(Path(args.before) / "python")
    procs: List[subprocess.Popen] = []
    try:
        if variant == "ddp":
            # --redirects/--tee non-zero: Debian's torch 1.13 on Python 3.11 crashes at start with
            # the default 0 (bench/compare/recovery.py).
            procs.append(start([PYTHON, "-m", "torch.distributed.run", "--redirects=2", "--tee=2",
                                "--standalone", f"--nproc_per_node={world}", *train], env, work / "torchrun.log"))
            waited = procs[0]
        else:
            credential = work / "credential"
            credential.write_text(os.urandom(16).hex())
            credential.chmod(0o600)
            env["REGROUP_CREDENTIAL_FILE"] = str(credential)
            port_file = work / "manager.port"
            procs.append(start([str(BUILD / "regroup-manager"), "--job-id", "steady", "--nodes", "1",
                                "--nproc-per-node", str(world), "--listen", "127.0.0.1:0",
                                "--port-file", str(port_file), "--record", str(work / "record.json"),
                                "--label", "fault-scheduling=force",
                                "--annotation", "regroup.io/global-batch-size=64",
                                "--annotation", "regroup.io/micro-batch-size=8",
                                "--annotation", f"regroup.io/checksum-interval={args.checksum_interval}"],
                               env, work / "manager.log"))
            deadline = time.monotonic() + 30
            while not (port_file.exists() and port_file.read_text().strip()):
                if time.monotonic() > deadline or procs[0].poll() is not None:
                    raise RuntimeError(f"the manager did not start: {(work / 'manager.log').read_text()[-2000:]}")
                time.sleep(0.02)
            procs.append(start([str(BUILD / "regroup-agent"), "--manager", f"127.0.0.1:{port_file.read_text().strip()}",
                                "--job-id", "steady", "--nnodes", "1", "--nproc-per-node", str(world),
                                "--node-rank", "0", "--master-addr", "127.0.0.1", "--host", "127.0.0.1",
                                "--socket-dir", str(work / "sock"), "--python", PYTHON, *train],
                               env, work / "agent.log"))
            waited = procs[1]
        try:
            code = waited.wait(args.timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{variant} x{world} did not finish within {args.timeout} s (logs in {work})")
        if code != 0 or not out.exists():
            logs = "\n".join(f"== {f.name}\n{f.read_text()[-2000:]}" for f in sorted(work.glob("*.log")))
            raise RuntimeError(f"{variant} x{world} exited {code}:\n{logs}")
        return json.loads(out.read_text())
    finally:
        for p in reversed(procs):
            kill(p)


def summarize(results: List[dict], warmup: int) -> dict:
    medians = [statistics.median(r["step_s"][warmup:]) for r in results]
    row = {"runs": len(results), "step_ms": 1000 * statistics.median(medians),
           "min_ms": 1000 * min(medians), "max_ms": 1000 * max(medians)}
    parts = {}
    for key in ("vote_s", "vote_round_trip_s", "undo_s", "reduce_s", "checksum_s"):
        per = [r["metrics"][key] / r["metrics"]["committed_steps"] for r in results
               if r["metrics"].get("committed_steps") and key in r["metrics"]]
        if per:
            parts[key[:-2] + "_ms"] = 1000 * statistics.median(per)
    held = [r["metrics"][k] for r in results for k in r["metrics"] if k.startswith("undo_bytes_")]
    if held:
        parts["undo_mb"] = max(held) / 2 ** 20
    row.update(parts)
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worlds", default="2,4", help="world sizes, comma-separated")
    p.add_argument("--runs", type=int, default=5, help="runs of each variant at each world size")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--warmup", type=int, default=10, help="steps left out of each run's median")
    p.add_argument("--checksum-interval", type=int, default=0,
                   help="regroup variants: a checksum vote every N steps (0: none)")
    p.add_argument("--timeout", type=float, default=600, help="seconds one run may take")
    p.add_argument("--pad-ms", type=float, default=0.0, help="a sleep in every step (a longer step)")
    p.add_argument("--before", default=None,
                   help="a tree with an earlier python/regroup: its regroup variants run too")
    p.add_argument("--smoke", action="store_true", help="tiny: 2 ranks, one run of each, 12 steps")
    p.add_argument("--json", default=None, help="also write the figures here")
    args = p.parse_args()
    if args.smoke:
        args.worlds, args.runs, args.steps, args.warmup = "2", 1, 12, 2
    for b in ("regroup-manager", "regroup-agent"):
        if not (BUILD / b).exists():
            raise SystemExit(f"{BUILD / b} is missing: run scripts/setup (or set REGROUP_BIN_DIR)")
    worlds = [int(w) for w in args.worlds.split(",")]
    variants = VARIANTS + (("regroup-ddp@before", "regroup@before") if args.before else ())
    torch_version = subprocess.run([PYTHON, "-c", "import torch; print(torch.__version__)"],
                                   capture_output=True, text=True, check=True).stdout.strip()
    print(f"torch {torch_version} ({PYTHON})")
    print(f"machine: {os.cpu_count()} cores, load {loadavg()}; {args.runs} runs x {args.steps} steps "
          f"(median after {args.warmup}), pad {args.pad_ms:g} ms, variants {', '.join(variants)}", flush=True)
    figures: Dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="regroup-steady-") as tmp:
        for world in worlds:
            results: Dict[str, List[dict]] = {v: [] for v in variants}
            for run in range(args.runs):
                for variant in (variants if run % 2 == 0 else tuple(reversed(variants))):
                    r = one_run(variant, world, args, Path(tmp) / f"{world}-{variant}-{run}")
                    results[variant].append(r)
                    print(f"  x{world} {variant:18s} run {run}: "
                          f"{1000 * statistics.median(r['step_s'][args.warmup:]):.1f} ms/step", flush=True)
            base = None
            for variant in variants:
                row = summarize(results[variant], args.warmup)
                base = base or row["step_ms"]
                row["vs_ddp"] = row["step_ms"] / base
                figures[f"{variant}_x{world}"] = row
                extra = "".join(f", {k} {v:.2f}" for k, v in row.items() if k.endswith(("_ms", "_mb"))
                                and k not in ("step_ms", "min_ms", "max_ms"))
                print(f"x{world} {variant:18s} {row['step_ms']:7.1f} ms/step (runs {row['min_ms']:.1f}.."
                      f"{row['max_ms']:.1f}), {100 * (row['vs_ddp'] - 1):+.1f}% vs ddp{extra}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
