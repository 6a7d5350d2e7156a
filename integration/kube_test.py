"""Scenarios on the real Kubernetes control plane (kube_cluster.py): the API server, etcd,
kube-controller-manager, kube-scheduler, Volcano's job controller and regroup-scheduler as
deploy/ installs it, jobs submitted with kubectl, pods run by the process kubelets.

``scripts/test`` runs it as its own stage (the first run builds the control plane: minutes);
``REGROUP_KUBE_SCENARIOS="2 3"`` picks the scenarios. It needs network namespaces (root): without
them each test is skipped with the reason.
"""

import os
import time

import pytest

import scenarios

NUMBERS = [int(n) for n in os.environ.get("REGROUP_KUBE_SCENARIOS", "2 3 6 7 12 18").split()]
_started = time.monotonic()


@pytest.mark.parametrize("number", NUMBERS)
def test_scenario_on_kubernetes(number, tmp_path):
    result = scenarios.run(number, tmp_path, "auto", log=lambda m: None, kube=True)
    print(result.report())
    print(f"(suite time so far {time.monotonic() - _started:.0f} s)")
    if result.skipped:
        pytest.skip(result.skipped)
    assert result.ok, result.report()


def test_every_example_job_is_accepted_by_the_api_server(tmp_path):
    """deploy/examples/pytorch-job.yaml, examples/jobs/*.yaml and `regroupctl convert` of
    examples/mindcluster/*.yaml, applied (server-side dry run: Volcano's CRD schemas) on the
    control plane with deploy/volcano installed."""
    import subprocess

    from cluster import REPO, find_binaries
    from kube_cluster import KubeCluster
    from network import Network, NetworkError

    try:
        net = Network.create("netns", log=lambda m: None)
    except NetworkError as e:
        pytest.skip(str(e))
    regroupctl = find_binaries()["regroupctl"]
    docs = [REPO / "deploy" / "examples" / "pytorch-job.yaml", *sorted((REPO / "examples" / "jobs").glob("*.yaml"))]
    for source in sorted((REPO / "examples" / "mindcluster").glob("*.yaml")):
        out = tmp_path / f"converted-{source.name}"
        out.write_text(subprocess.run([regroupctl, "convert", str(source)], capture_output=True, text=True,
                                      check=True, timeout=30).stdout)
        docs.append(out)
    try:
        with KubeCluster(tmp_path / "kube", net, log=lambda m: None) as k:
            k.start()
            for d in docs:
                for ns in {line.split(":", 1)[1].strip() for line in d.read_text().splitlines()
                           if line.strip().startswith("namespace:")} - {"default"}:
                    k.kubectl("create", "namespace", ns, check=False)
                r = k.kubectl("apply", "--dry-run=server", "-f", str(d), check=False)
                print(f"{d.relative_to(REPO) if d.is_relative_to(REPO) else d.name}: {r.stdout.strip() or r.stderr.strip()}")
                assert r.returncode == 0, f"{d}: {r.stderr}"
    finally:
        net.close()
