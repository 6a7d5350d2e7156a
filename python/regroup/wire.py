# SPDX-License-Identifier: Apache-2.0
"""Framing of the trainer <-> agent socket: a 4-byte big-endian length, then one message.

The same format as common/framing.h on the agent's side. Frames above ``MAX_FRAME_BYTES``
are refused so a broken peer cannot make the reader allocate without limit.
"""

from __future__ import annotations

import socket
import struct
from typing import Optional, Type, TypeVar

from google.protobuf.message import DecodeError, Message

from regroup.api import AgentConnectionError, ProtocolError

MAX_FRAME_BYTES = 16 << 20
HEADER = struct.Struct(">I")

M = TypeVar("M", bound=Message)


def encode_frame(message: Message) -> bytes:
    """Returns the header and payload of one frame holding ``message``."""
    payload = message.SerializeToString()
    if len(payload) > MAX_FRAME_BYTES:
        raise ProtocolError(f"a {type(message).__name__} of {len(payload)} bytes is over the "
                            f"{MAX_FRAME_BYTES}-byte frame bound")
    return HEADER.pack(len(payload)) + payload


def decode_payload(payload: bytes, cls: Type[M]) -> M:
    """Parses one frame's payload as ``cls``.

    Raises:
        ProtocolError: the payload is not a valid ``cls``.
    """
    message = cls()
    try:
        message.ParseFromString(payload)
    except DecodeError as e:
        raise ProtocolError(f"a frame of {len(payload)} bytes is not a valid {cls.__name__}: {e}") from None
    return message


class FrameReader:
    """Splits a byte stream into frame payloads (for a reader that gets bytes in pieces)."""

    def __init__(self, max_bytes: int = MAX_FRAME_BYTES):
        self._max = max_bytes
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        """Appends bytes that arrived."""
        self._buffer += data

    def next(self) -> Optional[bytes]:
        """Returns the next whole payload, or None when more bytes are needed.

        Raises:
            ProtocolError: a header announces a frame over the bound (the stream is lost).
        """
        if len(self._buffer) < HEADER.size:
            return None
        (length,) = HEADER.unpack_from(self._buffer)
        if length > self._max:
            raise ProtocolError(f"the agent announced a frame of {length} bytes, over the "
                                f"{self._max}-byte bound: the connection's framing is lost")
        end = HEADER.size + length
        if len(self._buffer) < end:
            return None
        payload = bytes(self._buffer[HEADER.size:end])
        del self._buffer[:end]
        return payload

    @property
    def buffered(self) -> int:
        """Bytes held that do not yet form a whole frame."""
        return len(self._buffer)


def send_frame(sock: socket.socket, message: Message) -> None:
    """Writes one frame to a blocking socket.

    Raises:
        AgentConnectionError: the socket failed.
    """
    try:
        sock.sendall(encode_frame(message))
    except OSError as e:
        raise AgentConnectionError(f"cannot write to the agent's socket: {e}") from None


def recv_frame(sock: socket.socket, cls: Type[M], max_bytes: int = MAX_FRAME_BYTES) -> Optional[M]:
    """Reads one frame from a blocking socket; None at a clean end of stream.

    Raises:
        ProtocolError: an oversized frame, or a stream that ends inside a frame.
        AgentConnectionError: the socket failed.
    """

    def exactly(n: int, first: bool) -> Optional[bytes]:
        chunks = bytearray()
        while len(chunks) < n:
            try:
                data = sock.recv(n - len(chunks))
            except OSError as e:
                raise AgentConnectionError(f"cannot read from the agent's socket: {e}") from None
            if not data:
                if first and not chunks:
                    return None
                raise ProtocolError(f"the agent's stream ended inside a frame ({len(chunks)} of {n} bytes)")
            chunks += data
        return bytes(chunks)

    header = exactly(HEADER.size, True)
    if header is None:
        return None
    (length,) = HEADER.unpack(header)
    if length > max_bytes:
        raise ProtocolError(f"a frame of {length} bytes is over the {max_bytes}-byte bound")
    payload = exactly(length, False) if length else b""
    return decode_payload(payload, cls)
