"""Socket options in one place, so every hop is bounded the same way."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import zmq

DEFAULT_HWM = 10_000
DEFAULT_MAX_MESSAGE = 4 * 1024 * 1024


def configure(sock: zmq.Socket[Any], *, hwm: int, max_message: int) -> None:
    """Bounded queues and no linger: shutdown never waits on unsent messages."""
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.setsockopt(zmq.MAXMSGSIZE, max_message)


def prepare_ipc(endpoint: str) -> None:
    """Make the ipc socket's directory private (0700) before binding in it."""
    if not endpoint.startswith("ipc://"):
        return
    path = Path(endpoint[len("ipc://") :])
    if str(path).startswith("@"):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)


def configure_client(sock: zmq.Socket[Any], *, hwm: int, max_message: int) -> None:
    # Servers bound their replies to max_message; the socket's hard limit sits above it
    # because a reply over the limit is a protocol error that libzmq never reconnects.
    configure(sock, hwm=hwm, max_message=2 * max_message)
    # Queue only to completed connections: with no peer a send fails at once
    # (mapped to "unavailable") instead of waiting for a peer that may never come.
    sock.setsockopt(zmq.IMMEDIATE, 1)
    sock.setsockopt(zmq.RECONNECT_IVL, 50)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
