# SPDX-License-Identifier: Apache-2.0
"""The nodes' network: a Linux network namespace per node, joined by veth pairs to a bridge, or,
where namespaces are not allowed, loopback addresses on this machine.

    net = Network.create()           # namespaces if possible, else loopback (with a notice)
    a = net.add_node("node-0")       # a.address, a.wrap(argv) runs argv inside the node
    net.cut(a); net.restore(a)       # the node's link down / up (namespaces only)
    net.slow(a, "1mbit")             # tc tbf on the node's link (this kernel refuses netem)
    net.close()                      # deletes every namespace, link and bridge it made

Names carry a short id unique to this process, so parallel runs do not collide; a run that died
without cleaning up is cleaned by the next one (its owner's pid is in /run/regroup-integration).
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

STATE_DIR = Path(os.environ.get("REGROUP_NETNS_STATE", "/run/regroup-integration"))
NETNS_ETC = Path("/etc/netns")  # `ip netns exec NS` bind-mounts /etc/netns/NS/* over /etc

# A node's resolver. The host's nameserver is out of a namespace's reach (the bridge does not
# forward), so a lookup would wait out the resolver's timeouts: 5 s twice. torch 2.x looks up
# the name of every address it connects to (c10d's formatSockAddr calls getnameinfo), so each
# generation's store took 10 s to form in the first namespace process to connect. In a cluster
# the pod's DNS answers at once; here a nameserver on the node's own loopback, where nothing
# listens, refuses at once.
NODE_RESOLV_CONF = "# regroup integration node: no DNS, refuse at once\nnameserver 127.0.0.1\n"


class NetworkError(RuntimeError):
    pass


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if check and r.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {r.stderr.strip() or r.returncode}")
    return r


@dataclass
class NodeNet:
    """One node's place on the network."""
    name: str
    index: int
    address: str
    netns: Optional[str] = None     # None: loopback mode
    host_link: Optional[str] = None  # the bridge side of the node's veth pair
    ifname: str = "lo"              # the interface trainers use inside the node (GLOO_SOCKET_IFNAME)
    cut: bool = False
    env: Dict[str, str] = field(default_factory=dict)

    def wrap(self, argv: Sequence[str]) -> List[str]:
        """argv, run inside this node."""
        if self.netns is None:
            return list(argv)
        return ["ip", "netns", "exec", self.netns, *argv]


class Network:
    """Base: the manager's address and how nodes are added, cut and slowed."""

    mode = "?"
    manager_address = "127.0.0.1"

    @staticmethod
    def create(prefer: str = "auto", log=print) -> "Network":
        """Namespaces when allowed (root, `ip netns` works); otherwise loopback with a notice.
        ``prefer``: auto, netns (fail if not allowed) or loopback."""
        if prefer not in ("auto", "netns", "loopback"):
            raise ValueError(f"network mode must be auto, netns or loopback, not {prefer!r}")
        if prefer != "loopback":
            why = NetnsNetwork.unavailable()
            if why is None:
                return NetnsNetwork()
            if prefer == "netns":
                raise NetworkError(f"network namespaces are not available here: {why}")
            log(f"notice: network namespaces are not available ({why}); the nodes run on loopback "
                "addresses of this machine, and network faults (cut, slow) cannot be injected")
        return LoopbackNetwork()

    def add_node(self, name: str) -> NodeNet:
        raise NotImplementedError

    def pids(self, node: NodeNet) -> List[int]:
        """Every process running inside the node (namespaces only; loopback returns [])."""
        return []

    def cut(self, node: NodeNet) -> None:
        raise NetworkError(f"cannot cut {node.name} off the network in {self.mode} mode")

    def restore(self, node: NodeNet) -> None:
        raise NetworkError(f"cannot restore {node.name}'s network in {self.mode} mode")

    def slow(self, node: NodeNet, rate: str) -> None:
        raise NetworkError(f"cannot slow {node.name}'s link in {self.mode} mode")

    def unslow(self, node: NodeNet) -> None:
        raise NetworkError(f"cannot restore {node.name}'s link speed in {self.mode} mode")

    @property
    def can_cut(self) -> bool:
        return False

    def close(self) -> None:
        pass


class LoopbackNetwork(Network):
    """Every node on its own 127.0.x.y address of this machine (all of 127/8 is loopback)."""

    mode = "loopback"

    def __init__(self) -> None:
        self._block = random.randint(1, 250)
        self.nodes: Dict[str, NodeNet] = {}

    def add_node(self, name: str) -> NodeNet:
        index = len(self.nodes)
        node = NodeNet(name, index, f"127.{self._block}.{index // 250}.{index % 250 + 2}",
                       env={"GLOO_SOCKET_IFNAME": "lo"})
        self.nodes[name] = node
        return node


