# SPDX-License-Identifier: Apache-2.0
"""Public types: validated configuration and timeouts, errors, the MindCluster manager entry points."""

import os
import subprocess
import stat
import sys
import textwrap
import time
from pathlib import Path

import pytest

import regroup
from regroup import api


def test_timeouts_refuse_non_positive_or_non_numeric_values():
    for bad in (0, -1, float("nan"), float("inf"), "5", True):
        with pytest.raises(api.ConfigError, match="connect"):
            api.Timeouts(connect=bad)
    assert api.Timeouts(outcome=None, start=None).outcome is None
    with pytest.raises(api.ConfigError, match="heartbeat"):
        api.Timeouts(heartbeat=30)
    with pytest.raises(api.ConfigError, match="abort_grace"):
        api.Timeouts(abort_grace=10, collective=5)


def test_config_refuses_a_global_batch_larger_than_the_dataset():
    with pytest.raises(api.ConfigError, match="larger than the dataset"):
        api.TrainerConfig(dataset_size=10, micro_batch_size=4, microbatches_per_step=3)


def test_config_names_the_bad_field():
    with pytest.raises(api.ConfigError, match="micro_batch_size=0"):
        api.TrainerConfig(dataset_size=10, micro_batch_size=0, microbatches_per_step=1)
    with pytest.raises(api.ConfigError, match="checkpoint_dir"):
        api.TrainerConfig(dataset_size=10, micro_batch_size=1, microbatches_per_step=1, checkpoint_interval=5)
    with pytest.raises(api.ConfigError, match="backend"):
        api.TrainerConfig(dataset_size=10, micro_batch_size=1, microbatches_per_step=1, backend="")
    with pytest.raises(api.ConfigError, match="pipeline_parallel=0"):
        api.TrainerConfig(dataset_size=10, micro_batch_size=1, microbatches_per_step=1, pipeline_parallel=0)
    # Any backend's name is taken here (hccl too); whether torch knows it is checked when the
    # trainer starts (regroup.group.resolve_backend).
    api.TrainerConfig(dataset_size=10, micro_batch_size=1, microbatches_per_step=1, backend="hccl")


def test_config_derives_the_global_batch_and_steps_per_epoch():
    c = api.TrainerConfig(dataset_size=100, micro_batch_size=4, microbatches_per_step=3)
    assert (c.global_batch_size, c.steps_per_epoch) == (12, 8)


def test_errors_form_one_hierarchy():
    assert issubclass(api.ConfigError, ValueError)
    for cls in (api.ConfigError, api.UsageError, api.AgentError, api.StepFailed, api.TrainingStopped,
                api.StateSyncError, api.CheckpointError):
        assert issubclass(cls, api.RegroupError)
    for cls in (api.GenerationAborted, api.StepRolledBack, api.CollectiveFailed):
        assert issubclass(cls, api.StepFailed)
    assert api.TrainingStopped(api.StopMode.LEAVE, "drain").exit_code == 0
    assert api.TrainingStopped(api.StopMode.EXIT, "poison step").exit_code == 1
    assert "poison step" in str(api.TrainingStopped(api.StopMode.EXIT, "poison step"))


