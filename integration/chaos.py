# SPDX-License-Identifier: Apache-2.0
"""The chaos soak: real training on the local cluster through a random schedule of faults.

One seed draws (with Python's ``random.Random(seed)``) a schedule of faults from the whole menu,
printed at the start so a run can be replayed exactly:

    /usr/bin/python3 integration/scenarios.py chaos --seed 7 --faults 4
    /usr/bin/python3 integration/scenarios.py chaos --seeds 1-12 --faults 6 --json soak.json

The job is elastic (recover-in-place, elastic-training, prefer-elastic; 4 pods x 2 ranks), the
manager keeps its durable record (``--record``), and the harness plays the job controller: a pod
that ended is replaced on its node (a new uid) a moment later. Each fault is injected after the
job has settled from the one before (every pod running, full size, a few steps committed), so
the job makes progress between faults. At the end the run checks that training finished (or
stopped for a reason its configuration allows), the final weights equal an uninterrupted run's,
the ledger holds every sample exactly once per epoch, committed steps never go back to an older
epoch, every commit came from an epoch of the job's real manager (never from the second manager,
which must commit nothing), and that no process of the run outlived it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from cluster import PYTHON, Cluster, JobSpec, Pod, _agent_pid, _signal, _tree, free_ports  # noqa: F401
from regroup.testing import read_ledger, wait_for
from scenarios import Result, check_training, committed_attempts, measure, reference_weights

KINDS = ("kill-trainer", "kill-agent", "kill-node", "pause-agent", "pause-trainer", "cut-link",
         "reset-connection", "restart-manager", "second-manager", "starve-cpu", "slow-link")

# (low, high) seconds each kind lasts, where it lasts
DURATIONS = {"pause-agent": (0.2, 3.0), "pause-trainer": (0.2, 3.0), "cut-link": (0.5, 6.0),
             "restart-manager": (0.5, 3.0), "second-manager": (2.0, 4.0), "starve-cpu": (2.0, 5.0),
             "slow-link": (2.0, 5.0)}
SETTLE_S = 150        # the most a recovery may take before the run calls it stuck
REPLACE_AFTER_S = 1.0  # the job controller's delay before it replaces a pod that ended
STEPS_AFTER = 3       # steps committed at full size before the next fault


def chaos_job(faults: int, nodes: int = 4, nproc: int = 2, steps: Optional[int] = None) -> JobSpec:
    """The job a chaos run trains: one that recovers from every kind of fault on the menu."""
    return JobSpec(nodes=nodes, nproc=nproc, steps=steps or 40 + 45 * faults,
                   strategies="recover-in-place,elastic-training,exit", prefer_elastic=True,
                   liveness_misses=10, dataset=128, micro_batch=4, microbatches=8,
                   # the library's events in each pod's log: a failed seed tells what every
                   # rank was doing (a stalled rendezvous once cost a day to explain without)
                   extra_train=["--verbose"])


def draw_schedule(seed: int, faults: int, nodes: int, nproc: int) -> List[dict]:
    """The faults of one seed, in order: kind, target pod and local rank, how long it lasts and
    how long the job trains undisturbed before it."""
    rng = random.Random(seed)
    out = []
    for i in range(faults):
        kind = rng.choice(KINDS)
        low, high = DURATIONS.get(kind, (0.0, 0.0))
        out.append({"i": i, "kind": kind, "pod": rng.randrange(nodes), "local": rng.randrange(nproc),
                    "duration_s": round(rng.uniform(low, high), 2), "gap_s": round(rng.uniform(0.5, 3.0), 2)})
    return out


@dataclass
class Injected:
    """What happened to one fault of the schedule."""
    plan: dict
    at: float = 0.0
    step: int = -1
    target: str = "-"
    skipped: Optional[str] = None
    detected_by: str = "-"
    strategy: str = "-"
    detection_ms: Optional[int] = None
    progress_ms: Optional[int] = None   # fault -> the first step committed after it
    full_ms: Optional[int] = None       # fault -> every pod back and the job at full size
    settle_s: Optional[float] = None

    def line(self) -> str:
        p = self.plan
        if self.skipped:
            return f"  fault {p['i']}: {p['kind']} SKIPPED ({self.skipped})"
        ms = lambda v: "-" if v is None else f"{v} ms"  # noqa: E731
        return (f"  fault {p['i']}: {p['kind']} {self.target} at step {self.step}"
                + (f" for {p['duration_s']} s" if p["kind"] in DURATIONS else "")
                + f"; detected by {self.detected_by} in {ms(self.detection_ms)}; strategy {self.strategy}; "
                f"next commit {ms(self.progress_ms)}; full size {ms(self.full_ms)}")


@dataclass
class ChaosResult(Result):
    seed: int = 0
    schedule: List[dict] = field(default_factory=list)
    injected: List[Injected] = field(default_factory=list)
    outcome: str = "?"
    epochs: List[int] = field(default_factory=list)
    observations: List[str] = field(default_factory=list)  # worth a look, no broken promise

    def report(self) -> str:
        head = super().report().splitlines()
        lines = [head[0] + f"; outcome: {self.outcome}"]
        lines += [i.line() for i in self.injected]
        lines += [h for h in head[1:] if not h.startswith("  fault:")]
        lines += [f"  observed: {o}" for o in self.observations]
        lines.append(f"  replay: /usr/bin/python3 integration/scenarios.py chaos --seed {self.seed} "
                     f"--faults {len(self.schedule)}")
        return "\n".join(lines)


class Chaos:
    """One seed's run on a cluster: injects the schedule, plays the job controller, checks."""

    def __init__(self, c: Cluster, result: ChaosResult, log=print):
        self.c, self.r, self.log = c, result, log
        self.full = c.job.nodes * c.job.nproc
        self.lost_at: Dict[int, float] = {}     # pod index -> when the harness saw its pod end
        self.second_managers: List[dict] = []
        self.stopped = False                    # the manager ended the job

    # -- the job controller --------------------------------------------------------------------

    def _done(self) -> bool:
        return any(e["kind"] in ("done", "stop") for e in self.c.events()) or \
            (self.c.manager is not None and self.c.manager.poll() is not None and not self._manager_killed)

    _manager_killed = False

    def reconcile(self) -> None:
        """Replaces every pod that failed (on its node, with a new uid) after REPLACE_AFTER_S,
        unless the job is over or the node is cut off."""
        if self._done():
            return
        now = time.monotonic()
        for index in range(self.c.job.nodes):
            pod = self.c.pods.get(f"{self.c.job.name}-worker-{index}")
            if pod is None or pod.process.poll() in (None, 0):  # running, or left for good (done, leave)
                self.lost_at.pop(index, None)
                continue
            if pod.node.cut:
                continue
            seen = self.lost_at.setdefault(index, now)
            if now - seen >= REPLACE_AFTER_S:
                self.log(f"job controller: {pod.name} ended ({pod.process.returncode}); replacing it on {pod.node.name}")
                self.c.exited.append(pod)
                self.c.start_pod(index, pod.node)
                self.lost_at.pop(index, None)

    def _hold(self, seconds: float) -> None:
        """Waits ``seconds`` (a fault's duration), noting the committed step as it goes."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self._observe()
            time.sleep(min(0.1, max(0.0, end - time.monotonic())))

    def _observe(self) -> dict:
        """The manager's status, with the time of the first commit after the current fault."""
        st = self._status()
        inj = self.current
        if st and inj is not None and inj.progress_ms is None and inj.at and \
                int(st.get("committed_step", 0)) > inj.step:  # proto JSON leaves out 0
            inj.progress_ms = int((time.time() - inj.at) * 1000)
        return st

    current: Optional[Injected] = None

    def _status(self) -> dict:
        try:
            return self.c.status(timeout=1)
        except OSError:
            return {}

    def settle(self, inj: Injected) -> bool:
        """Plays the job controller until every pod runs, the job is at full size and has
        committed STEPS_AFTER steps since; False when that takes more than SETTLE_S."""
        start = time.monotonic()
        full_step = None
        while time.monotonic() - start < SETTLE_S:
            self.reconcile()
            if self._done():
                return True
            st = self._observe()
            committed = int(st.get("committed_step", 0)) if st else -1  # proto JSON leaves out 0
            world = int(st.get("world_size", 0)) if st else 0
            running = all(p.process.poll() is None for p in self.c.pods.values())
            if running and world == self.full and committed > inj.step:
                if full_step is None:
                    full_step = committed
                    inj.full_ms = int((time.time() - inj.at) * 1000)
                if committed >= full_step + STEPS_AFTER:
                    inj.settle_s = round(time.monotonic() - start, 1)
                    return True
            else:
                full_step = None
            time.sleep(0.1)
        return False

    # -- targets -------------------------------------------------------------------------------

    def _pod(self, index: int) -> Pod:
        """The running pod ``index``, or the next running one."""
        n = self.c.job.nodes
        for k in range(n):
            pod = self.c.pods.get(f"{self.c.job.name}-worker-{(index + k) % n}")
            if pod is not None and pod.process.poll() is None:
                return pod
        raise RuntimeError("no running pod")

    # -- the faults ------------------------------------------------------------------------------

    def _noted(self, record: dict) -> None:
        if self.current is not None and not self.current.at:
            self.current.at, self.current.step = record["at"], record["step"]

    def inject(self, plan: dict) -> Injected:
        c = self.c
        inj = self.current = Injected(plan)
        pod = self._pod(plan["pod"])
        node = pod.node.name
        kind, d = plan["kind"], plan["duration_s"]
        note = None
        local = plan["local"] % max(1, len(c.trainers(node)))  # a pod restarting may have fewer
        if kind in ("kill-trainer", "pause-trainer") and not c.trainers(node):
            inj.skipped = f"no trainer process running on {node}"
        elif kind == "kill-trainer":
            note = c.kill_trainer(node, local)
            inj.target = f"{node} local rank {local}"
        elif kind == "kill-agent":
            at = c._refresh()
            _signal(_agent_pid(pod.process.pid) or pod.process.pid, signal.SIGKILL)
            note = c.note("kill an agent", at=at, node=node)
            inj.target = node
        elif kind == "kill-node":
            note = c.kill_node(node)
            inj.target = node
        elif kind in ("pause-agent", "pause-trainer"):
            at = c._refresh()
            pid = _agent_pid(pod.process.pid) if kind == "pause-agent" else c.trainers(node)[local]
            _signal(pid, signal.SIGSTOP)
            note = c.note(f"SIGSTOP {kind[6:]} for {d} s", at=at, node=node, pid=pid)
            self._noted(note)
            self._hold(d)
            _signal(pid, signal.SIGCONT)
            inj.target = node + (f" local rank {local}" if kind == "pause-trainer" else "")
        elif kind == "cut-link":
            if not c.net.can_cut:
                inj.skipped = f"cannot cut a link in {c.net.mode} mode"
            else:
                note = c.cut_network(node)
                self._noted(note)
                self._hold(d)
                c.restore_network(node)
                inj.target = node
        elif kind == "slow-link":
            if not c.net.can_cut:
                inj.skipped = f"cannot slow a link in {c.net.mode} mode (tc netem/tbf needs namespaces)"
            else:
                # this kernel refuses netem: a token bucket (tbf) is what slows the link
                note = c.slow_link(node, "1mbit")
                self._noted(note)
                self._hold(d)
                c.net.unslow(c.nodes[node])
                inj.target = node
        elif kind == "reset-connection":
            note, why = self._reset_connection(pod)
            inj.skipped, inj.target = why, node
        elif kind == "restart-manager":
            self._manager_killed = True
            note = c.kill_manager()
            self._noted(note)
            self._hold(d)
            c.start_manager()
            self._manager_killed = False
            self._note_epoch()
            inj.target = "manager"
        elif kind == "second-manager":
            note = self._second_manager(d)
            inj.target = "a second manager"
        elif kind == "starve-cpu":
            at = c._refresh()
            n = os.cpu_count() or 2
            code = "import sys, time\nt = time.time() + float(sys.argv[1])\nwhile time.time() < t: pass"
            loops = [c._spawn([PYTHON, "-c", code, str(d), str(c.dir)], c.dir / "starve.log") for _ in range(n)]
            note = c.note(f"starve the CPU: {n} busy loops for {d} s", at=at)
            self._noted(note)
            self._hold(d)
            for p in loops:
                p.wait(timeout=30)
            inj.target = f"{n} cores"
        else:
            raise ValueError(f"unknown fault kind {kind}")
        if inj.skipped:
            self.log(f"notice: fault {plan['i']} ({kind}) skipped: {inj.skipped}")
        if note is not None:
            self._noted(note)
        return inj

    def _reset_connection(self, pod: Pod):
        """Resets the agent's TCP connection to the manager (``ss -K`` in the pod's node)."""
        c = self.c
        agent = _agent_pid(pod.process.pid)
        port = c.manager_port
        listing = subprocess.run(pod.node.wrap(["ss", "-tnpH", "state", "established", "dport", "=", f":{port}"]),
                                 capture_output=True, text=True, timeout=20)
        local = None
        for line in listing.stdout.splitlines():
            if f"pid={agent}," in line:
                local = line.split()[2].rsplit(":", 1)[1]  # with a state filter: Recv-Q Send-Q Local Peer
        if local is None:
            return None, f"no connection of the agent (pid {agent}) to the manager's port {port} found by ss"
        at = c._refresh()
        kill = subprocess.run(pod.node.wrap(["ss", "-K", "-tnH", "sport", "=", f":{local}", "dport", "=", f":{port}"]),
                              capture_output=True, text=True, timeout=20)
        if kill.returncode != 0 or not kill.stdout.strip():
            return None, f"ss -K refused ({kill.stderr.strip() or 'no socket destroyed'}): needs root and INET_DIAG_DESTROY"
        return c.note("reset the agent's connection to the manager", at=at, node=pod.node.name, port=local), None

    def _second_manager(self, duration: float) -> dict:
        """A second manager of the same job (same job file, credential and durable record) on
        other ports, for ``duration`` s: it must form no generation and commit nothing."""
        c = self.c
        n = len(self.second_managers) + 1
        port, http = free_ports(c.manager_host, 2)
        argv = [c.bin["regroup-manager"], "--job", str(c.job_file), "--job-id", c.job.job_id,
                "--listen", f"{c.manager_host}:{port}", "--http", f"{c.manager_host}:{http}",
                "--credential-file", str(c.credential), "--join-window-s", "120",
                "--stay-after-done"]  # its checks read /status once the job ended
        argv += c.record_args()
        at = c._refresh()
        log = c.dir / f"second-manager-{n}.log"
        p = c._spawn(argv, log)
        note = c.note("start a second manager of the job", at=at, port=port)
        self._noted(note)
        def status():
            try:
                import urllib.request
                with urllib.request.urlopen(c.status_request(http), timeout=1) as r:
                    return json.loads(r.read())
            except OSError:
                return None
        first = wait_for(lambda: status() or p.poll() is not None, 30, "the second manager to answer")
        self._hold(duration)
        last = status() if p.poll() is None else None
        for pid in _tree(p.pid):
            _signal(pid, signal.SIGKILL)
        p.wait(timeout=10)
        st = last or (first if isinstance(first, dict) else {})
        self.second_managers.append({"epoch": int(st.get("epoch", 0)), "status": st, "log": log,
                                     "exit": p.returncode})
        return note

    def _note_epoch(self) -> None:
        st = self._status()
        if st.get("epoch"):
            self.r.epochs.append(int(st["epoch"]))

    # -- the run ---------------------------------------------------------------------------------

    def run(self) -> None:
        c, r = self.c, self.r
        c.start()
        c.wait_step(3, timeout=180)
        self._note_epoch()
        for plan in r.schedule:
            time.sleep(plan["gap_s"])
            if self._done():
                r.injected.append(Injected(plan, skipped="training had ended"))
                continue
            inj = self.inject(plan)
            r.injected.append(inj)
            if inj.skipped:
                continue
            if not self.settle(inj):
                r.promise(f"the job recovered from fault {plan['i']} ({plan['kind']}) within {SETTLE_S} s", False,
                          f"status: world {self._status().get('world_size')}, committed "
                          f"{self._status().get('committed_step')}; pods "
                          f"{ {n: p.process.poll() for n, p in c.pods.items()} }")
                return
            self._measure(inj)
        # the rest of training, replacing pods that end until the job does
        deadline = time.monotonic() + 600
        while not self._done() and time.monotonic() < deadline:
            self.reconcile()
            time.sleep(0.1)

    def _measure(self, inj: Injected) -> None:
        """Detection and strategy from the manager's events (the first after the fault)."""
        rec = measure(self.c, self.r, {"at": inj.at, "fault": inj.plan["kind"]},
                      until={"at": time.time()})
        inj.detected_by, inj.strategy, inj.detection_ms = rec.detected_by, rec.strategy, rec.detection_ms
        self.r.faults.pop()  # reported by the Injected lines
        if inj.plan["kind"] == "reset-connection" and inj.strategy != "-":
            # docs/design.md ("Generations, fencing and the step commit"): a broken stream that
            # reconnects with the same pod uid and epoch in time is not a fault.
            self.r.observations.append(
                f"fault {inj.plan['i']}: one reset TCP connection of a live agent was taken as a fault "
                f"({inj.detected_by} in {inj.detection_ms} ms, then {inj.strategy}); the agent reconnected "
                "at once with the same uid and epoch and was refused as a zombie")

    def check(self) -> None:
        c, r = self.c, self.r
        events = c.events()
        done = any(e["kind"] == "done" for e in events)
        stop = next((e for e in events if e["kind"] == "directive" and e["message"].startswith(("exit", "dump"))), None)
        if done:
            r.outcome = "finished"
            codes = c.wait_pods_exit(timeout=120)
            r.promise("every pod exited 0", set(codes.values()) == {0}, str(codes))
            check_training(c, r)
        elif stop is not None:
            # exit is always allowed; dump is not in the job's strategies
            r.outcome = f"stopped: {stop['message'][:160]}"
            r.promise("the job stopped for a reason its configuration allows", stop["message"].startswith("exit"),
                      stop["message"])
            check_training(c, r, expect_done=False)
        else:
            r.outcome = "neither finished nor stopped"
            r.promise("training finished or stopped for a named reason", False,
                      "events:\n" + "\n".join(f"    {e['at_ms']} {e['kind']}: {e['message'][:200]}" for e in events))
            check_training(c, r, expect_done=False)
        # Replicas that disagree on their parameters are an exactness failure (a step applied from
        # the wrong state), never an allowed end, whatever the strategy does next.
        diverged = [e["message"] for e in events if "replicas disagree" in e["message"]]
        r.promise("the replicas never disagreed on their parameters", not diverged,
                  diverged[0][:300] if diverged else "")
        self.check_epochs()
        self.check_record()

    def check_record(self) -> None:
        """An observation, not a promise: the durable record should hold the newest epoch granted."""
        if self.c.record is None or not self.c.record.exists() or not self.second_managers:
            return
        on_record = int(json.loads(self.c.record.read_text()).get("epoch", 0))
        newest = max(m["epoch"] for m in self.second_managers)
        if on_record < newest:
            self.r.observations.append(
                f"the durable record ends at epoch {on_record}, below the epoch {newest} a second manager "
                "took from it: a new incarnation does not write its epoch until its first change, and the "
                "running manager writes its own older epoch back")

    def check_epochs(self) -> None:
        """Fencing: committed steps never go back to an older epoch or generation, every commit
        came from an epoch of the job's manager, and the second managers committed nothing."""
        r = self.r
        records = read_ledger(self.c.ledger)
        best = committed_attempts(records)
        steps = sorted(best)
        back = [(a, best[a], b, best[b]) for a, b in zip(steps, steps[1:]) if best[b] < best[a]]
        r.promise("committed steps never went back to an older epoch or generation", not back,
                  f"{len(steps)} steps in epochs {sorted({g[0] for g in best.values()})}" if not back
                  else f"step {back[0][0]} in {back[0][1]} but step {back[0][2]} in {back[0][3]}")
        real = set(r.epochs)
        foreign = sorted({g[0] for g in best.values()} - real)
        r.promise("every committed step came from an epoch of the job's manager", not foreign,
                  f"manager epochs {sorted(real)}" + (f"; committed in other epochs {foreign}" if foreign else ""))
        for i, m in enumerate(self.second_managers, 1):
            st, epoch = m["status"], m["epoch"]
            if not st:  # it never answered: it refused to start or died (its log says why)
                tail = m["log"].read_text(errors="replace")[-300:] if m["log"].exists() else ""
                r.promise(f"second manager {i} never ran (so committed nothing)", True, f"{tail!r}")
                continue
            events = st.get("events", [])
            formed = [e for e in events if e["kind"] in ("generation", "resumed", "done")]
            in_ledger = [x for x in records if x["g"][0] == epoch]
            r.promise(f"second manager {i} (epoch {epoch}) formed no generation and committed nothing",
                      epoch not in real and not formed and int(st.get("committed_step", 0)) < 0 and not in_ledger,
                      f"committed_step {st.get('committed_step', -1)}, events {[e['kind'] for e in events]}, "
                      f"{len(in_ledger)} ledger lines in its epoch")


