# SPDX-License-Identifier: Apache-2.0
"""A local multi-node cluster running a real Regroup job: nodes (network namespaces or loopback
addresses), the job's manager, one agent per pod with its PyTorch trainers, and faults on purpose.

    with Cluster(workdir, JobSpec(nodes=2, nproc=2, steps=40)) as c:
        c.start()                      # manager, then pod i on node i (standalone mode)
        c.wait_step(10)
        c.kill_trainer("node-1", 0)    # a fault (see the methods under "Faults")
        c.wait_done()
        print(c.events())              # the manager's event log, oldest first

The job is a Volcano Job (YAML, written to the work directory): the manager reads it with
``--job``, and its worker task's command is what each pod runs, so the same file serves the
standalone mode and Volcano in the loop. Every process is started in its own session and stopped
by :meth:`close`, every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import yaml

from network import Network, NodeNet

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

from regroup.api import UsageError  # noqa: E402
from regroup.testing import descendants, read_ledger, trainers_of, wait_for  # noqa: E402

EXAMPLE = REPO / "examples" / "train_mlp.py"
GRID = REPO / "examples" / "train_grid.py"       # a dp x tp x pp grid (JobSpec.pp > 1)
DROPIN = REPO / "examples" / "ddp_regroup.py"     # the drop-in: a DDP script with five lines changed
PLAIN = REPO / "examples" / "ddp_plain.py"        # the same script unchanged: the drop-in's reference
SEED = REPO / "integration" / "seed"   # MindCluster's train_start.sh and manager.py
SEED_MANAGER_PORT = 9601               # where MindCluster's manager listens, on rank 0's pod
ACCELERATOR = "huawei.com/Ascend910"   # what each node advertises (volcano_loop.py)
# The trainers' interpreter: $REGROUP_PYTHON (CI's torch 2.x stage names its venv's), else
# Debian's, else this one.
PYTHON = os.environ.get("REGROUP_PYTHON") or (
    "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable)


def find_binaries(build: Optional[Path] = None) -> Dict[str, str]:
    """regroup-manager, regroup-agent and regroupctl from $REGROUP_BIN_DIR or build/."""
    dirs = [Path(os.environ["REGROUP_BIN_DIR"])] if os.environ.get("REGROUP_BIN_DIR") else []
    dirs.append(build or REPO / "build")
    out = {}
    for name in ("regroup-manager", "regroup-agent", "regroupctl"):
        for d in dirs:
            if (d / name).is_file():
                out[name] = str(d / name)
                break
        else:
            raise FileNotFoundError(f"{name} not found in {', '.join(map(str, dirs))}: run scripts/setup first")
    return out


def free_port(address: str) -> int:
    return free_ports(address, 1)[0]


def free_ports(address: str, n: int) -> List[int]:
    """``n`` distinct free ports: each probe's socket stays open until all are chosen (probing one
    after another can return the same port twice, and a manager then cannot serve both; scenario 7
    failed so in CI)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(n):
            s = stack.enter_context(socket.socket())
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((address, 0))
            ports.append(s.getsockname()[1])
        return ports


# ---------------------------------------------------------------------------------------------
# The job
# ---------------------------------------------------------------------------------------------



