# SPDX-License-Identifier: Apache-2.0
"""Volcano in the loop: Volcano's scheduler framework with the ``regroup`` plugin places the job's
pods on the local cluster's nodes, and this module is the kubelet.

``integration/localsched`` (Go) runs the scheduler's sessions continuously over fake clientsets,
plays the API server's bookkeeping and the Volcano job controller, and talks JSON lines on its
stdin/stdout. :class:`VolcanoLoop` builds and starts it, gives it the cluster's nodes and the job
(``cluster.job_file``), and does what a kubelet does: a bound manager pod runs
:meth:`Cluster.start_manager` inside its node, attached to the plugin's coordinator; a bound
worker pod runs the worker command inside its node; a pod's end is reported Succeeded or Failed
with its exit code; an evicted pod's processes are killed.

    with Cluster(workdir, JobSpec(steps=30)) as c, VolcanoLoop(c) as v:
        v.start()                        # nodes and the job go to the scheduler; binds start pods
        v.wait_bound("mlp-worker-1")
        v.node_down(v.node_of("mlp-worker-1"))   # its kubelet dies, NotReady, its processes die
        node = v.add_node()              # capacity returns: the replacement is bound there
        pod = v.wait_replacement(1)      # ... and started by the kubelet
        c.wait_pods_exit()

Every process is stopped by :meth:`close` (the Cluster stops the pods), every wait is bounded.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import secrets
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from cluster import ACCELERATOR, REPO, Cluster, Pod, _signal, _tree

LOCALSCHED = REPO / "integration" / "localsched"
# The scheduler configuration that ships (regroup beside gang); localsched's built-in one otherwise.
SCHEDULER_CONF = REPO / "deploy" / "helm" / "regroup" / "files" / "volcano-scheduler.conf"
BUILD_DIR = Path(os.environ.get("REGROUP_BUILD_DIR", REPO / "build"))
CACHE = Path(os.environ.get("REGROUP_INTEGRATION_CACHE", "/tmp/regroup-integration-cache"))


def _go_env() -> Dict[str, str]:
    """cgo against build/libregroup.so, as go/test.sh does."""
    env = dict(os.environ)
    env["CGO_ENABLED"] = "1"
    env["CGO_LDFLAGS"] = f"-L{BUILD_DIR}" + (f" {env['CGO_LDFLAGS']}" if env.get("CGO_LDFLAGS") else "")
    env["LD_LIBRARY_PATH"] = f"{BUILD_DIR}" + (f":{env['LD_LIBRARY_PATH']}" if env.get("LD_LIBRARY_PATH") else "")
    env.setdefault("GOFLAGS", "-mod=mod")
    return env


def _source_digest() -> str:
    h = hashlib.sha256()
    for folder in (LOCALSCHED, REPO / "go" / "volcano", REPO / "go" / "regroup"):
        for f in sorted(folder.glob("*")):
            if f.is_file() and (f.suffix == ".go" or f.name in ("go.mod", "go.sum")) and not f.name.endswith("_test.go"):
                h.update(f.name.encode())
                h.update(f.read_bytes())
    lib = BUILD_DIR / "libregroup.so"
    if lib.exists():
        h.update(str(lib.stat().st_mtime_ns).encode())
    return h.hexdigest()[:16]


def build_localsched(log: Callable[[str], None] = print, timeout: float = 1800) -> Path:
    """The localsched binary, built once per source version (cached under $REGROUP_INTEGRATION_CACHE)."""
    if os.environ.get("REGROUP_LOCALSCHED"):
        return Path(os.environ["REGROUP_LOCALSCHED"])
    if not (BUILD_DIR / "libregroup.so").exists():
        raise FileNotFoundError(f"no libregroup.so in {BUILD_DIR}: run scripts/setup first")
    out = CACHE / f"localsched-{_source_digest()}"
    if out.exists():
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    log(f"building localsched (go build; Kubernetes' modules take a while the first time) -> {out}")
    start = time.monotonic()
    r = subprocess.run(["go", "build", "-o", str(tmp), "."], cwd=LOCALSCHED, env=_go_env(),
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"go build of {LOCALSCHED} failed:\n{r.stdout}{r.stderr}")
    tmp.rename(out)
    log(f"localsched built in {time.monotonic() - start:.0f} s")
    return out


def _exit_code(rc: Optional[int]) -> int:
    """A Popen return code as a container's exit code (a signal n is 128+n)."""
    if rc is None:
        return 0
    return 128 - rc if rc < 0 else rc


