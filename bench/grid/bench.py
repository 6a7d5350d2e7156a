#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A dp x tp x pp grid under Regroup: the steady step against the same layout without Regroup,
and what each recovery costs (issue 36).

    /usr/bin/python3 bench/grid/bench.py --layouts 2x2x1 --runs 3          # dp 2 x tp 2, torch 1.13
    REGROUP_PYTHON=$(scripts/torch2 --path) /usr/bin/python3 bench/grid/bench.py --layouts 2x2x2 --runs 3
    REGROUP_PYTHON=$(scripts/torch2 --path) /usr/bin/python3 bench/grid/bench.py --recovery
    /usr/bin/python3 bench/grid/bench.py --smoke --json out.json           # tiny (bench/smoke)

The job is examples/train_grid.py's model (bench/grid/rank.py runs it both ways): by default a
64-256-8 MLP with 4 residual blocks of inner width 1024 (2.2 M parameters), float64, Adam, global
batch 64 in 4 micro-batches of 16.

**Steady state** (``--layouts DPxTPxPP,...``): for each layout, ``--runs`` runs of each variant,
alternated so that the machine's drift spreads over both:

  plain    rank.py --variant plain on ``dp*tp*pp`` processes with torchrun's environment (gloo on
           loopback): the same model, tensor-parallel split and pipeline schedule on plain
           torch.distributed groups, no Regroup at all (bench/sharded/bench.py's ``run``)
  regroup  examples/train_grid.py under regroup-manager + regroup-agent (one pod of ``dp*tp*pp``
           ranks, integration/cluster.py's standalone cluster on loopback), checksums off: the
           library's step, the vote through agent and manager, the groups of a generation

A run's figure is the median gap between rank 0's step ends after ``--warmup`` steps; a
variant's, the median of its runs' (with their spread).

**Recovery** (``--recovery``, torch 2.x: pipeline stages): dp 2 x tp 2 x pp 2 on two pods of four
ranks (prefer-elastic; network namespaces where allowed, as integration scenario 40): a trainer of
pod 1 is SIGKILLed (restart in place), then pod 1's node is lost (its agent and trainers
SIGKILLed: scale-in to dp 1), then a new node and pod come (scale-out to dp 2). For each fault:
the time to the next committed step (the manager's "resumed" event, as the scenarios measure it),
to the first step at full size again, the longest stop of the survivors' steps (the longest gap
between consecutive committed step ends of a trainer that lived through it all, over the fault's
window), and the bytes of state sent to new or returning ranks in that window (the trainers'
``state_bytes_sent``, recorded at every step end by rank.py). Every process started here is
stopped by the cluster's close (or bench/sharded's bounded waits); every wait is bounded.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "integration"))
sys.path.insert(0, str(REPO / "bench" / "compare"))

from cluster import Cluster, JobSpec  # noqa: E402
from common import loadavg  # noqa: E402
from scenarios import Result, measure  # noqa: E402

_spec = importlib.util.spec_from_file_location("sharded_bench", REPO / "bench" / "sharded" / "bench.py")
sharded_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sharded_bench)   # run(): plain processes with torchrun's environment

RANK = HERE / "rank.py"
VARIANTS = ("plain", "regroup")


class GridJob(JobSpec):
    """integration/cluster.py's job, its trainers running bench/grid/rank.py --variant regroup
    (examples/train_grid.py, recording each step's end)."""

    @property
    def script(self) -> Path:
        return RANK

    def train_args(self, ledger: Path, out: Path) -> List[str]:
        return ["--variant", "regroup", *super().train_args(ledger, out)]


def model_args(args) -> List[str]:
    return ["--features", str(args.features), "--hidden", str(args.hidden), "--ffn", str(args.ffn),
            "--blocks", str(args.blocks), "--outputs", "8"]


def read_times(directory: Path) -> Dict[str, List[dict]]:
    """Each trainer process's step ends (rank.py's lines), by file, in order."""
    out = {}
    for f in sorted(directory.glob("*.jsonl")):
        lines = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        if lines:
            out[f.stem] = lines
    return out


def plain_run(layout, args) -> float:
    dp, tp, pp = layout
    extra = ["--float64", "--optimizer", "adam", "--dataset", str(args.dataset), "--micro-batch",
             str(args.micro_batch), "--microbatches", str(args.microbatches), "--steps", str(args.steps),
             "--tp", str(tp), "--pp", str(pp), "--warmup", str(args.warmup), "--quiet", *model_args(args)]
    return sharded_bench.run("plain", dp * tp * pp, extra, RANK)["step_s"]


