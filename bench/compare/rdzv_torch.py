#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Control plane at scale, torch side: N simulated node agents form a group with torch's c10d
rendezvous (torch.distributed.elastic.rendezvous.DynamicRendezvousHandler over
C10dRendezvousBackend, exactly what `torchrun --rdzv-backend=c10d` uses), then one of them dies
and the survivors form the next round.

    /usr/bin/python3 bench/compare/rdzv_torch.py --nodes 64 [--last-call 1] [--timeout 180]

The participants are threads, one handler and one TCPStore client each (torchrun has one agent
process per node with one handler each), in this process or spread over --procs forked processes
(one Python process caps them all at one core through the GIL). The TCPStore server that holds the
rendezvous state runs in a separate process (in torchrun it lives inside one node's agent), so its
CPU and memory are measured alone, as the Regroup manager's are.

The job is elastic: --nnodes=N-1:N. Forming: all N call next_rendezvous() at once; the time is
until the last returns. A node dies: its keep-alive heartbeats stop (as a SIGKILLed torchrun's
would); the N-1 survivors call next_rendezvous() at once (torchrun's agents do so when their
workers fail; here we start the clock when they call, so torchrun's monitor interval is not
counted); the time is until the last survivor returns in the new round. Everything is bounded by
--timeout; an error or a timeout is a result and is printed as such.

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import CpuSampler, PYTHON, free_port, loadavg, proc_cpu_seconds, proc_hwm_mb, proc_rss_mb  # noqa: E402

STORE_SERVER = """
import sys, time
from datetime import timedelta
from torch.distributed import TCPStore
s = TCPStore("127.0.0.1", int(sys.argv[1]), is_master=True, wait_for_workers=False, timeout=timedelta(seconds=600))
print("ready", flush=True)
while True:
    time.sleep(3600)
"""


def _make_handlers(share, port, run_id, n, args):
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler, RendezvousTimeout

    timeout = RendezvousTimeout(join=timedelta(seconds=args.timeout), last_call=timedelta(seconds=args.last_call))
    handlers = {}
    for i in share:
        store = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=args.timeout))
        backend = C10dRendezvousBackend(store, run_id)
        handlers[i] = DynamicRendezvousHandler.from_backend(run_id, store, backend, max(1, n - 1), n, timeout)
    return handlers


def _run_phase(handlers, which, start_at, bound):
    """next_rendezvous() on each handler of `which` at once, from `start_at` (wall clock)."""
    done, errors = {}, {}

    def run(i, h):
        time.sleep(max(0.0, start_at - time.time()))
        try:
            _, rank, world = h.next_rendezvous()
            done[i] = (time.time(), rank, world)
        except Exception as e:  # noqa: BLE001
            errors[i] = f"{type(e).__name__}: {e}"

    cpu0 = proc_cpu_seconds(os.getpid())
    threads = [threading.Thread(target=run, args=(i, handlers[i]), daemon=True) for i in which]
    for t in threads:
        t.start()
    deadline = start_at + bound + 10
    for t in threads:
        t.join(max(0.0, deadline - time.time()))
    return {"done": dict(done), "errors": dict(errors), "cpu": proc_cpu_seconds(os.getpid()) - cpu0}


class _Local:
    """Participants as threads of this process."""

    def __init__(self, share, port, run_id, n, args):
        self.share_set = set(share)
        self.handlers = _make_handlers(share, port, run_id, n, args)
        self.args = args
        self.reply = None

    def ready(self):
        pass

    def send(self, cmd):
        if cmd[0] == "phase":
            self.reply = _run_phase(self.handlers, cmd[1], cmd[2], self.args.timeout)
        elif cmd[0] == "kill":
            self.handlers[cmd[1]]._stop_heartbeats()  # noqa: SLF001

    def recv(self, timeout):
        return self.reply


def _worker(conn, share, port, run_id, n, args):
    handlers = _make_handlers(share, port, run_id, n, args)
    conn.send("ready")
    while True:
        cmd = conn.recv()
        if cmd[0] == "phase":
            conn.send(_run_phase(handlers, cmd[1], cmd[2], args.timeout))
        elif cmd[0] == "kill":
            handlers[cmd[1]]._stop_heartbeats()  # noqa: SLF001


