# SPDX-License-Identifier: Apache-2.0
"""The fork server (warm.py) driven as the agent drives it: a parent that is a child subreaper
hands it a socket pair as descriptor 3, reads WarmReady, asks for trainers with WarmStart, and
reaps what it forked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from regroup._proto import wire_pb2 as pb

PYTHON_DIR = Path(__file__).resolve().parents[1]

# The agent's side, in a process of its own (a subreaper changes who reaps orphans: not pytest).
AGENT = textwrap.dedent(r"""
    import ctypes, json, os, socket, subprocess, sys, time
    sys.path.insert(0, sys.argv[1])
    from regroup._proto import wire_pb2 as pb
    from regroup.wire import recv_frame, send_frame
    plan = json.loads(sys.argv[2])
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    mine, theirs = socket.socketpair()
    server = subprocess.Popen(
        [sys.executable, "-u", "-m", "regroup.warm", "--import", plan["imports"],
         "--script-dir", plan["script_dir"]],
        pass_fds=[3], env={**os.environ, "PYTHONPATH": sys.argv[1], "OMP_NUM_THREADS": "1"},
        preexec_fn=lambda: (os.dup2(theirs.fileno(), 3), os.set_inheritable(3, True)))
    theirs.close()
    out = {"server": server.pid}
    ready = recv_frame(mine, pb.WarmReady)
    out["ready"] = {"pid": ready.pid, "imported": list(ready.imported), "error": ready.error}
    with open(f"/proc/{server.pid}/comm") as f:
        out["server_comm"] = f.read().strip()
    out["trainers"] = []
    for start in (plan["starts"] if not ready.error else []):
        send_frame(mine, pb.WarmStart(local_rank=start["local_rank"], module=start.get("module", False),
                                      args=start["args"], env=start["env"], cwd=start["cwd"],
                                      reaper_pid=start.get("reaper_pid", os.getpid())))
        reply = recv_frame(mine, pb.WarmStarted)
        t = {"pid": reply.pid, "error": reply.error}
        if reply.pid:
            t["pgid"] = os.getpgid(reply.pid)
            t["ppid"] = int(open(f"/proc/{reply.pid}/stat").read().rsplit(")", 1)[1].split()[1])
            _, status = os.waitpid(reply.pid, 0)  # ours to reap: it was adopted
            t["exit_code"] = os.waitstatus_to_exitcode(status)
        out["trainers"].append(t)
    mine.close()
    out["server_exit"] = server.wait(timeout=30)
    print(json.dumps(out))
""")


def drive(tmp_path: Path, imports: str, starts, script_dir: Path = None) -> dict:
    harness = tmp_path / "agent_harness.py"
    harness.write_text(AGENT)
    plan = {"imports": imports, "starts": starts, "script_dir": str(script_dir or tmp_path)}
    done = subprocess.run([sys.executable, str(harness), str(PYTHON_DIR), json.dumps(plan)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


SCRIPT = textwrap.dedent("""
    import json, os, sys
    import helper_mod  # found next to the script, imported in the server already
    with open(os.environ["OUT"], "w") as f:
        json.dump({"name": __name__, "argv": sys.argv, "cwd": os.getcwd(),
                   "rank": os.environ.get("RANK"), "leak": os.environ.get("SERVER_ONLY"),
                   "path0": sys.path[0], "helper_loads": helper_mod.LOADS,
                   "pid": os.getpid(), "pgid": os.getpgid(0)}, f)
    sys.exit(int(sys.argv[1]))
