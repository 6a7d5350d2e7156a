#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Control plane at scale, Regroup side: N simulated node agents (no training) form a group with
a real `regroup-manager`, then one of them dies and the survivors get the next generation.

    /usr/bin/python3 bench/compare/rdzv_regroup.py --nodes 1024 [--nproc 8] [--timeout 120]

The agents are one asyncio task each in this process, speaking the manager's gRPC protocol
(`regroup.v1.Manager/Session`, proto/regroup/v1/wire.proto; messages generated with protoc
into a temporary directory, the stream driven through grpcio's generic stream-stream call). Each
agent registers its `--nproc` ranks, reports them up as soon as it is welcomed (a heartbeat),
heartbeats them every --heartbeat-ms, and records when its
StartGeneration arrives. The manager is the real binary in its own process; its CPU and memory
are read from /proc.

Forming: every agent registers at once; the time is until the last agent holds its
StartGeneration. A node dies: one agent's stream is cancelled (as a SIGKILLed agent's TCP
connection closes); the time is until every survivor holds the next generation's
StartGeneration (detection, the report window, the decision, the abort and the new plan all
included). The job is elastic as in the torch run: recover-in-place + elastic-training with
prefer-elastic (scale in at once).

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BUILD, REPO, CpuSampler, loadavg, proc_cpu_seconds, proc_hwm_mb, proc_rss_mb  # noqa: E402


def load_proto():
    out = tempfile.mkdtemp(prefix="regroup-bench-pb-")
    subprocess.run(["protoc", f"-I{REPO / 'proto'}", f"--python_out={out}",
                    str(REPO / "proto" / "regroup" / "v1" / "wire.proto")], check=True)
    sys.path.insert(0, out)
    from regroup.v1 import wire_pb2  # type: ignore  # noqa: E402
    return wire_pb2


pb = load_proto()
import grpc  # noqa: E402


class SimAgent:
    def __init__(self, node: int, nproc: int, job: str):
        self.node, self.nproc, self.job = node, nproc, job
        self.uid = f"sim-{node}"
        self.epoch = 0
        self.generation = 0
        self.starts = []  # (monotonic, generation)
        self.aborts = []
        self.call = None
        self.event = asyncio.Event()
        self.alive = True

    def header(self, m):
        m.header.job_id = self.job
        m.header.sender = self.uid
        m.header.epoch = self.epoch
        m.header.generation = self.generation
        return m

    def register(self):
        m = pb.AgentMessage()
        r = m.register
        r.pod_uid, r.pod_name, r.node_rank, r.node_name = self.uid, self.uid, self.node, f"node-{self.node}"
        r.host, r.nproc, r.free_port = "127.0.0.1", self.nproc, 20000 + self.node % 40000
        return self.header(m)

    def beat(self):
        m = pb.AgentMessage()
        hb = m.heartbeat
        hb.free_port = 20000 + self.node % 40000
        for l in range(self.nproc):
            r = hb.ranks.add()
            r.local_rank, r.pid, r.alive, r.step = l, 10000 + l, True, 0
            r.phase = pb.PHASE_COMPUTING
            r.generation, r.committed_step, r.heard_commit_step = self.generation, -1, -1
        return self.header(m)

    async def read(self):
        try:
            while True:
                m = await self.call.read()
                if m is grpc.aio.EOF:
                    return
                now = time.monotonic()
                if m.header.epoch > self.epoch:
                    self.epoch = m.header.epoch
                kind = m.WhichOneof("body")
                if kind == "welcome":
                    self.epoch = max(self.epoch, m.welcome.epoch)
                    # Its ranks are up (said hello): report them at once, so the agent is available.
                    await self.call.write(self.beat())
                elif kind == "start":
                    self.generation = m.start.plan.generation
                    self.starts.append((now, self.generation, m.start.plan.world_size))
                    self.event.set()
                elif kind == "abort":
                    self.aborts.append(now)
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            return

    async def beats(self, interval):
        try:
            while self.alive:
                await asyncio.sleep(interval)
                if self.alive:
                    await self.call.write(self.beat())
        except (grpc.aio.AioRpcError, asyncio.CancelledError, Exception):  # noqa: BLE001
            return