def regroup_run(layout, args, work: Path) -> float:
    dp, tp, pp = layout
    times = work / "times"
    times.mkdir(parents=True)
    os.environ["REGROUP_GRID_TIMES"] = str(times)   # the agent's trainers inherit it
    job = GridJob(nodes=1, nproc=dp * tp * pp, tp=tp, pp=pp, steps=args.steps, step_sleep=0.0, optimizer="adam",
                  dataset=args.dataset, micro_batch=args.micro_batch, microbatches=args.microbatches,
                  extra_train=[*model_args(args), "--checksum-interval", "0"],
                  extra_annotations={"regroup.io/checksum-interval": "0"})
    with Cluster(work, job, network="loopback", log=lambda _: None) as c:
        # 8 trainers importing torch 2.x on a loaded machine can take more than the cluster's
        # 120 s join window (the manager then waits for a replacement of the only pod)
        c.join_window_s = int(args.timeout)
        c.start()
        codes = c.wait_pods_exit(timeout=args.timeout)
        if set(codes.values()) != {0}:
            raise SystemExit(f"the regroup run exited {codes}:\n{c.logs()}")
    ends = sorted(line["t"] for lines in read_times(times).values() for line in lines
                  if line["rank"] == 0 and line["committed"])
    gaps = [b - a for a, b in zip(ends[args.warmup:], ends[args.warmup + 1:])]
    if not gaps:
        raise SystemExit(f"the regroup run recorded {len(ends)} committed steps on rank 0 (logs in {work})")
    return statistics.median(gaps)


def steady(args, tmp: Path) -> dict:
    figures = {}
    for text in args.layouts.split(","):
        layout = tuple(int(v) for v in text.split("x"))
        if len(layout) != 3 or min(layout) < 1:
            raise SystemExit(f"--layouts: {text!r} is not DPxTPxPP")
        runs: Dict[str, List[float]] = {v: [] for v in VARIANTS}
        for n in range(args.runs):
            for variant in (VARIANTS if n % 2 == 0 else tuple(reversed(VARIANTS))):
                step = (plain_run(layout, args) if variant == "plain"
                        else regroup_run(layout, args, tmp / f"{text}-{n}"))
                runs[variant].append(step)
                print(f"  {text} {variant:8s} run {n}: {step * 1000:.1f} ms/step (load {loadavg()})", flush=True)
        row = {}
        for variant, steps in runs.items():
            row[variant] = {"step_ms": statistics.median(steps) * 1000, "min_ms": min(steps) * 1000,
                            "max_ms": max(steps) * 1000, "runs_ms": [s * 1000 for s in steps]}
            print(f"{text} {variant:8s} median step {row[variant]['step_ms']:.1f} ms "
                  f"(runs {row[variant]['min_ms']:.1f}..{row[variant]['max_ms']:.1f})", flush=True)
        row["overhead"] = row["regroup"]["step_ms"] / row["plain"]["step_ms"] - 1
        print(f"{text} regroup over plain: {row['overhead'] * 100:+.1f} % a step (load {loadavg()})", flush=True)
        figures[text] = row
    return figures


def window_figures(times: Dict[str, List[dict]], start: float, end: float, survivors: List[str]) -> dict:
    """The longest gap between consecutive committed step ends of a survivor that ends in
    (start, end] (the stop a fault at ``start`` caused ends after it; one that ends after ``end``
    is the next fault's), and the state bytes every process sent in [start, end)."""
    longest = 0.0
    for name in survivors:
        ends = [line["t"] for line in times[name] if line["committed"]]
        longest = max([longest] + [b - a for a, b in zip(ends, ends[1:]) if start < b <= end])
    sent = 0
    for lines in times.values():
        before = max([line["sent"] for line in lines if line["t"] < start], default=0)
        upto = max([line["sent"] for line in lines if line["t"] < end], default=0)
        sent += upto - before
    return {"longest_stop_s": longest, "state_bytes_sent": sent}


