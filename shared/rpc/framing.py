"""ROUTER framing: the routing envelope to echo back, and the one body frame.

A DEALER sends ``[body]``; a REQ socket (or a DEALER that speaks like one) sends
``[…, b"", body]`` — an envelope ending in an empty delimiter, with REQ_CORRELATE a
request-id frame before it. The ROUTER prepends the peer's routing id. Whatever the
shape, a request is answered: framing that is not one body after an optional envelope
gets a coded error on the same route, never silence.
"""

from __future__ import annotations

import zmq

from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError


def split_frames(frames: list[bytes]) -> tuple[list[bytes], bytes, CodedError | None]:
    """``(route, body, problem)``: ``route`` is echoed before the reply; ``problem`` is
    set when the framing is wrong (``body`` is then the first body frame, if any, so
    the caller can still read its ``request/id``)."""
    if len(frames) < 2:
        return [], b"", CodedError(RuntimeErrorCode.REQUEST_MALFORMED, "no body frame")
    ident, rest = frames[0], frames[1:]
    if rest == [b""]:
        return [ident], b"", _malformed("the request body is empty")
    try:
        cut = rest.index(b"") + 1
    except ValueError:
        cut = 0  # DEALER: no envelope
    route, body = [ident, *rest[:cut]], rest[cut:]
    if not body:
        # [body, b""]: an empty frame after the body, not an envelope before it.
        return [ident], rest[0], _malformed("an empty frame after the body; send one frame")
    if len(body) > 1:
        return (
            route,
            body[0],
            _malformed(f"a request is one body frame after the envelope; got {len(body)} frames"),
        )
    if not body[0]:
        return route, b"", _malformed("the request body is empty")
    return route, body[0], None


def _malformed(message: str) -> CodedError:
    return CodedError(RuntimeErrorCode.REQUEST_MALFORMED, message, path="$")


def source_fd(frame: zmq.Frame) -> int:
    """The file descriptor of the connection a frame came on; -1 when there is none."""
    try:
        return int(frame.get(zmq.SRCFD))
    except (zmq.ZMQError, TypeError, ValueError):
        return -1


def user_id(frame: zmq.Frame) -> str | None:
    """The ZAP User-Id of the connection a frame came on (the CURVE key), if any."""
    try:
        value = frame.get("User-Id")
    except zmq.ZMQError:
        return None
    return value if isinstance(value, str) and value else None
