# SPDX-License-Identifier: Apache-2.0
"""The demo: an elastic training job on a local cluster surviving a crashed process, the loss of a
node (scale-in) and the node's return (scale-out), with every promise checked at the end.

    scripts/demo                         # builds what is missing, then runs this
    /usr/bin/python3 integration/demo.py --nodes 4 --nproc 2 --steps 240

While it runs it prints one line per committed step (step, loss, world size, generation) and each
of the manager's events as it happens; at the end a table of the faults (how each was detected,
the strategy, detection time, time to resume, steps lost, final weights equal to an uninterrupted
run's) and a PNG timeline of world size, throughput and faults. It exits 1 if a promise broke.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster import Cluster, JobSpec, refuse_a_used_workdir  # noqa: E402
from scenarios import Result, check_story, check_strategy, check_training, measure, reference_weights  # noqa: E402
from regroup.api import UsageError  # noqa: E402

STEP_LINE = re.compile(r"step=(\d+) loss=([0-9.eE+-]+) world=(\d+) dp=(\d+) generation=(\S+)")


class Watcher:
    """Follows the job: new step lines from the pods' output, new events from the manager, and a
    sample of (time, world size, committed step) every 0.2 s for the timeline."""

    def __init__(self, c: Cluster, t0: float, live: bool = True):
        self.c, self.t0, self.live = c, t0, live
        self.samples: List[Tuple[float, int, int]] = []
        self._seen_events = 0
        self._printed_step = -1
        self._offsets: Dict[Path, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._poll()

    def _print(self, text: str) -> None:
        if self.live:
            print(f"{time.time() - self.t0:7.1f}s  {text}", flush=True)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self._poll()

    def _poll(self) -> None:
        try:
            status = self.c.status(timeout=1)
        except OSError:
            status = None
        if status is not None:
            self.samples.append((time.time() - self.t0, int(status.get("world_size", 0)),
                                 int(status.get("committed_step", -1))))
            events = status.get("events", [])
            for e in events[self._seen_events:]:
                self._print(f"   event {e['kind']}: {e['message'][:150]}")
            self._seen_events = len(events)
        for pod in list(self.c.pods.values()) + self.c.exited:
            self._read_steps(pod.log)

    def _read_steps(self, log: Path) -> None:
        try:
            with open(log, "rb") as f:
                f.seek(self._offsets.get(log, 0))
                data = f.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1
        self._offsets[log] = self._offsets.get(log, 0) + end
        for line in data[:end].decode(errors="replace").splitlines():
            m = STEP_LINE.search(line)
            if m and int(m.group(1)) > self._printed_step:
                self._printed_step = int(m.group(1))
                self._print(f"step {m.group(1):>4}  loss {float(m.group(2)):.6f}  world {m.group(3)}  "
                            f"dp {m.group(4)}  generation {m.group(5)}")


def plot(path: Path, samples, faults, job: JobSpec) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s[0] for s in samples]
    world = [s[1] for s in samples]
    # throughput: samples per second over a 2 s window of committed steps
    thr = []
    for i, (ti, _, step) in enumerate(samples):
        j = i
        while j > 0 and samples[j - 1][0] > ti - 2.0:
            j -= 1
        dt, ds = ti - samples[j][0], step - samples[j][2]
        thr.append(ds * job.micro_batch * job.microbatches / dt if dt > 0 and ds >= 0 else 0.0)
    fig, (a, b) = plt.subplots(2, 1, figsize=(10, 5.5), sharex=True)
    a.step(t, world, where="post", color="tab:blue")
    a.set_ylabel("world size (ranks)")
    a.set_ylim(0, max(world + [1]) * 1.2)
    b.plot(t, thr, color="tab:green")
    b.set_ylabel("samples / s")
    b.set_xlabel("seconds since the job started")
    for at, label in faults:
        for ax in (a, b):
            ax.axvline(at, color="tab:red", linestyle="--", linewidth=1)
        a.annotate(label, (at, a.get_ylim()[1] * 0.92), rotation=0, fontsize=8, color="tab:red",
                   xytext=(3, 0), textcoords="offset points", va="top")
    a.set_title(f"Regroup demo: {job.nodes} nodes x {job.nproc} ranks, faults injected on purpose")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(result: Result, weights_equal: str) -> str:
    head = ["fault", "detected by", "strategy", "detection", "time to resume", "steps lost", "final weights equal"]
    rows = [[f.fault, f.detected_by, f.strategy.split(" [")[0],
             "-" if f.detection_ms is None else f"{f.detection_ms} ms",
             "-" if f.resume_ms is None else f"{f.resume_ms / 1000:.2f} s",
             "-" if f.steps_lost is None else str(f.steps_lost), weights_equal] for f in result.faults]
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=4, help="nodes, one pod each (default 4)")
    p.add_argument("--nproc", type=int, default=2, help="ranks per node (default 2)")
    p.add_argument("--steps", type=int, default=240)
    p.add_argument("--step-sleep", type=float, default=0.1, help="extra seconds of work per step")
    p.add_argument("--network", default="auto", choices=("auto", "netns", "loopback"))
    p.add_argument("--workdir", default=None, help="logs, ledger and the timeline go here")
    p.add_argument("--png", default=None, help="the timeline (default: WORKDIR/timeline.png)")
    p.add_argument("--quiet", action="store_true", help="no live lines, only the summary")
    p.add_argument("--script", choices=("contract", "ddp"), default="contract",
                   help="the trainer: examples/train_mlp.py (the step contract), or ddp: "
                        "examples/ddp_regroup.py, a plain DDP script adopted in five lines")
    p.add_argument("--trainers-die-first", action="store_true",
                   help="the lost node's trainers are killed a moment before its agent (a forced pod "
                        "deletion), so its agent reports a trainer's death before its own")
    args = p.parse_args(argv)
    if args.nodes < 2:
        p.error("--nodes must be at least 2: a node is lost on purpose")

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="regroup-demo-"))
    try:
        refuse_a_used_workdir(workdir)
    except UsageError as e:
        p.error(str(e))
    world = args.nodes * args.nproc
    job = JobSpec(nodes=args.nodes, nproc=args.nproc, steps=args.steps, step_sleep=args.step_sleep,
                  strategies="retry,recover-in-place,recover,elastic-training,dump,exit", prefer_elastic=True,
                  dataset=64 * world, micro_batch=4, microbatches=2 * world, quiet=False)
    if args.script == "ddp":
        # The drop-in's unit is a rank's batch of the full-size job: W micro-batches of 4 samples,
        # 8 steps an epoch of 32 samples per rank.
        job = dataclasses.replace(job, dropin=True, dataset=32 * world, microbatches=world)
    result = Result(0, "demo")
    print(f"regroup demo: {args.nodes} nodes x {args.nproc} ranks, {args.steps} steps; work in {workdir}")
    print("computing the uninterrupted run's final weights (once; cached) ...", flush=True)
    reference_weights(job)
    t0 = time.time()
    with Cluster(workdir, job, network=args.network, log=lambda m: print(f"{time.time() - t0:7.1f}s  {m}")) as c:
        result.network = c.net.mode
        watch = Watcher(c, t0, live=not args.quiet)
        watch.start()
        marks: List[Tuple[float, str]] = []
        try:
            c.start()
            c.wait_step(args.steps // 6)
            f1 = c.kill_trainer("node-1", 0)
            marks.append((f1["at"] - t0, "process killed"))
            c.wait_event("resumed", after_ms=int(f1["at"] * 1000))
            c.wait_step(c.last_step() + args.steps // 6)
            lost = f"node-{args.nodes - 1}"
            f2 = c.kill_node(lost, trainers_first=args.trainers_die_first)
            marks.append((f2["at"] - t0, f"{lost} lost"))
            c.wait_event("directive", "scale_in", after_ms=int(f2["at"] * 1000))
            c.wait_step(c.last_step() + args.steps // 6)
            node = c.add_node()
            f3 = c.note("a node joins", node=node.name)
            marks.append((f3["at"] - t0, f"{node.name} joins"))
            c.start_pod(args.nodes - 1, node)
            c.wait_event("generation", f"{args.nodes * args.nproc} ranks", after_ms=int(f3["at"] * 1000))
            codes = c.wait_pods_exit(timeout=600)
            result.promise("every pod exited 0", set(codes.values()) == {0}, str(codes))
        except AssertionError as e:
            result.promise("the demo ran to its end", False, f"{e}\n{c.logs()}")
        watch.stop()
        for f, until in ((f1, f2), (f2, f3), (f3, None)) if len(c.injected) >= 3 else ():
            measure(c, result, f, detected_kinds=("register",) if f is f3 else ("fault",), until=until)
        check_training(c, result)
        check_strategy(c, result, ["restart_in_place", "scale_in", "scale_out"], ["restart_job"])
        check_story(c, result, [("fault", "process_exit"), ("directive", "restart_in_place"),
                                ("fault", "pod_lost"), ("directive", "scale_in"),
                                ("directive", "scale_out"), ("done", "")])
        png = Path(args.png) if args.png else workdir / "timeline.png"
        plot(png, watch.samples, marks, job)
    weights = next((ok for name, ok, _ in result.promises if name.startswith("final weights")), False)
    print()
    print(table(result, "yes" if weights else "no"))
    print()
    for name, ok, detail in result.promises:
        print(f"[{'x' if ok else ' '}] {name}{': ' + detail.splitlines()[0] if detail else ''}")
    print(f"\ntimeline: {png}\nlogs, ledger and events: {workdir}")
    if not result.ok:
        print("\nA PROMISE WAS BROKEN:\n" + "\n".join(result.broken()), file=sys.stderr)
        return 1
    print(f"every promise kept in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
