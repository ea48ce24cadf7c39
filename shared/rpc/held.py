"""Replies a restarting peer missed, kept for its return.

A server's ``hold_for`` peer (core on the connector seam) has a fixed routing id; a
reply produced while it restarts cannot be sent, and the late replies its new
incarnation reconciles are exactly these. Bounded in count and bytes: past either,
a reply is dropped, counted and logged.
"""

from __future__ import annotations

import collections

import zmq

from sensorium.shared.logs import LibraryLogger
from sensorium.shared.rpc.channel import Channel

HOLD_MAX_REPLIES = 1024
HOLD_MAX_BYTES = 64 * 1024 * 1024
log = LibraryLogger("sensorium.rpc")


class HeldReplies:
    """What ``peer`` missed, oldest first."""

    def __init__(self, peer: bytes, server: str) -> None:
        self.peer = peer
        self.server = server
        self.dropped = 0
        self._replies: collections.deque[bytes] = collections.deque()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._replies)

    def hold(self, data: bytes, rid: str) -> None:
        if len(self._replies) >= HOLD_MAX_REPLIES or self._bytes + len(data) > HOLD_MAX_BYTES:
            self.dropped += 1
            log.error(
                "rpc.reply.hold_full",
                server=self.server,
                held=len(self._replies),
                dropped=self.dropped,
                **{"request/id": rid},
            )
            return
        self._replies.append(data)
        self._bytes += len(data)
        log.info(
            "rpc.reply.held", server=self.server, held=len(self._replies), **{"request/id": rid}
        )

    def redeliver(self, sock: Channel) -> None:
        """The peer is back: hand it what it missed, oldest first."""
        sent = 0
        while self._replies:
            data = self._replies[0]
            try:
                sock.send_multipart([self.peer, data])
            except zmq.ZMQError:
                break  # gone again; keep the rest for its next return
            self._replies.popleft()
            self._bytes -= len(data)
            sent += 1
        log.info("rpc.reply.redelivered", server=self.server, replies=sent, held=len(self._replies))
