"""Deferred jobs inside the OS connector, as core sees them: acceptance, status, cancel.

An accepted async directive is a row in :class:`~.store.JobStore` before its
acknowledgement leaves; how it then runs is :class:`~.scheduler.JobScheduler`'s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import msgspec
import structlog

from sensorium.connectors.os.jobs.scheduler import (
    JobScheduler,
    Live,
)
from sensorium.connectors.os.jobs.store import Job, NewJob, QueueFull, ack_of, status_of
from sensorium.shared.clock import rfc3339
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.wire.declaration import Declaration
from sensorium.shared.wire.deferred import ConnectorDeferred, DeferredOperationStatus
from sensorium.shared.wire.seam import (
    ConnectorInvoke,
    ConnectorStatusBatch,
    ConnectorStatuses,
    ConnectorWatch,
    EndedJobs,
)

log = structlog.get_logger("sensorium.connector")

# What an `overloaded` refusal of a full queue suggests.
QUEUE_FULL_RETRY_MS = 1000
# Every check of the sync path, raising its CodedError; the declaration when all pass.
Admit = Callable[[ConnectorInvoke], Declaration]

# The record of a claimed job travels with the runner that hands it to the service.
__all__ = ["JobRunner", "Live"]


class JobRunner(JobScheduler):
    """Schedules, runs, answers for and cancels this connector's deferred jobs."""

    # -- acceptance ------------------------------------------------------------

    async def accept(self, req: ConnectorInvoke, admit: Admit) -> ConnectorDeferred:
        """An async directive: the job its ``operation/id`` already names, or a new one
        that passed ``admit``, persisted ``pending`` before the answer leaves (with the
        others accepted at the same moment: one transaction, one fsync)."""
        directive, op = req.directive, req.operation_id
        if op is None:
            raise CodedError(
                RuntimeErrorCode.REQUEST_MALFORMED,
                "an async directive needs the operation/id core reserved for it",
                path="$.operation/id",
            )
        job = self.store.get(op)
        if job is None:
            decl = admit(req)
            job = await self._submit(
                NewJob(
                    operation_id=op,
                    action_id=directive.action_id,
                    directive_id=directive.directive_id,
                    directive=msgspec.msgpack.encode(directive),
                    timeout_ms=min(req.timeout_ms, decl.max_timeout_ms),
                    config_hash=req.config_hash,  # admit() checked it is the catalog's
                    accepted_by=self.instance_id,
                )
            )
        if (job.directive_id, job.action_id) != (directive.directive_id, directive.action_id):
            raise CodedError(
                RuntimeErrorCode.IDEMPOTENCY_CONFLICT,
                f"operation/id {op} names directive {job.directive_id} of {job.action_id}, "
                f"not {directive.directive_id} of {directive.action_id}",
                path="$.operation/id",
            )
        return self.ack(job)

    async def _submit(self, new: NewJob) -> Job:
        if self.stopping:
            raise CodedError(
                RuntimeErrorCode.SHUTTING_DOWN,
                "the connector is stopping and accepts no job; retry shortly",
                retry_after_ms=1000,
            )
        got = await self._submissions.submit(new)
        if isinstance(got, QueueFull):
            full = got
            raise CodedError(
                RuntimeErrorCode.OVERLOADED,
                f"{full.pending} deferred jobs are waiting, the limit is {self.max_pending}; "
                "retry later",
                retry_after_ms=QUEUE_FULL_RETRY_MS,
            ) from None
        job, created = got
        if created:
            log.info(
                "job.accepted",
                action_id=job.action_id,
                timeout_ms=job.timeout_ms,
                **{"directive/id": job.directive_id, "operation/id": job.operation_id},
            )
            self._pump()
        return self.store.get(job.operation_id) or job

    def ack(self, job: Job) -> ConnectorDeferred:
        """The acknowledgement of ``job`` as it is now (a resubmission gets the same)."""
        return ack_of(job, self._profile(job), self.cfg.limits.sigterm_grace_s, time.time())

    # -- status and cancel -----------------------------------------------------

    def status(self, operation_id: str) -> DeferredOperationStatus:
        job = self.store.get(operation_id)
        if job is None:
            return DeferredOperationStatus(
                operation_id=operation_id, status="unknown", updated_at=rfc3339()
            )
        return status_of(job, self._profile(job))

    async def status_batch(self, req: ConnectorStatusBatch) -> ConnectorStatuses:
        """``status`` of each, in the order asked, from one read of the store."""
        jobs = self.store.get_many(req.operation_ids)
        now = rfc3339()
        return ConnectorStatuses(
            statuses=[
                status_of(job, self._profile(job))
                if (job := jobs.get(op)) is not None
                else DeferredOperationStatus(operation_id=op, status="unknown", updated_at=now)
                for op in req.operation_ids
            ]
        )

    async def watch(self, req: ConnectorWatch) -> EndedJobs:
        """The jobs that ended after ``req.after``, held until one has (``ended.py``)."""
        seq, ids, whole = await self.ended.after(
            req.after, req.instance_id, 0.0 if self.stopping else req.wait_ms / 1000
        )
        statuses = [self.status(op) for op in ids]
        return EndedJobs(
            instance_id=self.ended.instance_id,
            seq=seq,
            # A job collected meanwhile is the poller's to find out about.
            statuses=[s for s in statuses if s.status != "unknown"],
            complete=whole,
        )

    async def cancel(self, operation_id: str) -> DeferredOperationStatus:
        """Pending: cancelled, never starts. Running: its processes get SIGTERM, SIGKILL
        after the grace, and the job ends ``cancelled``. Final: unchanged."""
        job = self.store.get(operation_id)
        if job is None or not job.open:
            return self.status(operation_id)
        profile = self._profile(job)
        if profile is not None and profile.cancel_unavailable_reason is not None:
            raise CodedError(
                RuntimeErrorCode.OPERATION_NOT_CANCELABLE,
                f"{job.action_id} jobs cannot be cancelled: {profile.cancel_unavailable_reason}",
                detail={"reason": profile.cancel_unavailable_reason},
            )
        if self.store.cancel_pending(operation_id, time.time()):
            self.ended.add(operation_id)
            log.info("job.cancelled", stage="pending", **{"operation/id": operation_id})
            return self.status(operation_id)
        live = self.live.get(operation_id)
        if live is None or live.task is None:
            return self.status(operation_id)
        # Once its process has exited the job is settling: a cancel cannot stop what
        # already happened, so the job ends as it ends and the answer says how.
        if live.stage != "exited" and not live.cancel_requested:  # one cancel is enough
            live.cancel_requested = True
            if live.stage == "spawning":
                # spawn() answers a cancellation with SIGTERM to the group, the grace,
                # then SIGKILL, and waits for the processes before it returns.
                live.task.cancel()
        # Waited for without passing our own cancellation on to the job.
        await asyncio.wait([live.task])
        return self.status(operation_id)
