# SPDX-License-Identifier: Apache-2.0
"""Volcano in the loop, end to end: Volcano's scheduler with the regroup plugin binds the job's
pods, the manager attaches to the plugin's coordinator, and a short real training finishes; a job
with a bad Regroup key is refused with the plugin's message and nothing is bound.

    /usr/bin/python3 -m pytest -q integration/volcano_loop_test.py

Needs build/ (regroup-manager, regroup-agent, libregroup.so) and Go; namespaces when root,
loopback addresses otherwise.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster import REPO, Cluster, JobSpec  # noqa: E402
from volcano_loop import BUILD_DIR, VolcanoLoop, build_localsched  # noqa: E402

pytestmark = pytest.mark.skipif(
    shutil.which("go") is None or not (BUILD_DIR / "libregroup.so").exists()
    or not (REPO / "build" / "regroup-manager").exists(),
    reason="needs Go and build/ (libregroup.so, regroup-manager, regroup-agent)")


@pytest.fixture(scope="module", autouse=True)
def localsched_binary():
    return build_localsched()


def test_training_with_volcano_in_the_loop(tmp_path):
    job = JobSpec(steps=30)
    with Cluster(tmp_path, job) as c, VolcanoLoop(c) as v:
        v.start()
        for pod in ("mlp-manager-0", "mlp-worker-0", "mlp-worker-1"):
            v.wait_bound(pod, timeout=60)
        binds = {e["pod"]: e["node"] for e in v.binds()}
        assert len(set(binds.values())) == 3, f"one pod per node: {binds}"
        v.wait_started("mlp-manager-0")
        assert c.manager_node is not None and c.manager_node.name == binds["default/mlp-manager-0"]
        c.wait_event("done", timeout=240)
        codes = c.wait_pods_exit(timeout=120)
        assert set(codes.values()) == {0}, f"exit codes {codes}\n{c.logs()}"
        assert c.last_step() == job.steps - 1

        # The manager took its decisions from the plugin's coordinator.
        manager_log = "".join(f.read_text(errors="replace") for f in sorted(c.dir.glob("manager-*.log")))
        assert f"attached to the coordinator {v.coordinator}" in manager_log, manager_log[-3000:]
        # Each worker ran inside the node Volcano bound it to, as the pod the scheduler knows.
        for name, pod in c.pods.items():
            assert pod.node.name == binds[f"default/{name}"], (name, pod.node.name, binds)
            bound_uid = next(e["uid"] for e in v.binds() if e["pod"] == f"default/{name}")
            assert pod.uid == bound_uid
        # The kubelet reported the workers' ends (the manager's pod stays up after the job).
        workers = [r for r in v.pods.values() if r["task"] == "worker"]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(r["reported"] for r in workers):
            time.sleep(0.1)
        assert len(workers) == 2 and all(r["reported"] for r in workers), v.pods
        assert not v.kubelet_errors, v.kubelet_errors


def test_bad_regroup_key_is_refused_and_nothing_bound(tmp_path):
    job = JobSpec(steps=10, extra_annotations={"regroup.io/min-data-parallel": "zero"})
    with Cluster(tmp_path, job) as c, VolcanoLoop(c) as v:
        v.start()
        ev = v.job_invalid(timeout=30)
        assert ev["job"] == "default/mlp"
        assert "regroup.io/min-data-parallel" in ev["message"], ev
        time.sleep(2)  # several scheduling sessions
        assert v.binds() == [], v.binds()
        assert c.manager is None and not c.pods