""")


def test_a_forked_trainer_runs_the_script_as_a_fresh_interpreter_would(tmp_path):
    (tmp_path / "helper_mod.py").write_text("import os\nLOADS = os.getpid()\n")
    (tmp_path / "train.py").write_text(SCRIPT)
    work = tmp_path / "work"
    work.mkdir()
    env = [f"OUT={tmp_path / 'out.json'}", "RANK=5", f"PYTHONPATH={PYTHON_DIR}"]
    out = drive(tmp_path, "json,helper_mod",
                [{"local_rank": 1, "args": [str(tmp_path / "train.py"), "3"], "env": env,
                  "cwd": str(work)}])
    assert out["ready"]["error"] == ""
    assert out["ready"]["imported"] == ["json", "helper_mod"]
    assert out["server_comm"] == "regroup-warm"
    [t] = out["trainers"]
    assert t["error"] == ""
    assert t["exit_code"] == 3, "the script's exit code is the process's"
    assert t["pgid"] == t["pid"], "a process group of its own, for the agent to signal"
    seen = json.loads((tmp_path / "out.json").read_text())
    assert seen["name"] == "__main__"
    assert seen["argv"] == [str(tmp_path / "train.py"), "3"]
    assert seen["cwd"] == str(work)
    assert seen["rank"] == "5"
    assert seen["leak"] is None, "exactly the rank's environment, nothing of the server's"
    assert seen["path0"] == str(tmp_path)
    assert seen["helper_loads"] == out["ready"]["pid"], "the module came imported from the server"
    assert out["server_exit"] == 0


def test_modules_run_with_dash_m_semantics(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "job.py").write_text("import json, os, sys\n"
                                "json.dump({'name': __name__, 'argv': sys.argv}, open(os.environ['OUT'], 'w'))\n")
    env = [f"OUT={tmp_path / 'out.json'}", f"PYTHONPATH={PYTHON_DIR}:{tmp_path}"]
    out = drive(tmp_path, "json", [{"local_rank": 0, "module": True, "args": ["pkg.job", "x"],
                                    "env": env, "cwd": str(tmp_path)}])
    [t] = out["trainers"]
    assert t["exit_code"] == 0
    seen = json.loads((tmp_path / "out.json").read_text())
    assert seen == {"name": "__main__", "argv": [str(pkg / "job.py"), "x"]}


def test_a_server_with_threads_refuses_to_fork_and_says_why(tmp_path):
    (tmp_path / "spawns_thread.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n")
    out = drive(tmp_path, "spawns_thread", [])
    assert "2 threads" in out["ready"]["error"]
    assert "OMP_NUM_THREADS=1" in out["ready"]["error"]
    assert out["server_exit"] == 0


def test_an_import_that_fails_is_named(tmp_path):
    out = drive(tmp_path, "json,no_such_module_here", [])
    assert out["ready"]["imported"] == ["json"]
    assert "cannot import no_such_module_here: ModuleNotFoundError" in out["ready"]["error"]


def test_a_script_that_raises_exits_1_with_its_traceback(tmp_path):
    (tmp_path / "helper_mod.py").write_text("LOADS = 0\n")
    (tmp_path / "boom.py").write_text("raise RuntimeError('boom at import')\n")
    out = drive(tmp_path, "helper_mod",
                [{"local_rank": 0, "args": [str(tmp_path / "boom.py")],
                  "env": [f"PYTHONPATH={PYTHON_DIR}"], "cwd": str(tmp_path)}])
    assert out["trainers"][0]["exit_code"] == 1


def test_a_trainer_the_agent_did_not_adopt_is_refused(tmp_path):
    """A trainer whose parent is not the agent (no subreaper) is out of the agent's reach: it
    exits, and the server answers with an error instead of a pid."""
    (tmp_path / "ok.py").write_text("")
    out = drive(tmp_path, "json", [{"local_rank": 0, "args": [str(tmp_path / "ok.py")], "env": [],
                                    "cwd": str(tmp_path), "reaper_pid": 1}])
    [t] = out["trainers"]
    assert t["pid"] == 0
    assert t["error"] == "the forked trainer exited before the agent adopted it"


def test_fork_hazard_names_a_second_thread():
    import threading
    import time

    from regroup import warm
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, args=(5,))
    t.start()
    try:
        time.sleep(0.01)
        assert "threads" in warm.fork_hazard()
    finally:
        stop.set()
        t.join()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
