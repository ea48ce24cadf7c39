"""Sync directives out to the connector and back: the dispatch intent on disk first,
the scoped signer grant for the dispatch, the connector's outcome, and a rejoin of an
earlier attempt after a restart (``core/rejoin.py``); at stop, the interrupt of what
still runs so each caller gets a definite outcome."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import structlog

from sensorium.core.audit import REJOIN_ONLY, AuditStore, PriorDispatch, settle_as_never_run
from sensorium.core.records import dispatch_intent
from sensorium.core.rejoin import journal_never_started, never_started
from sensorium.core.resolution import ResolutionMap
from sensorium.core.signer.server import Signer
from sensorium.shared.config import Limits
from sensorium.shared.diagnostics import OsErrorCode, RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.rpc.client import RpcClient, new_request_id
from sensorium.shared.wire.client_api import Invoke
from sensorium.shared.wire.outcome import Outcome
from sensorium.shared.wire.seam import (
    ConnectorInterrupt,
    ConnectorInvoke,
    ConnectorStarts,
    InterruptAnswer,
    StartsAnswer,
)

log = structlog.get_logger("sensorium.core")
# At stop: how long the connector has to answer an interrupt, and how long core then
# waits for the interrupted directives' outcomes (a killed group ends at once).
INTERRUPT_TIMEOUT_S = 2.0
INTERRUPT_DRAIN_S = 5.0
REPORT_TIMEOUT_S = 5.0


class Dispatcher:
    def __init__(
        self,
        *,
        resolution: ResolutionMap,
        limits: Limits,
        audit: AuditStore,
        connector: RpcClient,
        signer: Signer,
        instance_id: str,
        fetch_report: Callable[[], Awaitable[bool]],
    ) -> None:
        self._resolution = resolution
        self._limits = limits
        self._audit = audit
        self._connector = connector
        self._signer = signer
        self._instance_id = instance_id
        self._fetch_report = fetch_report
        # The sync directives out at the connector now (interrupted at a stop).
        self.running: set[str] = set()

    async def run(self, req: Invoke, timeout_ms: int, prior: PriorDispatch | None) -> Outcome:
        """Dispatch, or rejoin ``prior``; a rejoin the connector refuses because the
        earlier attempt provably never reached it (``core/rejoin.py``) is dispatched
        afresh, so the caller gets a definite answer instead of ``outcome-in-doubt``."""
        if prior is None:
            return await self._dispatch(req, timeout_ms, False)
        report = self._resolution.report
        seen_before = report.instance_id if report is not None else None
        try:
            return await self._dispatch(req, timeout_ms, True)
        except CodedError as exc:
            if exc.code != RuntimeErrorCode.OUTCOME_IN_DOUBT or exc.detail.get("in_flight"):
                raise
            key = req.directive.idempotency_key
            assert key is not None  # only a keyed directive rejoins
            now = time.time()
            since = now - self._limits.idempotency_window_s
            if not await never_started(
                key, since, seen_before, self._connector_instance, self._audit, now
            ):
                closed = await journal_never_started(key, since, self._audit, self._ask_starts)
                if closed is None:
                    raise
                # Nothing ran and, fenced, nothing will: close the intents so the next
                # retry dispatches afresh, and answer definitively.
                await self._audit.record(settle_as_never_run(closed))
                raise CodedError(
                    RuntimeErrorCode.CONNECTOR_UNAVAILABLE,
                    "the connector was lost before it started this directive; nothing ran: retry",
                    detail={"never_started": "true"},
                    retry_after_ms=250,
                ) from None
        return await self._dispatch(req, timeout_ms, False)

    async def _ask_starts(self, seam_requests: tuple[str, ...], sent_from: str) -> str | None:
        """The connector's start journal's answer for these dispatches (None: no answer)."""
        try:
            got = await self._connector.call(
                ConnectorStarts(
                    request_id=new_request_id(), seam_requests=seam_requests, sent_from=sent_from
                ),
                StartsAnswer,
                REPORT_TIMEOUT_S,
            )
        except CodedError as exc:
            log.warning("directive.starts.unanswered", code=exc.code)
            return None
        return got.answer

    async def _connector_instance(self) -> str | None:
        """The connector instance a fresh report names (None if none could be had)."""
        if not await self._fetch_report():
            return None
        report = self._resolution.report
        return report.instance_id if report is not None else None

    async def _dispatch(self, req: Invoke, timeout_ms: int, rejoin: bool) -> Outcome:
        report = self._resolution.report
        assert report is not None
        d = req.directive
        wait_s = (timeout_ms + self._limits.reply_margin_ms) / 1000
        resolved = self._resolution.get(d.action_id)
        signing = resolved.action.signing if resolved is not None else None
        # A fresh id on the seam: callers' ids are theirs, and two callers may collide.
        seam_request = new_request_id()
        # Where it was sent to be run; a rejoin runs nothing (core/rejoin.py).
        sent_to = REJOIN_ONLY if rejoin else report.instance_id
        intent = dispatch_intent(d, seam_request, self._instance_id, sent_to)
        if d.idempotency_key is not None:
            # On disk before the directive leaves: a retry after a crash must know.
            await self._audit.record(intent)
        else:
            self._audit.enqueue(intent)
        log.debug("directive.dispatched", seam_request=seam_request, timeout_ms=timeout_ms)
        self.running.add(d.directive_id)
        outcome: Outcome | None = None
        token: str | None = None
        try:
            # Its one bounded grant, named by the seam request and ended with this
            # dispatch (the finally below); a rejoin runs nothing new.
            if signing is not None and not rejoin:
                token = self._signer.issue(
                    seam_request, d.directive_id, d.action_id, signing, wait_s
                )
            call = ConnectorInvoke(
                request_id=seam_request,
                directive=d,
                timeout_ms=timeout_ms,
                config_hash=report.config_hash,
                rejoin=rejoin,
                signer_token=token,
            )
            outcome = await self._connector.call(call, Outcome, wait_s)
        except CodedError as exc:
            if exc.code in (
                RuntimeErrorCode.CATALOG_STALE,
                OsErrorCode.ACTION_CATALOG_UNAUTHORIZED,
            ):
                await self._fetch_report()
            raise
        finally:
            self.running.discard(d.directive_id)
            if token is not None:
                outcome = self._signer.end(seam_request, outcome)
        assert outcome is not None
        return outcome

    async def interrupt_running(self) -> None:
        """At stop, past the drain's grace: have the connector end the sync directives
        it still runs for us, so each caller gets a definite (failed, interrupted)
        outcome instead of one in doubt."""
        ids = tuple(sorted(self.running))
        if not ids or not self._connector.connected:
            return
        log.warning("core.interrupting", directives=len(ids))
        await self._connector.call(
            ConnectorInterrupt(request_id=new_request_id(), directive_ids=ids),
            InterruptAnswer,
            INTERRUPT_TIMEOUT_S,
        )
