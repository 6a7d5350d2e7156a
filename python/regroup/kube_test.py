# SPDX-License-Identifier: Apache-2.0
"""The job's keys from the Kubernetes API: a manager's pod asks an API server over TLS, with its
service account's token, as in a cluster (the server here answers the two GETs a pod makes)."""

import json
import socket
import ssl
import stat
import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import regroup
from regroup import kube

TOKEN = "service-account-token"
POD = {"metadata": {"name": "llama-worker-0", "namespace": "team-a",
                    "labels": {"volcano.sh/job-name": "llama", "fault-scheduling": "grace"},
                    "annotations": {"scheduling.k8s.io/group-name": "llama-pg"},
                    "ownerReferences": [{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
                                         "name": "llama", "uid": "u-1", "controller": True}]}}
JOB = {"metadata": {"name": "llama", "namespace": "team-a",
                    "labels": {"fault-scheduling": "force", "pod-rescheduling": "on"},
                    "annotations": {"recover-strategy": "recover,elastic-training,exit",
                                    "wait-reschedule-timeout": "60", "regroup.io/min-data-parallel": "1",
                                    "kubectl.kubernetes.io/last-applied-configuration": "{" + "x" * 200000 + "}"}}}


class _Api(BaseHTTPRequestHandler):
    routes: dict = {}
    seen: list = []

    def do_GET(self):  # noqa: N802 - http.server's name
        self.seen.append((self.path, self.headers.get("Authorization")))
        if self.headers.get("Authorization") != "Bearer " + TOKEN:
            return self._send(401, {"kind": "Status", "message": "Unauthorized"})
        code, body = self.routes.get(self.path, (404, {"kind": "Status", "message": "not found"}))
        self._send(code, body)

    def _send(self, code, body):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    d = tmp_path_factory.mktemp("ca")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=kubernetes", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(d / "key.pem"), "-out", str(d / "ca.crt")],
                   check=True, capture_output=True)
    return d


@pytest.fixture
def api(certificate, tmp_path):
    """An HTTPS server on 127.0.0.1 and the pod's environment that points at it."""
    _Api.routes = {"/api/v1/namespaces/team-a/pods/llama-worker-0": (200, POD),
                   "/apis/batch.volcano.sh/v1alpha1/namespaces/team-a/jobs/llama": (200, JOB)}
    _Api.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(certificate / "ca.crt", certificate / "key.pem")
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(TOKEN + "\n")
    (sa / "namespace").write_text("team-a")
    (sa / "ca.crt").write_bytes((certificate / "ca.crt").read_bytes())
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(server.server_address[1]),
           "REGROUP_SERVICEACCOUNT_DIR": str(sa), "HOSTNAME": "llama-worker-0"}
    yield env
    server.shutdown()
    server.server_close()


def test_the_owning_volcano_jobs_keys_replace_the_pods(api):
    keys = kube.job_keys(api)
    # only the keys a job configures: MindCluster's and regroup.io/ (never a 200 KB kubectl blob)
    assert keys.labels == {"fault-scheduling": "force", "pod-rescheduling": "on"}
    assert keys.annotations == {"recover-strategy": "recover,elastic-training,exit", "wait-reschedule-timeout": "60",
                                "regroup.io/min-data-parallel": "1"}
    assert keys.source == "the Kubernetes API: Job team-a/llama (through pod team-a/llama-worker-0)"
    assert [p for p, _ in _Api.seen] == ["/api/v1/namespaces/team-a/pods/llama-worker-0",
                                         "/apis/batch.volcano.sh/v1alpha1/namespaces/team-a/jobs/llama"]


def test_a_mindcluster_ascendjob_is_an_owner_too(api):
    pod = json.loads(json.dumps(POD))
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "mindxdl.gitee.com/v1", "kind": "AscendJob", "name": "llama"}]
    _Api.routes["/api/v1/namespaces/team-a/pods/llama-worker-0"] = (200, pod)
    _Api.routes["/apis/mindxdl.gitee.com/v1/namespaces/team-a/ascendjobs/llama"] = (200, JOB)
    keys = kube.job_keys(api)
    assert keys.labels["fault-scheduling"] == "force"
    assert keys.source.startswith("the Kubernetes API: AscendJob team-a/llama")


def test_a_pod_without_a_known_owner_gives_its_own_keys(api):
    pod = json.loads(json.dumps(POD))
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "x"}]
    _Api.routes["/api/v1/namespaces/team-a/pods/llama-worker-0"] = (200, pod)
    keys = kube.job_keys(api)
    assert keys.labels["fault-scheduling"] == "grace"
    assert keys.source == "the Kubernetes API: pod team-a/llama-worker-0"


def test_a_refusal_names_the_call_and_the_rbac_it_needs(api):
    _Api.routes["/apis/batch.volcano.sh/v1alpha1/namespaces/team-a/jobs/llama"] = (403, {"kind": "Status"})
    with pytest.raises(kube.KubeError, match=r"GET /apis/batch.volcano.sh/v1alpha1/namespaces/team-a/jobs/llama: "
                                             r"HTTP 403 .*deploy/examples/manager-rbac.yaml"):
        kube.job_keys(api)
    said = []
    assert kube.job_keys_or_none(api, log=said.append) is None
    assert "could not be read from the Kubernetes API" in said[0]