class _Remote:
    """Participants as threads of a forked process (several of them spread the GIL's load)."""

    def __init__(self, ctx, share, port, run_id, n, args):
        self.share_set = set(share)
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, share, port, run_id, n, args), daemon=True)
        self.proc.start()

    def ready(self):
        if not self.conn.poll(120) or self.conn.recv() != "ready":
            raise RuntimeError("a participant process did not start")

    def send(self, cmd):
        self.conn.send(cmd)

    def recv(self, timeout):
        return self.conn.recv() if self.conn.poll(timeout) else None


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--last-call", type=int, default=30, help="last_call_timeout, s (torch's default: 30)")
    p.add_argument("--timeout", type=float, default=180.0, help="bound for each phase, s")
    p.add_argument("--procs", type=int, default=1, help="processes the participants are spread over")
    args = p.parse_args()

    import torch  # noqa: F401

    n = args.nodes
    result = {"system": "torch-c10d", "nodes": n, "min_nodes": max(1, n - 1), "max_nodes": n,
              "last_call_s": args.last_call, "keep_alive": "5 s x 3 (fixed in torch 1.13)",
              "loadavg_before": loadavg()}
    port = free_port()
    server = subprocess.Popen([PYTHON, "-c", STORE_SERVER, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        if server.stdout.readline().strip() != "ready":
            raise SystemExit("the TCPStore server did not start")
        base_rss = proc_rss_mb(server.pid)
        result["store_rss_base_mb"] = round(base_rss, 1)
        run_id = f"bench{os.getpid()}"
        procs = max(1, min(args.procs, n))
        result["participant_processes"] = procs
        shares = [list(range(n))[k::procs] for k in range(procs)]
        t_connect = time.monotonic()
        if procs == 1:
            workers = [_Local(shares[0], port, run_id, n, args)]
        else:
            import multiprocessing as mp
            ctx = mp.get_context("fork")  # before any store or thread exists in this process
            workers = [_Remote(ctx, share, port, run_id, n, args) for share in shares]
        for w in workers:
            w.ready()
        result["connect_s"] = round(time.monotonic() - t_connect, 3)

        def phase(which, label):
            sampler = CpuSampler(server.pid)
            start_at = time.time() + 0.5
            for w in workers:
                w.send(("phase", [i for i in which if i in w.share_set], start_at))
            time.sleep(max(0.0, start_at - time.time()))
            sampler.start()
            replies = [w.recv(args.timeout + 60) for w in workers]
            stats = sampler.stop()
            done, errors, cpu, lost = {}, {}, 0.0, 0
            for rep in replies:
                if rep is None:
                    lost += 1
                    continue
                done.update(rep["done"])
                errors.update(rep["errors"])
                cpu += rep["cpu"]
            t0 = start_at
            out = {"ok": len(done) == len(which) and not errors, "returned": len(done), "of": len(which),
                   "store_cpu_pct": stats["cpu_pct"], "store_cpu_s": stats["cpu_s"],
                   "store_rss_growth_mb": round(stats["rss_mb"] - base_rss, 1),
                   "clients_cpu_s": round(cpu, 2)}
            if done:
                out["s"] = round(max(v[0] for v in done.values()) - t0, 3)
                out["first_s"] = round(min(v[0] for v in done.values()) - t0, 3)
                out["world"] = sorted({v[2] for v in done.values()})
            if errors:
                out["errors"] = sorted(set(errors.values()))[:3]
                out["n_errors"] = len(errors)
            hung = len(which) - len(done) - len(errors)
            if hung:
                out["hung"] = hung
                out["error"] = f"{hung} of {len(which)} participants still in next_rendezvous() after {args.timeout + 10:.0f} s"
            result[label] = out
            return out

        form = phase(list(range(n)), "form")
        print(json.dumps(dict(result, partial=True)), flush=True)  # in case the next phase hangs
        if form["ok"]:
            victim = n - 1
            for w in workers:
                if victim in w.share_set:
                    w.send(("kill", victim))  # a SIGKILLed node stops heartbeating
            time.sleep(0.5)
            phase([i for i in range(n) if i != victim], "reform")
        result["store_hwm_mb"] = round(proc_hwm_mb(server.pid), 1)
    except Exception as e:  # noqa: BLE001
        result["error"] = f"{type(e).__name__}: {e}"
        result["traceback"] = traceback.format_exc()[-2000:]
    finally:
        server.kill()
        server.wait()
        for w in locals().get("workers", []):
            if isinstance(w, _Remote):
                w.proc.kill()
    result["loadavg_after"] = loadavg()
    print(json.dumps(result), flush=True)
    os._exit(0)  # the handlers' keep-alive threads and hung participants must not hold the exit


if __name__ == "__main__":
    sys.exit(main())
