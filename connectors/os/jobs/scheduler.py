"""The connector's deferred jobs run: the scheduler, restart, stop and retention.

The scheduler starts pending jobs in the order they were accepted, at most
``connector_max_running_jobs`` at once, each exactly as a sync directive runs (the
service's execution helper) with its own set of process handles, so a cancel kills
that job's processes and no other.

A job's process lives as long as this connector instance: a start finds the jobs an
earlier instance was running and ends them ``failed`` with ``job-lost``, because
nobody can say any more what their processes did.

A disk that cannot take a write (full, read-only) refuses new jobs with
``storage-unavailable``; jobs already accepted wait, and a finished job keeps its
outcome and holds its slot until its end is on disk: nothing is lost, nothing runs twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

import msgspec
import structlog

from sensorium.connectors.os.jobs.ended import EndedFeed
from sensorium.connectors.os.jobs.store import Job, JobStore, Recovered
from sensorium.connectors.os.jobs.submissions import Submissions
from sensorium.connectors.os.run.spawning import Killable
from sensorium.shared.config import NodeConfig
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.wire.declaration import Declaration, DeferredProfile
from sensorium.shared.wire.outcome import Outcome

log = structlog.get_logger("sensorium.connector")

# How often final jobs past their retention are collected.
COLLECT_EVERY_S = 600.0
STOPPED_MESSAGE = "the connector stopped while this job ran; its processes were killed"
# How often a write the disk refused (full, read-only) is tried again.
STORAGE_RETRY_S = 1.0

Stage = Literal["claimed", "spawning", "exited"]


@dataclass(eq=False)
class Live:
    """A job this instance has claimed: its task, its process handles, how far it got."""

    job: Job
    handles: set[Killable] = field(default_factory=set)
    # claimed: not spawned yet; spawning: its process may be running; exited: settling.
    stage: Stage = "claimed"
    task: asyncio.Task[None] | None = None
    cancel_requested: bool = False
    # Killed because the connector stops, not because anyone cancelled it.
    stopped: bool = False

    def __repr__(self) -> str:
        return (
            f"<Live {self.job.operation_id} {self.job.action_id} {self.stage} "
            f"handles={len(self.handles)} cancel={self.cancel_requested}>"
        )

    def on_stage(self, stage: Stage) -> None:
        """Called by the execution helper; a job cancelled before its spawn never spawns."""
        if stage == "spawning" and self.cancel_requested:
            raise asyncio.CancelledError
        self.stage = stage


RunJob = Callable[[Job, Live], Awaitable[Outcome]]
DeclarationOf = Callable[[str], Declaration | None]


class JobScheduler:
    """Starts, recovers, stops and collects this connector's deferred jobs."""

    def __init__(
        self,
        store: JobStore,
        cfg: NodeConfig,
        instance_id: str,
        run: RunJob,
        declaration_of: DeclarationOf,
    ) -> None:
        self.store = store
        self.cfg = cfg
        self.instance_id = instance_id
        self._run_job = run
        self._declaration_of = declaration_of
        self.max_running = cfg.deferred.connector_max_running_jobs
        self.max_pending = cfg.deferred.connector_max_pending_jobs
        self.live: dict[str, Live] = {}
        self.stopping = False
        self._submissions = Submissions(store, self.max_pending, self._free_slots, self._start)
        self.ended = EndedFeed(instance_id)
        self._collector: asyncio.Task[None] | None = None
        self._config_hash: str | None = None
        # No job starts before the store is truthful about the last instance.
        self._recovered = False
        self._pump_timer: asyncio.TimerHandle | None = None
        # Why the job store cannot be written now, if it cannot.
        self.storage_down: str | None = None

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.instance_id} live={len(self.live)}/{self.max_running} "
            f"stopping={self.stopping} {self.store!r}>"
        )

    # -- lifecycle -------------------------------------------------------------

    def start(self, config_hash: str | None) -> Recovered:
        """Make the store truthful about the last instance, then run what waits: a
        pending job still runs when the catalog (``None``: invalid) is the one it was
        accepted against. A disk that cannot take that now is tried again until it does."""
        self._config_hash = config_hash
        self._collector = asyncio.get_running_loop().create_task(self._collect_forever())
        try:
            found = self._recover()
        except CodedError as exc:
            if exc.code != RuntimeErrorCode.STORAGE_UNAVAILABLE:
                raise
            self._storage_failed(exc)
            self._pump_later()
            return Recovered(lost=[], requeued=[], stale=[])
        self._pump()
        return found

    def _recover(self) -> Recovered:
        def still_valid(job: Job) -> bool:
            return (
                job.config_hash == self._config_hash
                and self._declaration_of(job.action_id) is not None
            )

        found = self.store.recover(self.instance_id, time.time(), still_valid)
        self._recovered = True
        if found.lost or found.stale or found.requeued:
            log.warning(
                "job.recovered",
                lost=found.lost,
                stale=found.stale,
                requeued=len(found.requeued),
            )
        return found

    def begin_stop(self) -> None:
        """No job starts and none is accepted from now on; running ones go on for now."""
        self.stopping = True
        self.ended.close()

    def terminate_all(self) -> int:
        """SIGTERM every spawned job's processes (the connector is stopping); how many."""
        ended = 0
        for live in list(self.live.values()):
            if live.stage == "spawning":
                live.stopped = True
                ended += 1
                for handle in list(live.handles):
                    handle.terminate()
        return ended

    def kill_all(self) -> None:
        """SIGKILL every spawned job's processes; each is then recorded ``shutting-down``."""
        self.stopping = True
        for live in list(self.live.values()):
            if live.stage == "spawning":
                live.stopped = True
                for handle in list(live.handles):
                    handle.kill()

    async def stop(self, timeout_s: float, grace_s: float = 0.0) -> None:
        """Give jobs ``grace_s`` to end (after :meth:`terminate_all`), then wait for their
        records after :meth:`kill_all`; anything left is ended."""
        tasks = [lv.task for lv in self.live.values() if lv.task is not None]
        if tasks and grace_s > 0:
            await asyncio.wait(tasks, timeout=grace_s)
        self.kill_all()
        tasks = [lv.task for lv in self.live.values() if lv.task is not None]
        if tasks:
            _done, still = await asyncio.wait(tasks, timeout=timeout_s)
            for live in list(self.live.values()):
                if live.task in still:
                    live.stopped = True
                    live.task.cancel()
            if still:
                await asyncio.wait(still, timeout=1.0)
        if self._pump_timer is not None:
            self._pump_timer.cancel()
        try:
            left = self.store.fail_running(
                self.instance_id, time.time(), RuntimeErrorCode.SHUTTING_DOWN, STOPPED_MESSAGE
            )
        except CodedError as exc:
            if exc.code != RuntimeErrorCode.STORAGE_UNAVAILABLE:
                raise
            # The next start finds them running for a dead instance: job-lost.
            log.error("job.abandon.unrecorded", error=exc.message, jobs=len(self.live))
            left = []
        if left:
            log.warning("job.abandoned", operations=left)
        if self._collector is not None:
            self._collector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._collector

    # -- the scheduler ---------------------------------------------------------

    def _pump(self) -> None:
        """Start pending jobs in accepted order while a slot is free; a disk that cannot
        take the claim now is tried again shortly."""
        try:
            if not self._recovered:
                self._recover()
            while not self.stopping and len(self.live) < self.max_running:
                job = self.store.claim_next(self.instance_id, time.time())
                if job is None:
                    return
                self._storage_ok()
                self._start([job])
        except CodedError as exc:
            if exc.code != RuntimeErrorCode.STORAGE_UNAVAILABLE:
                raise
            self._storage_failed(exc)
            self._pump_later()

    def _free_slots(self) -> tuple[str, int] | None:
        """Who may claim jobs along with a batch of acceptances, and how many: none
        before the store is truthful about the last instance, or while stopping."""
        free = self.max_running - len(self.live)
        if not self._recovered or self.stopping or free <= 0:
            return None
        return self.instance_id, free

    def _start(self, jobs: list[Job]) -> None:
        """Run jobs already marked ``running`` for this instance."""
        for job in jobs:
            live = Live(job)
            self.live[job.operation_id] = live
            # A context of its own: the request that happened to free the slot is
            # not this job's (its log lines carry its operation/id instead).
            live.task = asyncio.get_running_loop().create_task(
                self._run(live), name=f"job-{job.operation_id}", context=contextvars.Context()
            )

    def _pump_later(self) -> None:
        if self._pump_timer is None and not self.stopping:
            self._pump_timer = asyncio.get_running_loop().call_later(
                STORAGE_RETRY_S, self._pump_again
            )

    def _pump_again(self) -> None:
        self._pump_timer = None
        self._pump()

    def _storage_failed(self, exc: CodedError) -> None:
        if self.storage_down is None:
            log.error("job.storage.unavailable", error=exc.message)
        self.storage_down = exc.message

    def _storage_ok(self) -> None:
        if self.storage_down is not None:
            log.info("job.storage.available")
            self.storage_down = None

    async def _run(self, live: Live) -> None:
        job = live.job
        try:
            if self.stopping and not live.cancel_requested:
                try:
                    self.store.requeue(job.operation_id, self.instance_id, time.time())
                except CodedError as exc:  # the next start calls it lost instead
                    log.error(
                        "job.requeue.failed", code=exc.code, **{"operation/id": job.operation_id}
                    )
                return
            await self._execute(live)
        finally:
            self.live.pop(job.operation_id, None)
            self._pump()

    async def _execute(self, live: Live) -> None:
        job = live.job
        outcome: Outcome | None = None
        code: str | None = None
        message: str | None = None
        t0 = time.monotonic()
        unexpected: asyncio.CancelledError | None = None
        log.info(
            "job.started",
            action_id=job.action_id,
            waited_ms=round((time.time() - job.created_at) * 1000),
            **{"directive/id": job.directive_id, "operation/id": job.operation_id},
        )
        try:
            if live.cancel_requested:
                raise asyncio.CancelledError
            outcome = await self._run_job(job, live)
            status: str = outcome.status
        except CodedError as exc:
            status, code, message = "failed", exc.code, exc.message
        except asyncio.CancelledError as exc:
            if live.cancel_requested:
                status = "cancelled"
            else:
                status, code, message = "failed", RuntimeErrorCode.SHUTTING_DOWN, STOPPED_MESSAGE
                unexpected = exc
        except Exception:
            log.exception("job.crashed", **{"operation/id": job.operation_id})
            status, code = "failed", RuntimeErrorCode.INTERNAL
            message = "the connector failed internally running this job; see its log"
        if live.stopped and status != "cancelled":
            status, code, message = "failed", RuntimeErrorCode.SHUTTING_DOWN, STOPPED_MESSAGE
        await self._finish(
            job,
            status,
            None if outcome is None else msgspec.msgpack.encode(outcome),
            code,
            message,
        )
        log.info(
            "job.finished",
            action_id=job.action_id,
            status=status,
            code=code,
            exit_code=outcome.exit_code if outcome else None,
            signal=outcome.signal if outcome else None,
            duration_ms=round((time.monotonic() - t0) * 1000),
            stdout_bytes=outcome.stdout.bytes_total if outcome else None,
            **{
                "directive/id": job.directive_id,
                "operation/id": job.operation_id,
                "outcome/id": outcome.outcome_id if outcome else None,
            },
        )
        if unexpected is not None:
            raise unexpected

    async def _finish(
        self, job: Job, status: str, outcome: bytes | None, code: str | None, message: str | None
    ) -> None:
        """Record the job's end. While the disk cannot take it the job stays ``running``
        (and holds its slot) with its outcome kept here, and the write is tried again."""
        while True:
            try:
                self.store.finish(
                    job.operation_id,
                    self.instance_id,
                    status,
                    time.time(),
                    outcome=outcome,
                    code=code,
                    message=message,
                )
            except CodedError as exc:
                if exc.code != RuntimeErrorCode.STORAGE_UNAVAILABLE:
                    raise
                self._storage_failed(exc)
                await asyncio.sleep(STORAGE_RETRY_S)
                continue
            self._storage_ok()
            self.ended.add(job.operation_id)
            return

    # -- retention -------------------------------------------------------------

    async def collect(self, now: float | None = None) -> int:
        """Delete final jobs past their retention, one transaction per batch; reads
        never delete, so a status between two collections may still find a job."""
        d = self.cfg.deferred
        before = (time.time() if now is None else now) - d.retention_s
        total = 0
        while True:
            n = self.store.collect(before, d.gc_batch)
            total += n
            if n < d.gc_batch:
                return total
            await asyncio.sleep(0)  # let requests in between batches

    async def _collect_forever(self) -> None:
        while True:
            try:
                n = await self.collect()
            except Exception as exc:
                if isinstance(exc, CodedError) and exc.code == RuntimeErrorCode.STORAGE_UNAVAILABLE:
                    self._storage_failed(exc)
                else:
                    log.exception("job.collect.failed")
            else:
                if n:
                    log.info("job.collected", deleted=n)
            await asyncio.sleep(COLLECT_EVERY_S)

    def _profile(self, job: Job) -> DeferredProfile | None:
        decl = self._declaration_of(job.action_id)
        return None if decl is None else decl.deferred_profile