def recovery(args, tmp: Path) -> dict:
    work = tmp / "recovery"
    times = work / "times"
    times.mkdir(parents=True)
    os.environ["REGROUP_GRID_TIMES"] = str(times)
    job = GridJob(nproc=4, tp=2, pp=2, steps=1_000_000, strategies="recover-in-place,elastic-training,exit",
                  prefer_elastic=True, optimizer="adam", dataset=args.dataset, micro_batch=args.micro_batch,
                  microbatches=args.microbatches, step_sleep=args.step_sleep, extra_train=model_args(args))
    r = Result(40, "bench/grid recovery")
    t = args.timeout
    with Cluster(work, job, network=args.network, log=print) as c:
        c.start()
        c.wait_step(5, timeout=t)
        node = c.node_of(1)
        c.wait_warm(node, timeout=t)
        before = time.time()
        c.wait_step(c.last_step() + 10, timeout=t)
        step_s = (time.time() - before) / 10
        f = c.kill_trainer(node, 3)   # the last stage's second tensor-parallel rank of replica 1
        c.wait_event("resumed", timeout=t, after_ms=int(f["at"] * 1000))
        full_f = c.wait_event("generation", "8 ranks", timeout=t, after_ms=int(f["at"] * 1000))
        c.wait_step(c.last_step() + 5, timeout=t)
        g = c.kill_node(node)
        c.wait_event("directive", "scale_in", timeout=t, after_ms=int(g["at"] * 1000))
        c.wait_step(c.last_step() + 5, timeout=t)
        new = c.add_node()
        h = c.note("add a node", node=new.name)
        c.replace_pod(1, new)
        c.wait_event("directive", "scale_out", timeout=t, after_ms=int(h["at"] * 1000))
        full_h = c.wait_event("generation", "8 ranks", timeout=t, after_ms=int(h["at"] * 1000))
        c.wait_step(c.last_step() + 5, timeout=t)
        end = time.time()
        recs = [measure(c, r, f, until=g), measure(c, r, g, until=h), measure(c, r, h, detected_kinds=("register",))]
        network = c.net.mode
    data = read_times(times)
    # The trainers that lived through every fault: a line before the first and after the last.
    survivors = [n for n, lines in data.items() if lines[0]["t"] < f["at"] and lines[-1]["t"] > int(full_h["at_ms"]) / 1000]
    # The returning pod's trainers: their first line after the node came; their first commit.
    returned = [min(line["t"] for line in lines if line["committed"]) for lines in data.values()
                if lines[0]["t"] > h["at"] and any(line["committed"] for line in lines)]
    rows = []
    for (fault, start, stop, full), rec in zip(((f, f["at"], g["at"], full_f), (g, g["at"], h["at"], None),
                                                (h, h["at"], end, full_h)), recs):
        row = {"fault": fault["fault"], "detected_by": rec.detected_by, "detection_ms": rec.detection_ms,
               "strategy": rec.strategy, "resume_ms": rec.resume_ms, "steps_lost": rec.steps_lost,
               **window_figures(data, start, stop, survivors)}
        if full is not None:
            row["full_size_s"] = int(full["at_ms"]) / 1000 - start
        rows.append(row)
    if returned:
        rows[2]["returning_first_step_s"] = min(returned) - h["at"]
    for row in rows:
        print(f"{row['fault']:24s} {row['detected_by']} {row['detection_ms']} ms, {row['strategy']}: next committed "
              f"step {row['resume_ms']} ms after the fault, " +
              (f"full size again {row['full_size_s']:.2f} s, " if "full_size_s" in row else "") +
              f"longest stop of the survivors "
              f"{row['longest_stop_s']:.2f} s, {row['state_bytes_sent']} bytes of state sent, "
              f"{row['steps_lost']} steps lost" +
              (f"; the returning pod's first step {row['returning_first_step_s']:.1f} s after the node came"
               if "returning_first_step_s" in row else ""), flush=True)
    print(f"recovery: {len(survivors)} survivors, a step {step_s * 1000:.0f} ms before the faults, network "
          f"{network}, load {loadavg()}", flush=True)
    return {"faults": rows, "step_s": step_s, "network": network, "survivors": len(survivors)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layouts", default="2x2x1,2x2x2", help="DPxTPxPP, comma-separated (pp > 1: torch 2.x)")
    p.add_argument("--runs", type=int, default=3, help="runs of each variant at each layout")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5, help="steps left out of each run's median")
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256, help="the blocks' width")
    p.add_argument("--ffn", type=int, default=1024, help="the blocks' inner width (split by tp)")
    p.add_argument("--blocks", type=int, default=4, help="residual blocks (split by pp)")
    p.add_argument("--dataset", type=int, default=1024)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--recovery", action="store_true", help="the recovery figures instead (dp 2 x tp 2 x pp 2)")
    p.add_argument("--step-sleep", type=float, default=0.05, help="--recovery: seconds of extra work a step")
    p.add_argument("--network", default="auto", help="--recovery: auto, netns or loopback")
    p.add_argument("--timeout", type=float, default=300, help="seconds one run (or one wait) may take")
    p.add_argument("--smoke", action="store_true", help="tiny: dp 2 x tp 2, one run of each, 12 steps")
    p.add_argument("--json", default=None, help="also write the figures here")
    p.add_argument("--workdir", default=None, help="keep the runs' logs and step times here (default: a "
                                                   "temporary folder, removed)")
    args = p.parse_args()
    if args.smoke:
        args.layouts, args.runs, args.steps, args.warmup = "2x2x1", 1, 12, 2
        args.hidden, args.ffn, args.features, args.dataset = 16, 32, 16, 256
    python = sharded_bench.PYTHON
    print(f"python {python}; machine: {os.cpu_count()} cores, load {loadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="regroup-grid-") as tmp:
        work = Path(args.workdir) if args.workdir else Path(tmp)
        figures = recovery(args, work) if args.recovery else steady(args, work)
    figures["load"] = loadavg()
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