def test_a_malformed_object_is_an_error_naming_it(api):
    pod = json.loads(json.dumps(POD))
    pod["metadata"]["labels"] = ["fault-scheduling=force"]
    _Api.routes["/api/v1/namespaces/team-a/pods/llama-worker-0"] = (200, pod)
    with pytest.raises(kube.KubeError, match="pod team-a/llama-worker-0: metadata.labels is not a map of strings"):
        kube.job_keys(api)
    _Api.routes["/api/v1/namespaces/team-a/pods/llama-worker-0"] = (200, b"<html>")
    with pytest.raises(kube.KubeError, match="not JSON"):
        kube.job_keys(api)


def test_a_server_whose_certificate_the_pod_does_not_trust_is_refused(api, tmp_path):
    other = tmp_path / "other"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=x",
                    "-keyout", str(tmp_path / "k.pem"), "-out", str(other)], check=True, capture_output=True)
    sa = tmp_path / "serviceaccount"
    (sa / "ca.crt").write_bytes(other.read_bytes())
    with pytest.raises(kube.KubeError, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        kube.job_keys(api)


def test_outside_a_pod_nothing_is_asked():
    assert not kube.in_cluster({})
    assert kube.job_keys_or_none({}) is None


def test_a_manager_py_in_a_pod_starts_the_manager_with_the_jobs_keys(api, tmp_path, monkeypatch):
    # MindCluster's manager.py gives the id and sizes; with no coordinator the keys still arrive.
    record = tmp_path / "args"
    fake = tmp_path / "regroup-manager"
    fake.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import sys
        open({str(record)!r}, "w").write("\\n".join(sys.argv[1:]))
        """))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    for k, v in {**api, "REGROUP_BIN_DIR": str(tmp_path)}.items():
        monkeypatch.setenv(k, v)
    regroup.init_manager({"job_id": "team-a/llama", "node_nums": 2, "proc_per_node": 8})
    assert regroup.start_manager() == 0
    args = record.read_text().split("\n")
    assert "fault-scheduling=force" in args and "recover-strategy=recover,elastic-training,exit" in args
    at = args.index("--keys-source")
    assert args[at + 1].startswith("the Kubernetes API: Job team-a/llama")
    assert "--listen" not in args  # $REGROUP_MANAGER_LISTEN, else the manager's 0.0.0.0:9601


# -- a hostile API server (issue 40, finding 6) -------------------------------------------------

class _Hostile:
    """A TLS server with the API server's certificate that answers every request with `answer`
    (a function of the connection), to be what a compromised or misrouted API server can be."""

    def __init__(self, certificate, answer, tls=True):
        self.answer, self.requests, self.stop = answer, [], threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.tls = None
        if tls:
            self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.tls.load_cert_chain(certificate / "ca.crt", certificate / "key.pem")
        self.port = self.sock.getsockname()[1]
        self.threads = [threading.Thread(target=self._serve, daemon=True)]
        self.threads[0].start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            t = threading.Thread(target=self._one, args=(conn,), daemon=True)
            self.threads.append(t)
            t.start()

    def _one(self, conn):
        try:
            conn.settimeout(5)
            if self.tls:
                conn = self.tls.wrap_socket(conn, server_side=True)
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                head += chunk
            self.requests.append(head.decode(errors="replace"))
            self.answer(conn, self)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)
        self.sock.close()


def _env_for(api_env, port):
    return {**api_env, "KUBERNETES_SERVICE_PORT": str(port)}


def test_a_redirect_is_never_followed_and_the_token_never_leaves_for_it(api, certificate):
    # urllib followed a redirect to plain HTTP, sent the token in clear there, and took the empty
    # answer for the pod's keys.
    plain = _Hostile(certificate, lambda c, s: c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"),
                     tls=False)

    def redirect(conn, server):
        conn.sendall(f"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:{plain.port}/steal\r\n"
                     f"Content-Length: 0\r\n\r\n".encode())

    hostile = _Hostile(certificate, redirect)
    try:
        with pytest.raises(kube.KubeError, match=r"GET /api/v1/namespaces/team-a/pods/llama-worker-0: HTTP 302 .*"
                                                 r"a redirect to .*follows none"):
            kube.job_keys(_env_for(api, hostile.port))
        assert plain.requests == [], "the client followed the redirect"
        assert TOKEN in hostile.requests[0]
    finally:
        hostile.close()
        plain.close()


def test_one_deadline_bounds_a_whole_call_to_a_trickling_server(api, certificate):
    # The 5 s timeout was per read: a server trickling a byte a second held job_keys for 90 s.
    def trickle(conn, server):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
        for _ in range(600):  # 60 s at most, far past the 1 s deadline
            if server.stop.is_set():
                return
            conn.sendall(b" ")
            time.sleep(0.1)

    hostile = _Hostile(certificate, trickle)
    try:
        with pytest.raises(kube.KubeError, match=r"GET /api/v1/namespaces/team-a/pods/llama-worker-0: "
                                                 r"no complete answer within 1 s"):
            kube.job_keys(_env_for(api, hostile.port), timeout_s=1.0)
    finally:
        hostile.close()


def test_deeply_nested_json_is_a_clear_error_not_a_recursion_error(api, certificate):
    # 100,000 nested arrays raised an uncaught RecursionError and init_manager crashed.
    body = b"[" * 100000 + b"]" * 100000

    def nested(conn, server):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

    hostile = _Hostile(certificate, nested)
    try:
        with pytest.raises(kube.KubeError, match=r"GET /api/v1/namespaces/team-a/pods/llama-worker-0: .*deeper than "
                                                 r"100 levels"):
            kube.job_keys(_env_for(api, hostile.port))
        said = []
        assert kube.job_keys_or_none(_env_for(api, hostile.port), log=said.append) is None
        assert "deeper than 100 levels" in said[0]
    finally:
        hostile.close()