def _fake_manager(tmp_path):
    record = tmp_path / "args"
    script = tmp_path / "regroup-manager"
    script.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import sys
        open({str(record)!r}, "w").write("\\n".join(sys.argv[1:]))
        """))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return record


def test_a_mindcluster_manager_py_needs_only_its_import_changed(tmp_path, monkeypatch):
    # MindCluster's manager.py, with `from taskd.api import ...` replaced:
    record = _fake_manager(tmp_path)
    monkeypatch.setenv("REGROUP_BIN_DIR", str(tmp_path))
    monkeypatch.setenv("MINDIO_WAIT_MINDX_TIME", "60")
    from regroup.api import init_taskd_manager, start_taskd_manager

    init_taskd_manager({"job_id": "default/llama", "node_nums": 4, "proc_per_node": 8})
    assert start_taskd_manager() == 0
    args = record.read_text().split("\n")
    assert args[:6] == ["--job-id", "default/llama", "--nodes", "4", "--nproc-per-node", "8"]
    assert "--env" in args and "MINDIO_WAIT_MINDX_TIME=60" in args


def test_init_manager_passes_labels_annotations_and_listen(tmp_path, monkeypatch):
    record = _fake_manager(tmp_path)
    monkeypatch.setenv("REGROUP_BIN_DIR", str(tmp_path))
    regroup.init_manager({"job_id": "j", "node_nums": "2", "proc_per_node": 2, "listen": "127.0.0.1:0",
                          "labels": {"fault-scheduling": "force"},
                          "annotations": {"recover-strategy": "recover-in-place,exit"}})
    p = regroup.start_manager(wait=False)
    assert p.wait(timeout=30) == 0
    args = record.read_text().split("\n")
    assert ["--listen", "127.0.0.1:0"] == args[6:8]
    assert "fault-scheduling=force" in args and "recover-strategy=recover-in-place,exit" in args
    assert "--insecure" not in args  # open mode only when asked for


def test_init_manager_passes_the_coordinator_that_holds_the_jobs_keys(tmp_path, monkeypatch):
    record = _fake_manager(tmp_path)
    monkeypatch.setenv("REGROUP_BIN_DIR", str(tmp_path))
    regroup.init_manager({"job_id": "j", "node_nums": 2, "proc_per_node": 2,
                          "coordinator": "regroup-coordinator.volcano-system.svc:8899",
                          "coordinator_credential_file": "/etc/regroup/coordinator/token"})
    assert regroup.start_manager() == 0
    args = record.read_text().split("\n")
    at = args.index("--coordinator")
    assert args[at + 1] == "regroup-coordinator.volcano-system.svc:8899"
    at = args.index("--coordinator-credential-file")
    assert args[at + 1] == "/etc/regroup/coordinator/token"
    assert "--label" not in args  # the keys come from the coordinator


def test_init_manager_passes_insecure_only_when_asked(tmp_path, monkeypatch):
    record = _fake_manager(tmp_path)
    monkeypatch.setenv("REGROUP_BIN_DIR", str(tmp_path))
    regroup.init_manager({"job_id": "j", "node_nums": 1, "proc_per_node": 1, "insecure": True})
    assert regroup.start_manager() == 0
    assert record.read_text().split("\n")[-1] == "--insecure"


def test_init_manager_passes_the_record_or_no_record(tmp_path, monkeypatch):
    record = _fake_manager(tmp_path)
    monkeypatch.setenv("REGROUP_BIN_DIR", str(tmp_path))
    regroup.init_manager({"job_id": "j", "node_nums": 1, "proc_per_node": 1, "record": "/ckpt/record.json"})
    assert regroup.start_manager() == 0
    args = record.read_text().split("\n")
    assert args[args.index("--record") + 1] == "/ckpt/record.json" and "--no-record" not in args
    regroup.init_manager({"job_id": "j", "node_nums": 1, "proc_per_node": 1, "no_record": True})
    assert regroup.start_manager() == 0
    assert record.read_text().split("\n")[-1] == "--no-record"


def test_a_standalone_manager_without_a_record_is_refused_unless_it_accepts_the_risk(
        tmp_path, monkeypatch, binaries, capfd):
    """Issue 40, finding 1: two standalone managers of one job, neither with a record, both
    trained. The real binary, as ``start_manager`` runs it: refused without ``record`` or
    ``no_record``, naming both; with ``record`` it runs."""
    monkeypatch.setenv("REGROUP_BIN_DIR", str(Path(binaries["manager"]).parent))
    for name in ("REGROUP_RECORD_FILE", "REGROUP_COORDINATOR_ADDR", "REGROUP_COORDINATOR_CREDENTIAL_FILE"):
        monkeypatch.delenv(name, raising=False)
    credential = tmp_path / "credential"
    credential.write_text("s3cret\n")
    job = {"job_id": "t/norecord", "node_nums": 1, "proc_per_node": 1, "listen": "127.0.0.1:0",
           "credential_file": str(credential), "labels": {"fault-scheduling": "force"}}
    regroup.init_manager(job)
    p = regroup.start_manager(wait=False)
    try:
        assert p.wait(timeout=10) == 2
    except subprocess.TimeoutExpired:
        pytest.fail("a manager without a record and without no_record ran")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=30)
    err = capfd.readouterr().err
    assert "no durable record" in err and "Give --record FILE" in err and "--no-record" in err, err
    port = tmp_path / "port"
    regroup.init_manager({**job, "record": str(tmp_path / "record.json"), "port_file": str(port)})
    p = regroup.start_manager(wait=False)
    try:
        for _ in range(200):  # 10 s
            if port.exists() or p.poll() is not None:
                break
            time.sleep(0.05)
        assert port.exists(), capfd.readouterr().err
    finally:
        p.terminate()
        p.wait(timeout=30)


def test_init_manager_refuses_missing_or_unknown_keys(monkeypatch):
    monkeypatch.delenv("MINDX_TASK_ID", raising=False)
    monkeypatch.delenv("REGROUP_JOB_ID", raising=False)
    with pytest.raises(api.ConfigError, match="job_id"):
        api.init_manager({"node_nums": 1, "proc_per_node": 1})
    with pytest.raises(api.ConfigError, match="node_nums"):
        api.init_manager({"job_id": "j", "node_nums": 0, "proc_per_node": 1})
    with pytest.raises(api.ConfigError, match="unknown key"):
        api.init_manager({"job_id": "j", "node_nums": 1, "proc_per_node": 1, "nodes": 3})


def test_find_binary_says_where_to_look(monkeypatch, tmp_path):
    monkeypatch.setenv("REGROUP_BIN_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    try:
        found = api.find_binary("regroup-no-such-binary")
    except api.ConfigError as e:
        assert "REGROUP_BIN_DIR" in str(e)
    else:
        pytest.fail(f"found {found}")


def test_a_manager_py_and_the_torchrun_hand_over_need_no_torch():
    # rank 0's manager.py imports regroup.api in a Python that may have no torch (or would spend
    # seconds importing it): the package imports what needs torch only on first use.
    code = ("import sys; sys.modules['torch'] = None\n"
            "from regroup.api import init_taskd_manager, start_taskd_manager\n"
            "import regroup, regroup.torchrun\n"
            "try:\n    regroup.Trainer\nexcept ImportError:\n    print('lazy')\n")
    env = {**os.environ, "PYTHONPATH": str(Path(regroup.__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "lazy"


def test_a_manager_py_in_a_converted_jobs_pod_starts_no_second_manager(tmp_path, monkeypatch, capfd):
    # regroupctl convert runs the manager in a task of its own and points the pods at it: a
    # manager.py their script still starts on rank 0 steps aside.
    record = _fake_manager(tmp_path)
    monkeypatch.setenv("REGROUP_BIN_DIR", str(tmp_path))
    monkeypatch.setenv("REGROUP_MANAGER_ADDR", "llama-manager-0.llama:9601")
    regroup.init_manager({"job_id": "team-a/llama", "node_nums": 2, "proc_per_node": 8})
    assert regroup.start_manager() == 0
    assert not record.exists()
    assert "the job's manager runs at llama-manager-0.llama:9601" in capfd.readouterr().err
    assert regroup.start_manager(wait=False) is None
    # An address of this pod is this manager's own: it starts.
    for here in ("127.0.0.1:9601", "[::1]:9601", "0.0.0.0:9601"):
        monkeypatch.setenv("REGROUP_MANAGER_ADDR", here)
        assert api.manager_elsewhere() is None, here
    monkeypatch.setenv("POD_IP", "10.1.2.3")
    monkeypatch.setenv("REGROUP_MANAGER_ADDR", "10.1.2.3:9601")
    assert regroup.start_manager() == 0
    assert record.exists()
