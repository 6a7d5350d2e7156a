# SPDX-License-Identifier: Apache-2.0
"""Scenarios on the real Kubernetes control plane (kube_cluster.py): the API server, etcd,
kube-controller-manager, kube-scheduler, Volcano's job controller and regroup-scheduler as
deploy/ installs it, jobs submitted with kubectl, pods run by the process kubelets.

``scripts/test`` runs it as its own stage (the first run builds the control plane: minutes);
``REGROUP_KUBE_SCENARIOS="2 3"`` picks the scenarios. It needs network namespaces (root): without
them each test is skipped with the reason.
"""

import json
import os
import time
from pathlib import Path

import pytest

import scenarios

NUMBERS = [int(n) for n in os.environ.get("REGROUP_KUBE_SCENARIOS", "2 6 7 12 18 19 20").split()]
_started = time.monotonic()


@pytest.mark.parametrize("number", NUMBERS)
def test_scenario_on_kubernetes(number, tmp_path):
    result = scenarios.run(number, tmp_path, "auto", log=lambda m: None, kube=True)
    print(result.report())
    print(f"(suite time so far {time.monotonic() - _started:.0f} s)")
    if result.skipped:
        pytest.skip(result.skipped)
    assert result.ok, result.report()


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory):
    """The control plane with the chart (deploy/helm/regroup) installed, and no worker node."""
    from kube_cluster import KubeCluster
    from network import Network, NetworkError

    try:
        net = Network.create("netns", log=lambda m: None)
    except NetworkError as e:
        pytest.skip(str(e))
    try:
        with KubeCluster(tmp_path_factory.mktemp("kube"), net, log=lambda m: None) as k:
            k.start()
            yield k
    finally:
        net.close()


def test_every_example_job_is_accepted_by_the_api_server(control_plane, tmp_path):
    """deploy/examples/pytorch-job.yaml and the pilot's job, examples/jobs/*.yaml and `regroupctl convert` of
    examples/mindcluster/*.yaml, applied (server-side dry run: Volcano's CRD schemas) on the
    control plane with the chart installed."""
    import subprocess

    from cluster import REPO, find_binaries

    k = control_plane
    regroupctl = find_binaries()["regroupctl"]
    docs = [REPO / "deploy" / "examples" / f for f in ("pytorch-job.yaml", "pilot-record.yaml", "pilot-job.yaml")]
    docs += sorted((REPO / "examples" / "jobs").glob("*.yaml"))
    for source in sorted((REPO / "examples" / "mindcluster").glob("*.yaml")):
        out = tmp_path / f"converted-{source.name}"
        out.write_text(subprocess.run([regroupctl, "convert", str(source)], capture_output=True, text=True,
                                      check=True, timeout=30).stdout)
        docs.append(out)
    for d in docs:
        for ns in {line.split(":", 1)[1].strip() for line in d.read_text().splitlines()
                   if line.strip().startswith("namespace:")} - {"default"}:
            k.kubectl("create", "namespace", ns, check=False)
        r = k.kubectl("apply", "--dry-run=server", "-f", str(d), check=False)
        print(f"{d.relative_to(REPO) if d.is_relative_to(REPO) else d.name}: {r.stdout.strip() or r.stderr.strip()}")
        assert r.returncode == 0, f"{d}: {r.stderr}"


def test_the_chart_lints_installs_and_leaves_no_port_open_to_the_examples(control_plane, tmp_path):
    """deploy/helm/regroup: `helm lint --strict` passes; the release installed by the fixture is
    deployed with every object it renders; the examples and the chart define no object twice,
    and every policy guarding the coordinator selects the scheduler's pods
    (tests/deploy_test.py --helm); and the chart, rendered with NetworkPolicies off and another
    namespace list, is accepted by the API server (server-side dry run)."""
    import subprocess
    import sys

    from cluster import REPO

    k = control_plane
    chart = str(REPO / "deploy" / "helm" / "regroup")
    lint = k.helm("lint", "--strict", chart)
    print(lint.stdout.strip())
    status = json.loads(k.helm("status", "regroup", "--namespace", "volcano-system", "--output", "json").stdout)
    assert status["info"]["status"] == "deployed", status["info"]
    for kind, name in (("deployment", "regroup-scheduler"), ("service", "regroup-coordinator"),
                       ("configmap", "regroup-scheduler-configmap"), ("networkpolicy", "regroup-coordinator")):
        k.kubectl("-n", "volcano-system", "get", kind, name)
    check = subprocess.run([sys.executable, str(REPO / "tests" / "deploy_test.py"), "--helm", str(k.bin / "helm")],
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    k.kubectl("create", "namespace", "team-a", check=False)
    rendered = k.helm("template", "other", chart, "--namespace", "volcano-system", "--set", "networkPolicy.enabled=false",
                      "--set", "coordinator.createClusterKey=true").stdout
    assert "kind: NetworkPolicy" not in rendered and "kind: Secret" in rendered
    r = k.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered, check=False)
    assert r.returncode == 0, r.stderr


def test_the_largest_saved_state_fits_a_podgroup_on_the_api_server(control_plane, tmp_path):
    """The plugin's state annotation of a 2,048-pod job (the largest the benchmarks run) with half
    its pods lost, as the engine's own test makes it at its largest, is accepted on a PodGroup by
    the real API server; one over Kubernetes' 256 KiB limit is refused."""
    import os
    import subprocess

    from cluster import find_binaries

    k = control_plane
    state = tmp_path / "state.json"
    tests = Path(find_binaries()["regroupctl"]).parent / "tests" / "regroup_tests"
    subprocess.run([str(tests), "--gtest_filter=EngineTest.JobStateOfAMassFailureFitsAnAnnotationAndRestoresTheSameDecisions"],
                   env={**os.environ, "REGROUP_DUMP_LARGEST_STATE": str(state)}, check=True, capture_output=True,
                   timeout=120)
    k.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
        "metadata": {"name": "largest-state", "namespace": "default"}, "spec": {"minMember": 1, "queue": "default"}}))

    def annotate(value: str):
        patch = tmp_path / "patch.json"
        patch.write_text(json.dumps({"metadata": {"annotations": {"scheduler.regroup.io/state": value,
                                                                  "scheduler.regroup.io/phase": "scaled_in"}}}))
        return k.kubectl("patch", "podgroup", "largest-state", "--type", "merge", "--patch-file", str(patch), check=False)

    text = state.read_text()
    r = annotate(text)
    assert r.returncode == 0, r.stderr
    saved = k.get("podgroup", "largest-state")["metadata"]["annotations"]["scheduler.regroup.io/state"]
    assert saved == text
    too_big = annotate("x" * (256 * 1024 + 1))
    print(f"the largest saved state, {len(text)} bytes, is accepted; {256 * 1024 + 1} bytes: "
          f"{too_big.stderr.strip()[:200]}")
    assert too_big.returncode != 0 and "Too long" in too_big.stderr
