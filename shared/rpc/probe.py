"""The probe: a server's own health request on its serving path, and its answer.

Every :class:`~.server.RpcServer` answers one before it decodes anything, so a probe
shows the receive loop itself is alive (``RpcServer.check``, ``sensorium status``).
"""

from __future__ import annotations

import asyncio
import os

import msgspec
import zmq
import zmq.asyncio

# A probe: the serving path's own health request, answered by every RpcServer before
# it decodes anything. 0xc1 is a byte MessagePack never uses, so no request starts so.
PROBE = b"\xc1sensorium.probe"


class ProbeReply(msgspec.Struct, frozen=True, kw_only=True):
    """What a server says about itself to a probe: who serves this socket, and how."""

    server: str
    pid: int
    token: str
    inflight: int
    closing: bool


def probe_request() -> bytes:
    return PROBE


def probe_reply(data: bytes) -> ProbeReply | None:
    """The decoded answer to a probe, or None when ``data`` is not one."""
    if not data.startswith(PROBE):
        return None
    try:
        return msgspec.msgpack.decode(data[len(PROBE) :], type=ProbeReply)
    except msgspec.DecodeError:
        return None


async def self_probe(
    ctx: zmq.asyncio.Context,
    endpoint: str,
    inode: tuple[int, int],
    token: str,
    name: str,
    timeout_s: float,
) -> str | None:
    """None when the ipc path clients connect to is still the socket a server bound
    (``inode``) and a probe sent there comes back with its ``token``; else what is
    wrong, in words (another process bound over it, the file is gone, no answer)."""
    path = endpoint[len("ipc://") :]
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"{name}: its ipc socket {path} is gone ({exc.strerror})"
    if (st.st_dev, st.st_ino) != inode:
        return f"{name}: {path} is another socket now, not the one it bound"
    probe = ctx.socket(zmq.DEALER)
    try:
        probe.setsockopt(zmq.LINGER, 0)
        probe.connect(endpoint)
        await probe.send(PROBE, flags=zmq.NOBLOCK)
        data = await asyncio.wait_for(probe.recv(), timeout_s)
    except (TimeoutError, zmq.ZMQError) as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else str(exc)
        return f"{name}: a probe of {endpoint} failed: {why} within {timeout_s}s"
    finally:
        probe.close(linger=0)
    reply = probe_reply(data)
    if reply is None or reply.token != token:
        return f"{name}: {endpoint} was answered by someone else"
    return None
