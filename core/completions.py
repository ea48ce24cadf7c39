"""Deferred operations settled the moment their job ends, and callers woken with them.

Core keeps one ``ConnectorWatch`` standing on the seam: the connector answers it when
jobs end (``connectors/os/jobs/ended.py``), with their final statuses, and core
records each exactly as a poll's answer would be recorded (``polling.apply``, one
transaction for the lot), then wakes every ``sensorium.operation.wait`` held on them.
The poller keeps polling on the host's own schedule (its clamp bounds how often), so
an answer lost here (core restarting, a connector that predates the watch) only
costs the time until that next poll.

Operations the poller settles (it is another process) wake their waiters through
``changed``'s periodic re-read: a waiter looks at the registry at least every
``RECHECK_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import structlog

from sensorium.shared.deferred import polling
from sensorium.shared.deferred.registry import Registry
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.rpc.client import RpcClient, new_request_id
from sensorium.shared.wire.deferred import DeferredOperationStatus
from sensorium.shared.wire.seam import ConnectorWatch, EndedJobs

log = structlog.get_logger("sensorium.core")
# How long one watch is held by the connector, and how much longer core waits for it.
WATCH_WAIT_MS = 20_000
WATCH_MARGIN_S = 5.0
# After a failed watch; after a connector that does not know the method.
RETRY_S = 0.5
UNSUPPORTED_RETRY_S = 60.0
# A waiter re-reads the registry at least this often (the poller settles there too).
RECHECK_S = 1.0


class Completions:
    def __init__(self, registry: Registry, connector: RpcClient, final_poll_grace_s: float) -> None:
        self.registry = registry
        self.connector = connector
        self.grace_s = final_poll_grace_s
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._after = 0
        self._instance: str | None = None
        self.settled = 0
        self.closed = False

    def __repr__(self) -> str:
        return f"<Completions after={self._after} settled={self.settled}>"

    # -- waiting -----------------------------------------------------------------

    async def changed(self, operation_id: str, timeout_s: float) -> None:
        """Return when ``operation_id`` may have ended (woken by its job's end or by
        ``close``), or after ``timeout_s`` (at most ``RECHECK_S``): then re-read it."""
        if self.closed:
            return
        event = asyncio.Event()
        waiting = self._waiters.setdefault(operation_id, set())
        waiting.add(event)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), max(0.0, min(timeout_s, RECHECK_S)))
        finally:
            waiting.discard(event)
            if not waiting:
                self._waiters.pop(operation_id, None)

    def wake(self, operation_id: str) -> None:
        for event in self._waiters.get(operation_id, ()):
            event.set()

    def close(self) -> None:
        """Core stops: every held wait is answered now."""
        self.closed = True
        for waiting in self._waiters.values():
            for event in waiting:
                event.set()

    # -- the watch ---------------------------------------------------------------

    async def serve(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if not self.connector.connected:
                await _pause(stop, RETRY_S)
                continue
            try:
                ended = await self.connector.call(
                    ConnectorWatch(
                        request_id=new_request_id(),
                        after=self._after,
                        instance_id=self._instance,
                        wait_ms=WATCH_WAIT_MS,
                    ),
                    EndedJobs,
                    WATCH_WAIT_MS / 1000 + WATCH_MARGIN_S,
                )
            except CodedError as exc:
                if exc.code == RuntimeErrorCode.REQUEST_MALFORMED:
                    log.info("completions.unsupported", note="the connector predates the watch")
                    await _pause(stop, UNSUPPORTED_RETRY_S)
                else:
                    await _pause(stop, RETRY_S)
                continue
            self._after, self._instance = ended.seq, ended.instance_id
            if ended.statuses:
                try:
                    await self._settle(ended.statuses)
                except Exception as exc:  # the poller records them at their next poll
                    log.warning("completions.unrecorded", error=repr(exc))
                    await _pause(stop, RETRY_S)

    async def _settle(self, statuses: list[DeferredOperationStatus]) -> None:
        ended = await asyncio.to_thread(self._record, statuses, time.time())
        for operation_id in ended:
            self.wake(operation_id)

    def _record(self, statuses: list[DeferredOperationStatus], now: float) -> list[str]:
        """Each final status as its poll's answer, all in one transaction; the ids whose
        operation is final now."""
        ended: list[str] = []
        with self.registry.batch():
            for status in statuses:
                op = self.registry.get(status.operation_id)
                if op is None or not op.open:
                    continue
                try:
                    settled = polling.apply(self.registry, op, None, status, now, self.grace_s)
                except CodedError as exc:
                    if exc.code == RuntimeErrorCode.STORAGE_UNAVAILABLE:
                        raise
                    continue
                if settled.changed and not settled.operation.open:
                    self.settled += 1
                    ended.append(op.operation_id)
                    log.info(
                        "operation.settled",
                        status=settled.operation.status,
                        by="completion",
                        resumed_flow=settled.resumed_flow,
                        **{"operation/id": op.operation_id},
                    )
        return ended


async def _pause(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