@dataclass
class JobSpec:
    """A training job of ``nodes`` pods of ``nproc`` ranks running examples/train_mlp.py, or with
    ``dropin`` examples/ddp_regroup.py (a DistributedDataParallel script adopted in five lines:
    ``micro_batch`` is its per-rank batch, ``dataset`` its samples, and ``steps`` a whole number
    of its epochs)."""
    name: str = "mlp"
    nodes: int = 2
    nproc: int = 2
    steps: int = 40
    tp: int = 1
    pp: int = 1                           # > 1: examples/train_grid.py, pipeline stages (torch 2.x)
    grid: bool = False                    # examples/train_grid.py also with pp 1 (a hand-split tp grid)
    optimizer: str = "sgd"
    step_sleep: float = 0.1
    strategies: str = "retry,recover-in-place,recover,elastic-training,dump,exit"
    fault_scheduling: str = "force"
    wait_reschedule_s: Optional[int] = None
    prefer_elastic: bool = False
    min_dp: Optional[int] = None
    liveness_misses: int = 100            # x heartbeat interval: the hang/liveness timeout (20 s)
    extra_labels: Dict[str, str] = field(default_factory=dict)
    extra_annotations: Dict[str, str] = field(default_factory=dict)
    extra_train: List[str] = field(default_factory=list)
    checkpoint_interval: int = 0          # steps between checkpoints in the cluster's checkpoints/
    dataset: int = 128
    micro_batch: int = 8
    microbatches: int = 4
    seed: int = 1234
    quiet: bool = True
    # MindCluster's own flow: no manager task; each pod runs train_start.sh, which starts
    # manager.py on rank 0 and torchrun everywhere (integration/seed/).
    seed_flow: bool = False
    # spec.minAvailable every pod, as MindCluster's jobs have it (the scheduler lowers it to the
    # elastic minimum once the job runs), rather than the elastic minimum
    min_available_every_pod: bool = False
    dropin: bool = False
    # examples/train_mlp.py --shard: "hsdp" shards the model with FSDP2 over each replica's tp
    # ranks (torch >= 2.6); its reference is the same layout's fault-free run (reference_ranks)
    shard: str = "none"

    @property
    def script(self) -> Path:
        return DROPIN if self.dropin else GRID if self.pp > 1 or self.grid else EXAMPLE

    @property
    def steps_per_epoch(self) -> int:
        """The drop-in's optimizer steps per epoch (its DistributedSampler's batches)."""
        return (self.dataset // (self.nodes * self.nproc)) // self.micro_batch

    def _dropin_args(self) -> List[str]:
        if self.steps % self.steps_per_epoch:
            raise ValueError(f"the drop-in trains whole epochs of {self.steps_per_epoch} steps: "
                             f"{self.steps} steps is not a whole number of them")
        return ["--dataset", str(self.dataset), "--batch-size", str(self.micro_batch),
                "--epochs", str(self.steps // self.steps_per_epoch)]

    @property
    def data(self) -> Dict[str, int]:
        """The sampler's parameters (what the ledger is checked against)."""
        return {"dataset": self.dataset, "micro_batch": self.micro_batch, "microbatches": self.microbatches,
                "seed": self.seed}

    @property
    def job_id(self) -> str:
        return f"default/{self.name}"

    def _data_args(self) -> List[str]:
        return ["--float64", "--dataset", str(self.dataset), "--micro-batch", str(self.micro_batch),
                "--microbatches", str(self.microbatches), "--seed", str(self.seed), "--steps", str(self.steps),
                "--optimizer", self.optimizer, *(["--shard", self.shard] if self.shard != "none" else [])]

    def train_args(self, ledger: Path, out: Path) -> List[str]:
        if self.dropin:
            return [*self._dropin_args(), "--step-sleep", str(self.step_sleep), "--ledger", str(ledger),
                    "--out", str(out), *self.extra_train]
        return [*self._data_args(), "--checksum-interval", "5", "--tp", str(self.tp),
                *(["--pp", str(self.pp)] if self.pp > 1 else []),
                "--step-sleep", str(self.step_sleep), "--ledger", str(ledger), "--out", str(out),
                *(["--quiet"] if self.quiet else []),
                *(["--checkpoint-dir", str(ledger.parent / "checkpoints"), "--checkpoint-interval",
                   str(self.checkpoint_interval)] if self.checkpoint_interval else []),
                *self.extra_train]

    def reference_args(self) -> List[str]:
        """The uninterrupted run whose final weights every run must equal: one plain process,
        or for the drop-in the unmodified script on every rank of the full-size job."""
        if self.dropin:
            return [*self._dropin_args(), *self.extra_train]
        if self.shard != "none":  # the layout's own run: a rank computes its part of a micro-batch
            return [*self._data_args(), "--quiet", "--tp", str(self.tp)]
        return [*self._data_args(), "--quiet"]

    @property
    def reference_ranks(self) -> int:
        """Processes of the reference run: one, but the full-size job's for a sharded or drop-in
        job (one replica would do for a sharded job: a rank's part of a micro-batch depends on
        its position only)."""
        return self.nodes * self.nproc if (self.dropin or self.shard != "none") else 1

    def labels(self) -> Dict[str, str]:
        return {"fault-scheduling": self.fault_scheduling, "pod-rescheduling": "on", **self.extra_labels}

    def annotations(self) -> Dict[str, str]:
        a = {"recover-strategy": self.strategies,
             "regroup.io/tensor-parallel": str(self.tp),
             "regroup.io/pipeline-parallel": str(self.pp),
             "regroup.io/global-batch-size": str(self.micro_batch * self.microbatches),
             "regroup.io/micro-batch-size": str(self.micro_batch),
             "regroup.io/checksum-interval": "5",
             "regroup.io/heartbeat-interval-ms": "200",
             "regroup.io/liveness-misses": str(self.liveness_misses)}
        if self.wait_reschedule_s is not None:
            a["wait-reschedule-timeout"] = str(self.wait_reschedule_s)
        if self.prefer_elastic:
            a["regroup.io/prefer-elastic"] = "true"
        if self.min_dp is not None:
            a["regroup.io/min-data-parallel"] = str(self.min_dp)
        a.update(self.extra_annotations)
        return a

    def volcano_job(self, ledger: Path, out: Path) -> dict:
        """The job as a Volcano Job (what a user submits, and what the manager reads): a manager
        task and the worker task, or in MindCluster's own flow the worker task alone."""
        min_dp = self.min_dp or 1
        replicas_per_pod = max(1, self.nproc // (self.tp * self.pp))
        min_pods = -(-min_dp // replicas_per_pod)
        if self.seed_flow:
            tasks = [{"name": "worker", "replicas": self.nodes,
                      "template": {"spec": {"containers": [self._seed_worker(ledger, out)]}}}]
        else:
            worker_cmd = ["regroup-agent", f"--nproc-per-node={self.nproc}", f"--nnodes={self.nodes}",
                          str(self.script), *self.train_args(ledger, out)]
            tasks = [
                {"name": "manager", "replicas": 1, "template": {"spec": {"containers": [
                    {"name": "manager", "command": ["regroup-manager", "--port=9601"],
                     "resources": {"requests": {"cpu": "1", "memory": "512Mi"}}}]}}},
                {"name": "worker", "replicas": self.nodes, "template": {"spec": {"containers": [
                    {"name": "trainer", "command": worker_cmd,
                     "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
                     "ports": [{"name": "taskd-port", "containerPort": 9601}]}]}}},
            ]
        return {
            "apiVersion": "batch.volcano.sh/v1alpha1",
            "kind": "Job",
            "metadata": {"name": self.name, "namespace": "default", "labels": self.labels(),
                         "annotations": self.annotations()},
            "spec": {
                "schedulerName": "volcano",
                "minAvailable": (self.nodes if self.min_available_every_pod else min_pods)
                + (0 if self.seed_flow else 1),  # the manager's pod
                # no fault policies: the job controller recreates the pod Regroup evicts (a
                # RestartTask would restart the survivors too: deploy/README.md)
                "tasks": tasks,
            },
        }

    def _seed_worker(self, ledger: Path, out: Path) -> dict:
        """The worker container as a MindCluster user writes it: train_start.sh, with the
        downward-API environment a pod template gives."""
        def field_env(name: str, path: str) -> dict:
            return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}
        env = [{"name": "NNODES", "value": str(self.nodes)}, {"name": "NPROC_PER_NODE", "value": str(self.nproc)},
               {"name": "MINDIO_WAIT_MINDX_TIME", "value": "60"},
               field_env("POD_IP", "status.podIP"), field_env("REGROUP_HOST", "status.podIP"),
               field_env("REGROUP_POD_UID", "metadata.uid"), field_env("REGROUP_POD_NAME", "metadata.name"),
               field_env("REGROUP_NODE_NAME", "spec.nodeName")]
        return {"name": "trainer",
                "command": ["/bin/bash", str(SEED / "train_start.sh"), str(self.script), *self.train_args(ledger, out)],
                "env": env,
                # one NPU per process, as MindCluster's pods request them: how the scheduler's
                # side learns the processes per pod
                "resources": {"requests": {"cpu": "1", "memory": "1Gi", ACCELERATOR: self.nproc},
                              "limits": {ACCELERATOR: self.nproc}},
                "ports": [{"name": "taskd-port", "containerPort": SEED_MANAGER_PORT}]}


# ---------------------------------------------------------------------------------------------
# The cluster
# ---------------------------------------------------------------------------------------------


@dataclass
class Pod:
    name: str
    index: int
    node: NodeNet
    uid: str
    process: subprocess.Popen
    log: Path


def refuse_a_used_workdir(workdir: Path) -> None:
    """A run's folder must not hold an earlier run's ledger or weights: the new run would read the
    old ledger as its own (a demo run twice with one --workdir killed its trainer before the job
    had formed, waiting for a step the old ledger already held).

    Raises:
        UsageError: it does, naming what it holds.
    """
    held = [name for name in ("ledger.jsonl", "final.pt") if (workdir / name).exists()]
    if held:
        raise UsageError(f"{workdir} holds an earlier run ({', '.join(held)}): give a new or empty folder, "
                         "or remove it first")


class Cluster:
    """Nodes, the job's manager and its pods, on this machine."""

    def __init__(self, workdir: Path, job: JobSpec, network: str = "auto", log: Callable[[str], None] = print,
                 binaries: Optional[Dict[str, str]] = None, spare_nodes: int = 0, record: bool = False):
        self.scheduler = None  # a VolcanoLoop when Volcano is in the loop (volcano_loop.py)
        self.dir = Path(workdir)
        refuse_a_used_workdir(self.dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.job = job
        self.log = log
        self.bin = binaries or find_binaries()
        self.net = Network.create(network, log=log)
        self.nodes: Dict[str, NodeNet] = {}
        for i in range(job.nodes + spare_nodes):
            self.add_node()
        self.ledger = self.dir / "ledger.jsonl"
        self.out = self.dir / "final.pt"
        self.job_file = self.dir / "job.yaml"
        self.job_file.write_text(yaml.safe_dump(job.volcano_job(self.ledger, self.out), sort_keys=False))
        self.credential = self.dir / "credential"
        self.credential.write_text(secrets.token_hex(24))
        self.credential.chmod(0o600)
        # The job's durable record (--record), kept across manager restarts, when asked for
        self.record: Optional[Path] = self.dir / "record.json" if record else None
        self.manager: Optional[subprocess.Popen] = None
        self.manager_host = self.net.manager_address   # where the manager listens
        self.manager_node: Optional[NodeNet] = None
        self.manager_port, self.http_port = free_ports(self.manager_host, 2)
        self.manager_starts = 0
        self.join_window_s = 120   # the manager's --join-window-s (bench/grid: longer, 8 cold trainers)
        self.pods: Dict[str, Pod] = {}       # by pod name (current incarnation)
        self.exited: List[Pod] = []          # pods that ended, in order
        self.injected: List[dict] = []       # faults injected: {"at": unix s, "fault": ..., ...}
        self._started: List[subprocess.Popen] = []
        self._status_cache: dict = {}
        # Pods' trainer sockets live under a short folder: a Unix socket path has 107 bytes at most.
        self.sockets = Path(tempfile.mkdtemp(prefix="rgsock-"))

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for p in self._started:
            if p.poll() is None:
                for pid in _tree(p.pid):
                    _signal(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)  # what outlived its pod's main process
        for p in self._started:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.net.close()
        shutil.rmtree(self.sockets, ignore_errors=True)

    def add_node(self) -> NodeNet:
        name = f"node-{len(self.nodes)}"
        self.nodes[name] = node = self.net.add_node(name)
        if self.scheduler is not None:
            self.scheduler.on_node_added(node)
        return node

    @property
    def manager_addr(self) -> str:
        return f"{self.manager_host}:{self.manager_port}"

    def _spawn(self, argv: Sequence[str], log: Path, env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
        full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
        with open(log, "ab") as out:
            p = subprocess.Popen(list(argv), env=full_env, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True, cwd=str(self.dir))
        self._started.append(p)
        return p

    def start_manager(self, node: Optional[NodeNet] = None, coordinator: Optional[str] = None,
                      coordinator_credential: Optional[Path] = None) -> None:
        """The job's manager: in this namespace on the bridge's address, or inside ``node`` (as a
        pod bound there); with its embedded engine, or taking decisions from ``coordinator``
        (with ``coordinator_credential``, the job's token there, minted from the cluster key)."""
        self.manager_starts += 1
        if node is not None and node.address != self.manager_host:
            self.manager_host = node.address
            self.manager_port, self.http_port = free_ports("127.0.0.1", 2)
        # With a coordinator the manager is given what MindCluster's manager.py gives it, the job's
        # id and sizes, and learns the labels and annotations from the coordinator; standalone it
        # reads them from the job file.
        job = (["--nodes", str(self.job.nodes), "--nproc-per-node", str(self.job.nproc)] if coordinator
               else ["--job", str(self.job_file)])
        argv = [self.bin["regroup-manager"], *job, "--job-id", self.job.job_id,
                "--listen", self.manager_addr, "--http", f"{self.manager_host}:{self.http_port}",
                "--credential-file", str(self.credential), "--join-window-s", str(self.join_window_s)]
        argv += ["--stay-after-done"]  # the scenarios read /status once the job ended
        argv += self.record_args(coordinator)
        if coordinator:
            argv += ["--coordinator", coordinator]
        if coordinator_credential:
            argv += ["--coordinator-credential-file", str(coordinator_credential)]
        self.manager_node = node
        run = node.wrap(argv) if node is not None else argv
        self.manager = self._spawn(run, self.dir / f"manager-{self.manager_starts}.log")
        wait_for(lambda: self._manager_up() or self.manager.poll() is not None, 30, "the manager to listen")
        if self.manager.poll() is not None:
            raise RuntimeError(f"regroup-manager exited with {self.manager.returncode}:\n"
                               + (self.dir / f"manager-{self.manager_starts}.log").read_text()[-3000:])

    def record_args(self, coordinator: Optional[str] = None) -> List[str]:
        """The manager's durable record: ``--record`` when the cluster keeps one; else, standalone,
        ``--no-record`` (a manager without a coordinator or a record is refused: the scenarios
        that run without one accept that a second manager of the job would train beside it)."""
        if self.record is not None:
            return ["--record", str(self.record)]
        return [] if coordinator else ["--no-record"]

    def _manager_up(self) -> bool:
        try:
            self.status(timeout=1)
            return True
        except OSError:
            return False

    def start(self) -> None:
        """The manager, then pod i of the worker task on node i; with Volcano in the loop, the
        job is submitted and Volcano binds its pods (the loop's kubelet starts them)."""
        if self.scheduler is not None:
            self.scheduler.start()
            self.scheduler.wait_running()
            return
        self.start_manager()
        for i in range(self.job.nodes):
            self.start_pod(i, self.node(i))

    def node(self, i: int) -> NodeNet:
        return list(self.nodes.values())[i]

    def worker_command(self) -> List[str]:
        doc = yaml.safe_load(self.job_file.read_text())
        task = next(t for t in doc["spec"]["tasks"] if t["name"] == "worker")
        return list(task["template"]["spec"]["containers"][0]["command"])

    def node_of(self, index: int) -> str:
        """The node that worker pod ``index`` runs on now."""
        pod = self.pods.get(f"{self.job.name}-worker-{index}")
        return pod.node.name if pod is not None else self.node(index).name

    def replace_pod(self, index: int, node: Optional[NodeNet] = None) -> Pod:
        """The replacement of worker pod ``index``: standalone, started on ``node``; with Volcano in
        the loop, the job controller's new pod, placed by Volcano and started by the loop."""
        if self.scheduler is not None:
            return self.scheduler.wait_replacement(index)
        return self.start_pod(index, node)

    def start_pod(self, index: int, node: NodeNet, uid: Optional[str] = None,
                  cluster_env: Optional[Dict[str, str]] = None) -> Pod:
        """What a kubelet does for a bound pod: runs the worker command inside the node. In the
        seed flow (MindCluster's train_start.sh) ``cluster_env`` is what the cluster gives the
        pod besides its template (see :meth:`seed_env`)."""
        name = f"{self.job.name}-worker-{index}"
        uid = uid or f"{name}-{secrets.token_hex(4)}"
        command = self.worker_command()
        if self.job.seed_flow:
            argv, env = command, {**self._template_env(name, uid, node), **(cluster_env or {})}
        else:
            argv = [self.bin["regroup-agent"], "--python", PYTHON, *command[1:]]
            env = {"REGROUP_MANAGER_ADDR": self.manager_addr, "REGROUP_JOB_ID": self.job.job_id,
                   "REGROUP_POD_UID": uid, "REGROUP_POD_NAME": name, "REGROUP_NODE_NAME": node.name,
                   "REGROUP_HOST": node.address, "PET_NODE_RANK": str(index),
                   "REGROUP_CREDENTIAL_FILE": str(self.credential)}
        env.update(self._image_env(index, node))
        log = self.dir / f"{uid}.log"
        pod = Pod(name, index, node, uid, self._spawn(node.wrap(argv), log, env), log)
        self.pods[name] = pod
        self.log(f"pod {name} started on {node.name} ({node.address})")
        if self.job.seed_flow and index == 0:
            # manager.py runs in this pod: the job's manager is at its address, port 9601.
            self.manager, self.manager_node = pod.process, node
            self.manager_host, self.manager_port = node.address, SEED_MANAGER_PORT
            self.http_port = int(env["REGROUP_MANAGER_HTTP"].rsplit(":", 1)[1])
        return pod

    def _image_env(self, index: int, node: NodeNet) -> Dict[str, str]:
        """What the image and the node give every pod: the library installed (the agent's fork
        server imports it before any script runs), the trainers' sockets, the node's network."""
        env = {"REGROUP_SOCKET_DIR": str(self.sockets / f"{index}-{secrets.token_hex(4)}"),
               "REGROUP_STOP_GRACE_S": "20",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "python"), os.environ.get("PYTHONPATH")])),
               **node.env}
        if self.job.seed_flow:
            # Regroup installed in the image: its binaries, and the torchrun entry point ahead of
            # torch's (`python3 -m regroup.torchrun shim`), which hands over to regroup-agent.
            shims = self.dir / "image-bin"
            if not (shims / "torchrun").exists():
                from regroup.torchrun import write_shim
                write_shim(shims, PYTHON)
            env.update({"PATH": f"{shims}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHON": PYTHON,
                        "REGROUP_BIN_DIR": str(Path(self.bin["regroup-agent"]).parent)})
        return env

    def _template_env(self, name: str, uid: str, node: NodeNet) -> Dict[str, str]:
        """The worker template's env, its downward-API fields resolved as a kubelet does."""
        doc = yaml.safe_load(self.job_file.read_text())
        task = next(t for t in doc["spec"]["tasks"] if t["name"] == "worker")
        fields = {"metadata.name": name, "metadata.uid": uid, "metadata.namespace": "default",
                  "spec.nodeName": node.name, "status.podIP": node.address}
        env = {}
        for e in task["template"]["spec"]["containers"][0].get("env", []):
            ref = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            env[e["name"]] = fields[ref] if ref else str(e.get("value", ""))
        return env

    def seed_env(self, index: int, coordinator: str, coordinator_token: Path) -> Dict[str, str]:
        """What the cluster gives pod ``index`` of a MindCluster job besides its template: its
        rank and rank 0's address (the operator's RANK and MASTER_ADDR), the job's id, the job's
        credential and coordinator token (Secrets), the coordinator's address (its Service), and
        the manager's HTTP address for this harness to read /status."""
        zero = self.pods.get(f"{self.job.name}-worker-0")
        if index != 0 and (zero is None or zero.process.poll() is not None):
            raise RuntimeError("rank 0's pod is not running: MASTER_ADDR is unknown")
        return {"RANK": str(index), "MASTER_ADDR": zero.node.address if index else "",
                "MINDX_TASK_ID": self.job.job_id, "REGROUP_CREDENTIAL_FILE": str(self.credential),
                "REGROUP_COORDINATOR_ADDR": coordinator,
                "REGROUP_COORDINATOR_CREDENTIAL_FILE": str(coordinator_token),
                "REGROUP_MANAGER_HTTP": f"0.0.0.0:{self.http_port}"}

    # -- observing -------------------------------------------------------------------------------

    def status_request(self, http_port: int) -> urllib.request.Request:
        """A GET of a manager's /status on this cluster's bridge: off loopback it needs the job's
        credential."""
        return urllib.request.Request(
            f"http://{self.manager_host}:{http_port}/status",
            headers={"Authorization": "Bearer " + self.credential.read_text().strip()})

    def status(self, timeout: float = 5) -> dict:
        with urllib.request.urlopen(self.status_request(self.http_port), timeout=timeout) as r:
            self._status_cache = json.loads(r.read())
        return self._status_cache

    def events(self) -> List[dict]:
        """The manager's events (at_ms, kind, message), oldest first; the last known if it is down
        (and on Kubernetes those its log has since: KubeLoop.logged_events)."""
        try:
            return self.status().get("events", [])
        except OSError:
            known = self._status_cache.get("events", [])
            since = getattr(self.scheduler, "logged_events", None)
            return known + since(known) if since else known

    def last_step(self) -> int:
        return max((r["step"] for r in read_ledger(self.ledger)), default=-1)

    def trainers(self, node: str) -> List[int]:
        """The trainer processes of the pod on ``node``, by local rank order of start."""
        pod = self.pod_on(node)
        agent = _agent_pid(pod.process.pid)
        return sorted(trainers_of(agent)) if agent else []

    def wait_warm(self, node: str, timeout: float = 120) -> None:
        """Waits until the pod on ``node`` has its fork server ready (its agent says so), so that a
        restarted trainer is forked warm rather than started plainly."""
        pod = self.pod_on(node)
        wait_for(lambda: "fork server ready" in pod.log.read_text(errors="replace")
                 or pod.process.poll() is not None, timeout, f"the fork server of {pod.name}")

    def pod_on(self, node: str) -> Pod:
        for pod in self.pods.values():
            if pod.node.name == node and pod.process.poll() is None:
                return pod
        raise KeyError(f"no running pod on {node}")

    def wait_step(self, step: int, timeout: float = 180) -> None:
        wait_for(lambda: self.last_step() >= step or self.manager.poll() is not None, timeout,
                 f"training to reach step {step}")
        if self.manager.poll() is not None:
            raise AssertionError(f"the manager exited with {self.manager.returncode}\n{self.logs()}")

    def wait_event(self, kind: str, contains: str = "", timeout: float = 120, after_ms: int = 0) -> dict:
        def find():
            for e in self.events():
                if e["kind"] == kind and contains in e["message"] and int(e["at_ms"]) >= after_ms:
                    return e
            return None
        return wait_for(find, timeout, f"a {kind!r} event{' with ' + repr(contains) if contains else ''}", 0.1)

    def wait_pods_exit(self, timeout: float = 300) -> Dict[str, int]:
        """Waits for every current pod to exit; returns pod name -> exit code."""
        deadline = time.monotonic() + timeout
        codes = {}
        for name, pod in self.pods.items():
            try:
                codes[name] = pod.process.wait(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"pod {name} still running after {timeout} s\n{self.logs()}")
        return codes

    def logs(self, tail: int = 2500) -> str:
        parts = []
        for f in sorted(self.dir.glob("*.log")):
            parts.append(f"== {f.name}\n" + f.read_text(errors="replace")[-tail:])
        return "\n".join(parts)

    # -- faults ----------------------------------------------------------------------------------

    def _refresh(self) -> float:
        """The manager's status just before a fault (its generation is what the fault aborts);
        returns the time of the fault (Unix s), taken before it is injected."""
        try:
            self.status(timeout=2)
        except OSError:
            pass
        return time.time()

    def note(self, fault: str, at: Optional[float] = None, **details) -> dict:
        """Records a fault (or another action of the test) at ``at`` (default: now)."""
        record = {"at": at or time.time(), "fault": fault, "step": self.last_step(), **details}
        known = self._status_cache
        if known.get("epoch"):
            record["generation"] = [int(known["epoch"]), int(known.get("generation", 0))]
        self.injected.append(record)
        self.log(f"! {fault}" + "".join(f" {k}={v}" for k, v in details.items()))
        return record

    def kill_trainer(self, node: str, local: int = 0) -> dict:
        at = self._refresh()
        pids = self.trainers(node)
        if local >= len(pids):
            raise AssertionError(f"{node} has {len(pids)} trainers, no local rank {local}")
        _signal(pids[local], signal.SIGKILL)
        return self.note("kill a trainer process", at=at, node=node, pid=pids[local])

    def freeze_trainer(self, node: str, local: int = 0) -> dict:
        at = self._refresh()
        pids = self.trainers(node)
        _signal(pids[local], signal.SIGSTOP)
        return self.note("freeze a trainer (SIGSTOP)", at=at, node=node, pid=pids[local])

    def kill_node(self, node: str, trainers_first: bool = False) -> dict:
        """Every process of the node, at once (SIGKILL), as when its host dies; with
        ``trainers_first``, as when its container is killed process by process (a forced pod
        deletion): an agent then reports a trainer's death before its own."""
        at = self._refresh()
        n = self.nodes[node]
        if self.scheduler is not None:
            self.scheduler.on_node_killed(node)  # its kubelet dies; the node goes NotReady
        pids = set(self.net.pids(n))
        agents = []
        for pod in self.pods.values():
            if pod.node is n:
                pids.update(_tree(pod.process.pid))
                agents.append(_agent_pid(pod.process.pid))
        # The agents first: a host that dies takes its processes down together, and an agent
        # killed after one of its trainers would report that trainer's exit first, a process
        # fault instead of the lost node.
        first = [a for a in agents if a is not None]
        order = first + sorted(pids - set(first))
        for pid in (order[len(first):] + first if trainers_first else order):
            _signal(pid, signal.SIGKILL)
            if trainers_first and pid == order[-1]:
                time.sleep(0.02)  # the agents read the exits before they go
        record = self.note("kill a node", at=at, node=node)
        for pod in self.pods.values():
            if pod.node is n:
                try:
                    pod.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        return record

    def sigterm_pod(self, node: str) -> dict:
        at = self._refresh()
        pod = self.pod_on(node)
        _signal(_agent_pid(pod.process.pid) or pod.process.pid, signal.SIGTERM)
        return self.note("SIGTERM a pod (planned departure)", at=at, node=node, pod=pod.name)

    def npu_fault(self, node: str, level: str = "SeparateNPU") -> dict:
        """MindCluster's device plugin reports an NPU of ``node`` faulty (Volcano in the loop)."""
        at = self._refresh()
        if self.scheduler is None:
            raise AssertionError("an NPU fault is reported through the scheduler: it needs Volcano in the loop")
        self.scheduler.npu_fault(node, level=level)
        return self.note(f"the device plugin reports an NPU fault ({level})", at=at, node=node)

    def cut_network(self, node: str) -> dict:
        at = self._refresh()
        self.net.cut(self.nodes[node])
        return self.note("cut a node's network", at=at, node=node)

    def restore_network(self, node: str) -> dict:
        at = self._refresh()
        self.net.restore(self.nodes[node])
        return self.note("restore a node's network", at=at, node=node)

    def slow_link(self, node: str, rate: str = "1mbit") -> dict:
        at = self._refresh()
        self.net.slow(self.nodes[node], rate)
        return self.note("slow a node's link", at=at, node=node, rate=rate)

    def kill_manager(self) -> dict:
        at = self._refresh()
        for pid in _tree(self.manager.pid):
            _signal(pid, signal.SIGKILL)
        self.manager.wait(timeout=10)
        return self.note("kill the manager's pod", at=at)


# ---------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


_tree = descendants


def _agent_pid(pid: int) -> Optional[int]:
    """The pod's regroup-agent process: ``pid`` itself, or the first of its descendants that is
    one (under ``ip netns exec``, or a pod's shell script and its torchrun)."""
    for p in [pid, *_tree(pid)]:
        try:
            if os.readlink(f"/proc/{p}/exe").endswith("regroup-agent"):
                return p
        except OSError:
            continue
    return None
