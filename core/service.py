"""The sensorium-core process: the client API's ROUTER and the connector seam's caller."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from typing import Any

import msgspec
import structlog
import zmq
import zmq.asyncio

from sensorium import __version__
from sensorium.core import observations
from sensorium.core.access import Access
from sensorium.core.admission import admit
from sensorium.core.answers import Answers
from sensorium.core.audit import AuditStore, PriorDispatch
from sensorium.core.auditread import AuditDesk
from sensorium.core.authenticity import signature_digest, verify
from sensorium.core.completions import Completions
from sensorium.core.consumer_reads import ConsumerReads
from sensorium.core.deferral import ContinuationFor, Deferrals
from sensorium.core.dispatch import REPORT_TIMEOUT_S, Dispatcher
from sensorium.core.flows import FlowRunner
from sensorium.core.idempotency import Idempotency
from sensorium.core.keyspace import scoped
from sensorium.core.ledger import CapabilityLedger
from sensorium.core.observations import ObservationPublisher
from sensorium.core.operations import OperationsView
from sensorium.core.orphans import OrphanDesk
from sensorium.core.outcomes import is_rejection, receipted, rejected_result
from sensorium.core.recorder import Recorder
from sensorium.core.records import in_doubt, outcome_record, refusal
from sensorium.core.render import Renderer
from sensorium.core.resolution import ResolutionMap
from sensorium.core.scoped import ScopedDeferred
from sensorium.core.signer.server import Signer
from sensorium.shared.clock import rfc3339
from sensorium.shared.config import NodeConfig, connector_endpoint
from sensorium.shared.deferred.policy import DeferredHostPolicy
from sensorium.shared.deferred.registry import Registry
from sensorium.shared.diagnostics import OsErrorCode, RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.ids import new_id
from sensorium.shared.paths import StatePaths
from sensorium.shared.rpc.client import RpcClient, new_request_id
from sensorium.shared.rpc.curve import seam_client_curve
from sensorium.shared.rpc.server import PEER, AnswerThen, Authorize, RpcServer
from sensorium.shared.sdnotify import Notifier
from sensorium.shared.wire.client_api import (
    ActionView,
    AuditGet,
    AuditQuery,
    CatalogDescribe,
    CatalogView,
    ConnectorHealth,
    FlowRun,
    FlowStatusRequest,
    Health,
    HealthReply,
    Invoke,
    Ledger,
    LedgerQuery,
    OperationCancel,
    OperationListRequest,
    OperationStatusBatch,
    OperationStatusRequest,
    OperationWait,
    SensoriumHealth,
)
from sensorium.shared.wire.deferred import (
    DeferredOperation,
)
from sensorium.shared.wire.directive import DEFAULT_TIMEOUT_MS, Directive
from sensorium.shared.wire.outcome import Outcome
from sensorium.shared.wire.report import ModuleReport
from sensorium.shared.wire.result import DirectiveResult
from sensorium.shared.wire.seam import (
    CORE_ROUTING_ID,
    ConnectorReport,
)

log = structlog.get_logger("sensorium.core")
_encoder = msgspec.msgpack.Encoder()


class CoreService:
    def __init__(
        self,
        paths: StatePaths,
        cfg: NodeConfig,
        ctx: zmq.asyncio.Context,
        notifier: Notifier | None = None,
    ) -> None:
        self.paths = paths
        self.notifier = notifier or Notifier({})
        self.cfg = cfg
        self.instance_id = new_id()
        self.started_at = rfc3339()
        self.resolution = ResolutionMap()
        self.audit = AuditStore(paths.audit_db)
        self.registry = Registry(paths.registry_db, DeferredHostPolicy.from_config(cfg.deferred))
        self.orphans = OrphanDesk(
            self.audit,
            cfg.orphans,
            lambda op: self.registry.get(op) is not None,
            idempotency_window_s=cfg.limits.idempotency_window_s,
        )
        self.connector = RpcClient(
            ctx,
            connector_endpoint(cfg, paths),
            name="connector",
            unavailable_code=RuntimeErrorCode.CONNECTOR_UNAVAILABLE,
            on_connect=self.refresh_report,
            # Replies meant for an earlier core (or a call given up on) are orphan events.
            on_unmatched=self.orphans.receive,
            routing_id=CORE_ROUTING_ID,
            max_message=cfg.limits.max_message_bytes,
            curve=seam_client_curve(cfg, paths),
        )
        self.operations = OperationsView(
            self.registry,
            self.connector,
            cfg.limits.sigterm_grace_s,
            cfg.deferred.final_poll_grace_s,
        )
        self.deferrals = Deferrals(
            self.registry, self.audit, self.connector, lambda rec: self.answers.written(rec)
        )
        self.flows = FlowRunner(
            self.registry,
            self.run_directive,
            self._async_only,
            self._default_timeout_ms,
            owner=f"core:{self.instance_id}",
            # Longer than any one step may take, so a live runner is never robbed.
            lease_s=(cfg.limits.max_action_timeout_ms + cfg.limits.reply_margin_ms) / 1000 + 60,
            renderer=Renderer(
                cfg.limits.flow_render_timeout_s, cfg.limits.flow_render_budget_steps
            ),
        )
        self._refreshing: asyncio.Lock = asyncio.Lock()
        self.ledger = CapabilityLedger()
        self.observer = ObservationPublisher(f"ipc://{paths.run / 'observations.sock'}", ctx)
        self.idempotency = Idempotency(self.audit, cfg.limits.idempotency_window_s)
        self.server: RpcServer | None = None
        self.recorder = Recorder(paths.recordings, cfg.record, self.instance_id, __version__)
        # Who may read what (core/access.py); serve() gives it the CURVE allowlist.
        self.access = Access(self.audit, self.group_of, lambda: list(self.resolution.actions))
        self.completions = Completions(
            self.registry, self.connector, cfg.deferred.final_poll_grace_s
        )
        self.scoped = ScopedDeferred(
            self.registry, self.operations, self.flows, self.access, self.completions
        )
        self.audit_desk = AuditDesk(
            self.audit, self.registry, self.access, cfg.limits.audit_page_max
        )
        self.answers = Answers(self.audit, self.resolution, paths)
        # The host signer boundary: scoped signer grants (core/signer/).
        self.signer = Signer(paths, self.audit)
        # Sync directives out to the connector and back (core/dispatch.py).
        self.dispatcher = Dispatcher(
            resolution=self.resolution,
            limits=cfg.limits,
            audit=self.audit,
            connector=self.connector,
            signer=self.signer,
            instance_id=self.instance_id,
            fetch_report=self.fetch_report,
        )
        # An invoke's grant is checked by on_invoke (serve() sets it), so that a denial
        # is the directive's ``rejected`` result like any other refusal.
        self.authorize_invoke: Authorize | None = None

    def group_of(self, action_id: str) -> str | None:
        resolved = self.resolution.get(action_id)
        return resolved.action.group if resolved is not None else None

    def __repr__(self) -> str:
        return f"<CoreService {self.instance_id} {self.resolution!r} {self.connector!r}>"

    def status_line(self) -> str:
        """What core tells its supervisor it is doing (``sensorium status``)."""
        report = self.resolution.report
        if report is not None:
            actions = len(self.resolution.actions)
            return f"serving; connector {report.instance_id} with {actions} actions"
        state = "connected" if self.connector.connected else "not yet connected"
        return f"serving; connector {state}"

    async def fetch_report(self) -> bool:
        """One attempt to bring the resolution map up to date; False if it failed."""
        try:
            report = await self.connector.call(
                ConnectorReport(request_id=new_request_id()), ModuleReport, REPORT_TIMEOUT_S
            )
        except CodedError as exc:
            log.warning("catalog.report.failed", code=exc.code)
            return False
        before = self.resolution.report
        self.resolution.load(report)
        self.ledger.observe(self.resolution)
        if before is None or (
            before.instance_id,
            before.config_hash,
            before.config_authorization,
        ) != (report.instance_id, report.config_hash, report.config_authorization):
            self.notifier.status(self.status_line())
            log.info(
                "catalog.resolved",
                connector=report.instance_id,
                actions=len(self.resolution.actions),
                exposed=report.catalog_exposed,
                config_hash=report.config_hash,
                authorization=report.config_authorization,
            )
        return True

    async def refresh_report(self) -> None:
        """Fetch the connector's module report until it comes; on every (re)connection."""
        async with self._refreshing:
            for attempt in range(50):
                if await self.fetch_report():
                    return
                await asyncio.sleep(min(0.1 * 2**attempt, 2.0))
            log.error(
                "catalog.report.unavailable",
                attempts=50,
                note="no report from the connector; retrying on its next connection",
            )

    # -- client API -------------------------------------------------------

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

    def _default_timeout_ms(self, action_id: str) -> int:
        resolved = self.resolution.get(action_id)
        return resolved.action.default_timeout_ms if resolved is not None else DEFAULT_TIMEOUT_MS

    def _async_only(self, action_id: str) -> bool:
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

    async def on_describe(self, _req: CatalogDescribe) -> CatalogView:
        # Never show an action as available while the connector would refuse it.
        fresh = self.connector.connected and await self.fetch_report()
        report = self.resolution.report
        actions = [
            ActionView(
                action_id=r.action.action_id,
                description=r.action.description,
                group=r.action.group,
                parameters_schema=r.action.parameters_schema,
                default_timeout_ms=r.action.default_timeout_ms,
                max_timeout_ms=r.action.max_timeout_ms,
                execution_mode_support=r.action.execution_mode_support,
                deferred_profile=r.action.deferred_profile,
                state=r.action.state if fresh else "failed",
                gaps=list(r.action.gaps) if fresh else ["the OS connector is unreachable"],
            )
            for r in self.resolution.actions.values()
        ]
        return CatalogView(
            module_id=report.module_id if report else None,
            connector_instance_id=report.instance_id if report else None,
            config_hash=report.config_hash if report else None,
            config_authorized=report.config_authorized if report else False,
            actions=sorted(actions, key=lambda a: ((a.group or ""), a.action_id)),
        )

    async def on_ledger(self, req: LedgerQuery) -> Ledger:
        # Never a stale plane: fresh from the connector, or marked failed without it.
        if self.connector.connected and await self.fetch_report():
            entries = [e for _aid, e in sorted(self.ledger.entries.items())]
        else:
            entries = self.ledger.disconnected()
        return Ledger(
            entries=[
                e
                for e in entries
                if not req.action_id or e.capabilityRef.endswith(f":{req.action_id}")
            ]
        )

    async def on_health(self, _req: Health) -> HealthReply:
        report = self.resolution.report
        return HealthReply(
            process="core",
            instance_id=self.instance_id,
            started_at=self.started_at,
            version=__version__,
            inflight=self.server.inflight if self.server else 0,
            connector=ConnectorHealth(
                connected=self.connector.connected,
                instance_id=report.instance_id if report else None,
                actions=len(self.resolution.actions),
                catalog_exposed=report.catalog_exposed if report else False,
            ),
        )

    def handlers(self) -> dict[type, Any]:
        return {
            FlowRun: self.scoped.flow_run,
            FlowStatusRequest: self.scoped.flow_status,
            Invoke: self.on_invoke,
            CatalogDescribe: self.on_describe,
            LedgerQuery: self.on_ledger,
            Health: self.on_health,
            SensoriumHealth: self.on_health,
            **ConsumerReads(
                self.audit, self.access, self.group_of, self.on_describe, self.cfg.observations
            ).handlers(),
            AuditGet: self.audit_desk.get,
            AuditQuery: self.audit_desk.query,
            OperationStatusRequest: self.scoped.status,
            OperationWait: self.scoped.wait,
            OperationStatusBatch: self.scoped.status_batch,
            OperationCancel: self.scoped.cancel,
            OperationListRequest: self.scoped.list,
            **self.recorder.handlers(),
        }
