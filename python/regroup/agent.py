# SPDX-License-Identifier: Apache-2.0
"""The trainer's link to its ``regroup-agent``: one Unix socket, one background thread.

The thread heartbeats (the rank's step and phase) every ``Timeouts.heartbeat`` and reads the
agent's replies. Replies are queued for the training thread in arrival order, except that an
abort (and a broken connection) is also handed at once to a callback on the thread itself: the
training thread may be blocked inside a collective and only the shutdown of that generation's
sockets gets it out (see ``regroup.abort``). A step's outcome is handed to it too, so that the
heartbeats tell a commit at once while the training thread computes the next step.
"""

from __future__ import annotations

import logging
import os
import queue
import select
import socket
import threading
import time
from typing import Callable, Optional, Sequence, Union

from regroup._proto import wire_pb2 as pb
from regroup.api import AgentConnectionError, ProtocolError, Timeouts
from regroup.wire import FrameReader, decode_payload, encode_frame

log = logging.getLogger("regroup")


class LinkLost:
    """Queued when the connection to the agent ends; ``reason`` says how."""

    def __init__(self, reason: str):
        self.reason = reason

    def __repr__(self) -> str:
        return f"LinkLost({self.reason!r})"


Item = Union[pb.AgentReply, LinkLost]


class AgentLink:
    """A connection to the agent's trainer socket.

    Args:
        path: the socket's path ($REGROUP_AGENT_SOCKET).
        local_rank: this process's local rank ($REGROUP_LOCAL_RANK).
        timeouts: heartbeat interval and connect timeout.
        on_urgent: called on the background thread with each AbortGeneration,
            StartGeneration (a newer one ends the generation this rank is in) and StepOutcome,
            and with a LinkLost, before they are queued. It must be quick and must not raise.
    """

    def __init__(self, path: str, local_rank: int, timeouts: Timeouts,
                 on_urgent: Optional[Callable[[Item], None]] = None):
        self.path = path
        self.local_rank = local_rank
        self._timeouts = timeouts
        self._on_urgent = on_urgent
        self._sock: Optional[socket.socket] = None
        self._send_lock = threading.Lock()
        self._queue: "queue.Queue[Item]" = queue.Queue()
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._wake_r, self._wake_w = -1, -1
        self.step = 0
        self.phase = pb.PHASE_STARTING
        self.agent_epoch = 0
        self.lost: Optional[str] = None

    # -- lifecycle ------------------------------------------------------------------------------

    def connect(self, hello: pb.TrainerHello) -> None:
        """Connects, says hello and starts the background thread.

        Raises:
            AgentConnectionError: the socket did not accept a connection within the connect
                timeout, or the hello could not be sent.
        """
        deadline = time.monotonic() + self._timeouts.connect
        last_error: Optional[OSError] = None
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.path)
                break
            except OSError as e:
                sock.close()
                last_error = e
                if time.monotonic() >= deadline:
                    raise AgentConnectionError(
                        f"cannot connect to the agent's socket {self.path} within "
                        f"{self._timeouts.connect} s: {last_error}") from None
                time.sleep(0.05)
        self._sock = sock
        self._wake_r, self._wake_w = os.pipe()
        message = pb.TrainerMessage()
        message.hello.CopyFrom(hello)
        self.send(message)
        self._thread = threading.Thread(target=self._run, name="regroup-agent-link", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stops the thread and closes the socket (idempotent)."""
        self._stop.set()
        if self._wake_w >= 0:
            try:
                os.write(self._wake_w, b"x")
            except OSError:
                pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        self._thread = None
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._wake_r = self._wake_w = -1

    # -- sending --------------------------------------------------------------------------------

    def send(self, message: pb.TrainerMessage) -> None:
        """Sends one message (any thread).

        Raises:
            AgentConnectionError: the connection is gone.
        """
        sock = self._sock
        if sock is None:
            raise AgentConnectionError("the connection to the agent is closed")
        data = encode_frame(message)
        with self._send_lock:
            try:
                sock.sendall(data)
            except OSError as e:
                raise AgentConnectionError(f"cannot write to the agent's socket {self.path}: {e}") from None

    def vote(self, generation: int, step: int, ok: bool, checksum: int) -> None:
        message = pb.TrainerMessage()
        v = message.vote
        v.generation, v.step, v.ok, v.checksum = generation, step, ok, checksum
        self.send(message)

    def fault(self, kind: int, generation: int, step: int, detail: str, early: bool = False,
              peer: str = "", missing_ranks: Sequence[int] = ()) -> None:
        """A fault; ``early``: a sign of which peer is gone, not a fault of its own: a collective
        failed just now, sent before the wait for an abort, naming ``peer`` (its host), or the
        ranks ``missing_ranks`` have not reached the forming generation's store (TrainerFault in
        proto/)."""
        message = pb.TrainerMessage()
        f = message.fault
        f.kind, f.generation, f.step, f.detail = kind, generation, step, detail[:4000]
        f.early, f.peer = early, peer[:256]
        f.missing_ranks.extend(missing_ranks)
        self.send(message)

    def ack(self, directive_id: int) -> None:
        message = pb.TrainerMessage()
        message.ack.directive_id = directive_id
        self.send(message)

    def set_status(self, step: int, phase: int, beat_now: bool = False) -> None:
        """Sets what the heartbeats report; ``beat_now`` sends one at once."""
        self.step = step
        self.phase = phase
        if beat_now:
            self._beat()

    # -- receiving ------------------------------------------------------------------------------

    def get(self, timeout: Optional[float]) -> Optional[Item]:
        """The next reply (or LinkLost) in arrival order; None after ``timeout`` seconds."""
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def get_nowait(self) -> Optional[Item]:
        try:
            return self._queue.get_nowait()
        except queue.Empty:
            return None

    def unget(self, item: Item) -> None:
        """Puts an item back at the head of the queue (for a reply read too early)."""
        with self._queue.mutex:
            self._queue.queue.appendleft(item)
            self._queue.not_empty.notify()

    # -- the background thread ------------------------------------------------------------------

    def _beat(self) -> None:
        message = pb.TrainerMessage()
        message.heartbeat.step = self.step
        message.heartbeat.phase = self.phase
        self.send(message)

    def _lose(self, reason: str) -> None:
        if self.lost is None:
            self.lost = reason
            item = LinkLost(reason)
            if self._on_urgent is not None:
                try:
                    self._on_urgent(item)
                except Exception:  # noqa: BLE001 - the callback must not kill the link thread
                    log.exception("regroup: the abort callback failed")
            self._queue.put(item)

    def _run(self) -> None:
        reader = FrameReader()
        sock = self._sock
        assert sock is not None
        interval = self._timeouts.heartbeat
        next_beat = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_beat:
                try:
                    self._beat()
                except AgentConnectionError as e:
                    self._lose(str(e))
                    return
                next_beat += interval
                if next_beat <= now:
                    next_beat = now + interval
            try:
                ready, _, _ = select.select([sock, self._wake_r], [], [], max(0.0, next_beat - time.monotonic()))
            except (OSError, ValueError) as e:
                if not self._stop.is_set():
                    self._lose(f"the agent's socket failed: {e}")
                return
            if self._wake_r in ready:
                return
            if sock not in ready:
                continue
            try:
                data = sock.recv(1 << 16)
            except OSError as e:
                self._lose(f"cannot read from the agent's socket: {e}")
                return
            if not data:
                self._lose("the agent closed the connection (the agent exited)")
                return
            reader.feed(data)
            try:
                while (payload := reader.next()) is not None:
                    reply = decode_payload(payload, pb.AgentReply)
                    kind = reply.WhichOneof("body")
                    if kind == "welcome":
                        self.agent_epoch = reply.welcome.epoch
                    if kind in ("abort", "start", "outcome") and self._on_urgent is not None:
                        try:
                            self._on_urgent(reply)
                        except Exception:  # noqa: BLE001
                            log.exception("regroup: the abort callback failed")
                    self._queue.put(reply)
            except ProtocolError as e:
                self._lose(str(e))
                return
