# SPDX-License-Identifier: Apache-2.0
"""A real Kubernetes control plane on this machine, with Volcano's job controller and Regroup's
scheduler, and a process kubelet per node.

Built from the Go module proxy at the versions the plugin builds against (integration/kube/go.mod:
kube-apiserver, kube-controller-manager, kube-scheduler, etcd; integration/localsched/go.mod:
Volcano's vc-controller-manager; go/volcano: regroup-scheduler; integration/kube/kubelet: the
process kubelet), cached per source version under $REGROUP_INTEGRATION_CACHE.

    with Network.create("netns") as net, KubeCluster(workdir, net) as k:
        k.start()                    # etcd, the API server, the controllers, the chart installed
        k.add_node("node-0")         # a namespace node with its kubelet (capacity 8 accelerators)
        k.kubectl("apply", "-f", "job.yaml")
        k.kill_node("node-0")        # its kubelet and every process on it, SIGKILL

Everything runs on the host except the kubelets (each inside its node's network namespace, so
its pods are too) and what the kubelets run: regroup-scheduler is the Helm chart's
(deploy/helm/regroup) Deployment, placed by kube-scheduler on the control-plane node ``node-cp``,
and every job's pods.
The API server listens on all addresses; nodes reach it at the bridge's address. There is no
kube-proxy and no DNS server: each kubelet writes its pods' /etc/hosts from Services and pods
(integration/kube/kubelet/hosts.go), so Service names and the svc plugin's hostnames resolve.
"""

from __future__ import annotations

import base64
import copy
import datetime
import hashlib
import json
import os
import re
import secrets
import signal
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import yaml

from cluster import ACCELERATOR, PYTHON, REPO, _signal, _tree, free_ports
from network import Network, NodeNet, _alive
from volcano_loop import BUILD_DIR, CACHE, _go_env

KUBE = REPO / "integration" / "kube"
LOCALSCHED = REPO / "integration" / "localsched"
VOLCANO_MOD = Path(os.environ.get("GOMODCACHE", Path.home() / "go" / "pkg" / "mod")) / "volcano.sh" / "volcano@v1.14.1"
DEPLOY = REPO / "deploy"
CHART = DEPLOY / "helm" / "regroup"
HELM_VERSION = "v4.3.2"
CONTROL_PLANE_NODE = "node-cp"
# The images the kubelets know (integration/kube/kubelet --images): what deploy/ and the jobs name.
SCHEDULER_IMAGE = "regroup/regroup-scheduler:0.1.0"
REGROUP_IMAGE = "regroup/regroup:0.1.0"
# kube-controller-manager's controllers this cluster needs: service accounts for pods, the
# Deployment of the scheduler, node lifecycle (NotReady taints, eviction), garbage collection.
KCM_CONTROLLERS = ("serviceaccount,root-ca-cert-publisher,namespace,garbagecollector,deployment,replicaset,"
                   "nodelifecycle,podgc,endpointslice,endpoint,ttl")


class KubeError(RuntimeError):
    pass


# ---------------------------------------------------------------------------------------------
# Building
# ---------------------------------------------------------------------------------------------

def _digest() -> str:
    h = hashlib.sha256(HELM_VERSION.encode())
    folders = [KUBE, KUBE / "kubelet", LOCALSCHED, REPO / "go" / "volcano", REPO / "go" / "volcano" / "cmd" / "regroup-scheduler",
               REPO / "go" / "regroup"]
    for folder in folders:
        for f in sorted(folder.glob("*")):
            if f.is_file() and (f.suffix == ".go" or f.name in ("go.mod", "go.sum")) and not f.name.endswith("_test.go"):
                h.update(str(f.relative_to(REPO)).encode())
                h.update(f.read_bytes())
    lib = BUILD_DIR / "libregroup.so"
    if lib.exists():
        h.update(str(lib.stat().st_mtime_ns).encode())
    return h.hexdigest()[:16]


BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl",
            "vc-controller-manager", "regroup-kubelet", "regroup-scheduler", "helm")


def build(log: Callable[[str], None] = print, timeout: float = 3000) -> Path:
    """The folder of the control plane's binaries, built once per source version."""
    if os.environ.get("REGROUP_KUBE_BIN"):
        return Path(os.environ["REGROUP_KUBE_BIN"])
    if not (BUILD_DIR / "libregroup.so").exists():
        raise FileNotFoundError(f"no libregroup.so in {BUILD_DIR}: run scripts/setup first")
    out = CACHE / f"kube-{_digest()}"
    if all((out / b).exists() for b in BINARIES):
        return out
    tmp = Path(tempfile.mkdtemp(prefix="kube-build-", dir=CACHE.mkdir(parents=True, exist_ok=True) or CACHE))
    env = _go_env()
    steps = [
        (KUBE, ["go", "build", "-o", str(tmp / "etcd"), "go.etcd.io/etcd/server/v3"]),
        (KUBE, ["go", "build", "-o", str(tmp) + "/", "k8s.io/kubernetes/cmd/kube-apiserver",
                "k8s.io/kubernetes/cmd/kube-controller-manager", "k8s.io/kubernetes/cmd/kube-scheduler",
                "k8s.io/kubernetes/cmd/kubectl"]),
        (KUBE, ["go", "build", "-o", str(tmp / "regroup-kubelet"), "./kubelet"]),
        (LOCALSCHED, ["go", "build", "-o", str(tmp / "vc-controller-manager"), "volcano.sh/volcano/cmd/controller-manager"]),
        (REPO / "go" / "volcano", ["go", "build", "-o", str(tmp / "regroup-scheduler"), "./cmd/regroup-scheduler"]),
        # helm as its own release's module pins it (its Kubernetes modules are newer than ours)
        (KUBE, ["env", f"GOBIN={tmp}", "go", "install", f"helm.sh/helm/v4/cmd/helm@{HELM_VERSION}"]),
    ]
    start = time.monotonic()
    log(f"building the control plane (Kubernetes {KUBERNETES_VERSION}, Volcano v1.14.1; the first build takes "
        f"minutes) -> {out}")
    for cwd, argv in steps:
        r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                           timeout=max(60.0, timeout - (time.monotonic() - start)))
        if r.returncode != 0:
            raise KubeError(f"{' '.join(argv)} (in {cwd}) failed:\n{r.stdout}{r.stderr}")
    if out.exists():
        subprocess.run(["rm", "-rf", str(out)], check=False)
    tmp.rename(out)
    log(f"control plane built in {time.monotonic() - start:.0f} s")
    return out


KUBERNETES_VERSION = "v1.34.1"


# ---------------------------------------------------------------------------------------------
# Certificates (openssl): the cluster CA, the API server's serving certificate, the admin's
# client certificate, the service-account signing key, and the coordinator's TLS pair.
# ---------------------------------------------------------------------------------------------

def _openssl(*args: str, cwd: Path) -> None:
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise KubeError(f"openssl {' '.join(args)}: {r.stderr.strip()}")