async def wait_all(agents, pred, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(pred(a) for a in agents):
            return True
        await asyncio.sleep(0.005)
    return False


async def run(args, manager_pid, port):
    n = args.nodes
    opts = [("grpc.keepalive_time_ms", 60000), ("grpc.max_receive_message_length", 64 << 20)]
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=opts + [("regroup.channel", c)])
                for c in range(args.channels)]
    method = "/regroup.v1.Manager/Session"
    agents = [SimAgent(i, args.nproc, "bench/rdzv") for i in range(n)]
    result = {}
    sampler = CpuSampler(manager_pid).start()
    mine0 = proc_cpu_seconds(os.getpid())
    t0 = time.monotonic()
    tasks = []
    for a in agents:
        ch = channels[a.node % len(channels)]
        a.call = ch.stream_stream(method, request_serializer=pb.AgentMessage.SerializeToString,
                                  response_deserializer=pb.ManagerMessage.FromString)()
        await a.call.write(a.register())
        tasks.append(asyncio.create_task(a.read()))
    t_sent = time.monotonic()
    for a in agents:
        tasks.append(asyncio.create_task(a.beats(args.heartbeat_ms / 1000)))
    ok = await wait_all(agents, lambda a: len(a.starts) >= 1, args.timeout)
    form = {"ok": ok, "returned": sum(1 for a in agents if a.starts), "of": n,
            "register_sent_s": round(t_sent - t0, 3)}
    if ok:
        form["s"] = round(max(a.starts[0][0] for a in agents) - t0, 3)
        form["first_s"] = round(min(a.starts[0][0] for a in agents) - t0, 3)
        form["world"] = sorted({a.starts[0][2] for a in agents})
    else:
        form["error"] = f"{n - form['returned']} of {n} agents had no generation after {args.timeout} s"
    st = sampler.stop()
    form.update(manager_cpu_s=st["cpu_s"], manager_cpu_pct=st["cpu_pct"], manager_rss_mb=st["rss_mb"],
                clients_cpu_s=round(proc_cpu_seconds(os.getpid()) - mine0, 2))
    result["form"] = form
    if ok:
        # Steady state: heartbeats only.
        sampler = CpuSampler(manager_pid).start()
        await asyncio.sleep(args.steady)
        st = sampler.stop()
        result["steady"] = {"manager_cpu_pct": st["cpu_pct"], "manager_rss_mb": st["rss_mb"],
                            "seconds": args.steady, "heartbeat_ms": args.heartbeat_ms}
        victim = agents[n - 1]
        survivors = agents[:-1]
        gens = {a.uid: a.generation for a in survivors}
        sampler = CpuSampler(manager_pid).start()
        mine0 = proc_cpu_seconds(os.getpid())
        t1 = time.monotonic()
        victim.alive = False
        victim.call.cancel()
        ok2 = await wait_all(survivors, lambda a: a.generation > gens[a.uid], args.timeout)
        reform = {"ok": ok2, "returned": sum(1 for a in survivors if a.generation > gens[a.uid]), "of": n - 1}
        if ok2:
            reform["s"] = round(max(a.starts[-1][0] for a in survivors) - t1, 3)
            reform["first_s"] = round(min(a.starts[-1][0] for a in survivors) - t1, 3)
            reform["world"] = sorted({a.starts[-1][2] for a in survivors})
            aborted = [a.aborts[-1] - t1 for a in survivors if a.aborts and a.aborts[-1] >= t1]
            if aborted:
                reform["abort_all_s"] = round(max(aborted), 3)
        else:
            reform["error"] = f"{reform['of'] - reform['returned']} survivors had no new generation after {args.timeout} s"
        st = sampler.stop()
        reform.update(manager_cpu_s=st["cpu_s"], manager_cpu_pct=st["cpu_pct"], manager_rss_mb=st["rss_mb"],
                      clients_cpu_s=round(proc_cpu_seconds(os.getpid()) - mine0, 2))
        result["reform"] = reform
    for a in agents:
        a.alive = False
        if a.call is not None:
            a.call.cancel()
    for t in tasks:
        t.cancel()
    try:
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
    except asyncio.TimeoutError:
        pass
    return result


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--nproc", type=int, default=8, help="ranks per simulated agent")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--heartbeat-ms", type=int, default=1000)
    p.add_argument("--steady", type=float, default=3.0, help="seconds of steady state measured")
    p.add_argument("--channels", type=int, default=8)
    p.add_argument("--manager-bin", default=str(BUILD / "regroup-manager"))
    args = p.parse_args()

    result = {"system": "regroup", "nodes": args.nodes, "nproc": args.nproc, "ranks": args.nodes * args.nproc,
              "heartbeat_ms": args.heartbeat_ms, "loadavg_before": loadavg()}
    tmp = Path(tempfile.mkdtemp(prefix="regroup-bench-rdzv-"))
    port_file = tmp / "port"
    argv = [args.manager_bin, "--job-id", "bench/rdzv", "--nodes", str(args.nodes), "--nproc-per-node",
            str(args.nproc), "--listen", "127.0.0.1:0", "--port-file", str(port_file), "--join-window-s", "600",
            "--record", str(tmp / "record.json"),
            "--stay-after-done",
            # The measure is the rendezvous, against torchrun's credential-less store: the simulated
            # agents (grpcio streams) send no credential, so the manager runs open, on loopback.
            "--insecure",
            "--label", "fault-scheduling=force",
            "--annotation", "recover-strategy=recover-in-place,elastic-training",
            "--annotation", "regroup.io/prefer-elastic=true",
            "--annotation", f"regroup.io/heartbeat-interval-ms={args.heartbeat_ms}",
            "--annotation", "regroup.io/liveness-misses=10",
            "--annotation", "regroup.io/hang-timeout-min-s=3600",
            "--annotation", "regroup.io/collective-timeout-s=7200"]
    log = open(tmp / "manager.log", "wb")
    manager = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if manager.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the manager did not start: " + (tmp / "manager.log").read_text()[-2000:])
            time.sleep(0.02)
        port = int(port_file.read_text())
        result["manager_rss_base_mb"] = round(proc_rss_mb(manager.pid), 1)
        loop = asyncio.new_event_loop()  # never closed: grpc.aio's shutdown can hang; os._exit below
        result.update(loop.run_until_complete(run(args, manager.pid, port)))
        result["manager_hwm_mb"] = round(proc_hwm_mb(manager.pid), 1)
    except Exception as e:  # noqa: BLE001
        result["error"] = f"{type(e).__name__}: {e}"
    finally:
        manager.terminate()
        try:
            manager.wait(10)
        except subprocess.TimeoutExpired:
            manager.kill()
            manager.wait()
        log.close()
    result["loadavg_after"] = loadavg()
    print(json.dumps(result), flush=True)
    os._exit(0)  # grpc's channels need no orderly shutdown here


if __name__ == "__main__":
    sys.exit(main())
