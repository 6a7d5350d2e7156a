# SPDX-License-Identifier: Apache-2.0
"""Shared helpers of the comparison benchmarks: process statistics, the machine, JSON output."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BUILD = Path(os.environ.get("REGROUP_BUILD") or os.environ.get("REGROUP_BIN_DIR") or REPO / "build")
PYTHON = "/usr/bin/python3"  # Debian's python3 with torch 1.13 (the pyenv python3 has no torch)
CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (its threads included), 0 when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = text[text.rfind(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def proc_hwm_mb(pid: int) -> float:
    """Peak resident memory (VmHWM)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "?"


def machine() -> Dict[str, str]:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "?"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.0f} GiB"
    except OSError:
        pass
    try:
        import torch  # noqa: F401
        torch_version = torch.__version__
    except Exception:  # noqa: BLE001
        torch_version = "?"
    return {"cpu": cpu, "cores": str(os.cpu_count()), "memory": mem, "kernel": platform.release(),
            "python": platform.python_version(), "torch": torch_version, "loadavg": loadavg(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}


def median(values: List[float]) -> Optional[float]:
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def append_jsonl(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def read_jsonl(path: Path) -> List[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a line cut by a kill
    return out


class CpuSampler:
    """CPU share and peak RSS of one process between start() and stop()."""

    def __init__(self, pid: int):
        self.pid = pid
        self.t0 = self.c0 = 0.0

    def start(self) -> "CpuSampler":
        self.t0, self.c0 = time.monotonic(), proc_cpu_seconds(self.pid)
        return self

    def stop(self) -> Dict[str, float]:
        dt = time.monotonic() - self.t0
        dc = proc_cpu_seconds(self.pid) - self.c0
        return {"cpu_s": round(dc, 3), "cpu_pct": round(100.0 * dc / dt, 1) if dt > 0 else 0.0,
                "rss_mb": round(proc_rss_mb(self.pid), 1), "wall_s": round(dt, 3)}


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------------------
# Part C's measures (pure functions, unit-tested in tests/compare_report_test.py)
# ------------------------------------------------------------------------------------------------


def lineage(events: List[dict]) -> tuple:
    """The samples the final model is made of: ({step: [sample index, ...]}, {incomplete steps}).

    `samples` records (step, rank, world, indices, t) are written by every process that applied a
    committed step. A step committed again later (a restart from a checkpoint redoes it) replaces
    the earlier attempt: per step, only the records of the world size of its last record count,
    and per rank the latest. A step with fewer ranks' records than its world size is incomplete (a
    process killed after the step committed but before it wrote its record)."""
    by_step: Dict[int, List[dict]] = {}
    for e in events:
        if e.get("kind") == "samples":
            by_step.setdefault(e["step"], []).append(e)
    steps: Dict[int, List[int]] = {}
    incomplete = set()
    for step, recs in by_step.items():
        recs.sort(key=lambda e: e["t"])
        world = recs[-1]["world"]
        latest: Dict[int, dict] = {}
        for e in recs:
            if e["world"] == world:
                latest[e["rank"]] = e
        steps[step] = [i for e in latest.values() for i in e["indices"]]
        if len(latest) < world:
            incomplete.add(step)
    return steps, incomplete


def sample_diff(reference: tuple, run: tuple) -> Dict[str, int]:
    """Samples lost and repeated by `run` against the fault-free `reference` (both `lineage`
    results): multiset differences of the samples of the steps complete in both (a killed
    process's unwritten record would otherwise read as lost); `skipped` counts the steps left out."""
    (ref_steps, ref_bad), (run_steps, run_bad) = reference, run
    skip = set(ref_bad) | set(run_bad)
    ref: Dict[int, int] = {}
    got: Dict[int, int] = {}
    for steps, counts in ((ref_steps, ref), (run_steps, got)):
        for step, indices in steps.items():
            if step in skip:
                continue
            for i in indices:
                counts[i] = counts.get(i, 0) + 1
    keys = set(ref) | set(got)
    return {"lost": sum(max(0, ref.get(k, 0) - got.get(k, 0)) for k in keys),
            "repeated": sum(max(0, got.get(k, 0) - ref.get(k, 0)) for k in keys),
            "skipped": len(skip)}


def _code_lines(text: str) -> List[str]:
    """A script's code lines: stripped, without blank lines, comments and the module docstring."""
    import ast
    lines = text.splitlines()
    try:
        tree = ast.parse(text)
        first = tree.body[0] if tree.body else None
        if isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant) \
                and isinstance(first.value.value, str):
            lines = lines[:first.lineno - 1] + lines[first.end_lineno:]
    except SyntaxError as e:
        raise ValueError(f"not Python: {e}") from e
    return [s.strip() for s in lines if s.strip() and not s.strip().startswith("#")]


def changed_lines(plain: str, adopted: str) -> Dict[str, int]:
    """Lines added and removed going from the plain script to the adopted one (code lines only)."""
    import difflib
    added = removed = 0
    for line in difflib.ndiff(_code_lines(plain), _code_lines(adopted)):
        if line.startswith("+ "):
            added += 1
        elif line.startswith("- "):
            removed += 1
    return {"added": added, "removed": removed}


def steady_step_s(timeline: List[list], skip: int = 5) -> Optional[float]:
    """Median time between consecutive committed steps ([t, step, world] rows), after `skip`."""
    ts = sorted(t for t, step, _ in timeline if step >= skip)
    return median([b - a for a, b in zip(ts, ts[1:])])


def weights_diff(reference: Path, run: Path) -> Optional[Dict[str, float]]:
    """Max absolute and relative L2 difference of two raw float32 parameter files."""
    import numpy as np
    if not (reference.exists() and run.exists()):
        return None
    a = np.fromfile(reference, dtype=np.float32).astype(np.float64)
    b = np.fromfile(run, dtype=np.float32).astype(np.float64)
    if a.shape != b.shape:
        raise ValueError(f"{run}: {b.size} parameters, the reference {reference} has {a.size}")
    return {"max_abs": float(np.abs(a - b).max()),
            "rel_l2": float(np.linalg.norm(a - b) / max(np.linalg.norm(a), 1e-30))}