def make_pki(d: Path, server_ips: Sequence[str], coordinator_names: Sequence[str]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "7",
             "-subj", "/CN=regroup-integration-ca", cwd=d)

    def issue(name: str, subject: str, usage: str, sans: Sequence[str] = ()) -> None:
        ext = [f"extendedKeyUsage={usage}"]
        if sans:
            ext.append("subjectAltName=" + ",".join(sans))
        (d / f"{name}.ext").write_text("\n".join(ext) + "\n")
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", subject, cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "7", "-extfile", f"{name}.ext", cwd=d)

    issue("apiserver", "/CN=kube-apiserver", "serverAuth",
          ["DNS:localhost", "DNS:kubernetes", "DNS:kubernetes.default", "DNS:kubernetes.default.svc",
           "IP:127.0.0.1", "IP:10.96.0.1", *(f"IP:{ip}" for ip in server_ips)])
    issue("admin", "/O=system:masters/CN=regroup-integration-admin", "clientAuth")
    issue("coordinator", "/CN=regroup-coordinator", "serverAuth", [f"DNS:{n}" for n in coordinator_names])
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)
    for f in d.glob("*.key"):
        f.chmod(0o600)


def write_kubeconfig(path: Path, server: str, pki: Path) -> None:
    def b64(f: str) -> str:
        return base64.b64encode((pki / f).read_bytes()).decode()
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "regroup",
        "clusters": [{"name": "regroup", "cluster": {"server": server, "certificate-authority-data": b64("ca.crt")}}],
        "users": [{"name": "admin", "user": {"client-certificate-data": b64("admin.crt"),
                                             "client-key-data": b64("admin.key")}}],
        "contexts": [{"name": "regroup", "context": {"cluster": "regroup", "user": "admin"}}],
    }))
    path.chmod(0o600)


# ---------------------------------------------------------------------------------------------
# The cluster
# ---------------------------------------------------------------------------------------------

def _ready(obj: dict) -> bool:
    """Whether a pod's or a node's Ready condition is True."""
    return any(c["type"] == "Ready" and c["status"] == "True" for c in obj.get("status", {}).get("conditions", []))


