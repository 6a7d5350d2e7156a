# SPDX-License-Identifier: Apache-2.0
"""The job's labels and annotations from the Kubernetes API, for a manager started in a pod.

A MindCluster ``manager.py`` gives the manager the job's id and sizes only. The coordinator, when
one is reachable, gives it the rest; where there is none, the manager's pod can still read them
where the user wrote them: its own pod names its owner (``ownerReferences``), a Volcano Job
(``batch.volcano.sh/v1alpha1``) or MindCluster's AscendJob (``mindxdl.gitee.com/v1``), whose
metadata holds the job's labels and annotations. The pod's own labels and annotations come first;
the owning job's replace them key by key (the job is what the user configured). Only the keys
a job configures are taken: MindCluster's (no prefix) and Regroup's (``regroup.io/``).

The pod talks to the API server as every in-cluster client does: ``https://$KUBERNETES_SERVICE_HOST:
$KUBERNETES_SERVICE_PORT``, with the service account's token and CA from
``/var/run/secrets/kubernetes.io/serviceaccount`` (``$REGROUP_SERVICEACCOUNT_DIR`` for another
mount). Its service account needs ``get`` on pods and on the owner's kind in the job's namespace:
``deploy/examples/manager-rbac.yaml``.
"""

from __future__ import annotations

import http.client
import itertools
import json
import os
import re
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Mapping, Optional

SERVICEACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# Owners whose metadata holds a training job's keys: (apiVersion, kind) -> the API path's group part.
OWNERS = {("batch.volcano.sh/v1alpha1", "Job"): "apis/batch.volcano.sh/v1alpha1/namespaces/{ns}/jobs/{name}",
          ("mindxdl.gitee.com/v1", "AscendJob"): "apis/mindxdl.gitee.com/v1/namespaces/{ns}/ascendjobs/{name}"}
TIMEOUT_S = 10.0  # one deadline for a whole job_keys call: every connection, handshake and byte
MAX_BYTES = 4 << 20  # an object larger than this is not a pod or a job
MAX_DEPTH = 100  # a pod or a job nests a few tens of levels; more is not one (json would recurse)
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


class KubeError(RuntimeError):
    """The API could not be asked, or refused (the message says which call and why)."""


@dataclass
class JobKeys:
    labels: Dict[str, str] = field(default_factory=dict)
    annotations: Dict[str, str] = field(default_factory=dict)
    source: str = ""  # "the Kubernetes API: Job team-a/llama (through pod team-a/llama-worker-0)"


def in_cluster(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process runs in a Kubernetes pod that has a service account token."""
    sa = Path(environ.get("REGROUP_SERVICEACCOUNT_DIR") or SERVICEACCOUNT_DIR)
    return bool(environ.get("KUBERNETES_SERVICE_HOST")) and (sa / "token").is_file()


def _depth(body: bytes) -> int:
    """How deep the JSON text's arrays and objects nest (strings skipped), without recursing."""
    brackets = _STRING.sub(b"", body).translate(None, delete=bytes(set(range(256)) - set(b"[]{}")))
    return max(itertools.accumulate(1 if c in b"[{" else -1 for c in brackets), default=0)


class _Client:
    """GETs from the API server, none of them past one deadline. It follows no redirect: the token
    goes only to the API server the pod was given, over TLS (issue 40: urllib followed a redirect
    to plain HTTP and sent the token in clear)."""

    def __init__(self, environ: Mapping[str, str], timeout_s: float = None):
        sa = Path(environ.get("REGROUP_SERVICEACCOUNT_DIR") or SERVICEACCOUNT_DIR)
        host = environ.get("KUBERNETES_SERVICE_HOST", "")
        port = environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise KubeError("KUBERNETES_SERVICE_HOST is not set: not in a Kubernetes pod")
        try:
            self.port = int(port)
            if not 0 < self.port < 65536:
                raise ValueError
        except ValueError:
            raise KubeError(f"KUBERNETES_SERVICE_PORT {port!r} is not a port (1 to 65535)") from None
        self.host = host
        self.timeout_s = TIMEOUT_S if timeout_s is None else timeout_s
        self.deadline = time.monotonic() + self.timeout_s
        try:
            self.token = (sa / "token").read_text().strip()
        except OSError as e:
            raise KubeError(f"cannot read the service account token {sa / 'token'}: {e.strerror}") from None
        if not self.token:
            raise KubeError(f"the service account token {sa / 'token'} is empty")
        try:
            self.namespace = (sa / "namespace").read_text().strip()
        except OSError:
            self.namespace = ""
        try:
            self.tls = ssl.create_default_context(cafile=str(sa / "ca.crt"))
        except (OSError, ssl.SSLError) as e:
            raise KubeError(f"cannot load the API server's CA {sa / 'ca.crt'}: {e}") from None

    def get(self, path: str) -> dict:
        left = self.deadline - time.monotonic()
        late = f"GET /{path}: no complete answer within {self.timeout_s:g} s"
        if left <= 0:
            raise KubeError(late)
        conn = http.client.HTTPSConnection(self.host, self.port, timeout=left, context=self.tls)
        # The deadline holds however slowly the server trickles: at it the socket is shut, and
        # whatever read waits on it ends.
        expired = threading.Event()

        def expire():
            expired.set()
            if conn.sock is not None:
                try:
                    conn.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        timer = threading.Timer(left, expire)
        timer.daemon = True
        timer.start()
        try:
            conn.request("GET", "/" + path, headers={
                "Authorization": "Bearer " + self.token, "Accept": "application/json"})
            r = conn.getresponse()
            if 300 <= r.status < 400:
                raise KubeError(f"GET /{path}: HTTP {r.status} {r.reason}, a redirect to "
                                f"{r.getheader('Location', 'nowhere')!r}: the API client follows none "
                                f"(the service account's token goes to the API server only)")
            if r.status != 200:
                hint = " (the pod's service account needs get on it: deploy/examples/manager-rbac.yaml)" \
                    if r.status == 403 else ""
                raise KubeError(f"GET /{path}: HTTP {r.status} {r.reason}{hint}")
            body = r.read(MAX_BYTES + 1)
        except (http.client.HTTPException, OSError, ValueError) as e:
            if expired.is_set():
                raise KubeError(late) from None
            raise KubeError(f"GET /{path}: {getattr(e, 'reason', None) or e}") from None
        finally:
            timer.cancel()
            conn.close()
        if expired.is_set():
            raise KubeError(late)
        if len(body) > MAX_BYTES:
            raise KubeError(f"GET /{path}: the answer is over {MAX_BYTES} bytes")
        if _depth(body) > MAX_DEPTH:
            raise KubeError(f"GET /{path}: the answer nests arrays or objects deeper than {MAX_DEPTH} "
                            f"levels: not a Kubernetes object")
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError) as e:
            raise KubeError(f"GET /{path}: not JSON ({e})") from None
        if not isinstance(doc, dict):
            raise KubeError(f"GET /{path}: not a JSON object")
        return doc


