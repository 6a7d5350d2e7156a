# SPDX-License-Identifier: Apache-2.0
"""torchrun, handed over to ``regroup-agent``: the counterpart of MindCluster's patch of torch.

A MindCluster job keeps ``torchrun ...`` in its ``scripts/train_start.sh`` and switches TaskD on
with an environment variable, after one line was inserted into torch's ``distributed/run.py``.
Here an image with Regroup installed does the same, in either of two ways:

* **the hook**: ``python3 -m regroup.torchrun install`` inserts one import line into torch's
  ``torch/distributed/run.py`` (``uninstall`` takes it out again, byte for byte; ``status`` says
  whether it is there). Every way of starting torchrun then hands over: the ``torchrun`` command
  and ``python3 -m torch.distributed.run``.
* **the entry point**: ``python3 -m regroup.torchrun shim DIR`` writes a ``torchrun`` into DIR,
  to be put ahead of torch's on ``PATH``. torch itself is left untouched.

With ``REGROUP_TORCHRUN=on``, torchrun then execs ``regroup-agent`` with the very same arguments
(the agent takes torchrun's flags, ``regroup-agent --help``). MindCluster's own switch,
``TASKD_PROCESS_ENABLE=on``, turns it on too, unless ``REGROUP_TORCHRUN`` says ``off``. With
neither on, torchrun runs exactly as it always did. ``$REGROUP_AGENT`` names the agent's binary;
otherwise it is looked up as :func:`regroup.find_binary` does (``$REGROUP_BIN_DIR``, ``PATH``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Mapping, Optional, Sequence

from .api import ConfigError, find_binary

SWITCH = "REGROUP_TORCHRUN"
MINDCLUSTER_SWITCH = "TASKD_PROCESS_ENABLE"
HOOK_LINE = ('import importlib.util as _regroup_util; _regroup_util.find_spec("regroup") and '
             '__import__("regroup.torchrun").torchrun.hook(__name__)  '
             '# regroup: hands torchrun over to regroup-agent when REGROUP_TORCHRUN=on\n')
_ON = ("on", "1", "true", "yes")
_OFF = ("off", "0", "false", "no", "")


def _switch(environ: Mapping[str, str], name: str) -> Optional[bool]:
    value = environ.get(name)
    if value is None:
        return None
    v = value.strip().lower()
    if v in _ON:
        return True
    if v in _OFF:
        return False
    raise ConfigError(f"{name}={value!r}: expected one of {', '.join(_ON)} or {', '.join(_OFF[:-1])}")


def enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether torchrun hands over: ``REGROUP_TORCHRUN`` if set, else ``TASKD_PROCESS_ENABLE``.

    Raises:
        ConfigError: a variable holds something other than on/off (1/0, true/false, yes/no).
    """
    own = _switch(environ, SWITCH)
    if own is not None:
        return own
    return bool(_switch(environ, MINDCLUSTER_SWITCH))


def hand_over(args: Sequence[str], environ: Mapping[str, str] = os.environ) -> None:
    """Replaces this process by ``regroup-agent ARGS...``; returns only by raising."""
    agent = environ.get("REGROUP_AGENT") or find_binary("regroup-agent")
    if not os.access(agent, os.X_OK):
        raise ConfigError(f"REGROUP_AGENT={agent!r} is not an executable file")
    print(f"torchrun: handing over to {agent} ({SWITCH} or {MINDCLUSTER_SWITCH} is on)",
          file=sys.stderr, flush=True)
    os.execv(agent, [agent, *args])


def _fail(error: Exception) -> None:
    sys.exit(f"torchrun: {error}")


def hook(module_name: str) -> None:
    """Called by the line :func:`install` puts into torch's ``distributed/run.py``.

    Hands over only when that module is the program (``torchrun``, or ``python -m
    torch.distributed.run``); a plain import of it elsewhere is left alone.
    """
    is_program = module_name == "__main__" or os.path.basename(sys.argv[0]) == "torchrun"
    try:
        if is_program and enabled():
            hand_over(sys.argv[1:])
    except ConfigError as e:
        _fail(e)


