"""The recording file: frames, a tail cut by a crash, and core's recorder bounds."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import msgspec
import pytest

from sensorium.core.recorder import Recorder
from sensorium.shared.config import RecordConfig
from sensorium.shared.wire.client_api import Health, RecordStart, RecordStatusRequest
from sensorium.shared.wire.recording import (
    RecordedRequest,
    RecordingError,
    RecordingHeader,
    frame,
    read_recording,
)

HEADER = RecordingHeader(started_at="2026-01-01T00:00:00.000Z", core_instance_id="c", version="0")


def test_a_tail_cut_mid_frame_reads_up_to_the_last_whole_request() -> None:
    data = frame(HEADER) + frame(RecordedRequest(1, b"a")) + frame(RecordedRequest(2, b"bb"))
    for cut in range(1, 8):
        header, entries = read_recording(io.BytesIO(data[:-cut]))
        assert header == HEADER
        assert [e.t_ns for e in entries] == [1]


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00\x00",
        b"\xff\xff\xff\xff",
        b"\x00\x00\x00\x01\x01",
        frame(RecordedRequest(1, b"")),
    ],
)
def test_what_is_not_a_recording_says_so(data: bytes) -> None:
    with pytest.raises(RecordingError):
        read_recording(io.BytesIO(data))


def test_the_recorder_stops_before_passing_its_byte_bound(tmp_path: Path) -> None:
    payload = msgspec.msgpack.encode(Health(request_id="r" * 26))

    async def go() -> None:
        rec = Recorder(tmp_path / "rec", RecordConfig(max_bytes=400), "c", "0")
        status = rec.start(RecordStart(request_id="s", name="b", max_bytes=10_000))
        assert status.max_bytes == 400  # a caller may only tighten the node's bound
        for i in range(100):
            rec.observe(b"client", payload, Health(request_id=str(i)), 10**9 + i)
            rec.observe(b"client", b"", RecordStatusRequest(request_id="x"), 0)  # never recorded
            rec.observe(b"sensorium-poller:01J", payload, Health(request_id="p"), 0)  # nor these
        await rec.wait_closed()
        final = rec.status()
        assert (final.active, final.stopped_reason) == (False, "max-bytes")
        assert final.bytes <= 400 and (tmp_path / "rec" / "b.srec").stat().st_size == final.bytes
        with (tmp_path / "rec" / "b.srec").open("rb") as fh:
            _h, entries = read_recording(fh)
            assert sum(1 for _ in entries) == final.requests > 0

    asyncio.run(go())
