"""The DeferredOperationPoller: claims due operations, polls them through core, records.

One loop claims what is due (with leases naming the poller's process, so the leases
of a poller that died mid-poll are released the moment another poller — its own
restart — sees that process gone, and lapse after ``lease_s`` in any case), at most
``max_concurrent_polls`` at once and ``per_module_max_polls`` per owner module. The
claims of one round are asked of core in one message (``sensorium.operation.status-batch``
with ``refresh``; core asks the connector in one message too), each answered on its
own; answers are recorded in batches, one transaction for whatever arrived together.
An operation past its expiry still gets a final poll: it ends with the
job's terminal result if there is one, ``expired`` only if the job is still open.
Owed connector cancels are delivered through core; terminal records past the
retention are collected in bounded batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable
from typing import TypeVar

import structlog

from sensorium.shared.config import DeferredConfig
from sensorium.shared.deferred import polling
from sensorium.shared.deferred.registry import Operation, Registry
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.rpc.client import RpcClient, new_request_id
from sensorium.shared.wire.client_api import (
    OperationCancel,
    OperationStatusBatch,
    OperationStatusRequest,
)
from sensorium.shared.wire.deferred import DeferredOperationStatus, OperationStatuses, StatusEntry

log = structlog.get_logger("sensorium.poller")
MAX_SLEEP_S = 1.0
GC_INTERVAL_S = 60.0
RELEASE_INTERVAL_S = 1.0
CANCEL_INTERVAL_S = 1.0
STATS_INTERVAL_S = 10.0
RECORD_RETRY_S = 1.0
MAX_CANCELS = 16
# The most operations one status message to core carries.
BATCH = 128
Answer = DeferredOperationStatus | CodedError
T = TypeVar("T")


class DeferredOperationPoller:
    def __init__(
        self,
        registry: Registry,
        core: RpcClient,
        cfg: DeferredConfig,
        owner: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry
        self.core = core
        self.cfg = cfg
        self.owner = owner
        self.clock = clock
        self._polls: set[asyncio.Task[None]] = set()
        # Operations being polled (a batch task polls many), and whether core takes
        # batches (False after one that predates them refused).
        self._polling = 0
        self._batched = True
        self._answers: list[tuple[Operation, Answer, float]] = []
        self._answered = asyncio.Event()
        self._wake = asyncio.Event()
        self.polled = 0
        # How late each poll started against its due time, since the last stats line.
        self.lateness: list[float] = []
        self._last_stats = 0.0
        # Owed connector cancels being delivered, and when a failed one may be retried.
        self._cancelling: set[str] = set()
        self._cancel_tasks: set[asyncio.Task[None]] = set()
        self._cancel_tries: dict[str, int] = {}
        self._cancel_after: dict[str, float] = {}
        # Why the registry cannot be written now (disk full, read-only), if it cannot.
        self.storage_down: str | None = None

    def __repr__(self) -> str:
        return f"<DeferredOperationPoller {self.owner} polling={len(self._polls)}>"

    async def run(self, stop: asyncio.Event) -> None:
        recorder = asyncio.create_task(self._record_loop(stop), name="poller-recorder")
        last_gc = last_cancels = last_release = 0.0
        try:
            while not stop.is_set():
                if recorder.done():
                    # A poller that polls but cannot record must not look healthy.
                    raise RuntimeError("the poller's recorder stopped") from (
                        None if recorder.cancelled() else recorder.exception()
                    )
                now = self.clock()
                if now - last_release >= RELEASE_INTERVAL_S:  # at once on start, then often
                    last_release = now
                    await self._release_dead_leases()
                free = self.cfg.max_concurrent_polls - self._polling
                if free > 0:
                    no_claims: list[Operation] = []
                    claims = await self._storage_guard(
                        no_claims,
                        self.registry.claim_due,
                        self.owner,
                        now,
                        self.cfg.lease_s,
                        free,
                        self.cfg.per_module_max_polls,
                    )
                    if claims:  # a lease was written: the registry takes writes again
                        self._storage_ok()
                    self._start_polls(claims)
                if now - last_cancels >= CANCEL_INTERVAL_S:
                    last_cancels = now
                    await self._deliver_owed_cancels(now)
                if now - self._last_stats >= STATS_INTERVAL_S:
                    self._stats(now)
                if now - last_gc >= GC_INTERVAL_S:
                    last_gc = now
                    await self._collect(now)
                await self._sleep(stop)
        finally:
            for task in [*self._polls, *self._cancel_tasks]:
                task.cancel()
            await asyncio.gather(*self._polls, *self._cancel_tasks, return_exceptions=True)
            stop.set()
            with contextlib.suppress(asyncio.CancelledError):
                await recorder

    async def _release_dead_leases(self) -> None:
        no_owners: list[str] = []
        dead = await self._storage_guard(no_owners, self.registry.release_dead_leases, self.owner)
        if dead:
            log.info("poller.leases.released", owners=dead[:8], dead_owners=len(dead))

    async def _storage_guard(self, fallback: T, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` in a thread; ``fallback`` when the registry cannot be written:
        the poller waits for space instead of dying (and being restarted into the same
        full disk). Its leases lapse meanwhile and its claims are taken again later.
        (A call that wrote nothing succeeds on a full disk too, so only the caller can
        tell that the registry takes writes again.)"""
        try:
            result = await asyncio.to_thread(fn, *args)
        except CodedError as exc:
            if exc.code != RuntimeErrorCode.STORAGE_UNAVAILABLE:
                raise
            self._storage_failed(exc)
            return fallback
        return result

    def _storage_failed(self, exc: CodedError) -> None:
        if self.storage_down is None:
            log.error("registry.storage.unavailable", error=exc.message)
        self.storage_down = exc.message

    def _storage_ok(self) -> None:
        if self.storage_down is not None:
            log.info("registry.storage.available")
            self.storage_down = None

    def _start_polls(self, claims: list[Operation]) -> None:
        """One message to core per ``BATCH`` claims (one at a time to a core that
        predates the batch): one status read each, answered each on its own."""
        if self._batched:
            groups = [claims[i : i + BATCH] for i in range(0, len(claims), BATCH)]
            polls = [self._poll_many(group) for group in groups]
        else:
            groups = [[op] for op in claims]
            polls = [self._poll(op) for op in claims]
        for group, poll in zip(groups, polls, strict=True):
            self._polling += len(group)
            task = asyncio.create_task(poll)
            self._polls.add(task)
            task.add_done_callback(functools.partial(self._done, polled=len(group)))

    def _done(self, task: asyncio.Task[None], polled: int = 1) -> None:
        self._polls.discard(task)
        self._polling -= polled
        self._wake.set()

    async def _sleep(self, stop: asyncio.Event) -> None:
        due = await asyncio.to_thread(self.registry.next_due)
        # At least a tick: what falls due meanwhile is claimed (and polled) together.
        tick = max(0.001, self.cfg.poll_tick_s)
        delay = MAX_SLEEP_S if due is None else max(tick, min(due - self.clock(), MAX_SLEEP_S))
        self._wake.clear()
        waits = [asyncio.ensure_future(stop.wait())]
        if self._polling >= self.cfg.max_concurrent_polls:
            waits.append(asyncio.ensure_future(self._wake.wait()))
        _done, pending = await asyncio.wait(waits, timeout=delay, return_when="FIRST_COMPLETED")
        for w in pending:
            w.cancel()

    def _wait_s(self, op: Operation, now: float, note: bool = True) -> float:
        """Never wait past the operation's expiry for an answer, except for the final
        poll of one already past it: that one may wait a whole poll. ``note``: count
        how late this poll starts (once per poll)."""
        if note and op.next_poll_at is not None:
            self._note_lateness(now - op.next_poll_at)
        left = op.expires_at - now
        return (
            self.cfg.poll_timeout_s if left <= 0 else max(0.05, min(self.cfg.poll_timeout_s, left))
        )

    async def _poll_many(self, ops: list[Operation]) -> None:
        now = self.clock()
        wait = min(self._wait_s(op, now) for op in ops)
        try:
            got = await self.core.call(
                OperationStatusBatch(
                    request_id=new_request_id(),
                    operation_ids=[op.operation_id for op in ops],
                    refresh=True,
                    include_result=True,
                ),
                OperationStatuses,
                wait,
            )
        except CodedError as exc:
            if exc.code == RuntimeErrorCode.REQUEST_MALFORMED:
                log.info("poller.batch.unsupported", note="core predates status batches")
                self._batched = False
                await asyncio.gather(*(self._poll(op, noted=True) for op in ops))
                return
            answers: dict[str, Answer] = {op.operation_id: exc for op in ops}
        else:
            answers = {e.operation_id: _answer(e) for e in got.entries}
        at = self.clock()
        for op in ops:
            answer = answers.get(op.operation_id)
            if answer is None:  # an answer that skipped one: not an attempt
                answer = CodedError(RuntimeErrorCode.INTERNAL, "core's batch left it out")
            self.polled += 1
            self._answers.append((op, answer, at))
        self._answered.set()

    async def _poll(self, op: Operation, noted: bool = False) -> None:
        now = self.clock()
        answer: Answer
        # A batch that fell back to this already noted how late it started.
        wait = self._wait_s(op, now, note=not noted)
        try:
            answer = await self.core.call(
                # The raw outcome: it is recorded, and a flow resumes with it.
                OperationStatusRequest(
                    request_id=new_request_id(),
                    operation_id=op.operation_id,
                    refresh=True,
                    include_result=True,
                ),
                DeferredOperationStatus,
                wait,
            )
        except CodedError as exc:
            answer = exc
        self.polled += 1
        self._answers.append((op, answer, self.clock()))
        self._answered.set()

    async def _record_loop(self, stop: asyncio.Event) -> None:
        while not (stop.is_set() and not self._answers and not self._polls):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._answered.wait(), 0.5)
            self._answered.clear()
            if not self._answers:
                continue
            batch, self._answers = self._answers, []
            try:
                owed = await asyncio.to_thread(self._record, batch)
            except Exception as exc:  # busy past the timeout, disk full: retry the batch
                if isinstance(exc, CodedError) and exc.code == RuntimeErrorCode.STORAGE_UNAVAILABLE:
                    self._storage_failed(exc)
                else:
                    log.error("poll.record.failed", error=repr(exc), answers=len(batch))
                self._answers = batch + self._answers
                await asyncio.sleep(RECORD_RETRY_S)
                self._answered.set()
                continue
            self._storage_ok()
            for op in owed:
                self._start_cancel(op)

    def _record(self, batch: list[tuple[Operation, Answer, float]]) -> list[Operation]:
        owed: list[Operation] = []
        with self.registry.batch():
            for op, answer, at in batch:
                try:
                    settled = polling.apply(
                        self.registry, op, self.owner, answer, at, self.cfg.final_poll_grace_s
                    )
                except CodedError as exc:  # the row was collected meanwhile
                    if exc.code == RuntimeErrorCode.STORAGE_UNAVAILABLE:
                        raise  # not this answer's fault: the whole batch is retried
                    log.warning("poll.record.skipped", code=exc.code, **_op(op))
                    continue
                after = settled.operation
                if settled.changed and not after.open:
                    log.info(
                        "operation.settled",
                        status=after.status,
                        attempts=after.attempts,
                        code=after.last_code,
                        resumed_flow=settled.resumed_flow,
                        **_op(op),
                    )
                if after.connector_cancel == "owed":
                    owed.append(after)
        return owed

    def _start_cancel(self, op: Operation) -> None:
        """Deliver an owed connector cancel in its own task (a job's SIGTERM grace must
        not hold up polling); one at a time per operation, backing off when it fails."""
        if op.operation_id in self._cancelling or len(self._cancelling) >= MAX_CANCELS:
            return
        if self._cancel_after.get(op.operation_id, 0.0) > self.clock():
            return
        self._cancelling.add(op.operation_id)
        task = asyncio.create_task(self._cancel(op))
        self._cancel_tasks.add(task)
        task.add_done_callback(self._cancel_tasks.discard)

    async def _cancel(self, op: Operation) -> None:
        try:
            await self.core.call(
                OperationCancel(request_id=new_request_id(), operation_id=op.operation_id),
                DeferredOperationStatus,
                self.cfg.poll_timeout_s,
            )
            self._cancel_tries.pop(op.operation_id, None)
            self._cancel_after.pop(op.operation_id, None)
        except CodedError as exc:
            tries = self._cancel_tries.get(op.operation_id, 0) + 1
            self._cancel_tries[op.operation_id] = tries
            self._cancel_after[op.operation_id] = self.clock() + min(2.0**tries, 300.0)
            log.debug("operation.cancel.retry", code=exc.code, tries=tries, **_op(op))
        finally:
            self._cancelling.discard(op.operation_id)

    async def _deliver_owed_cancels(self, now: float) -> None:
        for op in await asyncio.to_thread(self.registry.owed_cancels, 64):
            self._start_cancel(op)
        # Forget backoffs of cancels no longer owed (delivered by core or collected).
        if len(self._cancel_after) > 4 * MAX_CANCELS:
            self._cancel_after = {k: t for k, t in self._cancel_after.items() if t > now}

    async def _collect(self, now: float) -> None:
        total = 0
        for _ in range(10):  # bounded work per pass; the rest waits for the next one
            n = await self._storage_guard(
                0, self.registry.collect, now, self.cfg.retention_s, self.cfg.gc_batch
            )
            total += n
            if n < self.cfg.gc_batch:
                break
        if total:
            log.info("registry.collected", records=total, retention_s=self.cfg.retention_s)

    def _note_lateness(self, late_s: float) -> None:
        if len(self.lateness) < 200_000:
            self.lateness.append(late_s)

    def _stats(self, now: float) -> None:
        """One line for operators (and the benchmark): how punctual the polls were."""
        self._last_stats = now
        late, self.lateness = sorted(self.lateness), []
        if not late:
            return
        log.info(
            "poller.stats",
            polls=len(late),
            polling=len(self._polls),
            late_p50_ms=round(late[len(late) // 2] * 1000, 1),
            late_p99_ms=round(late[min(len(late) - 1, int(len(late) * 0.99))] * 1000, 1),
            within_250ms=round(sum(1 for x in late if x <= 0.25) / len(late), 4),
        )


def _answer(entry: StatusEntry) -> Answer:
    if entry.status is not None:
        return entry.status
    return CodedError(
        entry.code or RuntimeErrorCode.INTERNAL,
        entry.message or "no status",
        retry_after_ms=entry.retry_after_ms,
    )


def _op(op: Operation) -> dict[str, str]:
    return {"operation/id": op.operation_id}