class NetnsNetwork(Network):
    """A bridge in this namespace (the manager's side, its first address) and one namespace per
    node, each with ``eth0`` on a veth pair to the bridge and a default route through it."""

    mode = "netns"

    @staticmethod
    def unavailable() -> Optional[str]:
        if sys.platform != "linux":
            return "not Linux"
        if os.geteuid() != 0:
            return "not root"
        if shutil.which("ip") is None:
            return "no `ip` command (iproute2)"
        probe = f"rgprobe{os.getpid() % 100000}"
        r = _ip("netns", "add", probe, check=False)
        if r.returncode != 0:
            return r.stderr.strip() or "ip netns add failed"
        _ip("netns", "del", probe, check=False)
        return None

    def __init__(self) -> None:
        _clean_stale()
        self.id = f"{os.getpid() % 0xFFFF:04x}{random.randint(0, 255):02x}"
        self.bridge = f"rg{self.id}b"
        self.subnet = _free_subnet()
        hosts = list(self.subnet.hosts())
        self.manager_address = str(hosts[0])
        self._hosts = hosts[10:]
        self.nodes: Dict[str, NodeNet] = {}
        self._record({"pid": os.getpid(), "bridge": self.bridge, "netns": []})
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.manager_address}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def _record(self, state: dict) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        (STATE_DIR / f"{self.id}.json").write_text(json.dumps(state))

    def add_node(self, name: str) -> NodeNet:
        index = len(self.nodes)
        ns, link = f"rg{self.id}n{index}", f"rg{self.id}v{index}"
        address = str(self._hosts[index])
        self.nodes[name] = node = NodeNet(name, index, address, netns=ns, host_link=link, ifname="eth0",
                                          env={"GLOO_SOCKET_IFNAME": "eth0"})
        self._record({"pid": os.getpid(), "bridge": self.bridge, "netns": [n.netns for n in self.nodes.values()]})
        _ip("netns", "add", ns)
        (NETNS_ETC / ns).mkdir(parents=True, exist_ok=True)
        (NETNS_ETC / ns / "resolv.conf").write_text(NODE_RESOLV_CONF)
        _ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", link, "master", self.bridge, "up")
        _ip("-n", ns, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", "eth0")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "route", "add", "default", "via", self.manager_address)
        return node

    def pids(self, node: NodeNet) -> List[int]:
        r = _ip("netns", "pids", node.netns, check=False)
        return [int(p) for p in r.stdout.split()]

    @property
    def can_cut(self) -> bool:
        return True

    def cut(self, node: NodeNet) -> None:
        _ip("link", "set", node.host_link, "down")
        node.cut = True

    def restore(self, node: NodeNet) -> None:
        _ip("link", "set", node.host_link, "up")
        node.cut = False

    def slow(self, node: NodeNet, rate: str) -> None:
        for args in (["tc", "qdisc", "replace", "dev", node.host_link, "root", "tbf", "rate", rate,
                      "burst", "32kbit", "latency", "400ms"],
                     ["ip", "netns", "exec", node.netns, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf",
                      "rate", rate, "burst", "32kbit", "latency", "400ms"]):
            r = subprocess.run(args, capture_output=True, text=True, timeout=20)
            if r.returncode != 0:
                raise NetworkError(f"{' '.join(args)}: {r.stderr.strip()}")

    def unslow(self, node: NodeNet) -> None:
        subprocess.run(["tc", "qdisc", "del", "dev", node.host_link, "root"], capture_output=True, timeout=20)
        subprocess.run(["ip", "netns", "exec", node.netns, "tc", "qdisc", "del", "dev", "eth0", "root"],
                       capture_output=True, timeout=20)

    def close(self) -> None:
        for node in self.nodes.values():
            for pid in self.pids(node):
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
            _del_netns(node.netns)
        _ip("link", "del", self.bridge, check=False)
        try:
            (STATE_DIR / f"{self.id}.json").unlink()
        except FileNotFoundError:
            pass


def _free_subnet() -> ipaddress.IPv4Network:
    used = _ip("-4", "addr", "show").stdout
    for _ in range(200):
        net = ipaddress.ip_network(f"10.{random.randint(200, 250)}.{random.randint(0, 255)}.0/24")
        if f" {net.network_address}".rsplit(".", 1)[0] + "." not in used:
            return net
    raise NetworkError("no free 10.200-250.x.0/24 subnet for the cluster's bridge")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _del_netns(ns: str) -> None:
    _ip("netns", "del", ns, check=False)
    shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)


def _clean_stale() -> None:
    """Removes the namespaces and bridges of runs whose process is gone."""
    if not STATE_DIR.is_dir():
        return
    for f in STATE_DIR.glob("*.json"):
        try:
            state = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if _alive(int(state.get("pid", 0))):
            continue
        for ns in state.get("netns", []):
            _del_netns(ns)
        _ip("link", "del", state.get("bridge", ""), check=False)
        f.unlink(missing_ok=True)