def _job_key(key: str) -> bool:
    """MindCluster's keys (no prefix) and Regroup's (regroup.io/); not Kubernetes' or other
    tools' prefixed ones (kubectl.kubernetes.io/last-applied-configuration can hold the whole job)."""
    return "/" not in key or key.startswith("regroup.io/")


def _string_map(meta: dict, key: str, what: str) -> Dict[str, str]:
    value = meta.get(key) or {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise KubeError(f"{what}: metadata.{key} is not a map of strings")
    return {k: v for k, v in value.items() if _job_key(k)}


def job_keys(environ: Mapping[str, str] = os.environ, timeout_s: float = None) -> JobKeys:
    """The labels and annotations of this pod and of the job that owns it.

    The pod is ``$POD_NAME`` (else ``$REGROUP_POD_NAME``, else ``$HOSTNAME``, which Kubernetes sets
    to the pod's name) in ``$POD_NAMESPACE`` (else ``$REGROUP_NAMESPACE``, else the service
    account's namespace).

    Every GET of the call ends by one deadline, ``timeout_s`` (TIMEOUT_S) after the call starts.

    Raises:
        KubeError: not in a pod, the API unreachable, refusing, redirecting or too slow, or an
        object malformed; the message names the API path.
    """
    client = _Client(environ, timeout_s)
    pod_name = environ.get("POD_NAME") or environ.get("REGROUP_POD_NAME") or environ.get("HOSTNAME") or ""
    namespace = environ.get("POD_NAMESPACE") or environ.get("REGROUP_NAMESPACE") or client.namespace
    if not pod_name or not namespace:
        raise KubeError("the pod's name or namespace is unknown: set POD_NAME and POD_NAMESPACE "
                        "from the downward API")
    quote = urllib.parse.quote
    what = f"pod {namespace}/{pod_name}"
    pod = client.get(f"api/v1/namespaces/{quote(namespace)}/pods/{quote(pod_name)}")
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
    keys = JobKeys(_string_map(meta, "labels", what), _string_map(meta, "annotations", what),
                   f"the Kubernetes API: {what}")
    owners = meta.get("ownerReferences") or []
    if not isinstance(owners, list):
        raise KubeError(f"{what}: metadata.ownerReferences is not a list")
    for owner in owners:
        if not isinstance(owner, dict):
            continue
        path = OWNERS.get((owner.get("apiVersion"), owner.get("kind")))
        if path is None or not isinstance(owner.get("name"), str):
            continue
        job_what = f"{owner['kind']} {namespace}/{owner['name']}"
        job = client.get(path.format(ns=quote(namespace), name=quote(owner["name"])))
        job_meta = job.get("metadata") if isinstance(job.get("metadata"), dict) else {}
        keys.labels.update(_string_map(job_meta, "labels", job_what))
        keys.annotations.update(_string_map(job_meta, "annotations", job_what))
        keys.source = f"the Kubernetes API: {job_what} (through {what})"
        break
    return keys


def job_keys_or_none(environ: Mapping[str, str] = os.environ, log=print) -> Optional[JobKeys]:
    """:func:`job_keys` in a pod, logging why not instead of raising; None outside a pod."""
    if not in_cluster(environ):
        return None
    try:
        return job_keys(environ)
    except KubeError as e:
        log(f"regroup: the job's keys could not be read from the Kubernetes API: {e}")
        return None
