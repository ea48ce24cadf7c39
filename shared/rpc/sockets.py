"""Socket options in one place, so every hop is bounded the same way."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import zmq

from sensorium.shared.config import ConfigError

DEFAULT_HWM = 10_000
DEFAULT_MAX_MESSAGE = 4 * 1024 * 1024


def configure(sock: zmq.Socket[Any], *, hwm: int, max_message: int) -> None:
    """Bounded queues and no linger: shutdown never waits on unsent messages."""
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.setsockopt(zmq.MAXMSGSIZE, max_message)


def prepare_ipc(endpoint: str) -> None:
    """Make the ipc socket's directory private (0700) before binding in it: only this
    user can then connect, which is the whole of an ipc endpoint's access control.

    A directory shared with others (``/tmp``: sticky or group/world-writable) or owned
    by someone else is refused rather than chmod-ed; so is an abstract socket (``@``),
    which has no file permissions at all.
    """
    if not endpoint.startswith("ipc://"):
        return
    text = endpoint[len("ipc://") :]
    if text.startswith("@") or not text.startswith("/"):
        raise IpcEndpointError(
            f"{endpoint}: an ipc endpoint must be an absolute path in a private directory "
            "(abstract and relative sockets cannot be kept private)"
        )
    parent = Path(text).parent
    try:
        parent.mkdir(parents=True)
    except FileExistsError:
        st = os.stat(parent)
        if st.st_uid != os.geteuid() or st.st_mode & (stat.S_ISVTX | 0o022):
            raise IpcEndpointError(
                f"{endpoint}: {parent} is shared (mode {stat.S_IMODE(st.st_mode):o}, "
                f"uid {st.st_uid}); put ipc sockets in a directory of their own, "
                "such as the state directory's run/"
            ) from None
    os.chmod(parent, 0o700)


class IpcEndpointError(ConfigError):
    """An ipc endpoint whose directory cannot be made private to this user."""


def configure_client(
    sock: zmq.Socket[Any], *, hwm: int, max_message: int, immediate: bool = True
) -> None:
    # Servers bound their replies to max_message; the socket's hard limit sits above it
    # because a reply over the limit is a protocol error that libzmq never reconnects.
    configure(sock, hwm=hwm, max_message=2 * max_message)
    # immediate: queue only to completed connections, so with no peer a send fails at
    # once. Its price: a disconnect drops the replies already received but not yet
    # read — the last answers of a server that stops right after sending them. The RPC
    # clients turn it off: they check the connection before sending themselves.
    sock.setsockopt(zmq.IMMEDIATE, 1 if immediate else 0)
    sock.setsockopt(zmq.RECONNECT_IVL, 50)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)


def purge(sock: zmq.Socket[Any], endpoint: str) -> None:
    """Drop every message queued to ``endpoint`` and connect afresh. A disconnect
    only discards the queue with linger 0: otherwise the old connection lives on to
    deliver it to whichever server comes next."""
    linger = sock.getsockopt(zmq.LINGER)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        sock.disconnect(endpoint)
        sock.connect(endpoint)
    except zmq.ZMQError:
        pass
    finally:
        sock.setsockopt(zmq.LINGER, linger)
