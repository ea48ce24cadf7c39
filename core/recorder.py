"""Recording client requests with their arrival times, for ``sensorium replay``.

Core's request loop hands every decoded client request to :meth:`Recorder.observe`
with the monotonic time it arrived; while a recording runs, the request's bytes go
into ``<state>/recordings/NAME.srec`` (``sensorium-recording.v1``) exactly as they
arrived. Writes are buffered and flushed every second and at stop, so the receive
loop never waits on the disk; a recording ends by itself at ``max_requests``,
``max_bytes`` or ``max_duration_s`` and says which in its status.

Requests refused before they decode (too large, overloaded, shutting down) are not
recorded: a replay re-creates that load, it does not copy its refusals.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

import structlog

from sensorium.shared.clock import rfc3339
from sensorium.shared.config import RecordConfig
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.store import storage_error
from sensorium.shared.wire.client_api import (
    RECORD_CONTROL,
    RecordingStatus,
    RecordingStopReason,
    RecordStart,
    RecordStatusRequest,
    RecordStop,
)
from sensorium.shared.wire.recording import (
    RECORDING_SUFFIX,
    RecordedRequest,
    RecordingHeader,
    frame,
)
from sensorium.shared.wire.seam import POLLER_ROUTING_PREFIX

log = structlog.get_logger("sensorium.core.recorder")

FLUSH_INTERVAL_S = 1.0
_BUFFER = 256 * 1024


class _Recording:
    def __init__(self, path: Path, fh: BinaryIO, req: RecordStart, cfg: RecordConfig) -> None:
        self.path = path
        self.fh = fh
        self.started_at = rfc3339()
        self.t0 = time.monotonic_ns()
        self.requests = 0
        self.bytes = 0
        # A caller may tighten the node's bounds, never widen them.
        self.max_requests = min(req.max_requests or cfg.max_requests, cfg.max_requests)
        self.max_bytes = min(req.max_bytes or cfg.max_bytes, cfg.max_bytes)
        self.max_duration_s = req.max_duration_s
        self.flush_timer: asyncio.TimerHandle | None = None
        self.expire_timer: asyncio.TimerHandle | None = None


class Recorder:
    def __init__(self, directory: Path, cfg: RecordConfig, instance_id: str, version: str) -> None:
        self._dir = directory
        self._cfg = cfg
        self._instance_id = instance_id
        self._version = version
        self._rec: _Recording | None = None
        self._last: RecordingStatus = RecordingStatus(active=False)
        # Files being fsync'd and closed off the loop.
        self._closing: set[asyncio.Future[None]] = set()

    def __repr__(self) -> str:
        return f"<Recorder {self._rec.path if self._rec else 'idle'}>"

    def handlers(self) -> dict[type, Any]:
        return {
            RecordStart: self.on_start,
            RecordStop: self.on_stop,
            RecordStatusRequest: self.on_status,
        }

    async def on_start(self, req: RecordStart) -> RecordingStatus:
        return self.start(req)

    async def on_status(self, _req: RecordStatusRequest) -> RecordingStatus:
        return self.status()

    def start(self, req: RecordStart) -> RecordingStatus:
        if self._rec is not None:
            raise CodedError(
                RuntimeErrorCode.RECORDING_ACTIVE,
                f"a recording is already running into {self._rec.path}; stop it first "
                "(`sensorium record stop`)",
                detail={"path": str(self._rec.path)},
            )
        name = req.name or datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        path = self._dir / f"{name}{RECORDING_SUFFIX}"
        try:
            self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            raise CodedError(
                RuntimeErrorCode.RECORDING_INVALID,
                f"a recording named {name!r} exists ({path}); pick another name",
                detail={"path": str(path)},
            ) from None
        except OSError as exc:
            raise storage_error(exc, path) or exc from None
        rec = _Recording(path, os.fdopen(fd, "wb", buffering=_BUFFER), req, self._cfg)
        header = frame(
            RecordingHeader(
                started_at=rec.started_at,
                core_instance_id=self._instance_id,
                version=self._version,
            )
        )
        rec.fh.write(header)
        rec.bytes = len(header)
        self._rec = rec
        loop = asyncio.get_running_loop()
        rec.flush_timer = loop.call_later(FLUSH_INTERVAL_S, self._tick, rec)
        if rec.max_duration_s is not None:
            rec.expire_timer = loop.call_later(rec.max_duration_s, self._expire, rec)
        log.info(
            "record.started",
            path=str(path),
            max_requests=rec.max_requests,
            max_bytes=rec.max_bytes,
            max_duration_s=rec.max_duration_s,
        )
        return self.status()

    def observe(self, peer: bytes, payload: bytes, request: Any, arrived_ns: int) -> None:
        """Called by the request loop for each admitted request: the hot path. The
        node's own traffic (the poller's polls) and recording control stay out."""
        rec = self._rec
        if (
            rec is None
            or isinstance(request, RECORD_CONTROL)
            or peer.startswith(POLLER_ROUTING_PREFIX)
        ):
            return
        data = frame(RecordedRequest(max(0, arrived_ns - rec.t0), payload))
        if rec.bytes + len(data) > rec.max_bytes:
            self.stop("max-bytes")
            return
        try:
            rec.fh.write(data)
        except OSError as exc:
            log.error("record.write.failed", path=str(rec.path), error=exc.strerror)
            self.stop("write-failed")
            return
        rec.bytes += len(data)
        rec.requests += 1
        if rec.requests >= rec.max_requests:
            self.stop("max-requests")

    def status(self) -> RecordingStatus:
        rec = self._rec
        if rec is None:
            return self._last
        return self._snapshot(rec, None)

    def stop(self, reason: RecordingStopReason) -> RecordingStatus:
        """End the recording now; its file is flushed, fsync'd and closed on a worker
        thread (the request loop never waits on the disk). :meth:`on_stop` awaits that."""
        rec = self._detach(reason)
        if rec is not None:
            fut = asyncio.get_running_loop().run_in_executor(None, self._finish, rec)
            self._closing.add(fut)
            fut.add_done_callback(self._closing.discard)
        return self._last

    async def on_stop(self, _req: RecordStop) -> RecordingStatus:
        rec = self._detach("operator")
        if rec is not None:
            await asyncio.to_thread(self._finish, rec)
        return self._last

    async def wait_closed(self) -> None:
        """Until every stopped recording's file is fsync'd and closed."""
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    def _detach(self, reason: RecordingStopReason) -> _Recording | None:
        rec = self._rec
        if rec is None:
            return None
        self._rec = None
        for timer in (rec.flush_timer, rec.expire_timer):
            if timer is not None:
                timer.cancel()
        self._last = self._snapshot(rec, reason)
        log.info(
            "record.stopped",
            path=str(rec.path),
            reason=reason,
            requests=rec.requests,
            bytes=rec.bytes,
        )
        return rec

    @staticmethod
    def _snapshot(rec: _Recording, stopped: RecordingStopReason | None) -> RecordingStatus:
        """The recording as a status: running while ``stopped`` is None."""
        return RecordingStatus(
            active=stopped is None,
            path=str(rec.path),
            started_at=rec.started_at,
            requests=rec.requests,
            bytes=rec.bytes,
            max_requests=rec.max_requests,
            max_bytes=rec.max_bytes,
            max_duration_s=rec.max_duration_s,
            stopped_reason=stopped,
        )

    def _finish(self, rec: _Recording) -> None:
        try:
            rec.fh.flush()
            os.fsync(rec.fh.fileno())
        except OSError as exc:
            log.error("record.write.failed", path=str(rec.path), error=exc.strerror)
            if self._last.path == str(rec.path):
                self._last = self._snapshot(rec, "write-failed")
        finally:
            with contextlib.suppress(OSError):
                rec.fh.close()

    def close(self) -> None:
        """At core's exit: finish here, the loop is done serving."""
        rec = self._detach("core-stopped")
        if rec is not None:
            self._finish(rec)

    def _tick(self, rec: _Recording) -> None:
        if self._rec is not rec:
            return
        try:
            rec.fh.flush()
        except OSError as exc:
            log.error("record.write.failed", path=str(rec.path), error=exc.strerror)
            self.stop("write-failed")
            return
        rec.flush_timer = asyncio.get_running_loop().call_later(FLUSH_INTERVAL_S, self._tick, rec)

    def _expire(self, rec: _Recording) -> None:
        if self._rec is rec:
            self.stop("max-duration")
