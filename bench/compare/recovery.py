#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Recovery end to end: the same training job (train_bench.py, 2 "nodes" x 2 ranks on loopback)
under Regroup and under torchrun, with the same faults, timed the same way.

    /usr/bin/python3 bench/compare/recovery.py --systems regroup,torchrun-ckpt10,torchrun-ckpt1 \
        --reps 3 --out bench/compare/results/recovery.jsonl

Systems:
  regroup          regroup-manager (its own process, as its own pod) + one regroup-agent per node;
                   recover-in-place, elastic-training with prefer-elastic; checkpoints every
                   --ckpt steps too (the same I/O cost as torchrun's run, not used for recovery).
  torchrun-ckptN   `python -m torch.distributed.run` per node, c10d rendezvous hosted by node 0
                   (is_host), --nnodes=1:2, --max_restarts=10, torch's default timeouts
                   (monitor interval 5 s, last_call 30 s, keep-alive 5 s x 3), checkpoint every N
                   steps, resuming from the newest at every (re)start.

Faults, in this order in one run (node 1 is the victim; node 0 hosts torchrun's store):
  trainer   SIGKILL one trainer process of node 1, once the job committed step --at-trainer;
  node      SIGKILL node 1's whole tree (agent + trainers / torchrun + workers) at --at-node;
            no spare: the job must continue on node 0 alone;
  return    node 1 is launched again at --at-return.
A fault waits for the previous one's first committed step. Each run ends when --steps steps are
committed. A run with no fault (--baseline) gives the job time without faults.

Per fault: detect_s (fault -> the first line of the control plane that shows it knows: Regroup's
manager, torchrun's agents; lines timestamped by this harness as they arrive), resume_s (fault ->
the first step committed after it; for `return`, the first committed at full size), redone
(steps committed before the fault and committed again after it). Per run: job_s (launch -> last
step committed). Every number comes from wall-clock times written by the processes themselves
(events.jsonl of the trainers) or by this harness.

Launching a node is one function, `launch_node`, so it can be swapped for the integration
cluster's (network namespaces) later.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (BUILD, HERE, PYTHON, append_jsonl, free_port, lineage, loadavg, read_jsonl,  # noqa: E402
                    sample_diff, steady_step_s, weights_diff)

sys.path.insert(0, str(HERE.parents[1] / "python"))
from regroup.testing import descendants  # noqa: E402

TRAIN = HERE / "train_bench.py"
# Part C: each peer's own script (train_bench.py serves Regroup and torchrun).
SCRIPT = {"regroup": TRAIN, "torchrun": TRAIN, "torchft": HERE / "train_torchft.py", "nvrx": HERE / "train_nvrx.py"}
NEVER = re.compile(r"(?!)")
NPROC = 2
NODES = 2

# The first line that shows the control plane knows of the fault (see --help text above).
DETECT = {
    "regroup": {
        "trainer": re.compile(r"exit|killed|signal", re.I),
        "node": re.compile(r"lost|broken|disconnect|gone|stream", re.I),
        "return": re.compile(r"regist|scale_out|scale out", re.I),
    },
    "torchrun": {
        "trainer": re.compile(r"failed \(exitcode|Worker group FAILED", re.I),
        "node": re.compile(r"failed \(exitcode|Worker group FAILED", re.I),
        "return": re.compile(r"new nodes|Detected \d+ new", re.I),
    },
    # Part C does not time detection for the peers (no line of theirs is comparable).
    "torchft": {"trainer": NEVER, "node": NEVER, "return": NEVER},
    "nvrx": {"trainer": NEVER, "node": NEVER, "return": NEVER},
}
# What a peer cannot do here, said in the results instead of an empty cell.
UNSUPPORTED = {
    ("nvrx", "return"): "nvidia-resiliency-ext 0.4.1's in-process restart only shrinks the job (its rank "
                        "assignment drops terminated ranks); a new process cannot join a running Wrapper, "
                        "and bringing ranks back is its in-job restart (ft_launcher), which restarts every rank",
}


WORKER_LINE = re.compile(r"^\[default\d+\]:")


class Logged:
    """A process whose output lines are timestamped (wall clock) as they arrive."""

    def __init__(self, name: str, argv: List[str], env: Dict[str, str], logfile: Path):
        self.name = name
        self.lines: List[tuple] = []
        self.file = open(logfile, "a")
        full = dict(os.environ)
        full.update(env)
        self.proc = subprocess.Popen(argv, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True, text=True, errors="replace")
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            t = time.time()
            self.lines.append((t, line.rstrip("\n")))
            self.file.write(f"{t:.3f} {line}")
            self.file.flush()

    def tree(self) -> List[int]:
        """This process and all its descendants."""
        return descendants(self.proc.pid)

    def kill_tree(self) -> None:
        for pid in self.tree():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class Run:
    def __init__(self, system: str, ckpt: int, args, workdir: Path):
        self.system = system
        self.kind = system if system in ("regroup", "torchft", "nvrx") else "torchrun"
        self.python = getattr(args, "python", None) or PYTHON
        self.ckpt = ckpt
        self.args = args
        self.dir = workdir
        self.events = workdir / "events.jsonl"
        self.ckpt_dir = workdir / "ckpt"
        self.nodes: Dict[str, Logged] = {}
        self.control: List[Logged] = []  # processes whose lines show detection
        self.manager: Optional[Logged] = None
        self.port = free_port()
        self.job = f"bench-{os.getpid()}-{int(time.time())}"
        self.status: Optional[dict] = None  # regroupctl status --json at the end (Regroup)

    # -- the node launcher: the one function to swap for the integration cluster's ------------

    def launch_node(self, node_rank: int, name: str) -> Logged:
        train = [str(SCRIPT[self.kind]), "--steps", str(self.args.steps), "--events", str(self.events)]
        if self.kind in ("regroup", "torchrun"):
            train += ["--checkpoint-dir", str(self.ckpt_dir), "--checkpoint-interval", str(self.ckpt)]
        if getattr(self.args, "final", False):
            train += ["--final", str(self.dir / "final.bin")]
        env = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        if self.kind in ("torchft", "nvrx"):
            # A node is its processes under one shell (killing the node kills the tree):
            # torchft: one replica group per `torchrun --nproc_per_node=1`, as its examples run it;
            # nvrx: one plain process per rank, the in-process wrapper inside.
            cmds = []
            for local in range(NPROC):
                r = node_rank * NPROC + local
                q = " ".join(f"'{a}'" for a in train)
                if self.kind == "torchft":
                    cmds.append(f"REPLICA_GROUP_ID={r} exec '{self.python}' -m torch.distributed.run --standalone "
                                f"--nnodes=1 --nproc_per_node=1 --max_restarts=10 {q} --groups {NODES * NPROC}")
                else:
                    cmds.append(f"RANK={r} exec '{self.python}' {q}")
            if self.kind == "torchft":
                env["TORCHFT_LIGHTHOUSE"] = f"http://127.0.0.1:{self.port}"
            else:
                env.update(WORLD_SIZE=str(NODES * NPROC), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(self.port))
            argv = ["bash", "-c", " & ".join(f"({c})" for c in cmds) + " & wait"]
        elif self.kind == "regroup":
            argv = [str(BUILD / "regroup-agent"), "--manager", f"127.0.0.1:{self.mport}", "--job-id", self.job,
                    "--nnodes", str(NODES), "--nproc-per-node", str(NPROC), "--node-rank", str(node_rank),
                    "--master-addr", "127.0.0.1", "--host", "127.0.0.1",
                    "--socket-dir", str(self.dir / f"sock-{name}"), "--python", self.python, *train]
        else:
            env["LOGLEVEL"] = "INFO"
            # --redirects/--tee non-zero: Debian's torch 1.13 on Python 3.11 crashes at start with
            # the default 0 (an IntFlag zero-member quirk).
            argv = [self.python, "-m", "torch.distributed.run", "--redirects=2", "--tee=2",
                    f"--nnodes=1:{NODES}", f"--nproc_per_node={NPROC}", "--rdzv_backend=c10d",
                    f"--rdzv_endpoint=127.0.0.1:{self.port}", f"--rdzv_id={self.job}",
                    f"--rdzv_conf=is_host={1 if name == 'node0' else 0}",
                    "--max_restarts=10", *train]
        p = Logged(name, argv, env, self.dir / f"{name}.log")
        self.nodes[name] = p
        if self.kind == "torchrun":
            self.control.append(p)
        return p

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.kind == "torchft":
            # The lighthouse as torchft's README starts it, in its own process (like its own pod).
            lh = str(Path(self.python).parent / "torchft_lighthouse")
            self.manager = Logged("lighthouse", [lh, "--min_replicas", "1", "--quorum_tick_ms", "100",
                                                 "--join_timeout_ms", "10000", "--bind", f"127.0.0.1:{self.port}"],
                                  {}, self.dir / "lighthouse.log")
            self.control.append(self.manager)
        if self.kind == "regroup":
            port_file = self.dir / "manager.port"
            argv = [str(BUILD / "regroup-manager"), "--job-id", self.job, "--nodes", str(NODES),
                    "--nproc-per-node", str(NPROC), "--listen", "127.0.0.1:0", "--port-file", str(port_file),
                    "--join-window-s", "120", "--stay-after-done", "--label", "fault-scheduling=force",
                    "--record", str(self.dir / "record.json"),
                    # torchrun's c10d store has no credential either: the comparison is of recovery,
                    # on one machine, so the manager runs open (--insecure) like its peer.
                    "--insecure",
                    "--annotation", "recover-strategy=retry,recover-in-place,recover,elastic-training,dump,exit",
                    "--annotation", "regroup.io/prefer-elastic=true",
                    "--annotation", "regroup.io/global-batch-size=64",
                    "--annotation", "regroup.io/micro-batch-size=8",
                    "--annotation", "regroup.io/checksum-interval=0",
                    # A frozen-process timeout of 5 s (200 ms x 25) instead of the default 500 ms: at
                    # the load of this shared 2-core machine the default flags busy survivors as
                    # frozen (see README.md, "Findings").
                    "--annotation", "regroup.io/heartbeat-interval-ms=200",
                    "--annotation", "regroup.io/liveness-misses=25"]
            self.manager = Logged("manager", argv, {}, self.dir / "manager.log")
            self.control.append(self.manager)
            deadline = time.time() + 30
            while not (port_file.exists() and port_file.read_text().strip()):
                if time.time() > deadline or self.manager.proc.poll() is not None:
                    raise RuntimeError("the manager did not start")
                time.sleep(0.02)
            self.mport = int(port_file.read_text())
        self.t_launch = time.time()
        for n in range(NODES):
            self.launch_node(n, f"node{n}")

    def stop(self) -> None:
        for p in list(self.nodes.values()) + ([self.manager] if self.manager else []):
            p.kill_tree()
        for p in list(self.nodes.values()) + ([self.manager] if self.manager else []):
            try:
                p.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass

    # -- reading progress ---------------------------------------------------------------------

    def commits(self) -> List[dict]:
        return [e for e in read_jsonl(self.events) if e.get("kind") == "commit"]

    def max_step(self) -> int:
        return max((e["step"] for e in self.commits()), default=-1)

    def wait(self, pred, timeout: float, what: str) -> None:
        deadline = time.time() + timeout
        while not pred():
            if time.time() > deadline:
                raise TimeoutError(f"{what}: not within {timeout:.0f} s")
            if self.kind in ("regroup", "torchft") and self.manager and self.manager.proc.poll() is not None:
                raise RuntimeError(f"{what}: the {self.manager.name} exited")
            if all(p.proc.poll() is not None for p in self.nodes.values()):
                if not pred():
                    raise RuntimeError(f"{what}: every node exited")
            time.sleep(0.02)

    def trainers_of(self, name: str) -> List[int]:
        node = self.nodes[name]
        pids = []
        for pid in node.tree()[1:]:
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(c.endswith(str(SCRIPT[self.kind].name).encode()) for c in cmd) and b"torch.distributed.run" not in cmd:
                pids.append(pid)
        return sorted(pids)

    # -- faults -------------------------------------------------------------------------------

    def measure(self, fault: str, t_f: float, full_size: bool, t_next: float = float("inf")) -> dict:
        commits = self.commits()
        before = [c for c in commits if c["t"] < t_f]
        after = [c for c in commits if c["t"] >= t_f]
        if full_size:
            after = [c for c in after if c["world"] == NODES * NPROC]
        m = max((c["step"] for c in before), default=-1)
        out = {"fault": fault, "t": t_f, "last_before": m}
        if after:
            first = min(after, key=lambda c: c["t"])
            # The longest time without any committed step, from the fault to that first step.
            ts = [t_f] + sorted(c["t"] for c in commits if t_f <= c["t"] <= first["t"])
            out["pause_s"] = round(max(b - a for a, b in zip(ts, ts[1:])), 3) if len(ts) > 1 else None
            out["resume_s"] = round(first["t"] - t_f, 3)
            out["first_after"] = first["step"]

        # Steps done again: commits (after the fault, before the next one) of a step that had been
        # committed already.
        repeats, best = [], -1
        for c in sorted(commits, key=lambda c: c["t"]):
            if c["step"] <= best:
                repeats.append(c["t"])
            best = max(best, c["step"])
        out["redone"] = sum(1 for t in repeats if t_f <= t < t_next)
        pattern = DETECT[self.kind][fault]
        if self.kind == "regroup":
            # The manager's own event log (regroupctl status): when it learned of the fault.
            events = (self.status or {}).get("events", [])
            seen = [int(e.get("at_ms", e.get("atMs", 0))) / 1000 for e in events
                    if int(e.get("at_ms", e.get("atMs", 0))) / 1000 >= t_f - 0.002 and pattern.search(
                        f"{e.get('kind', '')} {e.get('message', '')}")]
            out["detect_event"] = next((f"{e.get('kind')}: {e.get('message', '')[:160]}" for e in events
                                        if int(e.get("at_ms", e.get("atMs", 0))) / 1000 >= t_f - 0.002
                                        and pattern.search(f"{e.get('kind', '')} {e.get('message', '')}")), None)
        else:
            # The agents' own lines, not their workers' (torchrun prefixes those with "[defaultN]:").
            seen = [t for p in self.control for (t, line) in list(p.lines)
                    if t >= t_f and pattern.search(line) and not WORKER_LINE.match(line)]
        if seen:
            out["detect_s"] = round(min(seen) - t_f, 3)
        return out

    def run(self) -> dict:
        a = self.args
        result = {"system": self.system, "ckpt_interval": self.ckpt, "steps": a.steps, "baseline": a.baseline,
                  "loadavg_before": loadavg(), "faults": []}
        try:
            self.start()
            t0 = self.t_launch
            self.wait(lambda: self.max_step() >= 0, a.phase_timeout, "the first step")
            result["first_step_s"] = round(min(c["t"] for c in self.commits()) - t0, 3)
            if not a.baseline:
                # 1. a trainer process is killed
                self.wait(lambda: self.max_step() >= a.at_trainer, a.phase_timeout, "step for the trainer fault")
                victims = self.trainers_of("node1")
                if not victims:
                    raise RuntimeError("no trainer process found on node1")
                t_f = time.time()
                os.kill(victims[-1], signal.SIGKILL)
                self.wait(lambda: any(c["t"] > t_f for c in self.commits()), a.phase_timeout, "recovery from the trainer fault")
                tf1 = t_f
                # 2. node 1 is killed; no spare
                self.wait(lambda: self.max_step() >= a.at_node, a.phase_timeout, "step for the node fault")
                t_f = time.time()
                self.nodes["node1"].kill_tree()
                self.nodes["node1"].proc.wait(10)
                self.wait(lambda: any(c["t"] > t_f for c in self.commits()), a.phase_timeout, "recovery from the node fault")
                tf2 = t_f
                # 3. node 1 returns
                self.wait(lambda: self.max_step() >= a.at_return, a.phase_timeout, "step for the node's return")
                t_f = time.time()
                tf3 = t_f
            if not a.baseline and (self.kind, "return") not in UNSUPPORTED:
                old = self.nodes.pop("node1")
                self.nodes["node1-old"] = old
                if old in self.control:
                    self.control.remove(old)
                self.launch_node(1, "node1")
                self.wait(lambda: any(c["t"] > t_f and c["world"] == NODES * NPROC for c in self.commits())
                          or self.max_step() >= a.steps - 1, a.phase_timeout, "full size after the node's return")
            self.wait(lambda: self.max_step() >= a.steps - 1, a.phase_timeout * 2, "the last step")
            commits = self.commits()
            last = min(c["t"] for c in commits if c["step"] == a.steps - 1)
            result["job_s"] = round(last - t0, 3)
            result["timeline"] = [[round(c["t"] - t0, 3), c["step"], c["world"]] for c in sorted(commits, key=lambda c: c["t"])]
            if not a.baseline:
                result["faults"] = [self.measure("trainer", tf1, False, tf2), self.measure("node", tf2, False, tf3),
                                    self.measure("return", tf3, True)]
                for f in result["faults"]:
                    f["at_s"] = round(f["t"] - t0, 3)
                    if (self.kind, f["fault"]) in UNSUPPORTED:
                        f["unsupported"] = UNSUPPORTED[(self.kind, f["fault"])]
            result["steady_step_s"] = steady_step_s(result["timeline"])
            result["ok"] = True
        except Exception as e:  # noqa: BLE001
            result["ok"] = False
            result["error"] = f"{type(e).__name__}: {e}"
        finally:
            if self.kind == "regroup" and self.manager is not None and self.manager.proc.poll() is None:
                try:
                    st = subprocess.run([str(BUILD / "regroupctl"), "status", "--manager", f"127.0.0.1:{self.mport}",
                                         "--json"], capture_output=True, text=True, timeout=30)
                    (self.dir / "status.json").write_text(st.stdout)
                    self.status = json.loads(st.stdout)
                    if result.get("faults"):
                        ts = [f["t"] for f in result["faults"]] + [float("inf")]
                        result["faults"] = [dict(self.measure(f["fault"], f["t"], f["fault"] == "return", ts[i + 1]),
                                                 at_s=f["at_s"]) for i, f in enumerate(result["faults"])]
                except (subprocess.SubprocessError, json.JSONDecodeError, OSError) as e:
                    result["status_error"] = str(e)
            # Let the processes finish by themselves for a moment, then stop everything.
            deadline = time.time() + 20
            while time.time() < deadline and any(p.proc.poll() is None for p in self.nodes.values()):
                time.sleep(0.1)
            self.stop()
        if result.get("ok"):
            result["lineage"] = lineage(read_jsonl(self.events))  # after every process wrote its records
        result["loadavg_after"] = loadavg()
        result["workdir"] = str(self.dir)
        return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--systems", default="regroup,torchrun-ckpt10,torchrun-ckpt1")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--at-trainer", type=int, default=15)
    p.add_argument("--at-node", type=int, default=30)
    p.add_argument("--at-return", type=int, default=40)
    p.add_argument("--ckpt", type=int, default=10, help="Regroup's checkpoint interval (I/O parity)")
    p.add_argument("--baseline", action="store_true", help="also run each system once without faults")
    p.add_argument("--baseline-systems", default="", help="with --baseline: only these (default: all)")
    p.add_argument("--phase-timeout", type=float, default=240)
    p.add_argument("--out", default=str(HERE / "results" / "recovery.jsonl"))
    p.add_argument("--workdir", default=None, help="keep logs here (default: a temporary directory)")
    p.add_argument("--keep", action="store_true", help="keep the work directories")
    p.add_argument("--python", default=PYTHON, help="the trainers' python (part C: the torch 2.x venv)")
    p.add_argument("--peers", action="store_true",
                   help="part C: per repetition, each system (in an order rotated every repetition) runs "
                        "once without faults, then with them; samples and final weights are compared with "
                        "that fault-free run")
    args = p.parse_args()
    if args.peers:
        return peers(args)
    base = Path(args.workdir or tempfile.mkdtemp(prefix="regroup-recovery-"))
    systems = args.systems.split(",")
    out = Path(args.out)
    for rep in range(args.reps):
        plan = [(s, False) for s in systems]
        if args.baseline and rep == 0:
            only = args.baseline_systems.split(",") if args.baseline_systems else systems
            plan = [(s, True) for s in systems if s in only] + plan
        for system, baseline in plan:
            ckpt = args.ckpt if system == "regroup" else int(system.split("ckpt")[1])
            run_args = argparse.Namespace(**vars(args))
            run_args.baseline = baseline
            run_args.final = False
            wd = base / f"rep{rep}-{system}{'-baseline' if baseline else ''}"
            r = Run(system, ckpt, run_args, wd).run()
            r.pop("lineage", None)
            r["rep"] = rep
            print(json.dumps(r), flush=True)
            append_jsonl(out, r)
            if not args.keep and r.get("ok"):
                shutil.rmtree(wd, ignore_errors=True)
    return 0


