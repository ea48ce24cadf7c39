"""The reply envelope every server sends: ``request/id`` echoed, then a result or an error."""

from __future__ import annotations

import msgspec

from sensorium.shared.wire.base import OpenMessage


class WireError(OpenMessage, frozen=True, kw_only=True):
    """A coded error reply. ``message`` says what to do; never a traceback."""

    code: str
    message: str
    path: str | None = None
    retry_after_ms: int | None = None
    detail: dict[str, str] = msgspec.field(default_factory=dict)


# MessagePack nil: an error reply's empty result.
NIL = b"\xc0"


class Reply(OpenMessage, frozen=True, kw_only=True):
    """``result`` is the method's result document, MessagePack-encoded in place (nil on error)."""

    request_id: str = msgspec.field(name="request/id")
    ok: bool
    result: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(NIL))
    error: WireError | None = None


class RequestHead(OpenMessage, frozen=True, kw_only=True):
    """The part of any request a server can still read when the rest is malformed."""

    request_id: str | None = msgspec.field(name="request/id", default=None)
    method: str | None = None
