#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Benchmarks of the trainer library (python/regroup) on CPU with gloo.

    /usr/bin/python3 bench/trainer_bench.py            # all parts, 3 repetitions, writes bench/trainer_results.md
    /usr/bin/python3 bench/trainer_bench.py --only abort,sync --reps 2 --no-write
    /usr/bin/python3 bench/trainer_bench.py --e2e      # also the real regroup-manager/regroup-agent run
    /usr/bin/python3 bench/trainer_bench.py --e2e --compare-plain   # and part 1 with plain dist.all_reduce
    /usr/bin/python3 bench/trainer_bench.py --smoke --json out.json  # tiny sizes, once each (bench/smoke)

Parts (every process started here is killed at the end of its part; every wait is bounded):

1. abort: 8 ranks in an all-reduce loop (build_groups + GroupSockets, as the trainer does); one rank
   is SIGKILLed and, right after, every survivor's "agent link" thread (here: a thread reading the
   process's stdin, as the real one reads the agent's socket) is told to abort and calls
   GroupSockets.shutdown(). Measured: kill -> the last survivor out of its all-reduce, and per rank
   abort -> out. Detection (the agent seeing the death) is not part of it: the abort is sent at once.
   The survivors wait as the trainer does (dist.all_reduce(async_op=True) + GroupSockets.wait, which
   an abort ends at once); with --compare-plain the same runs are also made with the training thread
   in a plain blocking dist.all_reduce, where gloo's lost wake-up (see regroup/abort.py) shows.
2. recovery (scripted agent, regroup.testing.FakeAgent): 8 trainer processes of
   examples/train_mlp.py; after a few committed steps one rank is SIGKILLed, the survivors get an
   AbortGeneration at once, then (once all heartbeat PAUSED) a StartGeneration of one rank fewer,
   no state to move. Measured: abort -> all paused (100 ms heartbeat resolution), start -> every rank
   voted the redone step = first committed step; chained 8 -> 7 -> 6 -> 5 in one launch.
   With --e2e, also the real binaries (2 agents x 4 ranks, a trainer SIGKILLed, restart in place):
   the manager's own "first step committed N ms" from regroupctl status.
3. sync: send_state / recv_state of a ~100 MB model (4 x Linear(2560, 2560), float32, no optimizer
   state) between 2 ranks over gloo; receiver-side time from the start of the transfer to the state
   loaded, and a raw dist.send of the same bytes for comparison.
4. vote / checksum: examples/train_mlp.py, one rank, steps timed from its stdout lines, without an
   agent and under a FakeAgent that commits every vote at once; contract.checksum of the ~100 MB
   parameters.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
EXAMPLE = REPO / "examples" / "train_mlp.py"
PY = sys.executable
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "python")}


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Procs:
    """Every process started, killed (process group) by stop_all."""

    def __init__(self):
        self.ps = []

    def start(self, argv, **kw):
        p = subprocess.Popen(argv, env=kw.pop("env", ENV), start_new_session=True, **kw)
        self.ps.append(p)
        return p

    def stop_all(self):
        for p in self.ps:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for p in self.ps:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.ps = []


def line_reader(p, q, tag):
    """A thread putting (time, tag, line) for each stdout line of p."""

    def run():
        for raw in iter(p.stdout.readline, b""):
            q.put((time.monotonic(), tag, raw.decode(errors="replace").rstrip("\n")))
        q.put((time.monotonic(), tag, None))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


# ---------------------------------------------------------------------------------------------
# Workers (run in child processes)
# ---------------------------------------------------------------------------------------------