class KubeCluster:
    """The control plane on this host, deploy/ applied, and nodes with process kubelets."""

    def __init__(self, workdir: Path, net: Network, log: Callable[[str], None] = print,
                 node_capacity: Optional[Dict[str, str]] = None):
        if net.mode != "netns":
            raise KubeError("the Kubernetes cluster needs network namespaces (root, `ip netns`): each node's "
                            "pods listen on the same ports (the manager on 9601, the coordinator on 8899)")
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.net = net
        self.log = log
        self.bin: Optional[Path] = None
        self.pki = self.dir / "pki"
        self.kubeconfig = self.dir / "admin.kubeconfig"          # for this host (kubectl)
        self.node_kubeconfig = self.dir / "node.kubeconfig"      # for the kubelets, at the bridge's address
        self.capacity = node_capacity or {"cpu": "8", "memory": "32Gi", "pods": "1", ACCELERATOR: "8"}
        self.procs: Dict[str, subprocess.Popen] = {}             # control-plane processes by name
        self.kubelets: Dict[str, subprocess.Popen] = {}          # by node name
        self.nodes: Dict[str, NodeNet] = {}
        self.dead: set = set()
        self.cluster_key = self.dir / "cluster.key"
        self.images = self.dir / "images.json"
        self.api_port = 0
        self._tls = None

    def __enter__(self) -> "KubeCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- processes -------------------------------------------------------------------------------

    def _spawn(self, name: str, argv: Sequence[str], env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
        with open(self.dir / f"{name}.log", "ab") as out:
            p = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                 cwd=str(self.dir), env={**os.environ, **(env or {})})
        return p

    def kubectl(self, *args: str, input: Optional[str] = None, check: bool = True,
                timeout: float = 60) -> subprocess.CompletedProcess:
        # kubectl of the control plane's own version (built with it), not whatever the machine has
        assert self.bin is not None, "start() first"
        r = subprocess.run([str(self.bin / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args], input=input,
                           capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise KubeError(f"kubectl {' '.join(args)}: {r.stderr.strip() or r.stdout.strip()}")
        return r

    def helm(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """helm (built with the control plane) against this control plane."""
        assert self.bin is not None, "start() first"
        r = subprocess.run([str(self.bin / "helm"), "--kubeconfig", str(self.kubeconfig), *args],
                           capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, "HELM_CACHE_HOME": str(self.dir / "helm-cache"),
                                "HELM_CONFIG_HOME": str(self.dir / "helm-config"),
                                "HELM_DATA_HOME": str(self.dir / "helm-data")})
        if r.returncode != 0:
            raise KubeError(f"helm {' '.join(args)}: {r.stderr.strip() or r.stdout.strip()}")
        return r

    def get(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def api(self, path: str, timeout: float = 10) -> dict:
        """GET ``path`` from the API server as the admin: what the watchers poll (a kubectl
        process per poll would cost a core's worth of CPU)."""
        if self._tls is None:
            ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
            ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
            self._tls = ctx
        url = f"https://127.0.0.1:{self.api_port}{path}"
        with urllib.request.urlopen(url, timeout=timeout, context=self._tls) as r:
            return json.loads(r.read())

    def _wait(self, what: str, ok: Callable[[], bool], timeout: float, procs: Sequence[str] = ()) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name in procs:
                p = self.procs[name]
                if p.poll() is not None:
                    raise KubeError(f"{name} exited with {p.returncode} while waiting for {what}:\n{self.tail(name)}")
            try:
                if ok():
                    return
            except (KubeError, subprocess.TimeoutExpired, ValueError, OSError):
                pass
            time.sleep(0.25)
        raise KubeError(f"{what}: not within {timeout} s\n" + "".join(self.tail(n) for n in procs))

    def tail(self, name: str, n: int = 3000) -> str:
        try:
            return f"--- {name}.log:\n" + (self.dir / f"{name}.log").read_text(errors="replace")[-n:]
        except OSError:
            return ""

    # -- the control plane -----------------------------------------------------------------------

    def start(self, build_timeout: float = 3000) -> None:
        self.bin = build(self.log, timeout=build_timeout)
        host = self.net.manager_address
        make_pki(self.pki, [host], ["regroup-coordinator", "regroup-coordinator.volcano-system",
                                    "regroup-coordinator.volcano-system.svc"])
        etcd_client, etcd_peer, self.api_port = free_ports("127.0.0.1", 3)
        self.procs["etcd"] = self._spawn("etcd", [
            str(self.bin / "etcd"), "--name", "regroup", "--data-dir", str(self.dir / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{etcd_client}",
            "--advertise-client-urls", f"http://127.0.0.1:{etcd_client}",
            "--listen-peer-urls", f"http://127.0.0.1:{etcd_peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd_peer}",
            "--initial-cluster", f"regroup=http://127.0.0.1:{etcd_peer}",
            "--quota-backend-bytes", str(2 << 30), "--log-level", "warn"])
        pki = self.pki
        self.procs["kube-apiserver"] = self._spawn("kube-apiserver", [
            str(self.bin / "kube-apiserver"), "--etcd-servers", f"http://127.0.0.1:{etcd_client}",
            "--bind-address", "0.0.0.0", "--secure-port", str(self.api_port), "--advertise-address", host,
            "--tls-cert-file", str(pki / "apiserver.crt"), "--tls-private-key-file", str(pki / "apiserver.key"),
            "--client-ca-file", str(pki / "ca.crt"),
            "--service-account-issuer", "https://kubernetes.default.svc",
            "--service-account-key-file", str(pki / "sa.pub"),
            "--service-account-signing-key-file", str(pki / "sa.key"),
            "--authorization-mode", "RBAC", "--service-cluster-ip-range", "10.96.0.0/16",
            "--allow-privileged", "--profiling=false", "--v=1"])
        write_kubeconfig(self.kubeconfig, f"https://127.0.0.1:{self.api_port}", pki)
        write_kubeconfig(self.node_kubeconfig, f"https://{host}:{self.api_port}", pki)
        self._wait("the API server to be ready",
                   lambda: self.kubectl("get", "--raw", "/readyz", check=False, timeout=10).returncode == 0,
                   120, procs=("etcd", "kube-apiserver"))
        self.log(f"kube-apiserver ready at https://{host}:{self.api_port} (kubeconfig {self.kubeconfig})")
        kc = ["--kubeconfig", str(self.kubeconfig)]
        self.procs["kube-controller-manager"] = self._spawn("kube-controller-manager", [
            str(self.bin / "kube-controller-manager"), *kc, "--controllers", KCM_CONTROLLERS,
            "--root-ca-file", str(pki / "ca.crt"), "--service-account-private-key-file", str(pki / "sa.key"),
            "--use-service-account-credentials=false", "--leader-elect=false", "--bind-address", "127.0.0.1",
            "--secure-port", "0",
            # a node that stops its heartbeats is NotReady after 8 s (not 40), and its pods are
            # evicted by the taint manager after their tolerations (300 s by default admission)
            "--node-monitor-grace-period", "8s", "--node-monitor-period", "1s", "--v=1"])
        self.procs["kube-scheduler"] = self._spawn("kube-scheduler", [
            str(self.bin / "kube-scheduler"), *kc, "--leader-elect=false", "--bind-address", "127.0.0.1",
            "--secure-port", "0", "--v=1"])
        # Volcano's CRDs, then its job controller (its webhooks are not run: the jobs here state
        # what the webhook would default, their queue included)
        crds = sorted((VOLCANO_MOD / "config" / "crd").glob("*/bases/*.yaml"))
        if not crds:
            raise KubeError(f"Volcano's CRDs not found in {VOLCANO_MOD}: run `go mod download` in {LOCALSCHED}")
        for crd in crds:
            self.kubectl("apply", "--server-side", "-f", str(crd), timeout=120)
        self.kubectl("wait", "--for", "condition=Established", "--timeout", "60s", "crd", "--all", timeout=90)
        self.procs["vc-controller-manager"] = self._spawn("vc-controller-manager", [
            str(self.bin / "vc-controller-manager"), *kc, "--leader-elect=false", "--scheduler-name", "volcano",
            "--enable-healthz=false", "--enable-metrics=false", "--logtostderr", "-v=2"])
        self._wait("the default ServiceAccount", lambda: self.kubectl(
            "get", "serviceaccount", "default", check=False).returncode == 0, 60, procs=("kube-controller-manager",))
        self._images()
        self.install_regroup()

    def _images(self) -> None:
        """What each image is on this machine (the kubelets' --images)."""
        path = os.pathsep.join([str(BUILD_DIR), "/usr/bin", "/bin", "/usr/sbin", "/sbin"])
        lib = str(BUILD_DIR)
        trainer = {"env": {"PATH": path, "LD_LIBRARY_PATH": lib, "PYTHONPATH": str(REPO / "python"),
                           "PYTHON": PYTHON, "OMP_NUM_THREADS": "1"}, "workingDir": str(self.dir)}
        self.images.write_text(json.dumps({
            SCHEDULER_IMAGE: {"entrypoint": ["regroup-scheduler"],
                              "env": {"PATH": os.pathsep.join([str(self.bin), path]), "LD_LIBRARY_PATH": lib}},
            REGROUP_IMAGE: {"env": {"PATH": path, "LD_LIBRARY_PATH": lib}},
            "*": trainer,
        }, indent=1))

    def install_regroup(self) -> None:
        """deploy/README.md's steps 2 and 3 as an administrator types them."""
        self.cluster_key.write_text(secrets.token_hex(32))
        self.cluster_key.chmod(0o600)
        self.kubectl("create", "namespace", "volcano-system")
        self.kubectl("-n", "volcano-system", "create", "secret", "generic", "regroup-coordinator-credential",
                     f"--from-file=token={self.cluster_key}")
        self.kubectl("-n", "volcano-system", "create", "secret", "generic", "regroup-coordinator-tls",
                     f"--from-file=tls.crt={self.pki / 'coordinator.crt'}",
                     f"--from-file=tls.key={self.pki / 'coordinator.key'}", f"--from-file=ca.crt={self.pki / 'ca.crt'}")
        # The chart as deploy/README.md installs it, pinned to the control-plane node (an
        # administrator's choice; the node is tainted so that no job's pod lands there).
        # $REGROUP_KUBE_VALUES (a JSON object) adds chart values, e.g. '{"coordinator": {"leaseMs": 30000}}'.
        values = self.dir / "regroup-values.yaml"
        values.write_text(yaml.safe_dump({
            "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
            "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}],
        }))
        extra = os.environ.get("REGROUP_KUBE_VALUES")
        more = [] if not extra else ["--values", str(self.dir / "regroup-values-extra.yaml")]
        if extra:
            try:
                given = json.loads(extra)
            except ValueError as e:
                raise ValueError(f"$REGROUP_KUBE_VALUES is not JSON: {e}") from None
            if not isinstance(given, dict):
                raise ValueError(f"$REGROUP_KUBE_VALUES must be a JSON object of chart values, not {extra!r}")
            (self.dir / "regroup-values-extra.yaml").write_text(yaml.safe_dump(given))
        self.helm("install", "regroup", str(CHART), "--namespace", "volcano-system", "--values", str(values), *more)
        # Volcano's installation creates the root queue and the default queue under it
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([
            {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": name},
             "spec": {"weight": 1, "reclaimable": name == "default", **({"parent": "root"} if name == "default" else {})}}
            for name in ("root", "default")]))
        self.add_node(CONTROL_PLANE_NODE, capacity={"cpu": "4", "memory": "8Gi", "pods": "8"},
                      labels={"node-role.kubernetes.io/control-plane": ""},
                      taints=["node-role.kubernetes.io/control-plane:NoSchedule"])
        self.wait_scheduler()

    def wait_scheduler(self, timeout: float = 120) -> dict:
        """The regroup-scheduler pod, ready (its coordinator listens)."""
        found: List[dict] = []

        def ready() -> bool:
            pods = self.api("/api/v1/namespaces/volcano-system/pods?labelSelector=app%3Dregroup-scheduler")["items"]
            found[:] = [p for p in pods if not p["metadata"].get("deletionTimestamp") and _ready(p)]
            return bool(found)
        self._wait("regroup-scheduler to be ready", ready, timeout, procs=tuple(self.procs))
        pod = found[0]
        self.log(f"regroup-scheduler ready: pod {pod['metadata']['name']} on {pod['spec'].get('nodeName')} "
                 f"({pod['status'].get('podIP')})")
        return pod

    # -- nodes -----------------------------------------------------------------------------------

    def add_node(self, name: str, capacity: Optional[Dict[str, str]] = None, labels: Optional[Dict[str, str]] = None,
                 taints: Sequence[str] = ()) -> NodeNet:
        node = self.net.add_node(name)
        self.nodes[name] = node
        self.start_kubelet(node, capacity, labels, taints)
        return node

    def start_kubelet(self, node: NodeNet, capacity: Optional[Dict[str, str]] = None,
                      labels: Optional[Dict[str, str]] = None, taints: Sequence[str] = ()) -> None:
        assert self.bin is not None
        cap = capacity or self.capacity
        argv = [str(self.bin / "regroup-kubelet"), "--kubeconfig", str(self.node_kubeconfig), "--node-name", node.name,
                "--node-ip", node.address, "--root", str(self.dir / "nodes" / node.name), "--images", str(self.images),
                "--capacity", ",".join(f"{k}={v}" for k, v in cap.items()), "--heartbeat", "1s"]
        if labels:
            argv += ["--labels", ",".join(f"{k}={v}" for k, v in labels.items())]
        self.dead.discard(node.name)
        self.kubelets[node.name] = self._spawn(f"kubelet-{node.name}", node.wrap(argv), env=node.env)
        self._wait(f"node {node.name} to be Ready", lambda: self.node_ready(node.name), 60)
        if taints:
            self.kubectl("taint", "node", node.name, "--overwrite", *taints)

    def node_ready(self, name: str) -> bool:
        return _ready(self.api(f"/api/v1/nodes/{name}"))   # a node not yet registered: 404, an OSError

    def kill_node(self, name: str) -> None:
        """The node dies: its kubelet and every process in it, SIGKILL (no heartbeat, no report)."""
        node = self.nodes[name]
        self.dead.add(name)
        k = self.kubelets.get(name)
        pids = set(self.net.pids(node))
        if k is not None:
            pids.update([k.pid, *_tree(k.pid)])
        for pid in pids:
            _signal(pid, signal.SIGKILL)
        if k is not None:
            k.wait(timeout=10)

    def pods(self, *selector: str, namespace: str = "default") -> List[dict]:
        return self.get("-n", namespace, "pods", *selector)["items"]

    # -- stopping --------------------------------------------------------------------------------

    def close(self) -> None:
        for name, k in list(self.kubelets.items()):
            if k.poll() is None:
                k.send_signal(signal.SIGTERM)   # it stops its pods
        for name, k in list(self.kubelets.items()):
            try:
                k.wait(timeout=40)
            except subprocess.TimeoutExpired:
                pass
        for node in self.nodes.values():        # what outlived its kubelet
            for pid in self.net.pids(node):
                _signal(pid, signal.SIGKILL)
        for p in [*self.kubelets.values(), *reversed(list(self.procs.values()))]:
            if p.poll() is None:
                for pid in [*_tree(p.pid), p.pid]:
                    _signal(pid, signal.SIGKILL)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


# ---------------------------------------------------------------------------------------------
# integration/kube/up and down: a cluster that outlives the command that started it
# ---------------------------------------------------------------------------------------------

DEFAULT_DIR = Path(os.environ.get("REGROUP_KUBE_DIR", "/tmp/regroup-kube"))


def serve(workdir: Path, nodes: int) -> int:
    """The cluster's owner: brings it up, writes ``ready`` (or ``failed``), and holds it until
    SIGTERM (``down``), then stops everything it started."""
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    net = Network.create("netns")
    try:
        with KubeCluster(workdir, net, log=lambda m: print(m, flush=True)) as k:
            try:
                k.start()
                for i in range(nodes):
                    k.add_node(f"node-{i}")
            except Exception as e:  # noqa: BLE001 - reported to `up`, then everything stops
                (workdir / "failed").write_text(f"{type(e).__name__}: {e}")
                raise
            (workdir / "ready").write_text(json.dumps({"kubeconfig": str(k.kubeconfig), "nodes": list(k.nodes),
                                                       "kubectl": str(k.bin / "kubectl")}))
            while not stop:
                time.sleep(0.5)
    finally:
        net.close()
    return 0


def up(workdir: Path, nodes: int, timeout: float) -> int:
    pidfile = workdir / "pid"
    if pidfile.exists() and _alive(int(pidfile.read_text())):
        print(f"a cluster is already up in {workdir} (pid {pidfile.read_text().strip()}): run integration/kube/down first")
        return 1
    subprocess.run(["rm", "-rf", str(workdir)], check=True)
    workdir.mkdir(parents=True)
    with open(workdir / "up.log", "ab") as out:
        p = subprocess.Popen([PYTHON if Path(PYTHON).exists() else "python3", __file__, "serve", "--workdir", str(workdir),
                              "--nodes", str(nodes)], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True, cwd=str(REPO))
    pidfile.write_text(str(p.pid))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (workdir / "ready").exists():
            info = json.loads((workdir / "ready").read_text())
            print(f"up: {len(info['nodes']) - 1} worker nodes and {CONTROL_PLANE_NODE}; logs in {workdir}; kubectl of "
                  f"this version: {info['kubectl']} --kubeconfig {info['kubeconfig']}")
            print(info["kubeconfig"])
            return 0
        if p.poll() is not None or (workdir / "failed").exists():
            print((workdir / "up.log").read_text(errors="replace")[-4000:])
            print(f"up failed (logs in {workdir})")
            down(workdir)
            return 1
        time.sleep(0.5)
    print(f"up: not ready within {timeout} s (logs in {workdir})")
    down(workdir)
    return 1


def down(workdir: Path, timeout: float = 90) -> int:
    pidfile = workdir / "pid"
    if not pidfile.exists():
        print(f"no cluster in {workdir}")
        return 0
    pid = int(pidfile.read_text())
    _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _alive(pid):  # its children, then it
        for p in [*_tree(pid), pid]:
            _signal(p, signal.SIGKILL)
    pidfile.unlink()
    print(f"down: the cluster in {workdir} is stopped")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=("up", "down", "serve", "build"))
    ap.add_argument("--workdir", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--nodes", type=int, default=3, help="worker nodes besides the control-plane node (default 3)")
    ap.add_argument("--timeout", type=float, default=3000, help="seconds for up, the first build included")
    a = ap.parse_args(argv)
    if a.nodes < 0 or a.nodes > 64:
        ap.error(f"--nodes must be 0..64, not {a.nodes}")
    if a.command == "build":
        print(build())
        return 0
    if a.command == "serve":
        return serve(a.workdir, a.nodes)
    if a.command == "up":
        return up(a.workdir, a.nodes, a.timeout)
    return down(a.workdir)



# ---------------------------------------------------------------------------------------------
# Scenarios on the real control plane (scenarios.py --kube)
# ---------------------------------------------------------------------------------------------

MANAGER_HTTP_PORT = 9602     # the manager pod's /status (the harness reads it at the pod's IP)
# An event as the manager logs it (manager/event_log.h): time, level, the job's fields, kind: message.
_EVENT_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})\] \[\w+\] job=\S+ epoch=\d+ "
                         r"generation=\d+(?: pod=[\d,]+)? (\w+): (.*)$")