class VolcanoLoop:
    """The scheduler loop (localsched) and the kubelet over a :class:`Cluster`.

    ``manager_node``: add one node for the manager's pod (one pod per node, so that the cluster's
    other nodes keep their worker capacity). ``pods_per_node``: a node's pod capacity (1: each
    worker pod fills a node, as an accelerator-filling pod does)."""

    def __init__(self, cluster: Cluster, manager_node: bool = True, pods_per_node: int = 1,
                 cpu: str = "8", memory: str = "32Gi", log: Optional[Callable[[str], None]] = None,
                 period_ms: int = 200):
        self.c = cluster
        self.log = log or cluster.log
        self.manager_node = manager_node
        self.pods_per_node = pods_per_node
        self.cpu, self.memory = cpu, memory
        self.period_ms = period_ms
        self.proc: Optional[subprocess.Popen] = None
        self.coordinator: Optional[str] = None
        self.events: List[dict] = []           # every event from localsched, in order
        self._cond = threading.Condition()
        self._write = threading.Lock()
        self._kubelet: "queue.Queue[Optional[dict]]" = queue.Queue()
        self._threads: List[threading.Thread] = []
        self._stopping = threading.Event()
        # The kubelet's view, by pod key ("default/mlp-worker-1"): uid, node, task, index, process.
        self.pods: Dict[str, dict] = {}
        self._pending_workers: List[dict] = []
        self.kubelet_errors: List[str] = []
        self._tokens: Dict[tuple, Path] = {}    # (job, job uid) -> its coordinator token file
        self.log_file = self.c.dir / "localsched.log"
        self.nodes_added: List[str] = []
        self.dead_nodes: set = set()           # nodes whose kubelet is dead (killed): no reports, no starts
        self.started = False

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> "VolcanoLoop":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self, submit: bool = True, ready_timeout: float = 60) -> None:
        """Builds and starts localsched, waits for the coordinator, gives it the nodes and (with
        ``submit``) the job."""
        if self.started:
            return
        self.started = True
        binary = build_localsched(self.log)
        listen = f"{self.c.net.manager_address}:0"
        # The coordinator holds the cluster key; the job's manager gets the job's token, derived
        # from it (as deploy/ sets it up).
        self.coordinator_credential = self.c.dir / "coordinator-credential"
        self.coordinator_credential.write_text(secrets.token_hex(24))
        self.coordinator_credential.chmod(0o600)
        argv = [str(binary), "--coordinator-listen", listen, "--credential-file", str(self.coordinator_credential),
                "--period", f"{self.period_ms}ms"]
        if SCHEDULER_CONF.exists():
            argv += ["--scheduler-conf", str(SCHEDULER_CONF)]
        env = {**os.environ, "LD_LIBRARY_PATH": f"{BUILD_DIR}" + (f":{os.environ['LD_LIBRARY_PATH']}"
                                                                 if os.environ.get("LD_LIBRARY_PATH") else "")}
        with open(self.log_file, "ab") as err:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                         env=env, start_new_session=True, cwd=str(self.c.dir))
        for target, name in ((self._read, "localsched-reader"), (self._run_kubelet, "localsched-kubelet")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        ready = self.wait_event("ready", timeout=ready_timeout)
        self.coordinator = ready.get("coordinator") or None
        self.log(f"Volcano in the loop: scheduler running, the plugin's coordinator at {self.coordinator}")
        if self.manager_node:
            self.c.add_node()  # with the hook, Cluster.add_node gives it to the scheduler itself
        for name in list(self.c.nodes):
            self.on_node_added(self.c.nodes[name])
        if submit:
            self.submit()

    def submit(self, job_file: Optional[Path] = None) -> None:
        self.send({"op": "submit", "file": str(job_file or self.c.job_file)})

    def close(self) -> None:
        self._stopping.set()
        self._kubelet.put(None)
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.send({"op": "quit"})
            except OSError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _signal(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        for t in self._threads:
            t.join(timeout=10)

    # -- talking to localsched -------------------------------------------------------------------

    def send(self, cmd: dict) -> None:
        if self.proc is None or self.proc.stdin is None:
            raise RuntimeError("localsched is not running")
        with self._write:
            self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
            self.proc.stdin.flush()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                ev = json.loads(raw)
            except ValueError:
                self.log(f"localsched: not JSON: {raw[:200]!r}")
                continue
            ev["at"] = time.time()
            with self._cond:
                self.events.append(ev)
                self._cond.notify_all()
            kind = ev.get("event")
            if kind in ("bind", "evict"):
                self._kubelet.put(ev)
            elif kind in ("error", "warning", "job_invalid"):
                self.log(f"localsched {kind}: {ev.get('message')}")
            elif kind == "plugin_event":
                self.log(f"scheduler event {ev.get('reason')}: {ev.get('message')}")
        with self._cond:
            self._cond.notify_all()

    def wait_event(self, kind: str, match: Optional[Callable[[dict], bool]] = None, timeout: float = 60,
                   after: int = 0) -> dict:
        """The first event of ``kind`` (from index ``after`` of :attr:`events`) that ``match`` accepts."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for ev in self.events[after:]:
                    if ev.get("event") == kind and (match is None or match(ev)):
                        return ev
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {kind!r} event from localsched within {timeout} s; events: "
                                         f"{self.events[-20:]}\n{self._log_tail()}")
                if self.proc is not None and self.proc.poll() is not None:
                    raise AssertionError(f"localsched exited with {self.proc.returncode} while waiting for "
                                         f"a {kind!r} event\n{self._log_tail()}")
                self._cond.wait(min(left, 0.5))

    def _log_tail(self, n: int = 3000) -> str:
        try:
            return "localsched.log:\n" + self.log_file.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def binds(self) -> List[dict]:
        with self._cond:
            return [e for e in self.events if e.get("event") == "bind"]

    def job_invalid(self, timeout: float = 30) -> dict:
        return self.wait_event("job_invalid", timeout=timeout)

    # -- nodes -----------------------------------------------------------------------------------

    def _hooked(self) -> bool:
        """Whether the Cluster calls this loop itself (its ``scheduler`` attribute is this loop)."""
        return getattr(self.c, "scheduler", None) is self

    def on_node_added(self, node) -> None:
        """Hook (Cluster.add_node): the scheduler learns a node. Before :meth:`start`, nodes are
        given at start; a node already given is not given again."""
        if self.proc is None or node.name in self.nodes_added:
            return
        self.send({"op": "add_node", "name": node.name, "cpu": self.cpu, "memory": self.memory,
                   "pods": self.pods_per_node, "resources": {ACCELERATOR: "8"}})  # as a device plugin advertises them
        self.nodes_added.append(node.name)

    def on_node_killed(self, name: str, reason: str = "the node died") -> None:
        """Hook (Cluster.kill_node, before it kills): the node's kubelet dies with it (its pods are
        no longer reported, nothing starts there) and the node goes NotReady."""
        self.dead_nodes.add(name)
        if self.proc is not None:
            self.node_ready(name, False, reason)

    def add_node(self):
        """A new node of the cluster, given to the scheduler (capacity returns)."""
        node = self.c.add_node()
        self.on_node_added(node)
        return node

    def node_ready(self, name: str, ready: bool = True, reason: str = "") -> None:
        """The node's Ready condition; ready=True also brings a dead node's kubelet back."""
        if ready:
            self.dead_nodes.discard(name)
        self.send({"op": "node_ready", "name": name, "ready": ready, "reason": reason})

    def node_down(self, name: str, reason: str = "the node died") -> dict:
        """A node dies: its kubelet stops, it goes NotReady, and every process on it dies
        (Cluster.kill_node)."""
        if not self._hooked():
            self.on_node_killed(name, reason)
        return self.c.kill_node(name)

    def npu_fault(self, node: str, npu: str = "Ascend910-3", level: str = "SeparateNPU",
                  code: str = "80E18402") -> None:
        """MindCluster's device plugin on ``node`` reports an NPU fault at ``level``: it writes its
        ConfigMap kube-system/mindx-dl-deviceinfo-<node> as it does (docs/mindcluster-faults.md)."""
        faults = [{"fault_type": "CardUnhealthy", "npu_name": npu, "fault_level": level, "fault_handling": level,
                   "large_model_fault_level": level, "fault_code": code}]
        healthy = ",".join(f"Ascend910-{i}" for i in range(8) if f"Ascend910-{i}" != npu)
        info = {"DeviceInfo": {"DeviceList": {"huawei.com/Ascend910": healthy, "huawei.com/Ascend910-Unhealthy": npu,
                                              "huawei.com/Ascend910-Fault": json.dumps(faults)},
                               "UpdateTime": int(time.time())},
                "CheckCode": secrets.token_hex(32)}
        self.send({"op": "configmap", "namespace": "kube-system", "name": f"mindx-dl-deviceinfo-{node}",
                   "data": {"DeviceInfoCfg": json.dumps(info)}})

    # -- pods ------------------------------------------------------------------------------------

    def node_of(self, pod: str) -> str:
        """The node a pod ("mlp-worker-1" or "default/mlp-worker-1") is bound to now."""
        key = pod if "/" in pod else f"default/{pod}"
        with self._cond:
            for ev in reversed(self.events):
                if ev.get("event") == "bind" and ev.get("pod") == key:
                    return ev["node"]
        raise KeyError(f"{key} is not bound")

    def wait_bound(self, pod: str, timeout: float = 60, not_uid: Optional[str] = None) -> dict:
        """The bind of ``pod`` (an incarnation other than ``not_uid``)."""
        key = pod if "/" in pod else f"default/{pod}"
        return self.wait_event("bind", lambda e: e.get("pod") == key and e.get("uid") != not_uid, timeout)

    def wait_running(self, timeout: float = 120) -> None:
        """Waits until every pod of the job is bound and started (the manager attached)."""
        import yaml
        doc = yaml.safe_load(self.c.job_file.read_text())
        name = doc["metadata"]["name"]
        for task in doc["spec"]["tasks"]:
            for i in range(int(task.get("replicas", 1))):
                self.wait_started(f"{name}-{task['name']}-{i}", timeout=timeout)

    def wait_replacement(self, index: int, old_uid: Optional[str] = None, timeout: float = 120) -> Pod:
        """The replacement of worker pod ``index``, once the job controller created it, Volcano
        bound it and the kubelet started it; returns the Cluster's Pod. A replacement is an
        incarnation other than ``old_uid`` and those on nodes that died, bound to a live node (it
        may already have been started when this is called)."""
        name = f"{self.c.job.name}-worker-{index}"
        key = f"default/{name}"
        with self._cond:
            old = {e["uid"] for e in self.events
                   if e.get("event") == "bind" and e.get("pod") == key and e.get("node") in self.dead_nodes}
            # An evicted incarnation is never the replacement. Without it, a replacement already
            # started when this is called made the fallback below take the replacement for the
            # old pod, and the old pod's bind for its replacement (scenario 17, once in CI).
            old |= {e["uid"] for e in self.events if e.get("event") == "evict" and e.get("pod") == key}
        if old_uid:
            old.add(old_uid)
        if not old and key in self.pods:
            old.add(self.pods[key]["uid"])
        ev = self.wait_event("bind", lambda e: e.get("pod") == key and e.get("uid") not in old
                             and e.get("node") not in self.dead_nodes, timeout=timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pod = self.c.pods.get(name)
            if pod is not None and pod.uid == ev["uid"]:
                return pod
            time.sleep(0.05)
        raise AssertionError(f"{key} (uid {ev['uid']}) bound to {ev['node']} but not started within {timeout} s; "
                             f"kubelet errors {self.kubelet_errors}")

    def wait_started(self, pod: str, timeout: float = 60) -> dict:
        """Waits until the kubelet started ``pod``'s process; returns its record."""
        key = pod if "/" in pod else f"default/{pod}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rec = self.pods.get(key)
            if rec and rec.get("process") is not None:
                return rec
            time.sleep(0.05)
        raise AssertionError(f"{key} was not started within {timeout} s; kubelet errors {self.kubelet_errors}")

    def _run_kubelet(self) -> None:
        while not self._stopping.is_set():
            try:
                ev = self._kubelet.get(timeout=0.1)
            except queue.Empty:
                ev = False
            if ev is None:
                return
            try:
                if ev:
                    if ev["event"] == "bind":
                        self._bound(ev)
                    else:
                        self._evicted(ev)
                self._watch()
            except Exception as e:  # noqa: BLE001 - the kubelet reports and goes on
                msg = f"kubelet: {type(e).__name__}: {e}"
                self.kubelet_errors.append(msg)
                self.log(msg)

    def _bound(self, ev: dict) -> None:
        key, uid, node_name = ev["pod"], ev["uid"], ev["node"]
        self._stop_old(key)
        rec = {"uid": uid, "node": node_name, "task": ev.get("task"), "index": ev.get("index", 0),
               "process": None, "reported": False, "job": ev.get("job", ""), "job_uid": ev.get("job_uid", "")}
        self.pods[key] = rec
        if node_name in self.dead_nodes:
            self.log(f"{key} was bound to {node_name}, whose kubelet is dead: it does not start")
            return
        node = self.c.nodes.get(node_name)
        if node is None:
            self._report(key, uid, "Failed", 127)
            raise RuntimeError(f"{key} was bound to {node_name}, which the cluster does not have")
        if rec["task"] == "manager" or (self.c.job.seed_flow and int(rec["index"]) == 0):
            # The manager's pod, or in MindCluster's flow rank 0's pod (its manager.py, and the
            # MASTER_ADDR of the others)
            if rec["task"] == "manager":
                self._start_manager(key, rec, node)
            else:
                self._start_worker(key, rec)
            pending, self._pending_workers = self._pending_workers, []
            for w in pending:
                if self.pods.get(w["key"]) is w["rec"]:
                    self._start_worker(w["key"], w["rec"])
        elif self.c.manager is None or self.c.manager.poll() is not None:
            self._pending_workers.append({"key": key, "rec": rec})  # started once the manager runs
        else:
            self._start_worker(key, rec)

    def job_token(self, job: str, job_uid: str) -> Path:
        """The job's token at the coordinator, as an administrator mints it with the cluster key
        (``regroupctl token``), in a file of its own."""
        path = self._tokens.get((job, job_uid))
        if path is not None:  # minted once per job incarnation, as an administrator does
            return path
        out = subprocess.run([self.c.bin["regroupctl"], "token", "--cluster-key-file", str(self.coordinator_credential),
                              "--job", job, "--uid", job_uid], capture_output=True, text=True, check=True).stdout
        path = self.c.dir / "coordinator-token"
        path.write_text(out)
        path.chmod(0o600)
        self._tokens[(job, job_uid)] = path
        return path

    def _start_manager(self, key: str, rec: dict, node) -> None:
        try:
            token = self.job_token(rec["job"], rec["job_uid"]) if self.coordinator_credential else None
            self.c.start_manager(node=node, coordinator=self.coordinator, coordinator_credential=token)
        except (RuntimeError, AssertionError) as e:
            rec["process"] = self.c.manager
            self.log(f"the manager's pod {key} failed to start: {str(e).splitlines()[0]}")
            self._watch()
            return
        rec["process"] = self.c.manager
        self._report(key, rec["uid"], "Running")
        self.log(f"pod {key} (manager) started on {node.name}, attached to the coordinator {self.coordinator}")

    def _start_worker(self, key: str, rec: dict) -> None:
        node = self.c.nodes[rec["node"]]
        cluster_env = None
        if self.c.job.seed_flow:
            token = self.job_token(rec["job"], rec["job_uid"])
            cluster_env = self.c.seed_env(int(rec["index"]), self.coordinator, token)
        # the engine knows the pod by uid
        pod = self.c.start_pod(int(rec["index"]), node, uid=rec["uid"], cluster_env=cluster_env)
        rec["process"] = pod.process
        self._report(key, rec["uid"], "Running")

    def _stop_old(self, key: str) -> None:
        """An older incarnation of the pod still running (its eviction not yet seen) is killed."""
        old = self.pods.get(key)
        if old and old.get("process") is not None and old["process"].poll() is None:
            _kill_tree(old["process"])
            self._watch()

    def _evicted(self, ev: dict) -> None:
        rec = self.pods.get(ev["pod"])
        self.log(f"evict {ev['pod']}: {ev.get('reason')}")
        if rec is None or rec["uid"] != ev["uid"] or rec["node"] in self.dead_nodes:
            return
        if rec.get("process") is None:
            self._pending_workers = [w for w in self._pending_workers if w["rec"] is not rec]
            self._report(ev["pod"], rec["uid"], "Failed", 137)
            rec["reported"] = True
            return
        _kill_tree(rec["process"])
        self._watch()

    def _watch(self) -> None:
        """Reports each pod process that ended: Succeeded (exit 0) or Failed with its exit code."""
        for key, rec in list(self.pods.items()):
            p = rec.get("process")
            if p is None or rec["reported"] or p.poll() is None:
                continue
            rec["reported"] = True
            if rec["node"] in self.dead_nodes:
                continue  # a dead kubelet reports nothing
            code = _exit_code(p.returncode)
            self._report(key, rec["uid"], "Succeeded" if code == 0 else "Failed", code)

    def _report(self, key: str, uid: str, phase: str, code: Optional[int] = None) -> None:
        cmd: Dict[str, Any] = {"op": "pod_phase", "pod": key, "uid": uid, "phase": phase}
        if code is not None:
            cmd["exit_code"] = code
        try:
            self.send(cmd)
        except (OSError, RuntimeError, ValueError):
            pass  # localsched is gone (closing)


def volcano_unavailable() -> Optional[str]:
    """Why Volcano in the loop cannot run here (None when it can)."""
    import shutil
    if os.environ.get("REGROUP_LOCALSCHED"):
        return None if Path(os.environ["REGROUP_LOCALSCHED"]).exists() else "$REGROUP_LOCALSCHED does not exist"
    if shutil.which("go") is None:
        return "no Go toolchain (go) to build integration/localsched"
    if not (BUILD_DIR / "libregroup.so").exists():
        return f"no libregroup.so in {BUILD_DIR}"
    return None


def _kill_tree(p: subprocess.Popen) -> None:
    for pid in _tree(p.pid):
        _signal(pid, signal.SIGKILL)
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
