# SPDX-License-Identifier: Apache-2.0
"""Checkpoints: atomic shards, the manifest written last, the newest complete one found."""

import json
import os
import subprocess

import pytest
import torch

from regroup.api import CheckpointError
from regroup.checkpoint import Checkpointer, shard_name
from regroup.testing import EXAMPLE, PYTHON, relative_error


def _state(value):
    return {"committed_step": value, "model": {"w": torch.full((3,), float(value))}}


def test_a_checkpoint_is_complete_only_with_its_manifest_and_every_shard(tmp_path):
    c = Checkpointer(str(tmp_path), keep=0)
    c.write(_state(4), step=4, epoch=1, generation=2, position=0, replica_size=2)
    assert c.newest() is None  # shard 1 missing: no manifest yet
    assert not (c.path_for(4, 1, 2) / "manifest.json").exists()
    c.write(_state(4), step=4, epoch=1, generation=2, position=1, replica_size=2)
    info = c.newest()
    assert info is not None and (info.step, info.generation, info.replica_size) == (4, 2, 2)
    assert torch.equal(Checkpointer.load(info, 1)["model"]["w"], torch.full((3,), 4.0))


def test_a_truncated_shard_makes_the_checkpoint_incomplete(tmp_path):
    c = Checkpointer(str(tmp_path), keep=0)
    c.write(_state(1), step=1, epoch=1, generation=1, position=0, replica_size=1)
    c.write(_state(2), step=2, epoch=1, generation=1, position=0, replica_size=1)
    shard = c.path_for(2, 1, 1) / shard_name(0, 1)
    shard.write_bytes(shard.read_bytes()[:10])
    assert c.newest().step == 1


def test_no_temporary_file_is_left_and_the_manifest_names_the_shards(tmp_path):
    c = Checkpointer(str(tmp_path), keep=0)
    path = c.write(_state(3), step=3, epoch=7, generation=9, position=0, replica_size=1, meta={"seed": 1})
    assert sorted(os.listdir(path)) == ["manifest.json", shard_name(0, 1)]
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["step"] == 3 and manifest["generation"] == 9 and manifest["meta"] == {"seed": 1}
    assert path.name == "step-000000000003.e7.g9"  # fenced by generation


def test_a_symlink_planted_at_a_temporary_name_is_never_followed(tmp_path):
    # Issue 40, finding 4 (the files-written-safely rule): the temporary name was predictable
    # (".NAME.tmp-PID-THREAD") and opened with open(..., "wb"), so a symlink planted there had its
    # target truncated and overwritten with the shard or the manifest.
    import threading
    c = Checkpointer(str(tmp_path), keep=0)
    target = c.path_for(5, 1, 1)
    target.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    for name in (shard_name(0, 1), "manifest.json"):
        (target / f".{name}.tmp-{os.getpid()}-{threading.get_ident()}").symlink_to(victim)
    c.write(_state(5), step=5, epoch=1, generation=1, position=0, replica_size=1)
    assert victim.read_text() == "precious"
    assert c.newest().step == 5
    assert torch.equal(Checkpointer.load(c.newest(), 0)["model"]["w"], torch.full((3,), 5.0))


def test_the_newest_complete_checkpoint_wins_and_old_ones_are_pruned(tmp_path):
    c = Checkpointer(str(tmp_path), keep=2)
    for step in (9, 19, 29):
        c.write(_state(step), step=step, epoch=1, generation=1, position=0, replica_size=1)
    assert [i.step for i in c.complete()] == [19, 29]
    c.write(_state(39), step=39, epoch=1, generation=3, position=0, replica_size=2)  # incomplete
    assert c.newest().step == 29


def test_asynchronous_writes_finish_and_report_errors(tmp_path):
    c = Checkpointer(str(tmp_path), keep=0)
    c.write_async(_state(5), step=5, epoch=1, generation=1, position=0, replica_size=1)
    c.wait(30)
    assert c.newest().step == 5
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    bad = Checkpointer(str(blocker), keep=0)
    bad.write_async(_state(1), step=1, epoch=1, generation=1, position=0, replica_size=1)
    with pytest.raises(CheckpointError, match="cannot write checkpoint"):
        bad.wait(30)


def test_loading_a_position_the_checkpoint_lacks_names_the_problem(tmp_path):
    c = Checkpointer(str(tmp_path), keep=0)
    c.write(_state(1), step=1, epoch=1, generation=1, position=0, replica_size=1)
    with pytest.raises(CheckpointError, match="tensor x pipeline size changed"):
        Checkpointer.load(c.newest(), 1)


def _run(args, timeout=120):
    result = subprocess.run([PYTHON, str(EXAMPLE), "--quiet", "--float64", *args], capture_output=True,
                            text=True, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_fresh_start_resumes_exactly_from_the_newest_checkpoint(tmp_path, optimizer):
    common = ["--optimizer", optimizer, "--dataset", "128", "--microbatches", "4"]
    _run([*common, "--steps", "24", "--out", str(tmp_path / "ref.pt")])
    ckpt = tmp_path / "ckpt"
    _run([*common, "--steps", "13", "--checkpoint-dir", str(ckpt), "--checkpoint-interval", "5"])
    assert Checkpointer(str(ckpt)).newest().step == 9  # steps 4 and 9 written, 12 not
    _run([*common, "--steps", "24", "--checkpoint-dir", str(ckpt), "--checkpoint-interval", "5",
          "--out", str(tmp_path / "resumed.pt")])
    assert relative_error(torch.load(tmp_path / "ref.pt"), torch.load(tmp_path / "resumed.pt")) <= 1e-12