class PodProcess:
    """A pod's main process as the scenarios see a Popen: started by a kubelet (its container ID
    is ``process://<pid>``); its exit code is the API's (the kubelet's report), or 137 when its
    node died with it."""

    def __init__(self, loop: "KubeLoop", key: str, uid: str, pid: int, node: str):
        self.loop, self.key, self.uid, self.pid, self.node = loop, key, uid, pid, node
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        if self.returncode is not None:
            return self.returncode
        if _running(self.pid):
            return None
        code = self.loop.exit_code(self.key, self.uid)
        if code is None and self.node in self.loop.kube.dead:
            code = 137
        if code is None:
            return None     # gone, not yet reported: the kubelet reports within its sync
        self.returncode = code
        return code

    def wait(self, timeout: Optional[float] = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.key, timeout)
            time.sleep(0.1)
        return self.returncode  # type: ignore[return-value]


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def kube_job(doc: dict, http_port: int = MANAGER_HTTP_PORT) -> dict:
    """The scenario's Volcano Job as deploy/examples/pytorch-job.yaml writes one: the manager pod
    runs regroup-manager attached to the coordinator (its Service's name), the workers find the
    manager by the svc plugin's hostname, credentials and tokens come from Secrets, the identity
    fields from the downward API."""
    doc = copy.deepcopy(doc)
    name, ns = doc["metadata"]["name"], doc["metadata"].get("namespace", "default")
    spec = doc["spec"]
    spec["queue"] = "default"
    spec["plugins"] = {"svc": [], "env": []}   # hostnames; VC_TASK_INDEX (the agents' node ranks)
    secret = {"name": "regroup-credential", "secret": {"secretName": f"{name}-regroup-credential", "defaultMode": 0o400}}
    token = {"name": "regroup-coordinator-credential",
             "secret": {"secretName": f"{name}-regroup-coordinator-token", "defaultMode": 0o400}}
    ca = {"name": "regroup-coordinator-ca", "secret": {"secretName": "regroup-coordinator-ca",
                                                        "items": [{"key": "ca.crt", "path": "ca.crt"}]}}

    def field(env: str, path: str) -> dict:
        return {"name": env, "valueFrom": {"fieldRef": {"fieldPath": path}}}
    for task in spec["tasks"]:
        pod = task["template"]["spec"]
        c = pod["containers"][0]
        if task["name"] == "manager":
            workers = next(t for t in spec["tasks"] if t["name"] == "worker")
            cmd = next(t["template"]["spec"]["containers"][0]["command"] for t in spec["tasks"] if t["name"] == "worker")
            nproc = next(a.split("=", 1)[1] for a in cmd if a.startswith("--nproc-per-node="))
            c["image"] = REGROUP_IMAGE
            c["command"] = ["regroup-manager", f"--job-id=$(REGROUP_NAMESPACE)/{name}",
                            f"--nodes={workers['replicas']}", f"--nproc-per-node={nproc}",
                            "--listen=0.0.0.0:9601", f"--http=0.0.0.0:{http_port}", "--join-window-s=120",
                            "--coordinator-ca=/etc/regroup/coordinator-ca/ca.crt",
                            "--stay-after-done"]  # CompleteJob ends it; checks read it before
            c["env"] = [field("REGROUP_NAMESPACE", "metadata.namespace"),
                        {"name": "REGROUP_CREDENTIAL_FILE", "value": "/etc/regroup/credential/token"},
                        {"name": "REGROUP_COORDINATOR_ADDR", "value": "regroup-coordinator.volcano-system.svc:8899"},
                        {"name": "REGROUP_COORDINATOR_CREDENTIAL_FILE", "value": "/etc/regroup/coordinator/token"}]
            c["volumeMounts"] = [{"name": "regroup-credential", "mountPath": "/etc/regroup/credential", "readOnly": True},
                                 {"name": "regroup-coordinator-credential", "mountPath": "/etc/regroup/coordinator",
                                  "readOnly": True},
                                 {"name": "regroup-coordinator-ca", "mountPath": "/etc/regroup/coordinator-ca",
                                  "readOnly": True}]
            c["ports"] = [{"name": "taskd-port", "containerPort": 9601}]
            pod["volumes"] = [secret, token, ca]
            pod["restartPolicy"] = "OnFailure"
        else:
            c["image"] = "example.com/mlp-train:latest"
            c["env"] = [field("REGROUP_NAMESPACE", "metadata.namespace"),
                        {"name": "REGROUP_JOB_ID", "value": f"$(REGROUP_NAMESPACE)/{name}"},
                        {"name": "REGROUP_MANAGER_ADDR", "value": f"{name}-manager-0.{name}:9601"},
                        field("REGROUP_POD_UID", "metadata.uid"), field("REGROUP_POD_NAME", "metadata.name"),
                        field("REGROUP_NODE_NAME", "spec.nodeName"), field("REGROUP_HOST", "status.podIP"),
                        {"name": "REGROUP_CREDENTIAL_FILE", "value": "/etc/regroup/credential/token"},
                        {"name": "REGROUP_STOP_GRACE_S", "value": "20"},
                        {"name": "GLOO_SOCKET_IFNAME", "value": "eth0"}]
            c["volumeMounts"] = [{"name": "regroup-credential", "mountPath": "/etc/regroup/credential", "readOnly": True}]
            pod["volumes"] = [secret]
            pod["restartPolicy"] = "Never"
    return doc


