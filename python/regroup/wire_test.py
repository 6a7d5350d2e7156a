# SPDX-License-Identifier: Apache-2.0
"""Framing of the trainer <-> agent socket."""

import socket
import struct

import pytest

from regroup._proto import wire_pb2 as pb
from regroup.api import ProtocolError
from regroup.wire import MAX_FRAME_BYTES, FrameReader, decode_payload, encode_frame, recv_frame, send_frame


def _vote(step):
    m = pb.TrainerMessage()
    m.vote.generation, m.vote.step, m.vote.ok, m.vote.checksum = 3, step, True, 2**64 - 1
    return m


def test_a_frame_is_a_big_endian_length_then_the_message():
    m = _vote(7)
    frame = encode_frame(m)
    assert struct.unpack(">I", frame[:4])[0] == len(frame) - 4
    assert decode_payload(frame[4:], pb.TrainerMessage) == m


def test_frames_split_at_any_byte_come_out_whole_and_in_order():
    stream = b"".join(encode_frame(_vote(s)) for s in range(50))
    reader = FrameReader()
    got = []
    for i in range(0, len(stream), 3):
        reader.feed(stream[i:i + 3])
        while (payload := reader.next()) is not None:
            got.append(decode_payload(payload, pb.TrainerMessage).vote.step)
    assert got == list(range(50))
    assert reader.buffered == 0


def test_an_empty_message_is_a_zero_length_frame():
    frame = encode_frame(pb.AgentReply())
    assert frame == b"\0\0\0\0"
    reader = FrameReader()
    reader.feed(frame)
    assert reader.next() == b""


def test_a_frame_over_the_bound_is_refused():
    reader = FrameReader(max_bytes=100)
    reader.feed(struct.pack(">I", 101) + b"x" * 10)
    with pytest.raises(ProtocolError, match="101 bytes"):
        reader.next()
    assert MAX_FRAME_BYTES == 16 << 20  # the agent's bound (common/framing.h)


def test_a_payload_that_is_not_the_message_is_a_protocol_error():
    with pytest.raises(ProtocolError, match="not a valid AgentReply"):
        decode_payload(b"\xff\xff\xff", pb.AgentReply)


def test_round_trip_over_a_unix_socket():
    a, b = socket.socketpair()
    with a, b:
        reply = pb.AgentReply()
        reply.start.plan.world_size = 4
        reply.start.plan.ranks.add(local_rank=1, rank=3, replica=1)
        send_frame(a, reply)
        send_frame(a, pb.AgentReply())
        assert recv_frame(b, pb.AgentReply) == reply
        assert recv_frame(b, pb.AgentReply) == pb.AgentReply()
        a.close()
        assert recv_frame(b, pb.AgentReply) is None  # clean end of stream


def test_a_stream_that_ends_inside_a_frame_is_a_protocol_error():
    a, b = socket.socketpair()
    with b:
        a.sendall(struct.pack(">I", 10) + b"abc")
        a.close()
        with pytest.raises(ProtocolError, match="inside a frame"):
            recv_frame(b, pb.AgentReply)
