# SPDX-License-Identifier: Apache-2.0
"""The fork server behind warm trainer starts: a process that has already imported torch, this
library and the job's own modules, and forks a ready trainer whenever the agent asks.

A crashed rank's new process would otherwise spend about a second importing torch while every
survivor waits for it. The agent (``regroup-agent --warm-start``) starts one server per pod,
with the pod's environment, next to its trainers:

    python3 -u -m regroup.warm --import torch,torch.distributed,mymodel --script-dir DIR

and talks to it over a socket pair handed over as descriptor 3, in the framing of the trainer
socket (``WarmReady``, ``WarmStart``, ``WarmStarted`` in proto/regroup/v1/wire.proto). For each
``WarmStart`` the server forks twice: the intermediate child exits at once, so the trainer is
adopted by the agent (a child subreaper) and the agent reaps and signals it like any trainer it
started itself. The trainer then takes the rank's environment, working directory and arguments
and runs the script as ``__main__``, as ``python3 -u SCRIPT ARGS`` would.

What a script (and every module the job lists) must not do at import time, for a fork to be
safe: start a thread, create an accelerator context (CUDA, NPU), open a connection, or read a
variable of the rank's environment (RANK, LOCAL_RANK, ...): a forked trainer inherits what the
imports did in the server, where those variables are rank 0's. The server checks the first two
before every fork and refuses (the agent then starts the process plainly, as before); thread
pools such as OpenBLAS's start threads at import unless OMP_NUM_THREADS (or
OPENBLAS_NUM_THREADS) is 1, which the agent sets when a pod runs more than one rank.

Each forked trainer reseeds Python's ``random`` (Python does that at every fork); NumPy's global
generator is inherited, so seed it explicitly, as exact training does anyway.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import os
import runpy
import select
import signal
import socket
import sys
import time
from typing import List, Optional

from regroup._proto import wire_pb2 as pb
from regroup.wire import recv_frame, send_frame

SERVER_NAME = b"regroup-warm"  # the server's /proc/PID/comm, so tools can tell it from trainers
AGENT_FD = 3
ADOPTION_TIMEOUT_S = 2.0  # for the trainer to be adopted by the agent and report its pid

_PR_SET_NAME = 15
_PR_SET_PDEATHSIG = 1


def _prctl(option: int, arg) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, arg, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def fork_hazard() -> str:
    """Why forking this process now would be unsafe, or "" when it is not."""
    try:
        threads = len(os.listdir("/proc/self/task"))
    except OSError:
        threads = 1
    if threads > 1:
        return (f"the fork server has {threads} threads after its imports (a thread pool started "
                f"at import? set OMP_NUM_THREADS=1 or OPENBLAS_NUM_THREADS=1): a fork carries "
                f"only the calling thread")
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "cuda", None) is not None:
        try:
            if torch.cuda.is_initialized():
                return "an import created a CUDA context, which a forked process cannot use"
        except Exception:  # noqa: BLE001 - a broken CUDA build is not a reason to stop
            pass
    return ""


def _adopted_child(request: pb.WarmStart, report_fd: int, intermediate: int) -> None:
    """In the trainer: wait to be adopted by the agent, arm the death signal, report the pid."""
    os.setpgid(0, 0)
    deadline = time.monotonic() + ADOPTION_TIMEOUT_S
    while os.getppid() == intermediate and time.monotonic() < deadline:
        time.sleep(0.0005)
    if os.getppid() != request.reaper_pid:
        os.write(2, b"regroup.warm: the trainer was not adopted by the agent (is it a child "
                    b"subreaper?); exiting\n")
        os._exit(70)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != request.reaper_pid:  # the agent died before the signal was armed
        os._exit(70)
    os.write(report_fd, str(os.getpid()).encode())
    os.close(report_fd)


def _fork_trainer(sock: socket.socket, request: pb.WarmStart) -> Optional[pb.WarmStart]:
    """Forks one trainer. Returns the request in the trainer (which then runs it), None in the
    server once it answered the agent."""
    hazard = fork_hazard()
    if hazard:
        send_frame(sock, pb.WarmStarted(error=hazard))
        return None
    read_fd, write_fd = os.pipe()
    intermediate = os.fork()
    if intermediate == 0:
        try:
            os.close(read_fd)
            me = os.getpid()
            if os.fork() == 0:
                sock.close()
                _adopted_child(request, write_fd, me)
                return request
        except BaseException:  # noqa: BLE001 - the intermediate never returns to the server loop
            os._exit(71)
        os._exit(0)
    os.close(write_fd)
    os.waitpid(intermediate, 0)
    ready, _, _ = select.select([read_fd], [], [], ADOPTION_TIMEOUT_S)
    text = os.read(read_fd, 32) if ready else b""
    os.close(read_fd)
    try:
        pid = int(text)
    except ValueError:
        why = ("exited before the agent adopted it" if ready
               else f"did not report within {ADOPTION_TIMEOUT_S:g} s")
        send_frame(sock, pb.WarmStarted(error=f"the forked trainer {why}"))
        return None
    send_frame(sock, pb.WarmStarted(pid=pid))
    return None


def serve(sock: socket.socket, imports: List[str]) -> Optional[pb.WarmStart]:
    """Imports the modules, says so, and forks trainers until the agent closes the socket.

    Returns in a forked trainer only, with its request; returns None in the server at the end.
    """
    began = time.monotonic()
    imported = []
    try:
        for name in imports:
            importlib.import_module(name)
            imported.append(name)
    except Exception as e:  # noqa: BLE001 - any failure is reported to the agent, named
        send_frame(sock, pb.WarmReady(pid=os.getpid(), imported=imported,
                                      error=f"cannot import {name}: {type(e).__name__}: {e}"))
        return None
    hazard = fork_hazard()
    send_frame(sock, pb.WarmReady(pid=os.getpid(), imported=imported,
                                  import_seconds=time.monotonic() - began, error=hazard))
    if hazard:
        return None
    while True:
        request = recv_frame(sock, pb.WarmStart)
        if request is None:
            return None  # the agent is gone, or wants no more trainers
        trainer = _fork_trainer(sock, request)
        if trainer is not None:
            return trainer


def run_trainer(request: pb.WarmStart) -> None:
    """In a forked trainer: becomes the rank's process and runs its script as ``__main__``."""
    name = os.path.basename(sys.executable or "python3").encode()[:15]
    try:
        _prctl(_PR_SET_NAME, ctypes.c_char_p(name))
    except OSError:
        pass
    os.chdir(request.cwd or "/")
    os.environ.clear()
    for entry in request.env:
        key, sep, value = entry.partition("=")
        if sep and key:
            os.environ[key] = value
    args = list(request.args)
    # sys.path as the interpreter would have built it from this environment: the script's folder
    # (or, with -m, the working directory) first, then PYTHONPATH, then the rest.
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[1:1] = extra
    if request.module:
        sys.path[0] = os.getcwd()
        sys.argv = args  # run_module puts the module's file in argv[0]
        runpy.run_module(args[0], run_name="__main__", alter_sys=True)
    else:
        script = os.path.abspath(args[0])
        sys.argv = args
        sys.path[0] = os.path.dirname(script)
        runpy.run_path(script, run_name="__main__")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m regroup.warm", description=__doc__.split("\n")[0])
    parser.add_argument("--import", dest="imports", default="torch,torch.distributed,regroup.trainer",
                        help="comma-separated modules to import before forking")
    parser.add_argument("--script-dir", default="",
                        help="the training script's folder, searched first for the modules")
    parser.add_argument("--fd", type=int, default=AGENT_FD, help="the socket to the agent")
    args = parser.parse_args(argv)
    try:
        _prctl(_PR_SET_NAME, ctypes.c_char_p(SERVER_NAME))
    except OSError:
        pass
    if args.script_dir:
        sys.path.insert(0, args.script_dir)
    sock = socket.socket(fileno=args.fd)
    trainer = serve(sock, [m for m in args.imports.split(",") if m])
    if trainer is None:
        sock.close()
        return 0
    if args.script_dir:
        sys.path.remove(args.script_dir)
    run_trainer(trainer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