# ---------------------------------------------------------------------------------------------
# MindCluster's seed job, converted by `regroupctl convert` (scenario 20)
# ---------------------------------------------------------------------------------------------

SEED_ASCENDJOB = REPO / "examples" / "mindcluster" / "pytorch-elastic-910b.yaml"
# The labels MindCluster's node components give an Atlas 800T A2 node: what the seed's
# nodeSelector asks for. The job nodes here carry them (they advertise huawei.com/Ascend910 too).
ASCEND_NODE_LABELS = {"host-arch": "huawei-arm", "accelerator-type": "module-910b-8"}
# The seed's annotations this machine cannot keep: the model's layout. A replica of the seed is
# 4 x 2 = 8 ranks; here a pod has 2 CPU ranks and trains examples/train_mlp.py (no tensor or
# pipeline parallelism), so a replica is one rank. Every other label and annotation is the seed's.
SEED_RESIZED_ANNOTATIONS = {"regroup.io/tensor-parallel": "1", "regroup.io/pipeline-parallel": "1"}


# Where sized_seed may change the seed (scenario 20 checks that the fixture differs from the
# seed nowhere else): a path of `differences`.
SEED_SIZED_PATHS = re.compile(
    r"metadata\.(name|namespace|annotations\.regroup\.io/(tensor|pipeline)-parallel)"
    r"|spec\.runPolicy\.schedulingPolicy\.minAvailable"
    r"|spec\.replicaSpecs\.(Master|Worker)\.(replicas|template\.spec\.(containers\[0\]\.(args|resources\."
    r"(limits|requests)\.huawei\.com/Ascend910)|volumes\[0\]\.(nfs|hostPath)))")


