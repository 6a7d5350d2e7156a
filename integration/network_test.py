# SPDX-License-Identifier: Apache-2.0
"""The local cluster's network: what a node's processes see of it."""

import subprocess

import pytest

import network

needs_netns = pytest.mark.skipif(network.NetnsNetwork.unavailable() is not None,
                                 reason=f"network namespaces: {network.NetnsNetwork.unavailable()}")


@needs_netns
def test_a_name_lookup_on_a_node_is_refused_at_once_not_waited_out():
    # torch 2.x looks up the name of every address it connects to. The host's nameserver is out
    # of a node's reach, so a lookup waited out the resolver (5 s, twice) and each generation's
    # store took 10 s to form. The bound here is below one resolver timeout.
    net = network.NetnsNetwork()
    try:
        a, b = net.add_node("node-a"), net.add_node("node-b")
        resolv = subprocess.run(a.wrap(["cat", "/etc/resolv.conf"]), capture_output=True, text=True,
                                timeout=10)
        assert resolv.stdout == network.NODE_RESOLV_CONF
        lookup = subprocess.run(a.wrap(["getent", "hosts", b.address]), capture_output=True, text=True,
                                timeout=4)
        assert lookup.returncode != 0, lookup.stdout  # no name: refused, and not after a timeout
        folder = network.NETNS_ETC / a.netns
        assert folder.is_dir()
    finally:
        net.close()
    assert not folder.exists(), "the namespace's /etc/netns folder outlived the cluster"
