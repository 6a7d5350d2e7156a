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


def test_a_failed_collective_wrapped_by_a_library_is_still_a_communication_error():
    # torch.distributed.pipelining's stages re-raise a forward's error as a RuntimeError of their
    # own ("[Stage 1] failed to run forward: ..."), with the collective's error as the cause: a
    # tensor-parallel all-reduce inside a pipeline stage fails that way when a peer dies.
    from regroup.step import is_communication_error
    collective = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:545] "
                              "Read error [10.1.0.3]:48001: Connection reset by peer")
    try:
        try:
            raise collective
        except RuntimeError as e:
            raise RuntimeError("\n[Stage 1] failed to run forward:\nargs: ('Tensor',)\nkwargs: {}") from e
    except RuntimeError as wrapped:
        assert is_communication_error(wrapped)
        assert failed_peer(wrapped) == "10.1.0.3"
    assert not is_communication_error(RuntimeError("[Stage 1] failed to run forward: shape mismatch"))
    assert not is_communication_error(ValueError("a bug in the script"))
