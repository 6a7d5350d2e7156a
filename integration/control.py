# SPDX-License-Identifier: Apache-2.0
"""Run the local cluster by hand and inject faults by command.

    # a cluster of 3 nodes x 2 ranks running the example job; commands on stdin, or from
    # another shell through WORKDIR/control.sock
    /usr/bin/python3 integration/control.py up --nodes 3 --steps 2000 --workdir /tmp/rg

    /usr/bin/python3 integration/control.py inject /tmp/rg kill-node node-1
    /usr/bin/python3 integration/control.py inject /tmp/rg add-node
    /usr/bin/python3 integration/control.py inject /tmp/rg start-pod 1 node-3

Commands (``help`` lists them): kill-trainer NODE [LOCAL], freeze NODE [LOCAL], kill-node NODE,
sigterm NODE, cut NODE, restore NODE, slow NODE [RATE], unslow NODE, add-node,
start-pod INDEX NODE, kill-manager, start-manager, status, events, quit.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
from pathlib import Path
from typing import Callable, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster import Cluster, JobSpec  # noqa: E402


def _commands(c: Cluster) -> Dict[str, Callable[..., object]]:
    def node(name: str):
        if name not in c.nodes:
            raise ValueError(f"no node {name!r}; nodes: {', '.join(c.nodes)}")
        return name

    return {
        "kill-trainer": lambda n, local="0": c.kill_trainer(node(n), int(local)),
        "freeze": lambda n, local="0": c.freeze_trainer(node(n), int(local)),
        "kill-node": lambda n: c.kill_node(node(n)),
        "sigterm": lambda n: c.sigterm_pod(node(n)),
        "cut": lambda n: c.cut_network(node(n)),
        "restore": lambda n: c.restore_network(node(n)),
        "slow": lambda n, rate="1mbit": c.slow_link(node(n), rate),
        "unslow": lambda n: c.net.unslow(c.nodes[node(n)]) or {"unslowed": n},
        "add-node": lambda: {"node": c.add_node().name},
        "start-pod": lambda index, n: {"pod": c.start_pod(int(index), c.nodes[node(n)]).name},
        "kill-manager": lambda: c.kill_manager(),
        "start-manager": lambda: c.start_manager() or {"manager": c.manager_addr},
        "status": lambda: {k: v for k, v in c.status().items() if k != "events"},
        "events": lambda: c.events()[-20:],
    }


def execute(c: Cluster, line: str) -> str:
    """One command line -> one line of JSON: {"ok": ...} or {"error": "..."}; never raises."""
    words = line.split()
    if not words:
        return ""
    commands = _commands(c)
    if words[0] == "help":
        return json.dumps({"ok": sorted(commands) + ["quit"]})
    fn = commands.get(words[0])
    if fn is None:
        return json.dumps({"error": f"unknown command {words[0]!r}; try help"})
    try:
        return json.dumps({"ok": fn(*words[1:])}, default=str)
    except TypeError:
        return json.dumps({"error": f"wrong arguments for {words[0]}: {' '.join(words[1:]) or '(none)'}"})
    except Exception as e:  # noqa: BLE001 - a command's failure is reported, the cluster goes on
        return json.dumps({"error": f"{words[0]}: {e}"})


def serve(c: Cluster, path: Path, stop: threading.Event) -> None:
    """Answers one command per connection on a Unix socket (0600)."""
    if path.exists():
        path.unlink()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    os.chmod(path, 0o600)
    server.listen(4)
    server.settimeout(0.5)
    while not stop.is_set():
        try:
            conn, _ = server.accept()
        except socket.timeout:
            continue
        with conn:
            conn.settimeout(10)
            try:
                line = conn.recv(4096).decode(errors="replace").strip()
                conn.sendall((execute(c, line) + "\n").encode())
            except OSError:
                pass
    server.close()


def up(args) -> int:
    workdir = Path(args.workdir)
    job = JobSpec(nodes=args.nodes, nproc=args.nproc, steps=args.steps, step_sleep=args.step_sleep,
                  strategies=args.strategies, prefer_elastic=args.prefer_elastic, quiet=True,
                  micro_batch=4, microbatches=2 * args.nodes * args.nproc, dataset=64 * args.nodes * args.nproc)
    stop = threading.Event()
    with Cluster(workdir, job, network=args.network) as c:
        c.start()
        control = workdir / "control.sock"
        threading.Thread(target=serve, args=(c, control, stop), daemon=True).start()
        print(f"cluster up: {len(c.nodes)} nodes ({c.net.mode}), manager {c.manager_addr}; "
              f"commands on stdin or `integration/control.py inject {workdir} COMMAND` (help lists them)",
              flush=True)
        try:
            for line in sys.stdin:
                if line.strip() == "quit":
                    break
                out = execute(c, line)
                if out:
                    print(out, flush=True)
            else:
                # stdin closed (run in the background): serve the socket until the job ends
                for pod in list(c.pods.values()):
                    pod.process.wait()
        finally:
            stop.set()
    return 0


def inject(args) -> int:
    path = Path(args.workdir) / "control.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        try:
            s.connect(str(path))
        except OSError as e:
            print(f"no cluster at {path}: {e}", file=sys.stderr)
            return 2
        s.sendall(" ".join(args.command).encode())
        reply = s.recv(1 << 20).decode()
    print(reply, end="")
    return 1 if '"error"' in reply[:10] else 0


def main(argv: List[str] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up", help="start a cluster running the example job")
    u.add_argument("--nodes", type=int, default=3)
    u.add_argument("--nproc", type=int, default=2)
    u.add_argument("--steps", type=int, default=2000)
    u.add_argument("--step-sleep", type=float, default=0.1)
    u.add_argument("--strategies", default="retry,recover-in-place,recover,elastic-training,dump,exit")
    u.add_argument("--prefer-elastic", action="store_true")
    u.add_argument("--network", default="auto", choices=("auto", "netns", "loopback"))
    u.add_argument("--workdir", required=True)
    i = sub.add_parser("inject", help="send a command to a running cluster")
    i.add_argument("workdir")
    i.add_argument("command", nargs="+")
    args = p.parse_args(argv)
    return up(args) if args.cmd == "up" else inject(args)


if __name__ == "__main__":
    sys.exit(main())
