# SPDX-License-Identifier: Apache-2.0
"""The link to the agent: hello first, heartbeats, replies in order, aborts handed over at once."""

import struct
import time

import pytest

from regroup._proto import wire_pb2 as pb
from regroup.agent import AgentLink, LinkLost
from regroup.api import AgentConnectionError, Timeouts
from regroup.testing import FakeAgent, wait_for


@pytest.fixture
def agent(tmp_path):
    a = FakeAgent(tmp_path, nproc=2)
    yield a
    a.close()


def _link(agent, urgent=None, rank=1):
    link = AgentLink(agent.socket_path, rank, Timeouts(heartbeat=0.05, connect=2), urgent)
    link.connect(pb.TrainerHello(local_rank=rank, pid=1234, committed_step=-1, heard_commit_step=-1))
    return link


def test_the_hello_comes_first_and_heartbeats_follow_at_the_interval(agent):
    link = _link(agent)
    try:
        wait_for(lambda: len(agent.heartbeats[1]) >= 10, 10, "ten heartbeats")
        assert agent.hellos[1][0].pid == 1234
        link.set_status(7, pb.PHASE_REDUCING)
        wait_for(lambda: agent.heartbeats[1][-1][1].step == 7, 5, "the new status")
        assert agent.heartbeats[1][-1][1].phase == pb.PHASE_REDUCING
        times = [t for t, _ in agent.heartbeats[1][:10]]
        assert 0.02 < (times[-1] - times[0]) / 9 < 0.2
        assert link.get(5).WhichOneof("body") == "welcome"
    finally:
        link.close()


def test_replies_are_queued_in_order_and_an_outcome_and_an_abort_reach_the_callback_at_once(agent):
    urgent = []
    link = _link(agent, urgent.append)
    try:
        wait_for(lambda: agent.connected(1), 5, "the connection")
        agent.send(1, FakeAgent.outcome(1, 3, True))
        agent.send(1, FakeAgent.abort(9, 1, 1, 3, "rank 2 died"))
        agent.send(1, FakeAgent.stop(pb.StopTraining.MODE_EXIT, "bye"))
        kinds = [link.get(5).WhichOneof("body") for _ in range(4)]
        assert kinds == ["welcome", "outcome", "abort", "stop"]
        assert [u.WhichOneof("body") for u in urgent] == ["outcome", "abort"]
        assert urgent[1].abort.reason == "rank 2 died"
    finally:
        link.close()


def test_votes_faults_and_acks_reach_the_agent(agent):
    link = _link(agent, rank=0)
    try:
        link.vote(2, 5, True, 99)
        link.fault(pb.FAULT_KIND_COLLECTIVE_ERROR, 2, 5, "gloo: connection reset")
        link.ack(17)
        assert agent.next(0, ["vote"], 5).vote.checksum == 99
        assert agent.next(0, ["fault"], 5).fault.detail == "gloo: connection reset"
        assert agent.next(0, ["ack"], 5).ack.directive_id == 17
    finally:
        link.close()


def test_an_agent_that_goes_away_is_a_lost_link(agent):
    urgent = []
    link = _link(agent, urgent.append)
    try:
        wait_for(lambda: agent.connected(1), 5, "the connection")
        assert link.get(5).WhichOneof("body") == "welcome"
        agent.close()
        item = link.get(5)
        assert isinstance(item, LinkLost) and "agent" in item.reason
        assert urgent and isinstance(urgent[0], LinkLost)
        with pytest.raises(AgentConnectionError):
            for _ in range(100):  # the socket may take a write or two to report the loss
                link.vote(1, 1, True, 0)
                time.sleep(0.01)
    finally:
        link.close()


def test_an_oversized_frame_from_the_agent_is_a_lost_link(agent):
    link = _link(agent)
    try:
        wait_for(lambda: agent.connected(1), 5, "the connection")
        conn = agent._conns[1]
        with conn.lock:
            conn.sock.sendall(struct.pack(">I", 1 << 30))
        while True:
            item = link.get(5)
            if isinstance(item, LinkLost):
                break
        assert "bound" in item.reason
    finally:
        link.close()


def test_connecting_to_a_missing_socket_fails_after_the_timeout(tmp_path):
    link = AgentLink(str(tmp_path / "none.sock"), 0, Timeouts(connect=0.3))
    started = time.monotonic()
    with pytest.raises(AgentConnectionError, match="none.sock"):
        link.connect(pb.TrainerHello())
    assert time.monotonic() - started < 5