def worker_abort(rank: int, world: int, port: int, numel: int, mode: str = "library") -> None:
    import torch
    import torch.distributed as dist
    from regroup.abort import Abandoned, GroupSockets
    from regroup.group import Layout, build_groups

    import faulthandler
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the benchmark dumps a stuck rank's stacks
    torch.set_num_threads(1)
    sockets = GroupSockets(port)
    build_groups(store_host="127.0.0.1", store_port=port, layout=Layout(world, rank, 1), backend="gloo",
                 rendezvous_s=60, collective_s=60, aborted=threading.Event(), sockets=sockets)
    t = torch.ones(numel)
    dist.all_reduce(t)
    timing = {}

    def link():  # the agent link thread: an abort arrives, the group's sockets are shut down
        line = sys.stdin.readline()
        if line.startswith("abort"):
            timing["abort"] = time.monotonic()
            timing["shut"] = sockets.shutdown()
            sys.stderr.write(f"link: abort received; {timing['shut']} of {len(sockets.fds)} group sockets "
                             f"shut down in {(time.monotonic() - timing['abort']) * 1000:.2f} ms\n")
            sys.stderr.flush()

    threading.Thread(target=link, daemon=True).start()
    print("ready", flush=True)
    iters, error, left = 0, "", False
    while True:
        try:
            if mode == "plain":  # the training thread waits in gloo itself
                dist.all_reduce(t)
            else:  # as the trainer does: an abort frees the waiting thread (GroupSockets.wait)
                sockets.wait(dist.all_reduce(t, async_op=True))
            iters += 1
        except Exception as e:  # noqa: BLE001
            error = f"{type(e).__name__}: {e}"
            left = isinstance(e, Abandoned)
            break
    out = time.monotonic()
    deadline = out + 5
    while "abort" not in timing and time.monotonic() < deadline:
        time.sleep(0.001)
    blocked = False
    if left:  # was gloo's own worker really stuck (the lost wake-up), or about to fail by itself?
        deadline = time.monotonic() + 1.0
        while not all(check() for check in sockets.left) and time.monotonic() < deadline:
            time.sleep(0.01)
        blocked = not all(check() for check in sockets.left)
    print(json.dumps({"rank": rank, "out": out, "abort": timing.get("abort"), "shut": timing.get("shut"),
                      "iters": iters, "error": error[:120], "left": left,
                      "gloo_blocked_1s": blocked}), flush=True)
    os._exit(0)  # a broken group: do not wait in its destructor


def _big_model(width: int = 2560):
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)])


def worker_sync(rank: int, port: int, reps: int, width: int = 2560) -> None:
    import torch
    import torch.distributed as dist
    from regroup.abort import GroupSockets
    from regroup.group import Layout, build_groups
    from regroup.state import TrainingState, recv_state, send_state

    torch.set_num_threads(1)
    groups = build_groups(store_host="127.0.0.1", store_port=port, layout=Layout(2, rank, 1), backend="gloo",
                          rendezvous_s=60, collective_s=120, aborted=threading.Event(),
                          sockets=GroupSockets(port))
    state = TrainingState(_big_model(width))
    nbytes = sum(p.numel() * p.element_size() for p in state.model.parameters())
    cpu = torch.device("cpu")
    results = []
    for i in range(reps):
        ser = None
        dist.barrier()
        t0 = time.monotonic()
        if rank == 0:
            sent = send_state(state, i, [1], cpu)
            ser = None
        else:
            got = recv_state(state, 0, cpu)
            assert got == i
            sent = None
        dist.barrier()  # the receiver has loaded the state when it reaches the barrier
        t1 = time.monotonic()
        # the serialization alone (sender) and a raw send of the same number of bytes
        if rank == 0:
            s0 = time.monotonic()
            data = state.to_bytes(i)
            ser = time.monotonic() - s0
            size = len(data)
            del data
        dist.barrier()
        raw = torch.empty(sent if rank == 0 else 0, dtype=torch.uint8)
        n = torch.tensor([raw.numel()])
        dist.broadcast(n, 0)
        if rank == 1:
            raw = torch.empty(int(n.item()), dtype=torch.uint8)
        dist.barrier()
        r0 = time.monotonic()
        if rank == 0:
            dist.send(raw, 1)
        else:
            dist.recv(raw, 0)
        dist.barrier()
        r1 = time.monotonic()
        results.append({"sync_s": t1 - t0, "bytes": int(n.item()), "ser_s": ser, "raw_s": r1 - r0})
    if rank == 0:
        print(json.dumps({"param_bytes": nbytes, "runs": results}), flush=True)
    groups.destroy()


# ---------------------------------------------------------------------------------------------
# Parts
# ---------------------------------------------------------------------------------------------


