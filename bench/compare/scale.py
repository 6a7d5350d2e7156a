#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Control plane at scale: runs rdzv_regroup.py and rdzv_torch.py for each size, each in its own
process bounded by a hard timeout, and appends their JSON lines to --out.

    /usr/bin/python3 bench/compare/scale.py [--regroup 8,32,...] [--torch 8,32,...] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import HERE, PYTHON, append_jsonl, loadavg  # noqa: E402


def one(argv, bound: float, record: dict, out: Path) -> None:
    t0 = time.time()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=bound)
        lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
        r = json.loads(lines[-1]) if lines else {"error": f"no result (exit {p.returncode}): {p.stderr[-500:]}"}
    except subprocess.TimeoutExpired as e:
        text = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        lines = [l for l in text.splitlines() if l.startswith("{")]
        r = json.loads(lines[-1]) if lines else {}
        r["error"] = f"killed by the harness after {bound:.0f} s (hung)"
    r.update(record)
    r["harness_s"] = round(time.time() - t0, 1)
    print(json.dumps({k: v for k, v in r.items() if k != "traceback"}), flush=True)
    append_jsonl(out, r)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--regroup", default="8,32,64,128,256,1024,2048")
    p.add_argument("--torch", default="8,32,64,128,256")
    p.add_argument("--torch-default-last-call", default="8", help="sizes also run with last_call_timeout=30")
    p.add_argument("--reps", type=int, default=3, help="repetitions of each Regroup size")
    p.add_argument("--torch-reps", type=int, default=1)
    p.add_argument("--torch-procs", default="1,4", help="run the torch sizes with participants spread over these process counts")
    p.add_argument("--timeout", type=float, default=150, help="per phase (torch: also its join timeout)")
    p.add_argument("--out", default=str(HERE / "results" / "scale.jsonl"))
    args = p.parse_args()
    out = Path(args.out)
    for rep in range(args.reps):
        for n in [int(x) for x in args.regroup.split(",") if x]:
            one([PYTHON, str(HERE / "rdzv_regroup.py"), "--nodes", str(n), "--timeout", str(args.timeout)],
                3 * args.timeout + 60, {"system": "regroup", "nodes": n, "rep": rep}, out)
    for rep in range(args.torch_reps):
        for procs in [int(x) for x in args.torch_procs.split(",") if x]:
            for n in [int(x) for x in args.torch.split(",") if x]:
                if procs > 1 and n < 64:
                    continue  # below 64 the threads of one process are not the bottleneck
                one([PYTHON, str(HERE / "rdzv_torch.py"), "--nodes", str(n), "--last-call", "1",
                     "--timeout", str(args.timeout), "--procs", str(procs)], 2 * args.timeout + 150,
                    {"system": "torch-c10d", "nodes": n, "rep": rep, "last_call_s": 1, "procs": procs}, out)
        for n in [int(x) for x in args.torch_default_last_call.split(",") if x]:
            one([PYTHON, str(HERE / "rdzv_torch.py"), "--nodes", str(n), "--last-call", "30",
                 "--timeout", str(args.timeout)], 2 * args.timeout + 150,
                {"system": "torch-c10d", "nodes": n, "rep": rep, "last_call_s": 30}, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
