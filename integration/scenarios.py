# SPDX-License-Identifier: Apache-2.0
"""The integration scenarios: real training on the local cluster through real faults.

Each scenario starts a cluster, injects its faults and then checks the promises: training reached
its last step, the final weights equal an uninterrupted run's (float64, norm-relative 1e-9), the
ledger holds every sample exactly once per epoch, the strategy used is the one the configuration
calls for, and the job's events tell the story in order. It records, per fault, the detection
time, the time to resume and the steps lost.

    /usr/bin/python3 integration/scenarios.py            # all, with a summary table
    /usr/bin/python3 integration/scenarios.py 1 3 --network loopback
    /usr/bin/python3 integration/scenarios.py chaos --seed 7 --faults 4   # a random fault soak (chaos.py)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster import DROPIN, EXAMPLE, GRID, PLAIN, PYTHON, REPO, Cluster, JobSpec  # noqa: E402
from volcano_loop import VolcanoLoop, volcano_unavailable  # noqa: E402
from regroup.testing import (check_dropin_ledger, check_ledger, free_port, read_ledger, relative_error,  # noqa: E402
                             run_plain_ddp, wait_for)

TOLERANCE = 1e-9
CACHE = Path(os.environ.get("REGROUP_INTEGRATION_CACHE", Path(tempfile.gettempdir()) / "regroup-integration-cache"))


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------


@dataclass
class FaultRecord:
    fault: str
    detected_by: str = "-"
    strategy: str = "-"
    detection_ms: Optional[int] = None
    resume_ms: Optional[int] = None
    steps_lost: Optional[int] = None


@dataclass
class Result:
    number: int
    title: str
    mode: str = "standalone"
    network: str = "?"
    seconds: float = 0.0
    promises: List[Tuple[str, bool, str]] = field(default_factory=list)
    faults: List[FaultRecord] = field(default_factory=list)
    skipped: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.skipped is None and all(ok for _, ok, _ in self.promises)

    def promise(self, name: str, ok: bool, detail: str = "") -> bool:
        self.promises.append((name, bool(ok), detail))
        return bool(ok)

    def broken(self) -> List[str]:
        return [f"{name}: {detail}" for name, ok, detail in self.promises if not ok]

    def report(self) -> str:
        lines = [f"scenario {self.number}: {self.title} [{self.mode}, {self.network}] "
                 f"{'SKIPPED: ' + self.skipped if self.skipped else ('ok' if self.ok else 'BROKEN')} "
                 f"in {self.seconds:.1f} s"]
        for f in self.faults:
            lines.append(f"  fault: {f.fault}; detected by {f.detected_by} in {_ms(f.detection_ms)}; "
                         f"strategy {f.strategy}; resumed {_ms(f.resume_ms)} after the fault; "
                         f"steps lost {'-' if f.steps_lost is None else f.steps_lost}")
        for name, ok, detail in self.promises:
            lines.append(f"  [{'x' if ok else ' '}] {name}{': ' + detail if detail else ''}")
        return "\n".join(lines)


def _ms(v: Optional[int]) -> str:
    return "-" if v is None else f"{v} ms"


# ---------------------------------------------------------------------------------------------
# Checks shared by every scenario
# ---------------------------------------------------------------------------------------------


def reference_weights(job: JobSpec) -> Path:
    """The final weights of the same training without faults, computed once and cached: one
    plain process, or for the drop-in the unmodified DDP script on the full-size job's ranks
    (its ledger beside them: ``.ledger``)."""
    args = job.reference_args()
    world = job.nodes * job.nproc
    key = hashlib.sha256(json.dumps([args, PYTHON, job.dropin, world, _source_digest()]).encode()).hexdigest()[:16]
    path = CACHE / f"reference-{key}.pt"
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        if job.dropin:
            ledger = path.with_suffix(".ledger")
            ledger.unlink(missing_ok=True)
            run_plain_ddp(args, world, tmp, ledger=ledger)
        elif job.reference_ranks > 1:
            run_ranks([PYTHON, str(EXAMPLE), *args, "--out", str(tmp)], job.reference_ranks)
        else:
            subprocess.run([PYTHON, str(job.script), *args, "--out", str(tmp)], check=True, timeout=600,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
        tmp.rename(path)
    return path


def run_ranks(argv: Sequence[str], world: int) -> None:
    """``argv`` on ``world`` processes with torchrun's environment (no control plane)."""
    port = free_port()
    ranks = [subprocess.Popen(list(argv), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              env={**os.environ, "OMP_NUM_THREADS": "1", "RANK": str(r), "WORLD_SIZE": str(world),
                                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
             for r in range(world)]
    try:
        for r in ranks:
            _, err = r.communicate(timeout=600)
            if r.returncode:
                raise RuntimeError(f"a reference rank exited with {r.returncode}: {err.decode()[-2000:]}")
    finally:
        for r in ranks:
            if r.poll() is None:
                r.kill()
                r.wait(timeout=10)


def _source_digest() -> str:
    h = hashlib.sha256(EXAMPLE.read_bytes() + DROPIN.read_bytes() + PLAIN.read_bytes() + GRID.read_bytes())
    for f in sorted((REPO / "python" / "regroup").glob("*.py")):
        h.update(f.read_bytes())
    return h.hexdigest()


def committed_attempts(records: Sequence[dict]) -> Dict[int, Tuple]:
    best: Dict[int, Tuple] = {}
    for r in records:
        g = tuple(r["g"])
        if r["step"] not in best or g > best[r["step"]]:
            best[r["step"]] = g
    return best


class LongestStop:
    """The longest time the trainers' last step stood still while it runs, sampled every 0.1 s: a
    stop of training as the ledger shows it (a rank writes a step's line before its vote, and
    votes for the next step only once it heard the last one's outcome)."""

    def __init__(self, c: Cluster):
        self.c = c
        self.longest = 0.0
        self.steps = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="longest-stop", daemon=True)

    def __enter__(self) -> "LongestStop":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        first = last = self.c.last_step()
        since = time.monotonic()
        while not self._done.wait(0.1):
            step, now = self.c.last_step(), time.monotonic()
            if step != last:
                last, since = step, now
            self.longest = max(self.longest, now - since)
            self.steps = last - first


def steps_lost(records: Sequence[dict], generation: Sequence[int]) -> int:
    """Steps whose work was done and thrown away by a fault: attempts (ledger lines) in the
    generation the fault aborted that did not commit."""
    best = committed_attempts(records)
    g = tuple(generation)
    return len({r["step"] for r in records if tuple(r["g"]) == g and best[r["step"]] != g})


def check_training(c: Cluster, result: Result, expect_done: bool = True) -> None:
    """Last step reached, weights equal to the reference, every sample exactly once."""
    job = c.job
    events = c.events()
    done = any(e["kind"] == "done" for e in events)
    if expect_done:
        result.promise("training reached its last step", done and c.last_step() == job.steps - 1,
                       f"last step in the ledger {c.last_step()}, of {job.steps}")
        if c.out.exists():
            import torch
            error = relative_error(torch.load(reference_weights(job)), torch.load(c.out))
            result.promise("final weights equal the uninterrupted run's", error <= TOLERANCE,
                           f"norm-relative error {error:.2e} (at most {TOLERANCE:.0e})")
        else:
            result.promise("final weights equal the uninterrupted run's", False, "no final weights written")
    try:
        if job.dropin:
            check_dropin_ledger(c.ledger, reference_weights(job).with_suffix(".ledger"), job.dataset,
                                job.steps // job.steps_per_epoch)
            result.promise("every sample exactly once per epoch", True,
                           f"{c.last_step() + 1} steps, each with the unmodified script's samples")
        else:
            check_ledger(c.ledger, c.last_step() + 1, **job.data)
            result.promise("every sample exactly once per epoch", True,
                           f"{c.last_step() + 1} steps x {job.micro_batch * job.microbatches} samples")
    except AssertionError as e:
        result.promise("every sample exactly once per epoch", False, str(e))


def check_story(c: Cluster, result: Result, story: Sequence[Tuple[str, str]]) -> None:
    """The events hold ``story`` ((kind, text) pairs) as a subsequence, in order."""
    events = c.events()
    i = 0
    for e in events:
        if i < len(story) and e["kind"] == story[i][0] and story[i][1] in e["message"]:
            i += 1
    told = " -> ".join(f"{k}{'(' + t + ')' if t else ''}" for k, t in story)
    result.promise("the events tell the story in order", i == len(story),
                   told if i == len(story) else f"missing {story[i]} after {story[:i]}; " + _listed(events))


def _listed(events: Sequence[dict]) -> str:
    """The events, one per line, for a broken promise's detail: what CI's log keeps of a run."""
    return "events:\n" + "\n".join(f"    {e['at_ms']} {e['kind']}: {e['message'][:300]}" for e in events)


def check_strategy(c: Cluster, result: Result, expected: Sequence[str], forbidden: Sequence[str] = ()) -> None:
    events = c.events()
    used = [e["message"].split(":")[0] for e in events if e["kind"] == "directive"]
    ok = all(any(u.startswith(x) for u in used) for x in expected) and \
        not any(u.startswith(x) for u in used for x in forbidden)
    result.promise("the configured strategy was used", ok,
                   f"directives {used}; expected {list(expected)}" + (f", never {list(forbidden)}" if forbidden else "")
                   + ("" if ok else "; " + _listed(events)))


def measure(c: Cluster, result: Result, injected: dict, detected_kinds: Sequence[str] = ("fault",),
            until: Optional[dict] = None, resumed_kinds: Sequence[str] = ("resumed",)) -> FaultRecord:
    """The fault's record: the first detection event after it, the strategy chosen, the first step
    committed after it, and the steps lost in between."""
    at_ms = int(injected["at"] * 1000)
    end_ms = int(until["at"] * 1000) if until else None
    events = c.events()
    rec = FaultRecord(injected["fault"])
    detection = next((e for e in events if e["kind"] in detected_kinds and int(e["at_ms"]) >= at_ms), None)
    if detection:
        rec.detection_ms = int(detection["at_ms"]) - at_ms
        rec.detected_by = detection["message"].split(":")[0] if detection["kind"] == "fault" else detection["kind"]
        after = int(detection["at_ms"])
        directive = next((e for e in events if e["kind"] == "directive" and int(e["at_ms"]) >= after
                          and (end_ms is None or int(e["at_ms"]) < end_ms)), None)
        if directive:
            rec.strategy = directive["message"].split(":")[0]
        resumed = next((e for e in events if e["kind"] in resumed_kinds and int(e["at_ms"]) >= after
                        and (end_ms is None or int(e["at_ms"]) < end_ms)), None)
        if resumed:
            rec.resume_ms = int(resumed["at_ms"]) - at_ms
    if injected.get("generation"):
        rec.steps_lost = steps_lost(read_ledger(c.ledger), injected["generation"])
    result.faults.append(rec)
    return rec


# ---------------------------------------------------------------------------------------------
# The scenarios
# ---------------------------------------------------------------------------------------------


@dataclass
class Scenario:
    number: int
    title: str
    run: Callable[[Cluster, Result], None]
    job: Callable[[], JobSpec]
    spare_nodes: int = 0
    needs_cut: bool = False
    volcano: bool = False  # run with Volcano in the loop where it is available
    needs_volcano: bool = False  # skipped where Volcano in the loop is not available
    kube: Optional[bool] = None  # runs with --kube (default: where it runs with Volcano)
    needs_kube: bool = False  # skipped without --kube
    needs_pipelining: bool = False  # skipped where the trainers' torch has no pipelining (1.13)
    needs_fsdp2: bool = False  # skipped where the trainers' torch has no FSDP2 (before 2.6)


SCENARIOS: Dict[int, Scenario] = {}


def scenario(number: int, title: str, job: Callable[[], JobSpec], **kw):
    def register(fn):
        SCENARIOS[number] = Scenario(number, title, fn, job, **kw)
        return fn
    return register


@scenario(1, "a trainer process crashes; recover-in-place restarts only that process",
          lambda: JobSpec(steps=80, strategies="recover-in-place,dump,exit"), volcano=True)
def crash_in_place(c: Cluster, r: Result) -> None:
    c.start()
    c.wait_step(10)
    first, second = c.node_of(0), c.node_of(1)  # Volcano places the pods where it will
    # The restart is forked warm once the pod's fork server is ready (torch 2.x takes seconds to
    # import beside the trainers); a plain start could rejoin only after the survivors finished.
    c.wait_warm(second)
    before = {n: c.trainers(n) for n in (first, second)}
    f = c.kill_trainer(second, 1)
    c.wait_event("resumed", after_ms=int(f["at"] * 1000))
    after = {n: c.trainers(n) for n in (first, second)}
    r.promise("only the crashed process restarted",
              after[first] == before[first] and len(set(after[second]) - set(before[second])) == 1
              and f["pid"] not in after[second],
              f"trainers before {before}, after {after}")
    codes = c.wait_pods_exit()
    r.promise("every pod exited 0", set(codes.values()) == {0}, str(codes))
    measure(c, r, f)
    check_training(c, r)
    check_strategy(c, r, ["restart_in_place"], ["scale_in", "wait", "restart_job"])
    # The manager restarts the process at once; the decision maker's directive follows, before or
    # (with Volcano in the loop) after the process rejoined, and restarts nothing twice.
    check_story(c, r, [("fault", "process_exit"), ("abort", ""), ("restart_in_place", "survivors continued"),
                       ("generation", "4 ranks"), ("resumed", ""), ("done", "")])


@scenario(2, "a node dies, a spare node exists, recover: the replacement runs at full size",
          lambda: JobSpec(steps=50, strategies="recover,exit"), spare_nodes=1, volcano=True)
def node_lost_with_spare(c: Cluster, r: Result) -> None:
    c.start()
    c.wait_step(10)
    f = c.kill_node(c.node_of(1))
    c.wait_event("directive", "[recover]", after_ms=int(f["at"] * 1000))
    pod = c.replace_pod(1, c.nodes["node-2"])    # the job controller's replacement, on the spare
    c.wait_event("resumed", after_ms=int(f["at"] * 1000))
    codes = c.wait_pods_exit()
    r.promise("the survivors and the replacement exited 0", set(codes.values()) == {0}, str(codes))
    measure(c, r, f, detected_kinds=("fault",))
    check_training(c, r)
    # `recover` waits for the replacement, or resumes with it at once when the job controller's
    # replacement registered within the report window (it can, with the spare ready).
    check_strategy(c, r, [], ["scale_in", "restart_job"])
    decisions = [e["message"].split(":")[0] for e in c.events() if e["kind"] == "directive"]
    r.promise("recover waited for the replacement or resumed with it",
              any(d in ("wait [recover]", "resume [recover]") for d in decisions), str(decisions))
    # The scheduler's node report, the manager's own detection (a broken stream has the liveness
    # timeout to resume) and the replacement's registration race, so the story starts after them.
    check_story(c, r, [("register", pod.node.name), ("generation", "4 ranks"), ("resumed", ""),
                       ("done", "")])


@scenario(3, "a node dies, no spare, recover then elastic-training: waits, scales in, scales out",
          lambda: JobSpec(steps=200, strategies="recover,elastic-training,exit", wait_reschedule_s=30),
          volcano=True)
def wait_then_scale_in_out(c: Cluster, r: Result) -> None:
    c.start()
    c.wait_step(8)
    lose_a_node_wait_scale_in_then_out(c, r)


def lose_a_node_then_return(c: Cluster, r: Result, index: int = 1, full: str = "4 ranks") -> Tuple[dict, dict, Any]:
    """The node of pod ``index`` dies; after the scale-in and a few steps a new node and the
    replacement pod come, training runs at full size (``full``) again and every pod exits.
    Returns the loss's and the return's notes and the replacement pod."""
    f = c.kill_node(c.node_of(index))
    c.wait_event("directive", "scale_in", timeout=90, after_ms=int(f["at"] * 1000))
    c.wait_step(c.last_step() + 5)
    node = c.add_node()
    g = c.note("add a node", node=node.name)
    pod = c.replace_pod(index, node)
    c.wait_event("directive", "scale_out", after_ms=int(g["at"] * 1000))
    c.wait_event("generation", full, after_ms=int(g["at"] * 1000))
    codes = c.wait_pods_exit()
    r.promise("the survivors and the replacement exited 0", set(codes.values()) == {0}, str(codes))
    return f, g, pod


def lose_a_node_wait_scale_in_then_out(c: Cluster, r: Result) -> None:
    f, g, pod = lose_a_node_then_return(c, r)
    rec = measure(c, r, f, until=g)
    r.promise("recover waited wait-reschedule-timeout before scaling in",
              rec.resume_ms is not None and rec.resume_ms >= 30_000, f"resumed {rec.resume_ms} ms after the loss")
    measure(c, r, g, detected_kinds=("register",))
    check_training(c, r)
    check_strategy(c, r, ["wait", "scale_in", "scale_out"])
    check_story(c, r, [("fault", "pod_lost"), ("directive", "wait"), ("directive", "scale_in"),
                       ("generation", "2 ranks"), ("register", pod.node.name), ("directive", "scale_out"),
                       ("generation", "4 ranks"), ("done", "")])


@scenario(19, "a job with MindCluster's minAvailable (every pod): the scheduler lowers it once the job runs, "
              "then a node dies with no spare: waits, scales in, scales out as in scenario 3",
          lambda: JobSpec(steps=200, strategies="recover,elastic-training,exit", wait_reschedule_s=30,
                          min_available_every_pod=True), kube=True, needs_kube=True)
def every_pod_min_available(c: Cluster, r: Result) -> None:
    c.start()
    c.wait_step(8)
    # 2 pods of 2 ranks and the manager; min-data-parallel 1: one pod and the manager's.
    want = (2, "3", 2)
    try:
        wait_for(lambda: c.scheduler.min_available() == want, 30, "the lowered minAvailable", interval=0.5)
    except AssertionError:
        pass
    got = c.scheduler.min_available()
    r.promise("the scheduler lowered the Job's minAvailable from every pod to the elastic minimum once it ran, "
              "and the job controller carried it into the PodGroup", got == want,
              f"Job minAvailable {got[0]} (submitted {got[1]}), PodGroup minMember {got[2]}; want {want}")
    lose_a_node_wait_scale_in_then_out(c, r)


@scenario(18, "the scheduler restarts in the middle of a wait: the deadline survives in the PodGroup's annotations",
          lambda: JobSpec(steps=250, strategies="recover,elastic-training,exit", wait_reschedule_s=45), kube=True,
          needs_kube=True)
def scheduler_restart_during_wait(c: Cluster, r: Result) -> None:
    c.start()
    c.wait_step(8)
    # First a restart while the job trains: its manager is the lease holder the stored state names,
    # so the new coordinator leases it at once (issue 40); commits stop only while the manager is
    # without a coordinator past its lease (10 s), the new scheduler leading about 20 s after.
    with LongestStop(c) as stop:
        g = c.scheduler.restart_scheduler()
        ready = time.time()
        c.wait_step(c.last_step() + 10, timeout=120)
    r.promise("training went on after a scheduler restart while the job trained", stop.steps >= 10,
              f"longest stop of the trainers' steps {stop.longest:.1f} s ({stop.steps} steps); the new scheduler "
              f"was ready {ready - g['at']:.1f} s after the old pod's deletion")
    f = c.kill_node(c.node_of(1))
    c.wait_event("directive", "wait", after_ms=int(f["at"] * 1000))
    wait_for(lambda: c.scheduler.saved_state().get("phase") == "waiting", 30, "the wait saved in the PodGroup")
    deadline = int(c.scheduler.saved_state()["directive"]["deadline_ms"])
    time.sleep(5)  # well inside the 45 s wait
    # The new scheduler leads once the old one's lease expires (15 s: Volcano's scheduler does not
    # release it when it stops), about 20 s after the deletion.
    g = c.scheduler.restart_scheduler()
    ready = time.time()
    scale_in = c.wait_event("directive", "scale_in", timeout=120, after_ms=int(f["at"] * 1000))
    measure(c, r, f)
    # A wait started again by the new scheduler would end 45 s after its start, at least 5 s past
    # the saved deadline; the decision comes within a scheduling session or two of the deadline
    # (or of the new scheduler's start, had it started after the deadline).
    late = int(scale_in["at_ms"]) - max(deadline, int(ready * 1000))
    r.promise("the restarted scheduler scaled in at the deadline saved in the PodGroup, not after a new wait",
              -1000 <= late <= 3000,
              f"scale_in {late} ms after the saved deadline (or the new scheduler's start); the new scheduler "
              f"was ready {deadline - ready * 1000:.0f} ms before the deadline, {ready - g['at']:.1f} s after "
              "the old pod's deletion")
    codes = c.wait_pods_exit()
    r.promise("the survivor exited 0", codes.get(f"{c.job.name}-worker-0") == 0, str(codes))
    check_training(c, r)
    check_strategy(c, r, ["wait", "scale_in"], ["restart_job"])


def lose_a_node_scale_in_then_out(c: Cluster, r: Result, index: int, started: bool = False,
                                  small: str = "2 ranks", full: str = "4 ranks") -> None:
    """lose_a_node_then_return with pod ``index``'s node, prefer-elastic: a scale-in at once (to
    ``small``), a scale-out once the replacement registers (to ``full``), and nothing else.
    ``started``: the job runs already."""
    if not started:
        c.start()
        c.wait_step(8)
    f, g, _ = lose_a_node_then_return(c, r, index, full)
    measure(c, r, f, until=g)
    measure(c, r, g, detected_kinds=("register",))
    check_training(c, r)
    check_strategy(c, r, ["scale_in", "scale_out"], ["wait", "restart_job"])
    # With Volcano the scheduler's node report can decide before the manager's own detection
    # (a broken stream has the liveness timeout to resume), so the story starts at the decision.
    check_story(c, r, [("directive", "scale_in"), ("generation", small),
                       ("directive", "scale_out"), ("generation", full), ("done", "")])


@scenario(4, "elastic-training with prefer-elastic: scales in at once, out when the replacement registers",
          lambda: JobSpec(steps=120, strategies="elastic-training,exit", prefer_elastic=True))
def prefer_elastic(c: Cluster, r: Result) -> None:
    lose_a_node_scale_in_then_out(c, r, 1)


@scenario(5, "a second node dies while scaled in: scales in again",
          lambda: JobSpec(nodes=3, steps=60, strategies="elastic-training,exit", prefer_elastic=True,
                          micro_batch=4, microbatches=8))
def second_loss_while_scaled_in(c: Cluster, r: Result) -> None:
    c.start()
    c.wait_step(8)
    f = c.kill_node("node-2")
    c.wait_event("directive", "scale_in", after_ms=int(f["at"] * 1000))
    c.wait_step(c.last_step() + 5)
    # The second as a forced pod deletion: the node's trainers are killed a moment before its
    # agent, which reports a trainer's death first (the manager takes the stream's break right
    # after it for the pod's death, not a blip with a grace).
    g = c.kill_node("node-1", trainers_first=True)
    c.wait_event("directive", "scale_in", after_ms=int(g["at"] * 1000))
    codes = c.wait_pods_exit()
    r.promise("the last survivor exited 0", codes.get("mlp-worker-0") == 0, str(codes))
    measure(c, r, f, until=g)
    measure(c, r, g)
    check_training(c, r)
    check_strategy(c, r, ["scale_in"], ["wait", "restart_job"])
    # The second loss is told either way: a pod_lost as its stream breaks just after the kill
    # its agent reported, or, when the decision on that process exit comes first, the pod fenced
    # with its replicas (recover-in-place is not allowed here).
    check_story(c, r, [("fault", "pod_lost"), ("directive", "scale_in"), ("generation", "4 ranks"),
                       ("directive", "scale_in"), ("generation", "2 ranks"), ("done", "")])


@scenario(6, "the node of rank 0 dies (it hosted the generation's store)",
          lambda: JobSpec(steps=120, strategies="elastic-training,exit", prefer_elastic=True), volcano=True)
def rank0_node_lost(c: Cluster, r: Result) -> None:
    lose_a_node_scale_in_then_out(c, r, 0)


@scenario(7, "the manager's pod dies: training pauses, the restarted manager takes over, no trainer restarts",
          lambda: JobSpec(steps=50, strategies="recover-in-place,elastic-training,exit"), kube=True)
def manager_restart(c: Cluster, r: Result) -> None:
    c.start()
    c.wait_step(10)
    workers = [c.node_of(i) for i in range(c.job.nodes)]
    before = {n: c.trainers(n) for n in workers}
    if c.scheduler is not None:
        # On Kubernetes: the manager's node is drained (cordoned, its pod deleted); Volcano's job
        # controller recreates the pod, the scheduler places it on another node, with a new IP.
        # The agents find it by the svc plugin's hostname, which each pod's hosts file follows.
        old_host = c.manager_host
        f = c.scheduler.move_manager()
        r.promise("the recreated manager has a new address", c.manager_host != old_host,
                  f"{old_host} -> {c.manager_host}")
    else:
        f = c.kill_manager()
        time.sleep(2)  # the job runs without a manager for a while (agents reconnect with backoff)
        c.start_manager()
        c.note("restart the manager")
    c.wait_step(f["step"] + 5)
    after = {n: c.trainers(n) for n in workers}
    r.promise("no trainer restarted", after == before, f"trainers before {before}, after {after}")
    codes = c.wait_pods_exit()
    r.promise("every pod exited 0", set(codes.values()) == {0}, str(codes))
    # detection: the agents re-register with the new manager; resumed: its first generation (the
    # trainers kept their state and step, so that generation is the first step it commits)
    rec = measure(c, r, f, detected_kinds=("register",), resumed_kinds=("generation",))
    # The ranks vote for the step they computed and wait for its outcome (on the CPU the vote is
    # on the critical path); every rank of the generation voted, so the restarted manager
    # finishes that vote instead of having the step redone.
    r.promise("no step was lost", rec.steps_lost == 0, f"{rec.steps_lost} steps redone")
    check_training(c, r)
    check_strategy(c, r, [], ["restart_in_place", "scale_in", "restart_job"])
    check_story(c, r, [("register", ""), ("generation", "4 ranks"), ("done", "")])


@scenario(8, "a frozen trainer (SIGSTOP): detected by its silence and replaced",
          lambda: JobSpec(steps=40, strategies="recover-in-place,elastic-training,exit", liveness_misses=40))
def frozen_trainer(c: Cluster, r: Result) -> None:
    c.start()
    c.wait_step(8)
    f = c.freeze_trainer("node-1", 0)
    c.wait_event("resumed", timeout=120, after_ms=int(f["at"] * 1000))
    codes = c.wait_pods_exit()
    r.promise("every pod exited 0", set(codes.values()) == {0}, str(codes))
    measure(c, r, f)
    check_training(c, r)
    check_strategy(c, r, ["restart_in_place"])
    check_story(c, r, [("fault", "hang"), ("directive", "restart_in_place"), ("resumed", ""), ("done", "")])


@scenario(9, "a node cut off from the network, then restored: no split brain",
          lambda: JobSpec(steps=120, strategies="elastic-training,exit", prefer_elastic=True, liveness_misses=25),
          needs_cut=True)
def network_partition(c: Cluster, r: Result) -> None:
    c.start()
    c.wait_step(8)
    zombie = c.pod_on("node-1")
    f = c.cut_network("node-1")
    c.wait_event("directive", "scale_in", timeout=120, after_ms=int(f["at"] * 1000))
    c.wait_step(c.last_step() + 5)
    g = c.restore_network("node-1")
    # The cut-off pod was declared lost: back on the network it is told so (fenced), its trainers
    # leave the generation they were in (their state is stale), and it comes back as its own
    # replacement under a new incarnation of its uid; the job scales out with it.
    c.wait_event("register", "(a replacement)", timeout=120, after_ms=int(g["at"] * 1000))
    c.wait_event("directive", "scale_out", timeout=120, after_ms=int(g["at"] * 1000))
    c.wait_event("generation", "4 ranks", after_ms=int(g["at"] * 1000))
    log = zombie.log.read_text(errors="replace")
    r.promise("the cut-off pod was fenced once back and came back as its own replacement (no split brain)",
              "declared this pod lost" in log and "coming back as its own replacement" in log,
              "its log says neither" if "declared this pod lost" not in log else "not readmitted")
    codes = c.wait_pods_exit()
    r.promise("the survivor and the readmitted pod exited 0", set(codes.values()) == {0}, str(codes))
    measure(c, r, f, until=g)
    measure(c, r, g, detected_kinds=("register",))
    check_training(c, r)
    check_strategy(c, r, ["scale_in", "scale_out"])
    check_story(c, r, [("fault", ""), ("directive", "scale_in"), ("generation", "2 ranks"),
                       ("register", "a replacement"), ("directive", "scale_out"), ("generation", "4 ranks"),
                       ("done", "")])


@scenario(10, "a SIGTERM'd pod leaves at a step boundary with no lost work",
          lambda: JobSpec(steps=40, strategies="elastic-training,exit", prefer_elastic=True))
def planned_departure(c: Cluster, r: Result) -> None:
    c.start()
    c.wait_step(10)
    pod = c.pod_on("node-1")
    f = c.sigterm_pod("node-1")
    code = pod.process.wait(timeout=60)
    r.promise("the departing pod exited 0", code == 0, f"exit code {code}")
    codes = c.wait_pods_exit()
    r.promise("the remaining pod exited 0", codes.get("mlp-worker-0") == 0, str(codes))
    rec = measure(c, r, f, detected_kinds=("leave",))
    r.promise("no step was lost", rec.steps_lost == 0, f"{rec.steps_lost} steps redone")
    check_training(c, r)
    check_story(c, r, [("leave", ""), ("abort", "planned departure"), ("generation", "2 ranks"), ("done", "")])


@scenario(11, "a poison step (one sample fails every time): escalates to dump with the step named",
          lambda: JobSpec(steps=40, strategies="retry,recover-in-place,dump,exit",
                          extra_train=["--poison-step", "12", "--checkpoint-dir", "checkpoints"]))
def poison_step(c: Cluster, r: Result) -> None:
    c.start()
    c.wait_step(11)
    f = c.note("a poison sample at step 12")
    dump = c.wait_event("directive", "dump", timeout=180)
    codes = c.wait_pods_exit()
    r.promise("the job escalated to dump naming the step", "poison step 12" in dump["message"], dump["message"])
    r.promise("the survivors dumped and exited 0", list(codes.values()).count(0) >= 1, str(codes))
    manifests = sorted(p.parent.name for p in (c.dir / "checkpoints").glob("*/manifest.json"))
    r.promise("the dump wrote a complete checkpoint of the last committed step",
              any(m.startswith("step-000000000011.") for m in manifests), f"checkpoints {manifests}")
    measure(c, r, f)
    check_training(c, r, expect_done=False)
    check_story(c, r, [("fault", "process_exit"), ("directive", "restart_in_place"), ("fault", "process_exit"),
                       ("directive", "dump")])


@scenario(12, "a job with a bad Regroup key: refused with the message, nothing started",
          lambda: JobSpec(steps=10, extra_annotations={"regroup.io/min-data-parallel": "zero"}), volcano=True)
def bad_key(c: Cluster, r: Result) -> None:
    if c.scheduler is not None:
        c.scheduler.start()
        ev = c.scheduler.job_invalid(timeout=30)
        r.promise("the scheduler refused the job, naming the key", "regroup.io/min-data-parallel" in ev["message"],
                  ev["message"])
        time.sleep(2)  # several scheduling sessions
        r.promise("nothing was bound or started", not c.scheduler.binds() and not c.pods and c.manager is None,
                  f"binds {c.scheduler.binds()}")
        return
    try:
        c.start_manager()
        r.promise("the manager refused the job", False, "it started")
    except RuntimeError as e:
        r.promise("the manager refused the job, naming the key", "regroup.io/min-data-parallel" in str(e),
                  str(e).splitlines()[-1] if str(e) else "")
    r.promise("nothing was started", not c.pods, f"pods {list(c.pods)}")


def rescheduling(level: str) -> Callable[[Cluster, Result], None]:
    """MindCluster's rescheduling, process-level recovery off: a node dies, a spare exists; every
    process of the job restarts and resumes from the newest checkpoint (every 5 steps)."""

    def run(c: Cluster, r: Result) -> None:
        c.start()
        c.wait_step(12)
        survivor = c.node_of(0)
        before = set(c.trainers(survivor))
        f = c.kill_node(c.node_of(1))
        directive = c.wait_event("directive", f"restart_job [{level}]", timeout=90, after_ms=int(f["at"] * 1000))
        pod = c.replace_pod(1, c.nodes["node-2"])
        generation = c.wait_event("generation", "4 ranks", timeout=120, after_ms=int(directive["at_ms"]))
        resumed_after = int(generation["message"].split("resuming after step ")[1].split(";")[0])
        complete = sorted(int(m.parent.name.split(".")[0][len("step-"):])
                          for m in (c.dir / "checkpoints").glob("step-*/manifest.json"))
        newest = max((s for s in complete if s <= f["step"]), default=-1)
        r.promise("the job resumed from the newest checkpoint before the fault",
                  resumed_after == newest and resumed_after >= 0,
                  f"resumed after step {resumed_after}; complete checkpoints {complete}, the fault at step {f['step']}")
        after = set(c.trainers(survivor))
        r.promise("every process restarted, the surviving pod's too", before and not (before & after),
                  f"trainers of {survivor} before {sorted(before)}, after {sorted(after)}")
        codes = c.wait_pods_exit()
        r.promise("the pods exited 0", set(codes.values()) == {0}, str(codes))
        formed = [e for e in c.events() if e["kind"] in ("generation", "directive")
                  and int(e["at_ms"]) > int(directive["at_ms"])]
        r.promise("one generation formed after the restart, and one decision",
                  [e["kind"] for e in formed] == ["directive", "generation"],
                  "; ".join(f"{e['kind']}: {e['message'][:100]}" for e in formed))
        # With Volcano in the loop the scheduler sees the node die (NotReady) before the manager's
        # grace for the broken streams runs out: its directive is the detection.
        volcano = c.scheduler is not None
        measure(c, r, f, detected_kinds=("fault", "directive") if volcano else ("fault",))
        check_training(c, r)
        check_strategy(c, r, ["restart_job"], ["scale_in", "wait", "restart_in_place", "retry"])
        check_story(c, r, ([] if volcano else [("fault", "pod_lost")]) + [("directive", f"restart_job [{level}]"),
                           (level.replace("-", "_"), "every process restarts from the newest checkpoint"),
                           ("register", pod.node.name), ("generation", "4 ranks"), ("resumed", ""),
                           ("done", "")])

    return run


def _rescheduling_job(pod_rescheduling: str) -> JobSpec:
    return JobSpec(steps=40, strategies="exit", checkpoint_interval=5,
                   extra_labels={"process-recover-enable": "off", "pod-rescheduling": pod_rescheduling})


scenario(13, "MindCluster's job-level rescheduling: a node dies, every process resumes from the newest checkpoint",
         lambda: _rescheduling_job("off"), spare_nodes=1, volcano=True)(rescheduling("job-rescheduling"))
scenario(14, "MindCluster's pod-level rescheduling: only the lost pod is replaced, every process restarts",
         lambda: _rescheduling_job("on"), spare_nodes=1)(rescheduling("pod-rescheduling"))



@scenario(15, "a fault of the training's own under fault-retry-times: the job restarts while retries last, then ends",
          lambda: JobSpec(steps=60, strategies="exit", checkpoint_interval=5,
                          extra_labels={"process-recover-enable": "off", "pod-rescheduling": "on",
                                        "fault-retry-times": "1"}))
def business_fault_retries(c: Cluster, r: Result) -> None:
    c.start()
    c.wait_step(12)
    f = c.kill_trainer("node-1", 1)
    before = {n: set(c.trainers(n)) for n in ("node-0", "node-1")}
    # No pod is given up, so the decision maker may resume in the tick it restarts the job: the
    # manager then sees the resume alone, and restarts every process all the same.
    restart = c.wait_event("pod_rescheduling", "every process restarts from the newest checkpoint",
                           timeout=90, after_ms=int(f["at"] * 1000))
    resume = c.wait_event("directive", "[pod-rescheduling]", timeout=90, after_ms=int(f["at"] * 1000))
    r.promise("the first crash restarts the job, counting the retry", "reschedule 1 of 1" in resume["message"],
              resume["message"])
    generation = c.wait_event("generation", "4 ranks", timeout=120, after_ms=int(restart["at_ms"]))
    resumed_after = int(generation["message"].split("resuming after step ")[1].split(";")[0])
    r.promise("the job resumed from a checkpoint at or before the crash", 0 <= resumed_after <= f["step"],
              f"resumed after step {resumed_after}, the crash at step {f['step']}")
    after = {n: set(c.trainers(n)) for n in ("node-0", "node-1")}
    r.promise("every process restarted, the healthy pod's too",
              all(before[n] and not before[n] & after[n] for n in before), f"before {before}, after {after}")
    c.wait_step(f["step"] + 3)
    second = c.kill_trainer("node-0", 1)
    ending = c.wait_event("directive", "exit", timeout=90, after_ms=int(second["at"] * 1000))
    r.promise("the second crash ends the job: fault-retry-times is used up",
              "used up (1 of 1, fault-retry-times)" in ending["message"], ending["message"])
    codes = c.wait_pods_exit()
    r.promise("every pod ended", len(codes) == len(c.pods), str(codes))
    measure(c, r, f)
    check_training(c, r, expect_done=False)
    check_strategy(c, r, ["exit"], ["restart_in_place", "scale_in", "wait", "retry"])
    check_story(c, r, [("fault", "process_exit"), ("directive", "[pod-rescheduling]"),
                       ("pod_rescheduling", ""), ("generation", "4 ranks"), ("fault", "process_exit"),
                       ("directive", "exit")])


def finish_with_replacement(c: Cluster, r: Result, f: dict, pod, never: Sequence[str]) -> None:
    """The end of a pod's loss that its replacement recovered (with Volcano in the loop the
    scheduler's directive may come before the manager's own detection): every pod exits 0, the
    training promises hold, no strategy in ``never`` was used, and the replacement rejoined."""
    codes = c.wait_pods_exit()
    r.promise("the survivors and the replacement exited 0", set(codes.values()) == {0}, str(codes))
    measure(c, r, f, detected_kinds=("directive", "fault"))
    check_training(c, r)
    check_strategy(c, r, [], never)
    check_story(c, r, [("register", pod.node.name), ("generation", "4 ranks"), ("resumed", ""), ("done", "")])


@scenario(16, "MindCluster's own job: manager.py on rank 0, torchrun in train_start.sh; a node dies, recover",
          lambda: JobSpec(steps=50, seed_flow=True, strategies="retry,recover-in-place,recover,elastic-training,dump",
                          extra_labels={"fault-retry-times": "10", "process-recover-enable": "on"}),
          spare_nodes=1, volcano=True, needs_volcano=True)
def mindcluster_seed_flow(c: Cluster, r: Result) -> None:
    """The job as MindCluster's documentation has users write it (integration/seed/): worker pods
    only, each running train_start.sh; rank 0's starts manager.py (its import line changed), which
    passes only the job's id and sizes; every pod's torchrun hands over to regroup-agent."""
    c.start()
    c.wait_step(10)
    zero, one = c.pods[f"{c.job.name}-worker-0"], c.pods[f"{c.job.name}-worker-1"]
    said = zero.log.read_text(errors="replace")
    r.promise("manager.py's manager learned the job's keys from the coordinator",
              f"from the coordinator at {c.scheduler.coordinator}" in said and "recovery is off" not in said,
              "\n".join(line for line in said.splitlines() if "labels and" in line or "recovery" in line)[:600])
    said = one.log.read_text(errors="replace")
    r.promise("torchrun handed over, and the agent found the manager at $MASTER_ADDR:9601",
              "torchrun: handing over to" in said and f"{zero.node.address}:9601" in said,
              "\n".join(line for line in said.splitlines() if "handing over" in line or ":9601" in line)[:600])
    f = c.kill_node(c.node_of(1))
    c.wait_event("directive", "[recover]", after_ms=int(f["at"] * 1000))
    pod = c.replace_pod(1, c.nodes["node-2"])
    c.wait_event("resumed", after_ms=int(f["at"] * 1000))
    finish_with_replacement(c, r, f, pod, never=["scale_in", "restart_job"])


SEED_STRATEGIES = "retry,recover-in-place,recover,elastic-training,dump"   # the seed's recover-strategy


def _converted_seed_job() -> JobSpec:
    """The training of scenario 20: what its pods run and what its checks compare with. Its job
    document is not JobSpec's: it is `regroupctl convert` of the seed AscendJob
    (kube_cluster.sized_seed), whose batch keys (global 512, micro 4) the trainer's arguments
    follow: 128 micro-batches of 4 a step."""
    return JobSpec(name="llama-pretrain", nodes=2, nproc=2, steps=40, micro_batch=4, microbatches=128,
                   dataset=1024, strategies=SEED_STRATEGIES, min_dp=2, wait_reschedule_s=60)


@scenario(20, "MindCluster's seed AscendJob (Master and Worker, the seed's labels and annotations) converted by "
              "regroupctl convert, on the real control plane: a node dies, a spare exists; recover",
          _converted_seed_job, spare_nodes=1, kube=True, needs_kube=True)
def converted_seed_job(c: Cluster, r: Result) -> None:
    """examples/mindcluster/pytorch-elastic-910b.yaml sized for this machine (Master 1 and Worker
    1 pod of 2 processes; kube_cluster.sized_seed says what else), converted by `regroupctl
    convert` and submitted with kubectl with only kube_cluster.POST_CONVERSION changed: the
    seed's labels and annotations reach the API server as convert wrote them, the job trains, and
    a node's loss is recovered as the seed's recover-strategy and wait-reschedule-timeout (60 s)
    say: recover, the job controller's replacement on the spare node."""
    from kube_cluster import (ASCEND_NODE_LABELS, POST_CONVERSION, SEED_ASCENDJOB, SEED_RESIZED_ANNOTATIONS,
                              SEED_SIZED_PATHS, converted_for_this_machine, differences, sized_seed)
    seed = yaml.safe_load(SEED_ASCENDJOB.read_text())
    fixture, changes = sized_seed(seed, c.job, c.job.train_args(c.ledger, c.out), REPO / "examples")
    source = c.dir / "ascendjob.yaml"
    source.write_text(yaml.safe_dump(fixture, sort_keys=False))
    conv = subprocess.run([c.bin["regroupctl"], "convert", str(source), "-o", str(c.job_file)], capture_output=True,
                          text=True, timeout=60)
    (c.dir / "convert-report.txt").write_text(conv.stderr)
    c.log("the seed sized for this machine:\n  " + "\n  ".join(changes) + "\nregroupctl convert:\n" + conv.stderr)
    if not r.promise("regroupctl convert converted the seed and the result validates", conv.returncode == 0,
                     conv.stderr.strip().splitlines()[-1] if conv.returncode == 0 and conv.stderr.strip()
                     else f"exit {conv.returncode}: {conv.stderr[-3000:]}"):
        return
    converted = yaml.safe_load(c.job_file.read_text())
    c.scheduler.rewrite = converted_for_this_machine
    c.scheduler.node_labels = dict(ASCEND_NODE_LABELS)
    submitted = converted_for_this_machine(converted)
    changed = differences(converted, submitted)
    r.promise("only the declared changes were made after the conversion", changed == sorted(POST_CONVERSION),
              f"changed {changed}: " + "; ".join(f"{k}: {v}" for k, v in POST_CONVERSION.items()))
    seed_keys = {f: {k: str(v) for k, v in seed["metadata"][f].items()} for f in ("labels", "annotations")}
    seed_keys["annotations"].update(SEED_RESIZED_ANNOTATIONS)
    elsewhere = [p for p in differences(seed, fixture) if not SEED_SIZED_PATHS.fullmatch(p)]
    r.promise("the fixture is the seed but for its size, and has the seed's labels and annotations (but the "
              "model's layout)",
              not elsewhere and all({k: str(v) for k, v in fixture["metadata"][f].items()} == seed_keys[f]
                                    for f in seed_keys),
              "changed from the seed: " + "; ".join(changes)
              + (f"; also, unexpectedly: {elsewhere}" if elsewhere else ""))
    c.start()
    job = c.scheduler.kube.api(f"/apis/batch.volcano.sh/v1alpha1/namespaces/default/jobs/{c.job.name}")
    wrong = {f"{f}[{k}]": (v, job["metadata"].get(f, {}).get(k)) for f in ("labels", "annotations")
             for k, v in converted["metadata"][f].items() if job["metadata"].get(f, {}).get(k) != v}
    theirs = ("scheduler.regroup.io/", "volcano.sh/", "kubectl.kubernetes.io/")   # not convert's to write
    extra = [k for f in ("labels", "annotations") for k in job["metadata"].get(f, {})
             if k not in converted["metadata"][f] and not k.startswith(theirs)]
    kept = all(converted["metadata"][f].get(k) == str(v) for f in seed_keys for k, v in seed_keys[f].items())
    r.promise("the Job on the API server has the labels and annotations convert wrote, the seed's among them",
              kept and not wrong and not extra,
              f"{len(converted['metadata']['labels'])} labels, {len(converted['metadata']['annotations'])} annotations"
              + (f"; differ {wrong}" if wrong else "") + (f"; not convert's {extra}" if extra else "")
              + ("" if kept else "; convert did not keep the seed's"))
    tasks = {t["name"]: t.get("replicas") for t in job["spec"]["tasks"]}
    r.promise("Master and Worker became one training task beside the manager", tasks == {"manager": 1, "worker": 2},
              str(tasks))
    c.wait_step(10)
    f = c.kill_node(c.node_of(1))
    c.wait_event("directive", "[recover]", after_ms=int(f["at"] * 1000))
    pod = c.replace_pod(1)
    c.wait_event("resumed", after_ms=int(f["at"] * 1000))
    finish_with_replacement(c, r, f, pod, never=["scale_in", "restart_job"])
    decisions = [e["message"].split(":")[0] for e in c.events() if e["kind"] == "directive"]
    r.promise("recover waited for the replacement or resumed with it (wait-reschedule-timeout 60 s)",
              any(d in ("wait [recover]", "resume [recover]") for d in decisions), str(decisions))


@scenario(17, "MindCluster's device plugin reports an NPU of a pod's node at SeparateNPU: the pod is replaced",
          lambda: JobSpec(steps=60, strategies="recover,elastic-training,exit"), spare_nodes=1, volcano=True,
          needs_volcano=True)
def device_plugin_fault(c: Cluster, r: Result) -> None:
    """A cluster that runs MindCluster's device plugin reports its faults to Regroup unchanged: the
    plugin reads the ConfigMap, the node turns faulty, Volcano evicts the pod on it and places its
    replacement elsewhere; the healthy pod trains on from its state, nothing is redone."""
    c.start()
    c.wait_step(10)
    faulty = c.node_of(1)
    survivor_before = c.trainers(c.node_of(0))
    f = c.npu_fault(faulty)
    evicted = c.scheduler.wait_event("evict", lambda e: "SeparateNPU" in str(e.get("reason")), timeout=60)
    r.promise("Volcano evicted the pod on the faulty node, naming the device plugin's fault",
              evicted["pod"] == f"default/{c.job.name}-worker-1" and
              "MindCluster device plugin: Ascend910-3 fault 80E18402 level SeparateNPU" in evicted["reason"],
              str(evicted)[:300])
    c.wait_event("directive", "[recover]", timeout=60, after_ms=int(f["at"] * 1000))
    pod = c.replace_pod(1)
    r.promise("the replacement is not on the faulty node", pod.node.name != faulty,
              f"replacement on {pod.node.name}, the fault on {faulty}")
    c.wait_event("resumed", after_ms=int(f["at"] * 1000))
    r.promise("the healthy pod's trainers were not restarted", c.trainers(c.node_of(0)) == survivor_before,
              f"before {survivor_before}, after {c.trainers(c.node_of(0))}")
    finish_with_replacement(c, r, f, pod, never=["restart_job", "restart_in_place"])


def trainers_lack_fsdp2() -> Optional[str]:
    """Why the trainers' torch cannot shard with FSDP2 (None when it can)."""
    probe = subprocess.run([PYTHON, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                            "from regroup.sharded import fsdp2_available as a; print(int(a()))",
                            str(REPO / "python")], capture_output=True, text=True, timeout=120)
    if probe.stdout.strip() == "1":
        return None
    return (f"HSDP needs FSDP2 (torch >= 2.6) in the trainers' python {PYTHON} "
            "(set REGROUP_PYTHON to scripts/torch2's)")


@scenario(30, "HSDP (FSDP2, 2 replicas x 2 shards): a killed rank, then a lost node and its return; "
              "each replica's shards come back from the peer replica's rank at the same position",
          lambda: JobSpec(steps=400, tp=2, optimizer="adam", shard="hsdp", step_sleep=0.2,
                          strategies="recover-in-place,elastic-training,exit", prefer_elastic=True),
          needs_fsdp2=True)
def hsdp_killed_rank_lost_node_return(c: Cluster, r: Result) -> None:
    killed_rank_then_lost_node_and_return(c, r)


def killed_rank_then_lost_node_and_return(c: Cluster, r: Result, never: Sequence[str] = ()) -> None:
    """On 2 pods of 2 ranks: a killed trainer restarts in place, then node 1 is lost (scale-in to
    2 ranks) and returns (scale-out to 4); weights, ledger, strategies and events checked."""
    c.start()
    c.wait_step(8)
    second = c.node_of(1)
    c.wait_warm(second)
    f = c.kill_trainer(second, 1)
    c.wait_event("generation", "4 ranks", after_ms=int(f["at"] * 1000))   # the rank (replica) is back
    c.wait_step(c.last_step() + 3)                                         # and trains
    measure(c, r, f)
    g, h, pod = lose_a_node_then_return(c, r)
    measure(c, r, g, until=h)
    measure(c, r, h, detected_kinds=("register",))
    check_training(c, r)
    check_strategy(c, r, ["restart_in_place", "scale_in", "scale_out"], never)
    check_story(c, r, [("fault", "process_exit"), ("restart_in_place", ""), ("generation", "4 ranks"),
                       ("fault", "pod_lost"), ("directive", "scale_in"), ("generation", "2 ranks"),
                       ("register", pod.node.name), ("directive", "scale_out"), ("generation", "4 ranks"),
                       ("done", "")])


@scenario(40, "a dp 2 x tp 2 x pp 2 grid on 8 ranks (2 pods x 4): a killed rank restarts in place, a lost "
              "node scales in to dp 1, its return scales out; groups and pipeline schedule rebuilt each time",
          lambda: JobSpec(nproc=4, tp=2, pp=2, steps=150, strategies="recover-in-place,elastic-training,exit",
                          prefer_elastic=True, micro_batch=4, microbatches=4, dataset=64, step_sleep=0.05,
                          # scaled in, a step takes 1 s more: the replacement pod's four trainers
                          # import torch 2.x (tens of seconds on a loaded machine) before training ends
                          extra_train=["--scaled-in-sleep", "1.0"]),
          needs_pipelining=True)
def grid_kill_lose_return(c: Cluster, r: Result) -> None:
    """On 2 pods of 4 ranks: rank 7 (a tp rank of replica 1's last position) killed and restarted
    in place, then node 1 lost (scale-in to 4 ranks) and returned (scale-out to 8).

    The node is lost once the generation the restarted rank rejoined has trained, not
    the moment it is planned: on torch 1.13 a peer lost while the groups are built, after it
    published its address, holds the survivors in torch's group constructor, which no abort
    reaches, until the abort watchdog exits them with the state (docs/design.md, "Aborts";
    a CI run of scenario 52 lost the node 58 ms after the plan and stopped). That window is
    group_test.py's, on torch 2.x, where the groups are built under the rendezvous bound."""
    c.start()
    c.wait_step(5)
    node = c.node_of(1)
    c.wait_warm(node)
    f = c.kill_trainer(node, 3)   # the last stage's second tensor-parallel rank of replica 1
    c.wait_event("resumed", after_ms=int(f["at"] * 1000))
    c.wait_event("generation", "8 ranks", after_ms=int(f["at"] * 1000))  # the rank is back
    c.wait_step(c.last_step() + 3)   # ... and its generation trains
    measure(c, r, f)
    lose_a_node_scale_in_then_out(c, r, 1, started=True, small="4 ranks", full="8 ranks")
    check_strategy(c, r, ["restart_in_place", "scale_in", "scale_out"], ["wait", "restart_job"])


def zero1_repartitions(c: Cluster) -> List[str]:
    """The trainers' log lines of ZeRO-1 repartitions ("slices [..] of dp N assembled from dp M")."""
    return [line for f in sorted(c.dir.glob("*.log")) for line in f.read_text(errors="replace").splitlines()
            if "ZeRO-1 optimizer slices" in line]


@scenario(50, "a distributed optimizer (ZeRO-1, dp 4, a second copy of each slice): a killed rank, then a "
              "lost node and its return; every optimizer slice comes back from its other copy, in place",
          lambda: JobSpec(steps=150, optimizer="adam", step_sleep=0.1, prefer_elastic=True,
                          strategies="recover-in-place,elastic-training,exit",
                          # scaled in, a step takes 0.5 s more: the replacement's trainers import
                          # torch (tens of seconds for torch 2.x on a loaded machine) before the end
                          extra_train=["--optimizer-sharding", "zero1", "--optimizer-copies", "2", "--verbose",
                                       "--scaled-in-sleep", "0.5"]))
def zero1_killed_rank_lost_node_return(c: Cluster, r: Result) -> None:
    # the weights checked against the fault-free run's: plain Adam, one process
    killed_rank_then_lost_node_and_return(c, r, never=["restart_job"])
    lines = zero1_repartitions(c)
    r.promise("the slices were cut to dp 2 from dp 4 (the lost node's from their second copies) and back to dp 4",
              any("of dp 2 assembled from dp 4" in x for x in lines)
              and any("of dp 4 assembled from dp 2" in x for x in lines), "\n".join(lines[-12:]))
    r.promise("no optimizer slice was lost", not any("optimizer shard lost" in e["message"] for e in c.events()))


@scenario(52, "ZeRO-1 (a second copy of each slice) on a dp 4 x tp 2 grid (2 pods x 4, examples/train_grid.py "
              "--tp-impl hand): a killed rank, a lost node (dp 2) and its return; each position's slices come back "
              "from its own data-parallel group",
          lambda: JobSpec(nproc=4, tp=2, grid=True, steps=150, optimizer="adam", step_sleep=0.05,
                          strategies="recover-in-place,elastic-training,exit", prefer_elastic=True,
                          micro_batch=4, microbatches=4, dataset=64,
                          # scaled in, a step takes 0.5 s more: the replacement's trainers import
                          # torch before training ends
                          extra_train=["--optimizer-sharding", "zero1", "--optimizer-copies", "2", "--verbose",
                                       "--scaled-in-sleep", "0.5"]))
def zero1_grid_kill_lose_return(c: Cluster, r: Result) -> None:
    grid_kill_lose_return(c, r)
    lines = zero1_repartitions(c)
    at = "at position 1 (pipeline stage 0, tensor-parallel rank 1)"
    # (from dp 3 when the node is lost while the killed rank's return is still forming: the
    # partition held at the committed step is the one cut)
    r.promise("position 1's slices were cut to dp 2 (the lost node's from their second copies) and back to dp 4",
              any(f"{at} of dp 2 assembled from dp " in x for x in lines)
              and any(f"{at} of dp 4 assembled from dp 2" in x for x in lines), "\n".join(lines[-12:]))
    r.promise("no optimizer slice was lost", not any("optimizer shard lost" in e["message"] for e in c.events()))


@scenario(53, "ZeRO-1 (a second copy of each slice) on a dp 2 x tp 2 x pp 2 grid run by torch's pipeline "
              "schedule (2 pods x 4): a killed rank, a lost node (dp 1) and its return; each position's slices "
              "come back from its own data-parallel group",
          lambda: JobSpec(nproc=4, tp=2, pp=2, steps=150, strategies="recover-in-place,elastic-training,exit",
                          prefer_elastic=True, micro_batch=4, microbatches=4, dataset=64, step_sleep=0.05,
                          optimizer="adam",
                          extra_train=["--optimizer-sharding", "zero1", "--optimizer-copies", "2", "--verbose",
                                       "--scaled-in-sleep", "1.0"]),
          needs_pipelining=True)
def zero1_pipeline_grid_kill_lose_return(c: Cluster, r: Result) -> None:
    grid_kill_lose_return(c, r)
    lines = zero1_repartitions(c)
    at = "at position 3 (pipeline stage 1, tensor-parallel rank 1)"   # the killed rank's position
    r.promise("the last stage's slices were cut to dp 1 (the lost node's from their second copies) and back to dp 2",
              any(f"{at} of dp 1 assembled from dp 2" in x for x in lines)
              and any(f"{at} of dp 2 assembled from dp 1" in x for x in lines), "\n".join(lines[-12:]))
    r.promise("no optimizer slice was lost", not any("optimizer shard lost" in e["message"] for e in c.events()))


@scenario(51, "a distributed optimizer (ZeRO-1, dp 4) without second copies: a killed rank's optimizer slice is "
              "lost, named in the event, and every process restarts from the newest checkpoint",
          lambda: JobSpec(steps=80, optimizer="adam", step_sleep=0.1, checkpoint_interval=10,
                          strategies="recover-in-place,exit",
                          # a fault of the training's own restarts the job only with fault-retry-times
                          extra_labels={"fault-retry-times": "2", "pod-rescheduling": "on"},
                          extra_train=["--optimizer-sharding", "zero1", "--optimizer-copies", "1"]))
def zero1_lost_slice_goes_to_the_checkpoint(c: Cluster, r: Result) -> None:
    c.start()
    c.wait_step(25)
    second = c.node_of(1)
    c.wait_warm(second)
    f = c.kill_trainer(second, 1)
    codes = c.wait_pods_exit()
    r.promise("every pod exited 0", set(codes.values()) == {0}, str(codes))
    measure(c, r, f)
    check_training(c, r)   # the fault-free run's weights, every sample once (the redone steps' last commit)
    check_story(c, r, [("fault", "process_exit"), ("fault", "optimizer shard lost, no second copy: slice [3]"),
                       ("pod_rescheduling", "every process restarts from the newest checkpoint"),
                       ("generation", "from the newest checkpoint"), ("resumed", ""), ("done", "")])
    resumed = [e["message"] for e in c.events() if e["kind"] == "generation" and "from the newest checkpoint" in e["message"]]
    r.promise("the job went back to a checkpoint (a step before the fault's)",
              any(f"resuming after step {s}" in m for m in resumed for s in range(9, f["step"], 10)),
              f"fault at step {f['step']}; {resumed}")


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------



def run(number: int, workdir: Path, network: str = "auto", log=print, volcano: bool = True,
        kube: bool = False) -> Result:
    s = SCENARIOS[number]
    job = s.job()
    result = Result(number, s.title)
    if s.needs_kube and not kube:
        result.skipped = "needs the real Kubernetes control plane (scenarios.py --kube, integration/kube_test.py)"
        return result
    if s.needs_pipelining and subprocess.run([PYTHON, "-c", "import torch.distributed.pipelining"],
                                             capture_output=True, timeout=120).returncode:
        result.skipped = (f"needs torch.distributed.pipelining (torch 2.4 or later) in {PYTHON}: "
                          "scripts/torch2 test runs it")
        return result
    if s.needs_fsdp2:
        why = trainers_lack_fsdp2()
        if why:   # before the reference run, which would fail on it too
            result.skipped = why
            return result
    start = time.monotonic()
    with Cluster(workdir, job, network=network, log=lambda m: log(f"  [{number}] {m}"),
                 spare_nodes=s.spare_nodes) as c:
        result.network = c.net.mode
        if kube:
            # the real control plane (kube_cluster.py): only the scenarios that run with Volcano
            if not (s.volcano if s.kube is None else s.kube):
                result.skipped = "not a scenario for the Kubernetes cluster (it runs standalone only)"
                return result
            if c.net.mode != "netns":
                result.skipped = "the Kubernetes cluster needs network namespaces"
                return result
            from kube_cluster import KubeLoop
            c.scheduler = KubeLoop(c, manager_node=not job.seed_flow)
            result.mode = "kube"
        elif s.volcano and volcano:
            why = volcano_unavailable()
            if why is None:
                # MindCluster's flow has no manager pod: its manager runs in rank 0's pod
                c.scheduler = VolcanoLoop(c, manager_node=not job.seed_flow)
                result.mode = "volcano"
            else:
                log(f"  [{number}] notice: standalone mode, Volcano in the loop unavailable: {why}")
        else:
            why = "--standalone"
        if s.needs_volcano and c.scheduler is None:
            result.skipped = f"needs Volcano in the loop (its coordinator holds the job's keys): {why}"
            return result
        if s.needs_cut and not c.net.can_cut:
            result.skipped = "needs network namespaces to cut a node's link"
            return result
        reference_weights(job)  # before the clock matters
        try:
            s.run(c, result)
            if result.skipped:
                return result
            if kube:
                c.scheduler.check(result)
        except Exception as e:  # noqa: BLE001 - any failure is a broken promise, reported with the logs
            story = "\n".join(f"    {e['at_ms']} {e['kind']}: {e['message']}" for e in c.events())
            pods = c.scheduler.logs() if hasattr(c.scheduler, "logs") else ""
            result.promise("the scenario ran to its end", False, f"{e}\n  events:\n{story}\n{c.logs()}\n{pods}")
        finally:
            if c.scheduler is not None:
                c.scheduler.close()
    result.seconds = time.monotonic() - start
    return result


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["chaos"]:
        import chaos
        return chaos.main(argv[1:])
    p = argparse.ArgumentParser(description="Runs the integration scenarios and prints what each measured.")
    p.add_argument("numbers", nargs="*", type=int, help="scenarios to run (default: all)")
    p.add_argument("--network", default="auto", choices=("auto", "netns", "loopback"))
    p.add_argument("--workdir", default=None, help="keep each run's logs here (default: a temporary folder)")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--standalone", action="store_true", help="never put Volcano in the loop")
    p.add_argument("--kube", action="store_true",
                   help="run on a real Kubernetes control plane with Volcano's job controller (kube_cluster.py)")
    args = p.parse_args(argv)
    numbers = args.numbers or sorted(SCENARIOS)
    root = Path(args.workdir or tempfile.mkdtemp(prefix="regroup-scenarios-"))
    results = []
    for n in numbers:
        res = run(n, root / f"scenario-{n}", args.network, volcano=not args.standalone, kube=args.kube)
        print(res.report(), flush=True)
        results.append(res)
    if args.json:
        Path(args.json).write_text(json.dumps([r.__dict__ | {"faults": [f.__dict__ for f in r.faults]}
                                               for r in results], indent=1, default=str))
    broken = [r.number for r in results if not r.ok and not r.skipped]
    print(f"\n{len(results) - len(broken)} of {len(results)} scenarios kept every promise"
          + (f"; broken: {broken}" if broken else ""))
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
