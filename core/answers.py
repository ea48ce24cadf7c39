"""What an invoke's caller is answered: the ``sensorium-directive-result.v1`` read off
the directive's outcome record (``core/outcomes.py`` builds both), and the record of
where an admitted directive went (``Dispatched``)."""

from __future__ import annotations

import contextlib

from sensorium.core.allowlist import AllowlistRefs
from sensorium.core.audit import AuditRecord, AuditStore
from sensorium.core.auditread import find
from sensorium.core.outcomes import (
    Dispatched,
    admitted,
    deduplicated,
    executed,
    rejected_result,
    result,
    row,
)
from sensorium.core.records import refusal
from sensorium.core.resolution import ResolutionMap
from sensorium.shared.clock import rfc3339
from sensorium.shared.errors import CodedError
from sensorium.shared.paths import StatePaths
from sensorium.shared.wire.audit import OutcomeRecord
from sensorium.shared.wire.client_api import Invoke
from sensorium.shared.wire.deferred import DeferredOperation
from sensorium.shared.wire.outcome import Outcome
from sensorium.shared.wire.result import DirectiveResult

# How many just-written records wait for their answer, at most.
WRITTEN_KEPT = 1024


class Answers:
    def __init__(self, audit: AuditStore, resolution: ResolutionMap, paths: StatePaths) -> None:
        self._audit = audit
        self._resolution = resolution
        self._allowlist = AllowlistRefs(paths)
        # Outcome records this core has just written, by outcome/id, until the answer
        # that reads them: reading one back from the store cost more than building it.
        self._written: dict[str, OutcomeRecord] = {}

    def written(self, rec: OutcomeRecord) -> None:
        """``rec`` is on disk: the answer may read it from here (the oldest go first, so a
        record whose answer never comes, a flow step's, does not stay)."""
        self._written[rec.outcome_id] = rec
        while len(self._written) > WRITTEN_KEPT:
            del self._written[next(iter(self._written))]

    def __repr__(self) -> str:
        return f"<Answers {self._allowlist!r}>"

    def dispatched(self, dispatched_at: str | None = None) -> Dispatched:
        """The connector the latest report names, with its signed catalog; with
        ``dispatched_at``, responded now."""
        report = self._resolution.report
        return Dispatched(
            connector_id=report.module_id if report is not None else "unknown",
            allowlist=self._allowlist.ref(report) if report is not None else None,
            dispatched_at=dispatched_at,
            responded_at=rfc3339() if dispatched_at is not None else None,
        )

    def file_now(self, rec: AuditRecord) -> bool:
        """``file`` when the queue has room (True); False, and nothing queued, when it
        is full (``file`` then waits for the disk)."""
        return not self._audit.full and self._audit.enqueue(rec)

    def file_given(self, rec: AuditRecord) -> None:
        """``file`` for a record whose receipt its caller already holds: queued now,
        full queue or not, so that a read of the audit that follows waits for it."""
        self._audit.enqueue(rec, past_full=True)

    async def file(self, rec: AuditRecord) -> None:
        """Record a refusal without waiting for the disk: it changed nothing, and a read
        of the audit waits for it (``AuditStore.settled``). Awaited only when the queue
        is full, so that its receipt never names a record that was dropped."""
        if not self.file_now(rec):
            with contextlib.suppress(CodedError):  # logged by the store
                await self._audit.record(rec)

    async def rejected(self, req: Invoke, exc: CodedError) -> DirectiveResult:
        """The ``rejected`` result of a refusal, recorded if it is not yet (a grant or an
        idempotency key refused before ``_invoke`` recorded anything)."""
        outcome_id = exc.detail.get("outcome/id")
        if outcome_id is None:
            rec = refusal(req, "rejection", exc)
            await self.file(rec)
            outcome_id = rec.record_id
        return rejected_result(req.directive, exc, outcome_id)

    async def answer(self, req: Invoke, answer: Outcome | DeferredOperation) -> DirectiveResult:
        """The result of a directive that ran or was admitted, read off its record.

        A keyed directive answered an earlier directive's outcome or handle (same
        ``idempotency/key``) gets a record of its own that points at that one
        (``sensorium/deduplicated-from``): one record per directive, always."""
        d = req.directive
        if isinstance(answer, DeferredOperation):
            ref = (answer.audit_outcome_ref or "").removeprefix("outcome:") or d.directive_id
            rec = self._written.pop(ref, None) or find(self._audit, ref, inline=True)
            if rec is None:  # admitted before outcome records existed
                rec = admitted(d, answer, ref, self.dispatched())
        else:
            rec = self._written.pop(answer.outcome_id, None) or find(
                self._audit, answer.outcome_id, inline=True
            )
            if rec is None or rec.outcome_id != answer.outcome_id:
                # An outcome recorded without its record (an earlier version, or the
                # orphan desk's reconciliation): record it now, for this directive.
                rec = executed(d, answer, [], self.dispatched())
                with contextlib.suppress(CodedError):
                    await self._audit.record(row(rec))
        if rec.directive_id != d.directive_id:
            rec = deduplicated(rec, d)
            with contextlib.suppress(CodedError):
                await self._audit.record(row(rec))
        if isinstance(answer, DeferredOperation):
            return result(rec, deferred=answer)
        return result(rec, answer)
