#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The NCCL abort and one recovery, on a machine with 2 or more GPUs (torch 2.x). NOT RUN YET.

    python3 bench/gpu/nccl_check.py                # every visible GPU, one rank each
    python3 bench/gpu/nccl_check.py --ranks 4 --mb 256

Each rank forms a generation with Regroup's own group code (``regroup.group.build_groups``,
backend nccl, a TCPStore on a free port), checks an all-reduce, then the last rank "freezes":
it never enters the next all-reduce. The others enter it and wait on it; after ``--freeze-ms``
an abort comes from another thread, as the agent link thread delivers one: the groups' sockets
shut down, then ``ProcessGroups.abort_inflight()`` (NCCL's: torch's communicator abort). Printed
per rank: whether the abort had a way (``aborted``), how long after it the waiting rank was out
(``out_ms``), and how. Then every rank destroys the generation and forms the next one without
the frozen rank (a scale-in): ``rebuild_ms`` (groups formed) and ``first_allreduce_ms`` (its
first all-reduce of ``--mb`` MiB, the communicator's lazy setup included), and whether the sum
was right. Nothing is judged by time; the exit code is 1 when a rank did not come out or a sum
was wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))


def rank_main(rank: int, world: int, args: argparse.Namespace, side_path: str, out: str) -> None:
    import torch
    import torch.distributed as dist

    from regroup.abort import GroupSockets
    from regroup.group import Layout, build_groups
    from regroup.testing import free_port

    torch.cuda.set_device(rank)
    side = dist.FileStore(side_path, world)
    result = {"rank": rank}

    def form(key: str, size: int, me: int):
        if me == 0:
            side.set(key, str(free_port()))
        port = int(side.get(key))
        sockets = GroupSockets(port)
        started = time.monotonic()
        groups = build_groups(store_host="127.0.0.1", store_port=port, layout=Layout(size, me, 1),
                              backend="nccl", rendezvous_s=120, collective_s=args.timeout_s,
                              aborted=threading.Event(), sockets=sockets)
        return groups, sockets, (time.monotonic() - started) * 1000

    groups, sockets, result["form_ms"] = form("gen1", world, rank)
    x = torch.ones(args.mb << 18, device="cuda")  # MiB of float32
    dist.all_reduce(x)
    torch.cuda.synchronize()
    result["first_sum_ok"] = bool(x[0].item() == world)
    frozen = rank == world - 1

    def abort() -> None:
        time.sleep(args.freeze_ms / 1000)
        result["abort_at"] = time.monotonic()
        sockets.shutdown(include_store=True)
        result["aborted"] = groups.abort_inflight()

    aborter = threading.Thread(target=abort, daemon=True)
    aborter.start()
    if frozen:
        aborter.join()
        result["out_ms"] = 0.0
        result["how"] = "frozen (never entered the all-reduce)"
    else:
        try:
            work = dist.all_reduce(torch.ones_like(x), async_op=True)
            work.wait()
            torch.cuda.synchronize()
            result["how"] = "the all-reduce returned (not expected: a peer never joined)"
        except Exception as e:  # noqa: BLE001 - what the abort makes of it is the figure
            result["how"] = f"raised {type(e).__name__}: {str(e)[:160]}"
        aborter.join()
        result["out_ms"] = (time.monotonic() - result.pop("abort_at", time.monotonic())) * 1000
    result.pop("abort_at", None)
    groups.destroy()
    side.add("left", 1)
    while int(side.add("left", 0)) < world:
        time.sleep(0.01)
    if not frozen:  # the next generation: the survivors, renumbered densely
        groups, sockets, result["rebuild_ms"] = form("gen2", world - 1, rank)
        y = torch.ones(args.mb << 18, device="cuda")
        started = time.monotonic()
        dist.all_reduce(y)
        torch.cuda.synchronize()
        result["first_allreduce_ms"] = (time.monotonic() - started) * 1000
        result["second_sum_ok"] = bool(y[0].item() == world - 1)
        groups.destroy()
    with open(out, "w") as f:
        json.dump(result, f)


def main() -> int:
    import torch
    import torch.multiprocessing as mp

    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--ranks", type=int, default=torch.cuda.device_count())
    p.add_argument("--mb", type=int, default=64, help="MiB per all-reduce")
    p.add_argument("--freeze-ms", type=float, default=500.0, help="the abort comes this long after")
    p.add_argument("--timeout-s", type=float, default=60.0, help="the collective timeout (the backstop)")
    args = p.parse_args()
    if args.ranks < 2 or args.ranks > torch.cuda.device_count():
        print(f"nccl_check: needs 2 or more GPUs, one per rank (asked {args.ranks}, "
              f"{torch.cuda.device_count()} visible)", file=sys.stderr)
        return 2
    print(f"torch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, "
          f"{args.ranks} x {torch.cuda.get_device_name(0)}", flush=True)
    with tempfile.TemporaryDirectory() as d:
        outs = [os.path.join(d, f"r{r}.json") for r in range(args.ranks)]
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=rank_main, args=(r, args.ranks, args, os.path.join(d, "side"), outs[r]))
                 for r in range(args.ranks)]
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + args.timeout_s * 3 + 120
        for proc in procs:
            proc.join(max(1.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
        ok = True
        for r, out in enumerate(outs):
            if not os.path.exists(out):
                print(f"rank {r}: no result (exit code {procs[r].exitcode})")
                ok = False
                continue
            res = json.load(open(out))
            print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in res.items()))
            ok &= res.get("first_sum_ok", False) and res.get("second_sum_ok", r == args.ranks - 1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
