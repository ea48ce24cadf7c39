"""The probe: a server's own health request on its serving path, and its answer.

Every :class:`~.server.RpcServer` answers one before it decodes anything, so a probe
shows the receive loop itself is alive (``RpcServer.check``, ``sensorium status``).
"""

from __future__ import annotations

import msgspec

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
