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
BUILD = Path(os.environ.get("REGROUP_BUILD", REPO / "build"))
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