def leftovers(workdir: Path) -> List[int]:
    """Processes still running whose command line names the run's folder."""
    mine = str(workdir)
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if mine in cmd:
            out.append(int(d.name))
    return out


def run_seed(seed: int, faults: int, workdir: Path, network: str = "auto", log=print,
             nodes: int = 4, nproc: int = 2, steps: Optional[int] = None) -> ChaosResult:
    job = chaos_job(faults, nodes, nproc, steps)
    schedule = draw_schedule(seed, faults, nodes, nproc)
    result = ChaosResult(0, f"chaos seed {seed}, {faults} faults, {nodes} pods x {nproc} ranks, {job.steps} steps",
                         seed=seed, schedule=schedule)
    log(f"[chaos {seed}] schedule: " + json.dumps(schedule))
    reference_weights(job)  # before the clock matters
    start = time.monotonic()
    workdir = Path(workdir).resolve()
    with Cluster(workdir, job, network=network, log=lambda m: log(f"  [chaos {seed}] {m}"),
                 record=True) as c:
        result.network = c.net.mode
        chaos = Chaos(c, result, log=lambda m: log(f"  [chaos {seed}] {m}"))
        try:
            chaos.run()
            chaos.check()
        except Exception as e:  # noqa: BLE001 - any failure is a broken promise, reported with the logs
            story = "\n".join(f"    {e['at_ms']} {e['kind']}: {e['message']}" for e in c.events())
            result.promise("the run went to its end", False, f"{type(e).__name__}: {e}\n  events:\n{story}\n{c.logs()}")
    left = leftovers(workdir)
    for pid in left:
        _signal(pid, signal.SIGKILL)
    result.promise("every process the run started was stopped", not left, f"left running: {left}" if left else "")
    result.seconds = time.monotonic() - start
    return result


