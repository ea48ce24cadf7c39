"""A directive's way through core: refused at once in the receive loop, or admitted,
dispatched (sync) or deferred (async), recorded, and answered."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable

import msgspec
import structlog

from sensorium.core import observations
from sensorium.core.access import Access
from sensorium.core.admission import admit
from sensorium.core.answers import Answers
from sensorium.core.audit import AuditStore, PriorDispatch
from sensorium.core.authenticity import signature_digest, verify
from sensorium.core.deferral import ContinuationFor, Deferrals
from sensorium.core.dispatch import Dispatcher
from sensorium.core.idempotency import Idempotency
from sensorium.core.keyspace import scoped
from sensorium.core.observations import ObservationPublisher
from sensorium.core.outcomes import is_rejection, receipted, rejected_result
from sensorium.core.records import in_doubt, outcome_record, refusal
from sensorium.core.resolution import ResolutionMap
from sensorium.shared.clock import rfc3339
from sensorium.shared.config import NodeConfig
from sensorium.shared.diagnostics import OsErrorCode, RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.ids import new_id
from sensorium.shared.rpc.client import RpcClient
from sensorium.shared.rpc.server import PEER, AnswerThen, Authorize
from sensorium.shared.wire.client_api import Invoke
from sensorium.shared.wire.deferred import DeferredOperation
from sensorium.shared.wire.directive import DEFAULT_TIMEOUT_MS, Directive
from sensorium.shared.wire.outcome import Outcome
from sensorium.shared.wire.result import DirectiveResult

log = structlog.get_logger("sensorium.core")


class Directives:
    """``Invoke`` for callers and ``run_directive`` for flow steps: one way for both."""

    def __init__(
        self,
        cfg: NodeConfig,
        *,
        resolution: ResolutionMap,
        connector: RpcClient,
        audit: AuditStore,
        answers: Answers,
        access: Access,
        idempotency: Idempotency,
        deferrals: Deferrals,
        dispatcher: Dispatcher,
        observer: ObservationPublisher,
        fetch_report: Callable[[], Awaitable[bool]],
    ) -> None:
        self.cfg = cfg
        self.resolution = resolution
        self.connector = connector
        self.audit = audit
        self.answers = answers
        self.access = access
        self.idempotency = idempotency
        self.deferrals = deferrals
        self.dispatcher = dispatcher
        self.observer = observer
        self.fetch_report = fetch_report
        # An invoke's grant is checked by on_invoke (serve() sets it), so that a denial
        # is the directive's ``rejected`` result like any other refusal.
        self.authorize_invoke: Authorize | None = None

    async def on_invoke(self, req: Invoke) -> DirectiveResult:
        """Every caller is answered a ``sensorium-directive-result.v1``; a refusal that
        is not an admission decision (``core/outcomes.py``) stays a coded error."""
        try:
            if self.authorize_invoke is not None:
                self.authorize_invoke(PEER.get(), req)
            verify(req.directive)  # a signed one before anything: a keyed retry's answer too
            answer = await self._invoke_as_caller(req)
        except CodedError as exc:
            if not is_rejection(exc):
                raise
            return await self.answers.rejected(req, exc)
        return await self.answers.answer(req, answer)

    def refused_at_once(self, req: Invoke) -> AnswerThen | None:
        """The ``rejected`` result of a directive for an action that cannot run here (not
        in the catalog, or not runnable), decided in the receive loop (``RpcServer``'s
        ``at_once``): that needs no I/O, so such a refusal costs no task. The same record,
        log line and result as ``on_invoke`` gives it.

        None (``on_invoke`` decides) whenever anything before admission could answer
        otherwise: a grant the caller's key lacks, a signature, an idempotency key whose
        first attempt answers, a report to fetch first, a full audit queue. None too for
        an action that can run: its parameters are validated once, on the usual way."""
        d = req.directive
        report = self.resolution.report
        if (
            d.signature is not None
            or d.idempotency_key is not None
            or report is None
            or not report.catalog_exposed
            or not self.connector.connected
            or self.audit.full  # on_invoke waits for room; a refusal here must not
        ):
            return None
        if self.authorize_invoke is not None:
            try:  # the caller's CURVE key (PEER is set for an answer at once too)
                self.authorize_invoke(PEER.get(), req)
            except CodedError:
                return None  # on_invoke refuses it, recorded as every refusal is
        resolved = self.resolution.get(d.action_id)
        if resolved is not None and resolved.runnable:
            return None
        try:
            admit(d, self.resolution, self.cfg.limits, connected=True, consent=self.cfg.consent)
        except CodedError as exc:
            if not is_rejection(exc):
                return None
            record_id = new_id()
            # The record and its log line follow the answer in this same turn of the
            # loop, so a read of the audit (which waits for what is queued) finds it.
            return AnswerThen(
                rejected_result(d, receipted(exc, record_id), record_id),
                functools.partial(self._file_refusal, req, exc, record_id),
            )
        return None

    def _file_refusal(self, req: Invoke, exc: CodedError, record_id: str) -> None:
        """The record of a refusal answered at once, and its log line."""
        # Its log line names the request as a handler's would (Replies.answer).
        with structlog.contextvars.bound_contextvars(**{"request/id": req.request_id}):
            try:
                rec = refusal(req, "rejection", exc, record_id=record_id)
            except Exception:
                # A receipt went out for it: say which, for whoever looks it up.
                log.exception("directive.rejected.unrecorded", receipt=f"outcome:{record_id}")
                raise
        # Queued in this same turn of the loop as the answer, room or not (room was
        # checked before, and only the writer took since).
        self.answers.file_given(rec)

    async def _invoke_as_caller(self, req: Invoke) -> Outcome | DeferredOperation:
        # A client's idempotency key lives in its own key space (core/keyspace.py).
        caller = self.access.caller().owner_key
        req = msgspec.structs.replace(req, directive=scoped(req.directive, caller))
        if req.directive.timing.mode == "async":
            # The registry remembers async keys itself (one row per key, durably).
            return await self._invoke(req, caller_key=caller)
        return await self.idempotency.run(
            req.directive, lambda prior: self._invoke_sync(req, prior)
        )

    async def run_directive(
        self, d: Directive, continuation: ContinuationFor | None, caller_key: str | None = None
    ) -> Outcome | DeferredOperation:
        """A flow step: the same way through core as a caller's directive, on behalf of
        the key that started the flow."""
        req = Invoke(request_id=new_id(), directive=d)
        if d.timing.mode == "async":
            return await self._invoke(req, continuation, caller_key=caller_key)
        return await self.idempotency.run(d, lambda prior: self._invoke_sync(req, prior))

    def default_timeout_ms(self, action_id: str) -> int:
        resolved = self.resolution.get(action_id)
        return resolved.action.default_timeout_ms if resolved is not None else DEFAULT_TIMEOUT_MS

    def async_only(self, action_id: str) -> bool:
        resolved = self.resolution.get(action_id)
        return resolved is not None and resolved.action.execution_mode_support == "async-only"

    async def _invoke_sync(self, req: Invoke, prior: PriorDispatch | None) -> Outcome:
        result = await self._invoke(req, prior=prior)
        assert isinstance(result, Outcome)
        return result

    async def _invoke(
        self,
        req: Invoke,
        continuation: ContinuationFor | None = None,
        *,
        prior: PriorDispatch | None = None,
        caller_key: str | None = None,
    ) -> Outcome | DeferredOperation:
        rejoin = prior is not None
        d = req.directive
        report = self.resolution.report
        if report is None and self.connector.connected:
            await self.fetch_report()  # connected moments ago; its report is on its way
        elif report is not None and not report.catalog_exposed and self.connector.connected:
            # A refusal must not outlive its cause: the connector re-verifies anyway.
            await self.fetch_report()
        try:
            timeout_ms = admit(
                d,
                self.resolution,
                self.cfg.limits,
                connected=self.connector.connected,
                consent=self.cfg.consent,
            )
        except CodedError as exc:
            rec = refusal(req, "rejection", exc)
            # Nothing ran and nothing waits on it: written by the audit writer's next
            # batch, not awaited; reads of the audit wait for it (AuditStore.settled).
            await self.answers.file(rec)
            raise receipted(exc, rec.record_id) from None
        # The declaration that actually ran, for the observations it asks for.
        resolved = self.resolution.get(d.action_id)
        report = self.resolution.report
        if d.timing.mode == "async":
            assert resolved is not None and report is not None
            try:
                return await self.deferrals.defer(
                    d,
                    req.request_id,
                    resolved.action,
                    report.module_id,
                    report.config_hash,
                    timeout_ms,
                    continuation,
                    caller_key,
                    self.answers.dispatched(rfc3339()),
                )
            except CodedError as exc:
                kind = "unknown" if "operation/id" in exc.detail else "rejection"
                rec = refusal(req, kind, exc, at=self.answers.dispatched(rfc3339()))
                with contextlib.suppress(CodedError):
                    await self.audit.record(rec)
                if exc.code in (
                    RuntimeErrorCode.CATALOG_STALE,
                    OsErrorCode.ACTION_CATALOG_UNAUTHORIZED,
                ):
                    await self.fetch_report()
                raise receipted(exc, rec.record_id) from None
        dispatched_at = rfc3339()
        try:
            outcome = await self.dispatcher.run(req, timeout_ms, prior)
        except CodedError as exc:
            # Refused before anything ran, or lost after it may have run: say which. A
            # refused rejoin leaves the earlier attempt as much in doubt as it was.
            kind = "unknown" if rejoin or in_doubt(exc) else "rejection"
            if exc.detail.get("never_started") == "true":
                kind = "rejection"  # the start journal proved that nothing ran
            # On disk before the caller hears: its retry must find this attempt settled.
            rec = refusal(req, kind, exc, settles=True, at=self.answers.dispatched(dispatched_at))
            with contextlib.suppress(CodedError):  # a storage failure is logged there
                await self.audit.record(rec)
            raise receipted(exc, rec.record_id) from None
        except asyncio.CancelledError:
            stopped = CodedError(
                RuntimeErrorCode.SHUTTING_DOWN, "core stopped while the action was running"
            )
            at = self.answers.dispatched(dispatched_at)
            self.audit.enqueue(refusal(req, "unknown", stopped, settles=True, at=at))
            raise
        if (digest := signature_digest(d)) is not None:
            outcome = msgspec.structs.replace(outcome, signature_digest=digest)
        found = (
            observations.build(
                outcome,
                resolved.action,
                report.module_id,
                declared_sensitivity=resolved.action.sensitivity_class,
                policy=self.cfg.observations,
            )
            if resolved is not None and report is not None
            else []
        )
        journal, published = outcome_record(
            req, outcome, found, self.answers.dispatched(dispatched_at)
        )
        try:
            await self.audit.record(journal)
        except CodedError as exc:
            # The action ran: the caller must not read this as "nothing was done". A
            # keyed retry rejoins the connector's attempt and records it then.
            raise CodedError(
                exc.code,
                f"the action ran (outcome/id {outcome.outcome_id}, {outcome.status}) but "
                f"its outcome could not be recorded: {exc.message}",
                detail={**exc.detail, "in_flight": "true", "outcome/id": outcome.outcome_id},
                retry_after_ms=exc.retry_after_ms,
            ) from None
        self.answers.written(published)
        for obs in found:  # durable first, then published
            self.observer.publish(obs)
        log.info(
            "directive.finished",
            action_id=d.action_id,
            status=outcome.status,
            exit_code=outcome.exit_code,
            duration_ms=outcome.duration_ms,
            receipt=f"outcome:{outcome.outcome_id}",
            **{"directive/id": d.directive_id},
        )
        return outcome

    async def interrupt_running(self) -> None:
        await self.dispatcher.interrupt_running()
