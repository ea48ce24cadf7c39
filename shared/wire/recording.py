"""The recording file (``sensorium-recording.v1``): client requests with arrival times.

A recording is a sequence of frames, each a 4-byte big-endian length and one
MessagePack document: first a :class:`RecordingHeader`, then one
:class:`RecordedRequest` per request core received, in arrival order. Any
MessagePack library reads it; a file cut short by a crash reads up to its last
whole frame.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Annotated, BinaryIO, Literal

import msgspec

from sensorium.shared.wire.base import OpenMessage, Timestamp

RECORDING_SCHEMA: Literal["sensorium-recording.v1"] = "sensorium-recording.v1"
RECORDING_SUFFIX = ".srec"
_LEN = struct.Struct(">I")
# Larger than any request core accepts (limits.max_message_bytes caps at 4 MiB by default).
MAX_FRAME = 64 * 1024 * 1024


class RecordingHeader(OpenMessage, frozen=True, kw_only=True):
    schema: Literal["sensorium-recording.v1"] = RECORDING_SCHEMA
    # Wall-clock time of offset 0: a request arrived at started_at + t_ns.
    started_at: Timestamp
    core_instance_id: str = msgspec.field(name="core/instance-id")
    version: str


class RecordedRequest(msgspec.Struct, frozen=True, array_like=True):
    """``[t_ns, request]``: nanoseconds since the header's ``started_at`` on core's
    monotonic clock, and the request's bytes exactly as they arrived (a
    ``sensorium-client-request.v1`` document, MessagePack)."""

    t_ns: Annotated[int, msgspec.Meta(ge=0)]
    request: bytes


_encoder = msgspec.msgpack.Encoder()
_header_decoder = msgspec.msgpack.Decoder(RecordingHeader)
_entry_decoder = msgspec.msgpack.Decoder(RecordedRequest)


class RecordingError(ValueError):
    """The file is not a recording, or is cut short before its first request."""


def frame(doc: msgspec.Struct) -> bytes:
    body = _encoder.encode(doc)
    return _LEN.pack(len(body)) + body


def _frames(fh: BinaryIO) -> Iterator[bytes]:
    while True:
        head = fh.read(_LEN.size)
        if len(head) < _LEN.size:
            return  # end of file, or a length cut by a crash
        (size,) = _LEN.unpack(head)
        if size > MAX_FRAME:
            raise RecordingError(f"a frame claims {size} bytes; this is not a recording")
        body = fh.read(size)
        if len(body) < size:
            return  # the last frame was being written when the writer died
        yield body


def read_recording(fh: BinaryIO) -> tuple[RecordingHeader, Iterator[RecordedRequest]]:
    """The header, and the requests lazily (a recording may hold a million)."""
    frames = _frames(fh)
    try:
        header = _header_decoder.decode(next(frames))
    except StopIteration:
        raise RecordingError("the file is empty or cut short before its header") from None
    except msgspec.DecodeError as exc:
        raise RecordingError(f"not a {RECORDING_SCHEMA} file: {exc}") from None

    def entries() -> Iterator[RecordedRequest]:
        for body in frames:
            try:
                yield _entry_decoder.decode(body)
            except msgspec.DecodeError as exc:
                raise RecordingError(f"a recorded request does not decode: {exc}") from None

    return header, entries()