def _seeds(args) -> List[int]:
    out = list(args.seed or [])
    for spec in args.seeds or []:
        a, _, b = spec.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return out or [1]


def summary(results: Sequence[ChaosResult]) -> str:
    """Runs, outcomes, and per kind of fault: how many were injected or skipped, and the time from
    the fault to the next commit and to the job back at full size (median and max)."""
    kinds: Dict[str, List[int]] = {}
    times: Dict[str, Dict[str, List[int]]] = {}
    for r in results:
        for i in r.injected:
            k = kinds.setdefault(i.plan["kind"], [0, 0])
            k[1 if i.skipped else 0] += 1
            for what in ("progress_ms", "full_ms"):
                if getattr(i, what) is not None and not i.skipped:
                    times.setdefault(i.plan["kind"], {}).setdefault(what, []).append(getattr(i, what))
    lines = [f"{len(results)} runs, {sum(r.ok for r in results)} kept every promise; outcomes: "
             + ", ".join(f"{o} x{n}" for o, n in _count(r.outcome for r in results).items())]
    lines.append("| fault | injected | skipped | next commit after (median, max) | full size after (median, max) |")
    lines.append("|---|---|---|---|---|")

    def spread(v: List[int]) -> str:
        v = sorted(v)
        return f"{v[len(v) // 2] / 1000:.1f} s, {v[-1] / 1000:.1f} s" if v else "-"
    for k in KINDS:
        if k in kinds:
            t = times.get(k, {})
            lines.append(f"| {k} | {kinds[k][0]} | {kinds[k][1]} | {spread(t.get('progress_ms', []))} | "
                         f"{spread(t.get('full_ms', []))} |")
    broken = [r.seed for r in results if not r.ok]
    if broken:
        lines.append(f"broken seeds: {broken}")
    observed = [r.seed for r in results if r.observations]
    if observed:
        lines.append(f"seeds with observations: {observed}")
    return "\n".join(lines)


