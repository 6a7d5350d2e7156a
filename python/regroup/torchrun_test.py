# SPDX-License-Identifier: Apache-2.0
"""torchrun handed over to regroup-agent: the hook in torch's run.py and the entry point on PATH."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from regroup import torchrun
from regroup.api import ConfigError

PYTHON_DIR = Path(__file__).resolve().parents[1]
TORCHRUN_ARGS = ["--nnodes", "2", "--nproc_per_node", "2", "train.py", "--lr", "0.1", "--", "x y"]


@pytest.fixture
def fake_agent(tmp_path):
    """An executable that writes the arguments it was given, one per line, and exits 0."""
    out = tmp_path / "agent-args"
    agent = tmp_path / "regroup-agent"
    agent.write_text(f'#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done > {out}\n')
    agent.chmod(0o755)
    return agent, out


def env(**extra):
    e = {k: v for k, v in os.environ.items()
         if k not in (torchrun.SWITCH, torchrun.MINDCLUSTER_SWITCH, "REGROUP_AGENT")}
    e["PYTHONPATH"] = os.pathsep.join([str(PYTHON_DIR), e.get("PYTHONPATH", "")])
    e.update(extra)
    return e


# --redirects/--tee non-zero: Debian's torch 1.13 on Python 3.11 crashes at start without them
# ('NoneType' object has no attribute 'get'); torch 2.x takes them too.
STANDALONE = ["--standalone", "--redirects=2", "--tee=2", "--nproc_per_node", "2"]


def a_trainer(tmp_path) -> tuple[Path, Path]:
    """A script that records the torchrun variables it was started with."""
    seen = tmp_path / "trainer-saw"
    script = tmp_path / "train.py"
    script.write_text("import os\n"
                      f"open({str(seen)!r} + os.environ['RANK'], 'w').write("
                      "os.environ['WORLD_SIZE'] + ' ' + os.environ['LOCAL_RANK'])\n")
    return script, seen


def test_the_switch_reads_on_and_off_and_names_a_bad_value():
    assert not torchrun.enabled({})
    assert torchrun.enabled({"REGROUP_TORCHRUN": "on"})
    assert torchrun.enabled({"TASKD_PROCESS_ENABLE": "on"})  # MindCluster's own switch
    assert not torchrun.enabled({"REGROUP_TORCHRUN": "off", "TASKD_PROCESS_ENABLE": "on"})
    assert not torchrun.enabled({"TASKD_PROCESS_ENABLE": "off"})
    with pytest.raises(ConfigError, match=r"REGROUP_TORCHRUN='maybe'"):
        torchrun.enabled({"REGROUP_TORCHRUN": "maybe"})


def test_the_entry_point_hands_every_argument_over_to_the_agent(tmp_path, fake_agent):
    agent, out = fake_agent
    shim = torchrun.write_shim(tmp_path / "bin")
    run = subprocess.run([str(shim), *TORCHRUN_ARGS], env=env(REGROUP_TORCHRUN="on", REGROUP_AGENT=str(agent)),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert out.read_text().splitlines() == TORCHRUN_ARGS
    assert "handing over to" in run.stderr


def test_with_the_switch_off_the_entry_point_is_torchrun(tmp_path, fake_agent):
    agent, out = fake_agent
    shim = torchrun.write_shim(tmp_path / "bin")
    script, seen = a_trainer(tmp_path)
    run = subprocess.run([str(shim), *STANDALONE, str(script)],
                         env=env(REGROUP_AGENT=str(agent)), capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert not out.exists()
    assert sorted(p.read_text() for p in tmp_path.glob("trainer-saw*")) == ["2 0", "2 1"]


def test_a_bad_switch_stops_torchrun_with_a_message_that_names_it(tmp_path, fake_agent):
    agent, out = fake_agent
    shim = torchrun.write_shim(tmp_path / "bin")
    run = subprocess.run([str(shim), "train.py"], env=env(REGROUP_TORCHRUN="sometimes", REGROUP_AGENT=str(agent)),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "REGROUP_TORCHRUN='sometimes'" in run.stderr
    assert not out.exists()


def patched_copy_of_torch_run_py(tmp_path) -> Path:
    """torch's run.py copied to a torch/distributed/ of its own, to patch without touching torch."""
    copy = tmp_path / "torch-copy" / "torch" / "distributed" / "run.py"
    copy.parent.mkdir(parents=True)
    shutil.copy2(torchrun.torch_run_py(), copy)
    return copy


def test_the_hook_goes_in_once_and_comes_out_leaving_run_py_as_it_was(tmp_path):
    run_py = patched_copy_of_torch_run_py(tmp_path)
    original = run_py.read_bytes()
    mode = run_py.stat().st_mode
    assert not torchrun.installed(run_py)
    assert torchrun.install(run_py)
    assert not torchrun.install(run_py)  # a second install changes nothing
    text = run_py.read_text()
    assert text.count(torchrun.HOOK_LINE) == 1
    assert text.index(torchrun.HOOK_LINE) < text.rindex('if __name__ == "__main__":')
    assert run_py.stat().st_mode == mode
    assert torchrun.uninstall(run_py)
    assert not torchrun.uninstall(run_py)
    assert run_py.read_bytes() == original


def test_the_hook_refuses_a_file_that_is_not_torchs_run_py(tmp_path):
    other = tmp_path / "run.py"
    other.write_text("print('hello')\n")
    with pytest.raises(ConfigError, match="is this torch's"):
        torchrun.install(other)
    assert other.read_text() == "print('hello')\n"


@pytest.mark.parametrize("switch", ["on", "off"])
def test_run_py_with_the_hook_hands_over_only_when_switched_on(tmp_path, fake_agent, switch):
    agent, out = fake_agent
    run_py = patched_copy_of_torch_run_py(tmp_path)
    tool = subprocess.run([sys.executable, "-m", "regroup.torchrun", "install", "--run-py", str(run_py)],
                          env=env(), capture_output=True, text=True, timeout=60)
    assert tool.returncode == 0 and "hook inserted" in tool.stdout, tool.stderr
    script, seen = a_trainer(tmp_path)
    args = [*STANDALONE, str(script)]
    run = subprocess.run([sys.executable, str(run_py), *args],  # as `python -m torch.distributed.run`
                         env=env(TASKD_PROCESS_ENABLE=switch, REGROUP_AGENT=str(agent)),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    if switch == "on":
        assert out.read_text().splitlines() == args
        assert not list(tmp_path.glob("trainer-saw*"))
    else:
        assert not out.exists()
        assert sorted(p.read_text() for p in tmp_path.glob("trainer-saw*")) == ["2 0", "2 1"]


def test_the_tool_says_whether_the_hook_is_there(tmp_path):
    run_py = patched_copy_of_torch_run_py(tmp_path)

    def tool(*args):
        r = subprocess.run([sys.executable, "-m", "regroup.torchrun", *args, "--run-py", str(run_py)],
                           env=env(), capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout

    assert "not installed" in tool("status")
    tool("install")
    assert "hook installed" in tool("status")
    assert "hook removed" in tool("uninstall")
