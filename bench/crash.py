# SPDX-License-Identifier: Apache-2.0
"""A crashed trainer, measured (issue 15): from the crash to the next committed step, and the
longest time without a committed step around it, as a ratio to `python3 -c 'import torch'`.

    /usr/bin/python3 bench/crash.py                      # 5 crashes, today's defaults
    /usr/bin/python3 bench/crash.py --warm-start off --survivors-continue false   # as before

The demo's shape: 4 nodes x 2 ranks of examples/train_mlp.py on the local cluster, a standalone
manager, the demo's job (`--step-sleep 0.1`: a step is about 0.15 s). After a warm-up, a trainer
is SIGKILLed every few seconds (each time another node's local rank 1, never global rank 0).
Commits are timed by polling the manager's /metrics every 10 ms (`regroup_committed_step`), so
each figure is good to about 10 ms. `python3 -c 'import torch'` is timed three times in the same
run, before the job starts, on the same machine: what a plain restart pays at least.

It prints one `key=value` line per crash and a summary line; the run fails (exit 1) only if the
job does, never on a figure. bench/README.md holds the results.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import List, Optional, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))

from cluster import PYTHON, Cluster, JobSpec  # noqa: E402

COMMITTED = re.compile(r"^regroup_committed_step\{[^}]*\} (-?\d+)", re.M)


class CommitClock:
    """When each step committed, as seen by polling the manager's /metrics."""

    def __init__(self, c: Cluster, interval: float = 0.01):
        self.c, self.interval = c, interval
        self.commits: List[Tuple[float, int]] = []  # (monotonic time, step), in order
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        last = None
        while not self._stop.is_set():
            request = self.c.status_request(self.c.http_port)
            request.full_url = request.full_url.replace("/status", "/metrics")
            try:
                with urllib.request.urlopen(request, timeout=1) as r:
                    m = COMMITTED.search(r.read().decode())
            except OSError:
                m = None
            now = time.monotonic()
            if m:
                step = int(m.group(1))
                if step != last:
                    self.commits.append((now, step))
                    last = step
            self._stop.wait(self.interval)

    def first_after(self, t: float) -> Optional[float]:
        return next((at for at, _ in self.commits if at > t), None)

    def longest_gap(self, since: float, until: float) -> float:
        """The longest time without a commit from the last commit before `since` to `until`."""
        times = [at for at, _ in self.commits if at <= until]
        before = [at for at in times if at <= since]
        times = ([before[-1]] if before else []) + [at for at in times if at > since]
        return max((b - a for a, b in zip(times, times[1:])), default=0.0)

    def step_time(self, until: float) -> float:
        gaps = [b - a for (a, _), (b, _) in zip(self.commits, self.commits[1:]) if b <= until]
        return statistics.median(gaps[-20:]) if gaps else 0.0


def import_torch_seconds(samples: int = 3) -> float:
    times = []
    for _ in range(samples):
        began = time.monotonic()
        subprocess.run([PYTHON, "-c", "import torch"], check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        times.append(time.monotonic() - began)
    return statistics.median(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--crashes", type=int, default=5)
    p.add_argument("--every", type=float, default=6.0, help="seconds between crashes")
    p.add_argument("--warm-start", choices=("on", "off"), default="on")
    p.add_argument("--survivors-continue", choices=("true", "false"), default="true")
    p.add_argument("--network", default="auto", choices=("auto", "netns", "loopback"))
    p.add_argument("--workdir", default=None)
    args = p.parse_args(argv)

    torch_s = import_torch_seconds()
    version = subprocess.run([PYTHON, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                             text=True, check=True).stdout.strip()
    print(f"torch={version} python={PYTHON} import_torch_s={torch_s:.3f}", flush=True)
    steps = int((args.crashes * args.every + 15) / 0.15)
    job = JobSpec(nodes=4, nproc=2, steps=steps, step_sleep=0.1, prefer_elastic=True,
                  dataset=512, micro_batch=4, microbatches=16,
                  extra_annotations={"regroup.io/survivors-continue": args.survivors_continue})
    os.environ["REGROUP_WARM_START"] = args.warm_start
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="regroup-crash-"))
    rows = []
    with Cluster(workdir, job, network=args.network, log=lambda m: None) as c:
        c.start()
        c.wait_step(40)
        clock = CommitClock(c)
        clock.start()
        time.sleep(2)
        try:
            for k in range(args.crashes):
                node = f"node-{1 + k % 3}"
                kill_at = time.monotonic()
                c.kill_trainer(node, 1)
                time.sleep(args.every)
                first = clock.first_after(kill_at)
                row = {"crash": k + 1, "node": node,
                       "to_next_commit_s": (first - kill_at) if first else float("nan"),
                       "longest_stop_s": clock.longest_gap(kill_at, kill_at + args.every - 0.5),
                       "step_s": clock.step_time(kill_at)}
                rows.append(row)
                print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                      flush=True)
        finally:
            clock.stop()
        codes = c.wait_pods_exit(timeout=600)
        failed = [name for name, code in codes.items() if code != 0]
    next_commit = statistics.median(r["to_next_commit_s"] for r in rows)
    longest = max(r["longest_stop_s"] for r in rows)
    print(f"crashes={len(rows)} warm_start={args.warm_start} survivors_continue={args.survivors_continue} "
          f"next_commit_s_median={next_commit:.3f} "
          f"next_commit_s_max={max(r['to_next_commit_s'] for r in rows):.3f} longest_stop_s_max={longest:.3f} "
          f"step_s={statistics.median(r['step_s'] for r in rows):.3f} import_torch_s={torch_s:.3f} "
          f"ratio_next_commit_to_import_torch={next_commit / torch_s:.2f} "
          f"loadavg_1m={os.getloadavg()[0]:.2f} result={'ok' if not failed else 'failed:' + ','.join(failed)}")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