def part_abort(reps: int, world: int = 8, victim: int = 5, numel: int = 1 << 18, wait_s: float = 20,
               mode: str = "library"):
    victim = min(victim, world - 1)
    print(f"  (survivors wait: {mode})", flush=True)
    runs = []
    tmp = Path(tempfile.mkdtemp(prefix="regroup-bench-abort-"))
    for rep in range(reps):
        procs = Procs()
        try:
            port = free_port()
            q: "queue.Queue" = queue.Queue()
            ps = []
            for r in range(world):
                p = procs.start([PY, __file__, "_abort", str(r), str(world), str(port), str(numel), mode],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=open(tmp / f"rep{rep}.r{r}.err", "wb"))
                ps.append(p)
                line_reader(p, q, r)
            ready, results = set(), {}
            deadline = time.monotonic() + 120
            while len(ready) < world:
                t, r, line = q.get(timeout=max(0.1, deadline - time.monotonic()))
                if line == "ready":
                    ready.add(r)
                elif line is None:
                    raise RuntimeError(f"abort worker {r} exited before it was ready")
            time.sleep(0.5)  # the all-reduce loop runs
            t_kill = time.monotonic()
            os.kill(ps[victim].pid, signal.SIGKILL)
            for r in range(world):
                if r != victim:
                    ps[r].stdin.write(b"abort\n")
                    ps[r].stdin.flush()
            t_sent = time.monotonic()
            deadline = time.monotonic() + wait_s
            exited = set()
            while len(results) + len(exited - set(results)) < world - 1:
                try:
                    t, r, line = q.get(timeout=max(0.1, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if line and line.startswith("{"):
                    results[r] = json.loads(line)
                elif line is None and r != victim:
                    exited.add(r)
            missing = [r for r in range(world) if r != victim and r not in results]
            if missing:
                for r in missing:  # dump their stacks, then report them as stuck
                    if ps[r].poll() is None:
                        os.kill(ps[r].pid, signal.SIGUSR1)
                time.sleep(1.0)
                stacks = {r: (tmp / f"rep{rep}.r{r}.err").read_text(errors="replace")[-1500:] for r in missing}
                runs.append({"stuck": missing, "alive": [r for r in missing if ps[r].poll() is None],
                             "stacks": stacks, "out_ok": len(results)})
                print(f"  abort rep {rep}: ranks {missing} not out within {wait_s} s after the abort\n"
                      + "\n".join(f"--- rank {r}:\n{st}" for r, st in stacks.items()), flush=True)
                continue
            outs = [d["out"] for d in results.values()]
            per_rank = [(d["out"] - d["abort"]) * 1000 for d in results.values() if d["abort"] is not None]
            early = sum(1 for d in results.values() if d["abort"] is None or d["out"] < d["abort"])
            runs.append({"kill_to_all_out_ms": (max(outs) - t_kill) * 1000,
                         "kill_to_abort_sent_ms": (t_sent - t_kill) * 1000,
                         "abort_to_out_max_ms": max(per_rank) if per_rank else float("nan"),
                         "abort_to_out_median_ms": med(per_rank),
                         "out_before_abort": early,
                         "left_in_gloo": sum(1 for d in results.values() if d.get("left")),
                         "gloo_blocked_1s": sum(1 for d in results.values() if d.get("gloo_blocked_1s")),
                         "errors": sorted({d["error"][:60] for d in results.values()})})
            print(f"  abort rep {rep}: {runs[-1]}", flush=True)
        finally:
            procs.stop_all()
    return runs


def part_recovery_fake(transitions: int = 3, world: int = 8):
    from regroup._proto import wire_pb2 as pb
    from regroup.testing import FakeAgent

    tmp = Path(tempfile.mkdtemp(prefix="regroup-bench-"))
    procs = Procs()
    agent = FakeAgent(tmp, world)
    runs = []
    try:
        argv = [PY, str(EXAMPLE), "--quiet", "--steps", "1000", "--dataset", "256", "--micro-batch", "8",
                "--microbatches", "8", "--checksum-interval", "0", "--step-sleep", "0.02"]
        ps = {}
        for r in range(world):
            ps[r] = procs.start(argv, env={**ENV, **agent.env(r, r, world)}, stdout=subprocess.DEVNULL,
                                stderr=open(tmp / f"r{r}.log", "wb"))
        deadline = time.monotonic() + 120
        while not all(agent.hellos[r] for r in range(world)):
            if time.monotonic() > deadline:
                raise RuntimeError("trainers did not connect")
            time.sleep(0.05)
        gen, directive, committed = 0, 0, -1
        ranks = list(range(world))

        def form():
            nonlocal gen, directive
            gen += 1
            directive += 1
            port = free_port()
            for g, local in enumerate(ranks):
                agent.send(local, FakeAgent.start(directive, 1, gen, len(ranks), g, port, committed,
                                                  local_rank=local))

        def votes(step):
            for local in ranks:
                while True:
                    v = agent.next(local, ["vote"], 60).vote
                    if (v.generation, v.step) == (gen, step):
                        break

        def commit(step):
            nonlocal committed
            for local in ranks:
                agent.send(local, FakeAgent.outcome(gen, step, True))
            committed = step

        form()
        for s in range(4):
            votes(s)
            commit(s)
        for _ in range(transitions):
            victim = ranks[-1]
            # run two more steps, then kill the victim right after a commit (the others start the
            # next step and block in its all-reduce)
            for _ in range(2):
                votes(committed + 1)
                commit(committed + 1)
            t_kill = time.monotonic()
            os.kill(ps[victim].pid, signal.SIGKILL)
            survivors = [r for r in ranks if r != victim]
            directive += 1
            for local in survivors:
                agent.send(local, FakeAgent.abort(directive, 1, gen, committed, "bench: rank killed"))
            t_abort = time.monotonic()
            deadline = time.monotonic() + 30
            while not all(any(t > t_abort and b.phase == pb.PHASE_PAUSED for t, b in agent.heartbeats[r])
                          for r in survivors):
                if time.monotonic() > deadline:
                    raise RuntimeError("survivors did not pause")
                time.sleep(0.002)
            t_paused = time.monotonic()
            ranks = survivors
            form()
            t_form = time.monotonic()
            votes(committed + 1)
            commit(committed + 1)
            t_commit = time.monotonic()
            runs.append({"world": f"{len(ranks) + 1}->{len(ranks)}",
                         "abort_to_all_paused_ms": (t_paused - t_abort) * 1000,
                         "start_to_first_commit_ms": (t_commit - t_form) * 1000,
                         "kill_to_first_commit_ms": (t_commit - t_kill) * 1000})
            print(f"  recovery (scripted agent): {runs[-1]}", flush=True)
    finally:
        agent.close()
        procs.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)
    return runs


def part_recovery_e2e(timeout: float = 150):
    """The real manager and agents: 2 nodes x 4 ranks, one trainer SIGKILLed (restart in place)."""
    from regroup.testing import read_ledger, trainers_of

    build = REPO / "build"
    manager, agent_bin, ctl = build / "regroup-manager", build / "regroup-agent", build / "regroupctl"
    if not (manager.exists() and agent_bin.exists()):
        return {"error": "binaries not built"}
    tmp = Path(tempfile.mkdtemp(prefix="regroup-bench-e2e-"))
    procs = Procs()
    try:
        ledger = tmp / "ledger"
        steps = 60
        train = ["--float64", "--dataset", "256", "--micro-batch", "8", "--microbatches", "8",
                 "--checksum-interval", "5", "--steps", str(steps), "--ledger", str(ledger), "--quiet",
                 "--step-sleep", "0.05"]
        port_file = tmp / "manager.port"
        # The job's credential, read by the manager, the agents and regroupctl alike.
        credential = tmp / "credential"
        credential.write_text(os.urandom(16).hex())
        credential.chmod(0o600)
        env = {**ENV, "REGROUP_CREDENTIAL_FILE": str(credential)}
        argv = [str(manager), "--job-id", "bench", "--nodes", "2", "--nproc-per-node", "4", "--listen",
                "127.0.0.1:0", "--port-file", str(port_file), "--join-window-s", "60", "--stay-after-done",
                "--record", str(tmp / "record.json"), "--label", "fault-scheduling=force"]
        for a in ["recover-strategy=retry,recover-in-place,recover,elastic-training,dump,exit",
                  "regroup.io/prefer-elastic=true", "regroup.io/heartbeat-interval-ms=200",
                  "regroup.io/liveness-misses=100", "regroup.io/global-batch-size=64",
                  "regroup.io/micro-batch-size=8", "regroup.io/checksum-interval=5",
                  "regroup.io/tensor-parallel=1"]:
            argv += ["--annotation", a]
        m = procs.start(argv, env=env, stdout=open(tmp / "manager.log", "wb"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not port_file.exists():
            if time.monotonic() > deadline or m.poll() is not None:
                return {"error": "manager did not start: " + (tmp / "manager.log").read_text()[-500:]}
            time.sleep(0.05)
        port = int(port_file.read_text())
        agents = []
        for n in range(2):
            a = [str(agent_bin), "--manager", f"127.0.0.1:{port}", "--job-id", "bench", "--nnodes", "2",
                 "--nproc-per-node", "4", "--node-rank", str(n), "--master-addr", "127.0.0.1", "--host",
                 "127.0.0.1", "--socket-dir", str(tmp / f"sock{n}"), "--stop-grace-s", "20", "--python", PY,
                 str(EXAMPLE), *train]
            agents.append(procs.start(a, env=env, stdout=open(tmp / f"node{n}.log", "wb"),
                                      stderr=subprocess.STDOUT))

        def last():
            return max((r["step"] for r in read_ledger(ledger)), default=-1) if ledger.exists() else -1

        end = time.monotonic() + timeout
        while last() < 10:
            if time.monotonic() > end or m.poll() is not None:
                return {"error": f"training did not reach step 10 (at {last()})"}
            time.sleep(0.1)
        victim = sorted(trainers_of(agents[1].pid))[1]
        os.kill(victim, signal.SIGKILL)
        for a in agents:
            left = end - time.monotonic()
            try:
                a.wait(timeout=max(1, left))
            except subprocess.TimeoutExpired:
                return {"error": f"job not finished within {timeout} s (at step {last()})"}
        status = subprocess.run([str(ctl), "status", "--manager", f"127.0.0.1:{port}"], capture_output=True,
                                text=True, timeout=30, env=env).stdout if ctl.exists() else ""
        ms = [int(line.split("first step committed ")[1].split(" ms")[0])
              for line in status.splitlines() if "first step committed" in line]
        return {"first_step_committed_ms": ms, "codes": [a.returncode for a in agents],
                "status_lines": [l for l in status.splitlines() if "committed" in l or "restart" in l][:6]}
    finally:
        procs.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)


def part_sync(reps: int, width: int = 2560):
    procs = Procs()
    try:
        port = free_port()
        ps = [procs.start([PY, __file__, "_sync", str(r), str(port), str(reps), str(width)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) for r in range(2)]
        out, err = ps[0].communicate(timeout=300)
        ps[1].wait(timeout=60)
        if ps[0].returncode:
            raise RuntimeError(err.decode()[-300:])
        data = json.loads(out.decode().strip().splitlines()[-1])
        for r in data["runs"]:
            print(f"  sync: {r}", flush=True)
        return data
    finally:
        procs.stop_all()


def _step_intervals(p, steps_wanted, timeout, driver=None):
    """Times of the 'step=' lines of p's stdout."""
    times = []
    q: "queue.Queue" = queue.Queue()
    line_reader(p, q, 0)
    deadline = time.monotonic() + timeout
    while len(times) < steps_wanted:
        try:
            t, _, line = q.get(timeout=0.05)
        except queue.Empty:
            if time.monotonic() > deadline:
                raise RuntimeError("steps timed out")
            continue
        if line is None:
            break
        if line.startswith("step="):
            times.append(t)
    gaps = [(b - a) * 1000 for a, b in zip(times, times[1:])]
    return gaps[10:]  # skip warm-up


def part_vote(steps: int = 200):
    from regroup.testing import FakeAgent

    argv = [PY, str(EXAMPLE), "--steps", str(steps), "--dataset", "256", "--micro-batch", "8",
            "--microbatches", "8", "--checksum-interval", "0"]
    procs = Procs()
    tmp = Path(tempfile.mkdtemp(prefix="regroup-bench-vote-"))
    try:
        p = procs.start(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        plain = _step_intervals(p, steps, 120)
        p.wait(timeout=30)
        agent = FakeAgent(tmp, 1)
        stop = threading.Event()
        try:
            p = procs.start(argv, env={**ENV, **agent.env(0, 0, 1)}, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 60
            while not agent.hellos[0]:
                if time.monotonic() > deadline:
                    raise RuntimeError("no hello")
                time.sleep(0.02)
            agent.send(0, FakeAgent.start(1, 1, 1, 1, 0, free_port(), -1, local_rank=0))

            def committer():  # commits each vote as soon as it arrives
                while not stop.is_set():
                    try:
                        v = agent.next(0, ["vote"], 0.5).vote
                    except AssertionError:
                        continue
                    agent.send(0, FakeAgent.outcome(v.generation, v.step, True))

            threading.Thread(target=committer, daemon=True).start()
            voted = _step_intervals(p, steps, 180)
            p.wait(timeout=30)
        finally:
            stop.set()
            agent.close()
        return {"plain_ms": med(plain), "voted_ms": med(voted), "n": (len(plain), len(voted))}
    finally:
        procs.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)


def part_checksum(reps: int, width: int = 2560):
    import torch
    from regroup.contract import checksum
    torch.set_num_threads(1)
    params = [p.detach() for p in _big_model(width).parameters()]
    nbytes = sum(p.numel() * p.element_size() for p in params)
    times = []
    for _ in range(reps):
        t0 = time.monotonic()
        checksum(params)
        times.append((time.monotonic() - t0) * 1000)
    return {"bytes": nbytes, "ms": times}


# ---------------------------------------------------------------------------------------------


def machine():
    cpu = ""
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout.splitlines():
            if line.startswith("Model name"):
                cpu = line.split(":", 1)[1].strip()
    except Exception:  # noqa: BLE001
        pass
    import torch
    return {"nproc": os.cpu_count(), "cpu": cpu, "torch": torch.__version__, "python": platform.python_version(),
            "kernel": platform.release(), "load_start": _loadavg()}


def _loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", default="abort,recovery,sync,vote,checksum")
    ap.add_argument("--e2e", action="store_true", help="also the real manager/agents run (slow)")
    ap.add_argument("--compare-plain", action="store_true",
                    help="also part 1 with the survivors blocked in a plain dist.all_reduce")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny sizes, once each (3 ranks, a 1 MB model, 15 steps), no e2e, nothing written "
                         "to bench/; exits 1 if a part failed. Its figures say only that it runs")
    ap.add_argument("--json", default="", help="also write the results as JSON to this file")
    args = ap.parse_args()
    parts = set(args.only.split(","))
    res = {"machine": machine(), "command": "/usr/bin/python3 bench/trainer_bench.py " + " ".join(sys.argv[1:])}
    started = time.monotonic()
    if args.smoke:
        args.no_write, args.e2e = True, False
        steps = [("abort", lambda: part_abort(1, world=3, numel=1 << 10, wait_s=5)),
                 ("abort_plain", lambda: part_abort(1, world=3, numel=1 << 10, wait_s=5, mode="plain")),
                 ("recovery", lambda: part_recovery_fake(1, world=3)),
                 ("sync", lambda: part_sync(1, width=256)),
                 ("vote", lambda: part_vote(steps=15)),
                 ("checksum", lambda: part_checksum(1, width=256))]
    else:
        steps = [("abort", lambda: part_abort(max(4 * args.reps, 12))),
                 ("abort_plain", lambda: part_abort(max(4 * args.reps, 12), mode="plain")),
                 ("recovery", lambda: part_recovery_fake(args.reps)),
                 ("sync", lambda: part_sync(args.reps)),
                 ("vote", lambda: part_vote()),
                 ("checksum", lambda: part_checksum(max(args.reps, 5)))]
    if args.compare_plain:
        parts.add("abort_plain")
    if args.e2e:
        steps.append(("e2e", lambda: [part_recovery_e2e() for _ in range(args.reps)]))
        parts.add("e2e")
    for name, fn in steps:
        if name not in parts:
            continue
        print(f"== {name}", flush=True)
        t0 = time.monotonic()
        try:
            res[name] = fn()
        except Exception as e:  # noqa: BLE001 - reported, not invented
            res[name] = {"error": f"{type(e).__name__}: {e}"[:400]}
            print(f"  {name} FAILED: {res[name]['error']}", flush=True)
        print(f"  ({time.monotonic() - t0:.1f} s)", flush=True)
    res["wall_s"] = time.monotonic() - started
    res["machine"]["load_end"] = _loadavg()
    print(json.dumps(res, indent=1, default=str))
    table = render(res)
    print(table)
    if not args.no_write:
        (REPO / "bench" / "trainer_results.md").write_text(table)
        print("written to bench/trainer_results.md")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=str))
    failed = [name for name, _ in steps if name in parts and err_of(res.get(name))]
    if failed:
        print(f"parts that failed: {', '.join(failed)}", flush=True)
    return 1 if args.smoke and failed else 0


def err_of(v):
    """A part's error, if it failed."""
    return v.get("error") if isinstance(v, dict) and "error" in v else None


def _fmt(xs, unit="ms", digits=1):
    xs = [x for x in xs if x == x]
    if not xs:
        return "n/a"
    return f"{med(xs):.{digits}f} {unit} (min {min(xs):.{digits}f}, max {max(xs):.{digits}f}, n={len(xs)})"


def render(res) -> str:
    m = res["machine"]
    rows = []

    def err(name):
        v = res.get(name)
        return v.get("error") if isinstance(v, dict) and "error" in v else None

    for key, how in (("abort", "as the trainer waits (GroupSockets.wait)"),
                     ("abort_plain", "plain blocking dist.all_reduce, for comparison")):
        if key not in res:
            continue
        if err(key):
            rows.append((f"1. rank death -> every survivor out of its all-reduce (8 ranks; {how})", "FAILED: " + err(key)))
            continue
        stuck = [r for r in res[key] if "stuck" in r]
        a = [r for r in res[key] if "stuck" not in r]
        rows.append((f"1. [{how}] runs in which some survivor did NOT leave its all-reduce within 20 s of the abort",
                     f"{len(stuck)} of {len(res[key])}" + "".join(
                         f"; rank {r['stuck']} (alive: {r['alive']}; its stack: blocked in dist.all_reduce; its "
                         + "/".join(l.strip() for st in r["stacks"].values() for l in st.splitlines()
                                    if l.startswith("link:")) + ")" for r in stuck)))
        rows.append((f"1. [{how}] SIGKILL of 1 of 8 ranks -> last of 7 survivors out of its all-reduce (abort sent "
                     "at once; runs where every survivor came out)",
                     _fmt([r["kill_to_all_out_ms"] for r in a], digits=2)))
        rows.append((f"1. [{how}] ... per run, sorted (ms)",
                     ", ".join(f"{x:.1f}" for x in sorted(r["kill_to_all_out_ms"] for r in a))))
        rows.append((f"1. [{how}] abort received -> that rank out (worst rank of each run)",
                     _fmt([r["abort_to_out_max_ms"] for r in a], digits=2)))
        rows.append((f"1. [{how}] survivors out before their abort (the dead rank's gloo neighbours), per run",
                     ", ".join(str(r["out_before_abort"]) for r in a)))
        if key == "abort":
            rows.append(("1. survivors that left a collective still running in gloo (its group parked), per run",
                         ", ".join(str(r.get("left_in_gloo", 0)) for r in a)))
            rows.append(("1. ... of which gloo's worker was still blocked 1 s later (the lost wake-up), per run",
                         ", ".join(str(r.get("gloo_blocked_1s", 0)) for r in a)
                         + f" (total {sum(r.get('gloo_blocked_1s', 0) for r in a)} of {7 * len(a)} survivors)"))
    if "recovery" in res:
        if err("recovery"):
            rows.append(("2. recovery (scripted agent)", "FAILED: " + err("recovery")))
        else:
            r = res["recovery"]
            worlds = ", ".join(x["world"] for x in r)
            rows.append((f"2. scripted agent, scale-in ({worlds}): abort -> every survivor heartbeats PAUSED",
                         _fmt([x["abort_to_all_paused_ms"] for x in r])))
            rows.append(("2. scripted agent: StartGeneration sent -> first step of the new generation committed",
                         _fmt([x["start_to_first_commit_ms"] for x in r])))
            rows.append(("2. scripted agent: SIGKILL -> first committed step (total)",
                         _fmt([x["kill_to_first_commit_ms"] for x in r])))
    if "e2e" in res:
        e = res["e2e"]
        if isinstance(e, dict):
            e = [e]
        ok = [x for x in e if "error" not in x]
        ms = [v for x in ok for v in x["first_step_committed_ms"]]
        val = _fmt(ms, digits=0) if ms else "n/a"
        bad = [x["error"] for x in e if "error" in x]
        if bad:
            val += f"; {len(bad)} run(s) failed: " + "; ".join(bad)
        rows.append(("2. real regroup-manager + 2 regroup-agents x 4 ranks, 1 trainer SIGKILLed, restart in place: "
                     "abort -> first step committed (manager's figure)", val))
    if "sync" in res:
        if err("sync"):
            rows.append(("3. state sync", "FAILED: " + err("sync")))
        else:
            s = res["sync"]
            mb = [r["bytes"] / 1e6 for r in s["runs"]]
            rows.append((f"3. send_state -> recv_state loaded, {mb[0]:.1f} MB state, 2 ranks gloo: throughput",
                         _fmt([r["bytes"] / 1e6 / r["sync_s"] for r in s["runs"]], "MB/s", 0)))
            rows.append(("3. ... its time", _fmt([r["sync_s"] * 1000 for r in s["runs"]], digits=0)))
            rows.append(("3. ... of which serialisation on the sender (to_bytes alone)",
                         _fmt([r["ser_s"] * 1000 for r in s["runs"]], digits=0)))
            rows.append(("3. raw dist.send/recv of the same bytes (for comparison)",
                         _fmt([r["bytes"] / 1e6 / r["raw_s"] for r in s["runs"]], "MB/s", 0)))
    if "vote" in res:
        if err("vote"):
            rows.append(("4. vote", "FAILED: " + err("vote")))
        else:
            v = res["vote"]
            rows.append(("4. train_mlp step, 1 rank, no agent (median step interval)", f"{v['plain_ms']:.2f} ms (n={v['n'][0]})"))
            rows.append(("4. same step under the scripted agent, every step voted and committed",
                         f"{v['voted_ms']:.2f} ms (n={v['n'][1]})"))
            rows.append(("4. => cost of the vote round trip per step", f"{v['voted_ms'] - v['plain_ms']:.2f} ms"))
    if "checksum" in res:
        if err("checksum"):
            rows.append(("4. checksum", "FAILED: " + err("checksum")))
        else:
            c = res["checksum"]
            rows.append((f"4. contract.checksum (blake2b) of {c['bytes'] / 1e6:.1f} MB of parameters",
                         _fmt(c["ms"], digits=0) + f" = {c['bytes'] / 1e6 / (med(c['ms']) / 1000):.0f} MB/s"))
    out = ["# Trainer library benchmarks (bench/trainer_bench.py)", "",
           f"Command: `{res['command'].strip()}` (from the repository root; {res['wall_s']:.0f} s wall).", "",
           f"Machine: nproc={m['nproc']}, CPU \"{m['cpu']}\", torch {m['torch']} (CPU, gloo), "
           f"Python {m['python']}, Linux {m['kernel']}; load average (1, 5, 15 min) {m.get('load_start', '?')} "
           f"at the start, {m.get('load_end', '?')} at the end (the machine is shared: other jobs' builds and "
           "benchmarks run beside this one).", "",
           "Medians over the repetitions (min, max, n in brackets).", "",
           "| measurement | result |", "|---|---|"]
    out += [f"| {a} | {b} |" for a, b in rows]
    out += ["", "Method: see the docstring of bench/trainer_bench.py. Notes:", "",
            "- 1 measures the abort path only: the abort is sent to the survivors right after the SIGKILL "
            "(over each process's stdin, read by a thread as the agent link's thread reads the agent socket); "
            "detecting the death (agent/manager) is not included. Times are CLOCK_MONOTONIC, shared by the "
            "processes. No run without the abort was made: non-neighbour survivors would wait for the collective "
            "timeout (60 s here).",
            "- 1, why a survivor can stay blocked although every socket of its group is shut down (the plain "
            "rows): gloo's TCP pair, when it fails, does not wake the waiter of an unbound-buffer send already in "
            "its transmit queue (Pair::signalException signals only bound buffers there), and once a socket is "
            "shut down a send triggered by a receive-ready notice still queued in it lands exactly there (EPIPE "
            "is 'write later' in gloo's asynchronous mode). gloo's worker thread then sleeps in "
            "UnboundBuffer::waitSend until the collective timeout (60 s here) with no descriptor left open "
            "(gdb: all pair sockets closed, only the store's connections remain). The trainer therefore never "
            "waits in gloo itself: it waits on the collective's future (GroupSockets.wait; send/recv on a helper "
            "thread, GroupSockets.call; DDP's hook through GroupSockets.future), which an abort ends at once; the "
            "collective left behind keeps its group alive until gloo gives up on it (regroup.abort.park). "
            "'still blocked 1 s later' counts the survivors for which that mattered; the others had left a "
            "collective that gloo was about to fail anyway.",
            "- 2 (scripted agent) is a scale-in with no state to move and no process start; the FakeAgent is "
            "Python in the benchmark's own process, the real manager/agent are not involved. 'PAUSED' is the first "
            "PAUSED heartbeat seen after the abort. The real-binaries row is a restart in place: it includes "
            "starting the replacement trainer (Python + torch import, about 0.8 s here) and sending it the "
            "(tiny) state; its figure is the manager's own (regroupctl status: 'first step committed N ms "
            "after the abort').",
            "- 3 is the whole send_state/recv_state path: torch.save of the state tree into memory, the gloo "
            "transfer, torch.load(weights_only) and load_state_dict on the receiver; no optimizer state.",
            "- 4 vote: the FakeAgent commits each vote at once from a Python thread; a real manager adds its "
            "network round trip. The checksum runs only every checksum_interval steps.",
            "- 2 cores shared by up to 8 trainer processes: expect run-to-run noise (see min/max).", ""]
    return "\n".join(out)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_abort":
        worker_abort(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]),
                     sys.argv[6] if len(sys.argv) > 6 else "library")
    elif len(sys.argv) > 1 and sys.argv[1] == "_sync":
        worker_sync(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]),
                    int(sys.argv[5]) if len(sys.argv) > 5 else 2560)
    else:
        sys.exit(main())