def sized_seed(seed: dict, job, train_args: Sequence[str], code: Path) -> Tuple[dict, List[str]]:
    """The seed AscendJob sized for this machine, and what was changed (one line each): ``job``'s
    pods (Master 1 and Worker ``job.nodes - 1``) of ``job.nproc`` processes, one NPU each as
    MindCluster sizes its pods; torchrun starting the repository's CPU trainer with
    ``train_args``; the code volume a hostPath of ``code`` (no NFS server here). Labels,
    annotations (but SEED_RESIZED_ANNOTATIONS), the pod templates' labels, affinity,
    nodeSelector, env, ports and policies are the seed's."""
    doc = copy.deepcopy(seed)
    meta, spec = doc["metadata"], doc["spec"]
    changes = [f"metadata.namespace {meta.get('namespace')} -> default: the harness follows the job in "
               "namespace default"]
    if meta["name"] != job.name:
        changes.append(f"metadata.name {meta['name']} -> {job.name}")
    meta["name"], meta["namespace"] = job.name, "default"
    for k, v in SEED_RESIZED_ANNOTATIONS.items():
        changes.append(f"metadata.annotations[{k}] {meta['annotations'][k]} -> {v}: a replica of train_mlp.py "
                       "is one rank")
        meta["annotations"][k] = v
    replicas = spec["replicaSpecs"]
    sizes = {"Master": 1, "Worker": job.nodes - 1}
    changes.append(f"replicas Master {replicas['Master']['replicas']}, Worker {replicas['Worker']['replicas']} -> "
                   f"{sizes['Master']}, {sizes['Worker']}; schedulingPolicy.minAvailable "
                   f"{spec['runPolicy']['schedulingPolicy']['minAvailable']} -> {job.nodes}: {job.nodes} pods")
    spec["runPolicy"]["schedulingPolicy"]["minAvailable"] = job.nodes
    script = " ".join(["torchrun", "--nproc_per_node", str(job.nproc), "--nnodes", str(job.nodes),
                       job.script.name, *train_args])
    for role, rs in replicas.items():
        rs["replicas"] = sizes[role]
        pod = rs["template"]["spec"]
        c = pod["containers"][0]
        c["args"] = [f"cd /job/code\n{script}\n"]
        for part in ("limits", "requests"):
            c["resources"][part][ACCELERATOR] = job.nproc
        for v in pod["volumes"]:
            if v["name"] == "code" and "nfs" in v:
                del v["nfs"]
                v["hostPath"] = {"path": str(code), "type": "Directory"}
    changes.append(f"the containers' script: torchrun --nproc_per_node 8 --nnodes 4 pretrain_llama.py ... -> {script}: "
                   "the repository's CPU trainer (examples/train_mlp.py, float64)")
    changes.append(f"resources {ACCELERATOR} 8 -> {job.nproc}: one NPU a process, as MindCluster sizes its pods")
    changes.append(f"volume code: nfs -> hostPath {code}: no NFS server here")
    return doc, changes


# Each change made to `regroupctl convert`'s output before kubectl applies it, with its reason:
# what this machine and this harness force, nothing else (scenario 20 checks that the submitted
# job differs from convert's output at these paths only).
POST_CONVERSION = {
    "spec.tasks[0].template.spec.containers[0].command":
        f"the manager: --http=0.0.0.0:{MANAGER_HTTP_PORT} (the harness reads /status and the events at the pod's "
        "IP) and --stay-after-done (the checks read them after the job completed)",
}


def converted_for_this_machine(doc: dict) -> dict:
    """`regroupctl convert`'s Volcano Job with POST_CONVERSION applied; image names stay as
    convert wrote them (the kubelets run regroup/regroup:VERSION as the Regroup image and any
    other, the seed's llama-train:latest included, as the trainer image), and so do resources
    (the nodes advertise the accelerators the pods request)."""
    doc = copy.deepcopy(doc)
    manager = next(t for t in doc["spec"]["tasks"] if t["name"] == "manager")
    manager["template"]["spec"]["containers"][0]["command"] += [f"--http=0.0.0.0:{MANAGER_HTTP_PORT}",
                                                                 "--stay-after-done"]
    return doc


