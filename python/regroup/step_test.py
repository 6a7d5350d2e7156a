# SPDX-License-Identifier: Apache-2.0
"""regroup.step.failed_peer: the peer a failed collective's error names, which the trainer reports
at once so that the manager settles a lost node from its peers' word (issue 37)."""

from regroup.step import failed_peer


def test_the_peer_of_a_gloo_error_is_its_host_and_an_error_naming_none_gives_none():
    closed = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:598] "
                          "Connection closed by peer [10.1.0.3]:41233")
    assert failed_peer(closed) == "10.1.0.3"
    reset = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
                         "Read error [127.0.0.2]:29511: Connection reset by peer")
    assert failed_peer(reset) == "127.0.0.2"
    timed_out = RuntimeError("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] "
                             "Timed out waiting 1800000ms for recv operation to complete")
    assert failed_peer(timed_out) == ""