def peers(args) -> int:
    """Part C: Regroup, torchrun, torchft and nvidia-resiliency-ext, alternated."""
    base = Path(args.workdir or tempfile.mkdtemp(prefix="regroup-peers-"))
    systems = args.systems.split(",")
    out = Path(args.out)
    invocation = int(time.time())
    for rep in range(args.reps):
        k = rep % len(systems)
        for system in systems[k:] + systems[:k]:
            ckpt = int(system.split("ckpt")[1]) if "ckpt" in system else args.ckpt
            ref = None
            for baseline in (True, False):
                run_args = argparse.Namespace(**vars(args))
                run_args.baseline = baseline
                run_args.final = True
                wd = base / f"rep{rep}-{system}{'-baseline' if baseline else ''}"
                r = Run(system, ckpt, run_args, wd).run()
                r.update(rep=rep, part="c", invocation=invocation, python=args.python)
                counts = r.pop("lineage", None)
                if baseline:
                    ref = (counts, wd / "final.bin") if r.get("ok") else None
                elif ref and counts is not None:
                    d = sample_diff(ref[0], counts)
                    r["samples_lost"], r["samples_repeated"], r["samples_steps_skipped"] = d["lost"], d["repeated"], d["skipped"]
                    try:
                        r["weights_vs_fault_free"] = weights_diff(ref[1], wd / "final.bin")
                    except ValueError as e:
                        r["weights_error"] = str(e)
                print(json.dumps(r), flush=True)
                append_jsonl(out, r)
                if not args.keep and r.get("ok") and not baseline:
                    shutil.rmtree(wd, ignore_errors=True)
            if not args.keep and ref:
                shutil.rmtree(ref[1].parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