def differences(a, b, path: str = "") -> List[str]:
    """The paths at which two YAML documents differ (lists by index), shallowest first."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str)
                for d in (differences(a.get(k), b.get(k), f"{path}.{k}" if path else str(k))
                          if k in a and k in b else [f"{path}.{k}" if path else str(k)])]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and not all(
            isinstance(x, str) for x in a + b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [path]


class KubeLoop:
    """The scenarios' scheduler on the real control plane: what :class:`volcano_loop.VolcanoLoop`
    does over fake clientsets, with kubectl, Volcano's job controller, the real API server and the
    process kubelets. It is the Cluster's ``scheduler``: the Cluster's nodes get kubelets, its
    node faults kill them, its pods are the kubelets' processes."""

    def __init__(self, cluster, manager_node: bool = True, log: Optional[Callable[[str], None]] = None):
        self.c = cluster
        self.log = log or cluster.log
        self.manager_node = manager_node
        self.kube = KubeCluster(cluster.dir / "kube", cluster.net, log=self.log)
        self.started = False
        self.token_checked = False   # check_token, once a run of the job is seen running
        self.dead_nodes = self.kube.dead
        self._status: Dict[str, dict] = {}     # pod key -> last status seen
        self._seen: Dict[str, str] = {}        # pod key -> uid of the incarnation in the Cluster
        self.job_name = cluster.job.name
        self._binds: List[dict] = []           # (pod, uid, node) in the order they were seen bound
        self.phases: Dict[str, List[str]] = {"Job": [], "PodGroup": []}   # each phase as it changed
        self.retries = 0                       # the Volcano Job's status.retryCount, as last seen
        self.restarts: Dict[str, int] = {}     # "pod/uid" -> the most container restarts seen
        self._phases_at = 0.0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.errors: List[str] = []
        # What the harness changes in the job file before kubectl applies it: kube_job for the
        # scenarios' own jobs; converted_for_this_machine for a `regroupctl convert` output.
        self.rewrite: Callable[[dict], dict] = kube_job
        self.node_labels: Dict[str, str] = {}   # every job node's labels (the control-plane node's aside)
        self.manager_log: Optional[Path] = None   # the running manager pod's container log

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self, submit: bool = True) -> None:
        if self.started:
            return
        self.started = True
        self.kube.start()
        if self.manager_node:
            self.c.add_node()   # the Cluster calls on_node_added
        for node in list(self.c.nodes.values()):
            self.on_node_added(node)
        self._thread = threading.Thread(target=self._watch, name="kube-watch", daemon=True)
        self._thread.start()
        if submit:
            self.submit()

    def submit(self) -> None:
        doc = self.rewrite(yaml.safe_load(self.c.job_file.read_text()))
        name = doc["metadata"]["name"]
        (self.kube.dir / "job.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        k = self.kube
        k.kubectl("create", "secret", "generic", f"{name}-regroup-credential", f"--from-file=token={self.c.credential}")
        k.kubectl("create", "secret", "generic", "regroup-coordinator-ca", f"--from-file=ca.crt={k.pki / 'ca.crt'}")
        # The job's TLS Secret in cert-manager's layout (deploy/examples/tls.yaml), as far as the
        # jobs here use it: ca.crt, which signed the coordinator's certificate (a converted job's
        # manager checks the coordinator with it; the managers here serve their agents plaintext).
        k.kubectl("create", "secret", "generic", f"{name}-regroup-tls", f"--from-file=ca.crt={k.pki / 'ca.crt'}")
        k.kubectl("apply", "-f", str(k.dir / "job.yaml"))
        uid = k.kubectl("get", "vcjob", name, "-o", "jsonpath={.metadata.uid}").stdout.strip()
        self.token_checked = False
        self.log(f"job {name} submitted with kubectl (uid {uid}); its token is the scheduler's to write")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.kube.close()

    # -- the Cluster's hooks ---------------------------------------------------------------------

    def on_node_added(self, node) -> None:
        if not self.started or node.name in self.kube.kubelets:
            return
        self.kube.nodes[node.name] = node
        self.kube.start_kubelet(node, labels=self.node_labels or None)

    def on_node_killed(self, name: str, reason: str = "the node died") -> None:
        self.kube.dead.add(name)   # Cluster.kill_node kills its processes, the kubelet's among them

    def add_node(self):
        return self.c.add_node()

    def check_token(self) -> None:
        """Nobody mints the job's coordinator token: the scheduler's regroup plugin writes it when
        the job appears (the manager's pod waits for the Secret, as a kubelet does), and it is the
        token `regroupctl token` derives from the cluster key, owned by the Volcano Job. (A job
        the plugin refuses, invalid, gets none.)"""
        k, name = self.kube, self.job_name
        uid = k.kubectl("get", "vcjob", name, "-o", "jsonpath={.metadata.uid}").stdout.strip()
        want = subprocess.run([self.c.bin["regroupctl"], "token", "--cluster-key-file", str(k.cluster_key),
                               "--job", f"default/{name}", "--uid", uid], capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()
        secret = f"{name}-regroup-coordinator-token"
        got: dict = {}

        def written() -> bool:
            r = k.kubectl("get", "secret", secret, "-o", "json", check=False)
            if r.returncode == 0:
                got.update(json.loads(r.stdout))
            return bool(got)
        k._wait(f"the regroup plugin to write Secret {secret}", written, 120)
        token = base64.b64decode(got["data"]["token"]).decode()
        owners = [(o["kind"], o["uid"]) for o in got["metadata"].get("ownerReferences", [])]
        if token != want or owners != [("Job", uid)]:
            raise AssertionError(f"Secret {secret}: token {'right' if token == want else 'wrong'}, owners "
                                 f"{owners}; want regroupctl's token, owned by the Volcano Job {uid}")
        self.token_checked = True
        self.log(f"job {name}: the scheduler wrote its coordinator token (Secret {secret})")

    def wait_running(self, timeout: float = 180) -> None:
        doc = yaml.safe_load(self.c.job_file.read_text())
        want = [f"{self.job_name}-{t['name']}-{i}" for t in doc["spec"]["tasks"] for i in range(int(t.get("replicas", 1)))]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(n in self._seen for n in want) and self.c.manager is not None:
                if not self.token_checked:
                    self.check_token()
                return
            time.sleep(0.1)
        raise AssertionError(f"not every pod of the job ran within {timeout} s: {sorted(self._seen)} of {want}\n"
                             + self._diagnose())

    def wait_replacement(self, index: int, old_uid: Optional[str] = None, timeout: float = 180):
        name = f"{self.job_name}-worker-{index}"
        old = {old_uid} if old_uid else set()
        old.update(b["uid"] for b in self._binds if b["pod"] == name and b["node"] in self.kube.dead)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pod = self.c.pods.get(name)
            if pod is not None and pod.uid not in old and pod.node.name not in self.kube.dead:
                return pod
            time.sleep(0.1)
        raise AssertionError(f"no replacement of {name} ran within {timeout} s\n" + self._diagnose())

    def move_manager(self, timeout: float = 120) -> dict:
        """Drains the manager's node as an administrator would (a new node joins, the old one is
        cordoned, the manager's pod deleted with its grace period); returns the fault's record once
        Volcano's job controller recreated the pod and it runs elsewhere."""
        old = self.c.manager
        name = f"{self.job_name}-manager-0"
        node = self.node_of(name)
        self.c.add_node()
        self.kube.kubectl("cordon", node)
        f = self.c.note("delete the manager's pod", node=node, at=self.c._refresh())
        self.kube.kubectl("delete", "pod", name, "--wait=false")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.c.manager is not old and self.c.manager is not None:
                return f
            time.sleep(0.1)
        raise AssertionError(f"the manager's pod was not recreated and run within {timeout} s\n" + self._diagnose())

    def podgroup(self) -> dict:
        """The job's PodGroup (Volcano's job controller owns it), or {} before it exists."""
        for pg in self.kube.api("/apis/scheduling.volcano.sh/v1beta1/namespaces/default/podgroups")["items"]:
            if any(o.get("name") == self.job_name for o in pg["metadata"].get("ownerReferences", [])):
                return pg
        return {}

    def min_available(self) -> Tuple[Optional[int], Optional[str], Optional[int]]:
        """The Volcano Job's spec.minAvailable, the value it was submitted with as the scheduler
        noted it when it lowered it (``scheduler.regroup.io/submitted-min-available``), and the
        PodGroup's minMember."""
        job = self.kube.api(f"/apis/batch.volcano.sh/v1alpha1/namespaces/default/jobs/{self.job_name}")
        return (job.get("spec", {}).get("minAvailable"),
                job.get("metadata", {}).get("annotations", {}).get("scheduler.regroup.io/submitted-min-available"),
                self.podgroup().get("spec", {}).get("minMember"))

    def saved_state(self) -> dict:
        """The engine's state of the job as the scheduler saved it in the job's PodGroup
        (``scheduler.regroup.io/state``), or {} before the first save."""
        text = self.podgroup().get("metadata", {}).get("annotations", {}).get("scheduler.regroup.io/state")
        return json.loads(text) if text else {}

    def restart_scheduler(self, timeout: float = 120) -> dict:
        """Deletes the regroup-scheduler pod (its Deployment creates another); returns the fault's
        record once the new one is ready (its coordinator listens)."""
        old = {p["metadata"]["name"] for p in self.kube.pods("-l", "app=regroup-scheduler", namespace="volcano-system")}
        f = self.c.note("delete the scheduler's pod", pods=",".join(sorted(old)), at=self.c._refresh())
        self.kube.kubectl("-n", "volcano-system", "delete", "pod", "-l", "app=regroup-scheduler", "--wait=false")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pod = self.kube.wait_scheduler(timeout=max(1.0, deadline - time.monotonic()))
            if pod["metadata"]["name"] not in old:
                self.c.note("the new scheduler is ready", pod=pod["metadata"]["name"])
                return f
            time.sleep(0.5)
        raise AssertionError(f"no new regroup-scheduler pod was ready within {timeout} s\n" + self._diagnose())

    def node_of(self, pod: str) -> str:
        for b in reversed(self._binds):
            if b["pod"] == pod:
                return b["node"]
        raise KeyError(f"{pod} is not bound")

    def binds(self) -> List[dict]:
        return list(self._binds)

    def job_invalid(self, timeout: float = 30) -> dict:
        """The RegroupInvalid event the scheduler records on the job's PodGroup (Volcano's job
        controller names the PodGroup after the job and its uid)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            events = self.kube.api("/api/v1/namespaces/default/events?fieldSelector=reason%3DRegroupInvalid")["items"]
            for e in events:
                if e["involvedObject"].get("kind") == "PodGroup" and e["involvedObject"]["name"].startswith(self.job_name):
                    return {"message": e.get("message", ""), "object": e["involvedObject"]["name"]}
            time.sleep(0.3)
        raise AssertionError(f"no RegroupInvalid event on {self.job_name}'s PodGroup within {timeout} s\n"
                             + self._diagnose())

    def exit_code(self, key: str, uid: str) -> Optional[int]:
        st = self._status.get(key)
        if not st or st["metadata"]["uid"] != uid:
            return None
        for cs in st.get("status", {}).get("containerStatuses", []):
            term = cs.get("state", {}).get("terminated")
            if term is not None:
                return int(term.get("exitCode", 0))
        return None

    def logs(self, tail: int = 2500) -> str:
        """The tails of the logs the job's pods and the scheduler's pod wrote (a failed scenario's
        report: the manager's log says why it never trained, for instance that it could not attach
        to the coordinator)."""
        parts = []
        for f in sorted(self.kube.dir.glob("nodes/*/pods/*/*.log")):
            text = f.read_text(errors="replace")
            if f.name.startswith("regroup-scheduler"):
                text = "\n".join(line for line in text.splitlines() if "regroup" in line.lower())
            parts.append(f"== {f.parent.parent.parent.name}/{f.parent.name.split('_')[1]}/{f.name}\n{text[-tail:]}")
        return "\n".join(parts)

    def _diagnose(self) -> str:
        out = []
        for args in (("get", "pods", "-A", "-o", "wide"), ("get", "vcjob,podgroup", "-o", "wide"),
                     ("get", "events", "-A", "--sort-by=.lastTimestamp"), ("get", "nodes", "-o", "wide")):
            r = self.kube.kubectl(*args, check=False)
            out.append(f"$ kubectl {' '.join(args)}\n{r.stdout[-3000:]}{r.stderr[-500:]}")
        return "\n".join(out)

    # -- watching the API ------------------------------------------------------------------------

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                self._sync()
            except Exception as e:  # noqa: BLE001 - reported, and the next round tries again
                msg = f"kube watch: {type(e).__name__}: {e}"
                if msg not in self.errors[-1:]:
                    self.errors.append(msg)
                    self.log(msg)
            self._stop.wait(0.2)

    def logged_events(self, known: Sequence[dict]) -> List[dict]:
        """The manager's events after the last of ``known`` as its log has them (the Cluster's
        events once /status cannot be read): a job with `TaskCompleted -> CompleteJob` (what
        `regroupctl convert` writes) has its manager pod stopped by Volcano's job controller
        within a fraction of a second of its last events, ``done`` among them. One line an event:
        ``[TIME] [LEVEL] job=... epoch=... generation=...[ pod=...] KIND: MESSAGE``; TIME is the
        logger's (this machine's clock, as at_ms is)."""
        manager = self.c.manager
        if self.manager_log is None or not self.manager_log.exists() or manager is None or _running(manager.pid):
            return []   # a manager that runs answers /status: its events are there
        logged = []
        for line in self.manager_log.read_text(errors="replace").splitlines():
            m = _EVENT_LINE.match(line)
            if m:
                at = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()
                logged.append({"at_ms": str(int(round(at * 1000))), "kind": m.group(2), "message": m.group(3)})
        if not known:
            return logged
        last = known[-1]
        for i in range(len(logged) - 1, -1, -1):   # the last known event, by what it says
            said = logged[i]["message"]
            if logged[i]["kind"] == last["kind"] and said == last["message"][:len(said)]:
                return logged[i + 1:]
        return [e for e in logged if int(e["at_ms"]) > int(last["at_ms"])]

    def check(self, r) -> None:
        """What the real controllers did to the job, as promises: Volcano never restarted, aborted
        or failed it, and no pod restarted its container (a survivor keeps its processes)."""
        self._sync_status()
        bad = [p for p in self.phases["Job"] if p in ("Restarting", "Aborting", "Aborted", "Failed", "Terminating")]
        r.promise("Volcano's job controller never restarted, aborted or failed the job",
                  not bad and self.retries == 0,
                  f"Job phases {' -> '.join(self.phases['Job'])}; PodGroup {' -> '.join(self.phases['PodGroup'])}; "
                  f"retryCount {self.retries}")
        restarted = {k: n for k, n in self.restarts.items() if n > 0}
        r.promise("no pod's container was restarted", not restarted, str(restarted or "none"))

    def _sync_status(self) -> None:
        """The Volcano Job's and its PodGroup's phases, each change kept (about once a second)."""
        self._phases_at = time.monotonic()
        job = self.kube.api(f"/apis/batch.volcano.sh/v1alpha1/namespaces/default/jobs/{self.job_name}")
        self.retries = int(job.get("status", {}).get("retryCount", 0))
        seen = {"Job": job.get("status", {}).get("state", {}).get("phase"),
                "PodGroup": self.podgroup().get("status", {}).get("phase")}
        for kind, phase in seen.items():
            if phase and (not self.phases[kind] or self.phases[kind][-1] != phase):
                self.phases[kind].append(phase)
                self.log(f"the Volcano {kind} is {phase}")

    def _sync(self) -> None:
        from cluster import Pod
        if time.monotonic() - self._phases_at > 1.0:
            self._sync_status()
        pods = self.kube.api(f"/api/v1/namespaces/default/pods?labelSelector=volcano.sh%2Fjob-name%3D{self.job_name}")["items"]
        for p in pods:
            meta, spec, st = p["metadata"], p["spec"], p.get("status", {})
            name, uid, node = meta["name"], meta["uid"], spec.get("nodeName")
            self._status[name] = p
            restarts = sum(int(cs.get("restartCount", 0)) for cs in st.get("containerStatuses") or [])
            self.restarts[f"{name}/{uid[:8]}"] = max(restarts, self.restarts.get(f"{name}/{uid[:8]}", 0))
            if node and not any(b["uid"] == uid for b in self._binds):
                self._binds.append({"pod": name, "uid": uid, "node": node, "at": time.time()})
                self.log(f"{name} ({uid[:8]}) bound to {node}")
            if self._seen.get(name) == uid or not node or node not in self.c.nodes:
                continue
            cs = (st.get("containerStatuses") or [{}])[0]
            cid = cs.get("containerID", "")
            if not cid.startswith("process://") or "running" not in cs.get("state", {}):
                continue
            pid = int(cid[len("process://"):])
            self._seen[name] = uid
            proc = PodProcess(self, name, uid, pid, node)
            nodenet = self.c.nodes[node]
            log = self.kube.dir / "nodes" / node / "pods" / f"{meta['namespace']}_{name}_{uid}" / f"{spec['containers'][0]['name']}.log"
            role = meta.get("labels", {}).get("volcano.sh/task-spec", "")
            if role == "manager":
                self.c.manager, self.c.manager_node = proc, nodenet
                self.manager_log = log
                self.c.manager_host, self.c.http_port = st["podIP"], MANAGER_HTTP_PORT
                self.log(f"the manager's pod {name} runs on {node} ({st['podIP']})")
            else:
                index = int(meta.get("annotations", {}).get("volcano.sh/task-index", name.rsplit("-", 1)[1]))
                self.c.pods[name] = Pod(name, index, nodenet, uid, proc, log)
                self.log(f"pod {name} runs on {node} ({st.get('podIP')})")


if __name__ == "__main__":
    raise SystemExit(main())