def main(argv: Optional[Sequence[str]] = None) -> None:
    """torchrun through the entry point (:func:`write_shim`): hand over, or run torch's own."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if enabled():
            hand_over(args)
    except ConfigError as e:
        _fail(e)
    from torch.distributed.run import main as torch_main

    sys.argv = ["torchrun", *args]
    sys.exit(torch_main())


# ---------------------------------------------------------------------------------------------
# Installing the hook or the entry point
# ---------------------------------------------------------------------------------------------


def torch_run_py() -> Path:
    """torch's ``distributed/run.py``, found without importing torch (it takes seconds)."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("torch is not installed for this Python: there is no run.py to patch")
    return Path(list(spec.submodule_search_locations)[0]) / "distributed" / "run.py"


def installed(run_py: Path) -> bool:
    return HOOK_LINE in run_py.read_text()


def install(run_py: Path) -> bool:
    """Inserts the hook line before run.py's ``if __name__ == "__main__":``; False if there."""
    text = run_py.read_text()
    if HOOK_LINE in text:
        return False
    marker = '\nif __name__ == "__main__":'
    at = text.rfind(marker)
    if at < 0:
        raise ConfigError(f"{run_py}: no 'if __name__ == \"__main__\":' line; is this torch's "
                          "distributed/run.py?")
    _write(run_py, text[:at + 1] + HOOK_LINE + text[at + 1:])
    return True


def uninstall(run_py: Path) -> bool:
    """Takes the hook line out again; False if it was not there."""
    text = run_py.read_text()
    if HOOK_LINE not in text:
        return False
    _write(run_py, text.replace(HOOK_LINE, ""))
    return True


def write_shim(directory: Path, python: str = sys.executable) -> Path:
    """Writes ``DIRECTORY/torchrun``, the entry point to put ahead of torch's on PATH."""
    directory.mkdir(parents=True, exist_ok=True)
    shim = directory / "torchrun"
    shim.write_text("#!/bin/sh\n"
                    "# Written by `python3 -m regroup.torchrun shim`: torchrun, handed over to\n"
                    "# regroup-agent when REGROUP_TORCHRUN (or TASKD_PROCESS_ENABLE) is on.\n"
                    f"exec {python} -c 'import regroup.torchrun as t; t.main()' \"$@\"\n")
    shim.chmod(0o755)
    return shim


def _write(path: Path, text: str) -> None:
    """Replaces a file's text in one rename, keeping its mode (run.py must never be half written)."""
    tmp = path.with_name(path.name + ".regroup-tmp")
    tmp.write_text(text)
    os.chmod(tmp, path.stat().st_mode & 0o7777)
    os.replace(tmp, path)


def _tool(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m regroup.torchrun",
        description="Make torchrun hand over to regroup-agent when REGROUP_TORCHRUN=on "
                    "(or MindCluster's TASKD_PROCESS_ENABLE=on).")
    sub = p.add_subparsers(dest="command", required=True)
    for name, text in (("install", "insert the hook line into torch's distributed/run.py"),
                       ("uninstall", "take the hook line out again"),
                       ("status", "say whether the hook line is there")):
        s = sub.add_parser(name, help=text)
        s.add_argument("--run-py", type=Path, default=None,
                       help="the run.py to change (default: this Python's torch)")
    s = sub.add_parser("shim", help="write a torchrun entry point into DIR, to put ahead on PATH")
    s.add_argument("directory", type=Path)
    a = p.parse_args(argv)
    try:
        if a.command == "shim":
            print(write_shim(a.directory))
            return 0
        run_py = a.run_py or torch_run_py()
        if a.command == "install":
            print(f"{run_py}: hook {'inserted' if install(run_py) else 'was there already'}")
        elif a.command == "uninstall":
            print(f"{run_py}: hook {'removed' if uninstall(run_py) else 'was not there'}")
        else:
            print(f"{run_py}: hook {'installed' if installed(run_py) else 'not installed'}")
        return 0
    except (ConfigError, OSError) as e:
        print(f"python3 -m regroup.torchrun {a.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(_tool())