def _count(items) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="scenarios.py chaos",
                                description="Random fault schedules on real training, one per seed (replayable).")
    p.add_argument("--seed", type=int, action="append", help="a seed (repeatable)")
    p.add_argument("--seeds", action="append", help="a range of seeds, A-B")
    p.add_argument("--faults", type=int, default=4, help="faults per run (default 4)")
    p.add_argument("--nodes", type=int, default=4, help="pods (default 4)")
    p.add_argument("--nproc", type=int, default=2, help="ranks per pod (default 2)")
    p.add_argument("--steps", type=int, default=None, help="training steps (default 40 + 45 per fault)")
    p.add_argument("--network", default="auto", choices=("auto", "netns", "loopback"))
    p.add_argument("--workdir", default=None, help="keep each run's logs here (default: a temporary folder)")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    root = Path(args.workdir or tempfile.mkdtemp(prefix="regroup-chaos-"))
    results = []
    for seed in _seeds(args):
        res = run_seed(seed, args.faults, root / f"seed-{seed}", args.network, nodes=args.nodes,
                       nproc=args.nproc, steps=args.steps)
        print(res.report(), flush=True)
        results.append(res)
    print("\n" + summary(results))
    if args.json:
        Path(args.json).write_text(json.dumps([{
            "seed": r.seed, "ok": r.ok, "outcome": r.outcome, "seconds": round(r.seconds, 1),
            "network": r.network, "broken": r.broken(), "observations": r.observations,
            "faults": [{k: v for k, v in i.__dict__.items()} for i in r.injected]} for r in results], indent=1))
    return 0 if all(r.ok for r in results) else 1
