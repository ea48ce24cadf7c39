"""The OS connector's service: publishes its catalog, runs actions, answers core alone.

One :class:`ConnectorService` per process; ``process.py`` starts it and serves the seam."""

from __future__ import annotations

import time
from typing import NamedTuple

import structlog

from sensorium.connectors.os.catalog import sources as catalog_mod
from sensorium.connectors.os.catalog.authorization import (
    Authorizer,
    Verdict,
    bootstrap,
    fingerprint,
)
from sensorium.connectors.os.catalog.report import build_report
from sensorium.connectors.os.catalog.state import action_state
from sensorium.connectors.os.envelope.builder import EnvelopeBuilder
from sensorium.connectors.os.envelope.canary import Canaries, choose_tier
from sensorium.connectors.os.envelope.probe import Runtime
from sensorium.connectors.os.jobs.runner import JobRunner, Live
from sensorium.connectors.os.jobs.store import Job, JobStore
from sensorium.connectors.os.run.execution import Executor
from sensorium.connectors.os.run.interrupts import Interrupts
from sensorium.connectors.os.run.keyed import KeyedAttempts
from sensorium.connectors.os.run.sandbox.spawner import Spawner
from sensorium.connectors.os.run.spawning import Killable
from sensorium.connectors.os.run.starts import StartJournal
from sensorium.shared.clock import parse_rfc3339, rfc3339
from sensorium.shared.config import ConfigError, NodeConfig, load_node_config
from sensorium.shared.diagnostics import OsErrorCode, RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.ids import new_id
from sensorium.shared.paths import StatePaths
from sensorium.shared.wire.declaration import Declaration
from sensorium.shared.wire.deferred import ConnectorDeferred, DeferredOperationStatus
from sensorium.shared.wire.directive import decode_stored
from sensorium.shared.wire.outcome import Outcome
from sensorium.shared.wire.report import LedgerState, ModuleReport
from sensorium.shared.wire.seam import (
    ConnectorCancel,
    ConnectorInterrupt,
    ConnectorInvoke,
    ConnectorReport,
    ConnectorStarts,
    ConnectorStatus,
    InterruptAnswer,
    StartsAnswer,
)

log = structlog.get_logger("sensorium.connector")


class Admitted(NamedTuple):
    """What ``_admit`` let through: the declaration, the catalog's verdict, and the
    action's ledger state with its gaps."""

    decl: Declaration
    verdict: Verdict
    state: LedgerState
    gaps: list[str]


class ConnectorService:
    """Holds the validated catalog and the module report built from it."""

    def __init__(
        self,
        paths: StatePaths,
        cfg: NodeConfig,
        runtime: Runtime | None = None,
        spawner: Spawner | None = None,
    ) -> None:
        self.paths = paths
        self.cfg = cfg
        self.runtime = runtime or Runtime.read()
        self.instance_id = new_id()
        self.started_at = rfc3339()
        inputs = fingerprint(paths)  # before loading: an edit from now on is a change
        self.catalog = catalog_mod.load(paths)
        # The trusted signers as they are now, not as they were when the process started.
        try:
            trust = load_node_config(paths)
        except ConfigError:
            trust = cfg
        verdict, self.node_signed = bootstrap(paths, trust, self.catalog)
        self.authorizer = Authorizer(paths, self.catalog, verdict, inputs)
        self.report_verdict = verdict
        # Each action's canary verdict (None: a no-op ran under exactly its envelope).
        self.canary: dict[str, str | None] = {}
        self.report = self._build_report(verdict)
        self.builder = EnvelopeBuilder(paths, cfg, self.runtime, self.catalog.policy, spawner)
        self.max_spawns = cfg.limits.connector_max_concurrent_spawns
        # A handle per sync action running now (each job keeps its own).
        self.running: set[Killable] = set()
        # The same, by directive, for core's stop (sensorium.connector.interrupt).
        self.interrupts = Interrupts(self.running)
        self.starting = 0
        self.keyed = KeyedAttempts()
        # Runs each directive in its envelope and builds its outcome (run/execution.py).
        self.executor = Executor(
            paths,
            self.builder,
            self.catalog.policy,
            self.interrupts,
            self.state_of,
            cfg.limits.max_message_bytes,
        )
        # Every sync spawn, written before it (connectors/os/run/starts.py).
        self.starts = StartJournal(paths.connector_starts_db, time.time())
        self.jobs = JobRunner(
            JobStore(paths.connector_jobs_db),
            cfg,
            self.instance_id,
            self._run_job,
            self.catalog.declarations.get,
        )

    def __repr__(self) -> str:
        return (
            f"<ConnectorService {self.instance_id} {self.catalog!r} running={len(self.running)} "
            f"jobs={len(self.jobs.live)} exposed={self.report.catalog_exposed}>"
        )

    def terminate_running(self) -> None:
        """The connector is stopping: SIGTERM every action now (ADR-008), sync ones marked
        interrupted so each is answered so; :meth:`kill_running` ends the rest."""
        ended = self.interrupts.interrupt(tuple(self.interrupts), terminate=True)
        jobs = self.jobs.terminate_all()
        if ended or jobs:
            log.warning("actions.terminated", directives=ended, jobs=jobs)

    async def kill_now(self) -> None:
        self.kill_running()

    def kill_running(self) -> None:
        """SIGKILL every action's group, jobs' too: nothing outlives a stopping connector."""
        for handle in list(self.running):
            handle.kill()
        self.jobs.kill_all()

    def _refresh_authorization(self) -> Verdict:
        """The current verdict; the report follows it, so core never sees a stale one."""
        verdict = self.authorizer.check()
        if verdict != self.report_verdict:
            log.warning(
                "catalog.authorization.changed",
                reason=verdict.reason,
                authorized=verdict.authorized,
                detail=verdict.message,
            )
            self.report_verdict = verdict
            self.report = self._build_report(verdict)
        return verdict

    def _exposed(self) -> Verdict:
        """The current verdict when it exposes the catalog; the coded refusal when not."""
        verdict = self._refresh_authorization()
        if not verdict.exposed:
            raise CodedError(
                OsErrorCode.ACTION_CATALOG_UNAUTHORIZED,
                f"{verdict.reason}: {verdict.message}",
                detail={"reason": verdict.reason},
            )
        return verdict

    def _build_report(self, verdict: Verdict) -> ModuleReport:
        return build_report(
            self.catalog,
            verdict,
            self.instance_id,
            self.started_at,
            self.state_of,
            self.runtime,
        )

    def state_of(self, decl: Declaration) -> tuple[LedgerState, list[str]]:
        """The action's ledger state on this node, its canary's verdict included."""
        canary = self.canary.get(decl.action_id, "no canary has run under this envelope yet")
        return action_state(decl, self.runtime, self.catalog.policy, canary)

    async def prove(self) -> None:
        """Find this host's tier, run a canary under every envelope of the catalog, and
        publish only what ran: the ledger's connector-runtime plane comes from here."""
        self.runtime = await choose_tier(self.runtime, self.builder)
        if self.runtime.sandbox:
            self.canary = await Canaries(self.builder).catalog(self.catalog.declarations)
        else:
            self.canary = {aid: self.runtime.why_not() for aid in self.catalog.declarations}
        self.report = self._build_report(self.report_verdict)

    async def on_report(self, _req: ConnectorReport) -> ModuleReport:
        self._refresh_authorization()
        return self.report

    async def on_status(self, req: ConnectorStatus) -> DeferredOperationStatus:
        return self.jobs.status(req.operation_id)

    async def on_cancel(self, req: ConnectorCancel) -> DeferredOperationStatus:
        return await self.jobs.cancel(req.operation_id)

    async def on_interrupt(self, req: ConnectorInterrupt) -> InterruptAnswer:
        """Core is stopping: end the named sync directives now (their outcomes say so)."""
        ended = self.interrupts.interrupt(req.directive_ids)
        log.warning("directives.interrupted", asked=len(req.directive_ids), ended=ended)
        return InterruptAnswer(interrupted=ended)

    async def on_starts(self, req: ConnectorStarts) -> StartsAnswer:
        try:
            sent_from = parse_rfc3339(req.sent_from)
        except ValueError:
            raise CodedError(
                RuntimeErrorCode.REQUEST_MALFORMED,
                "sent/from is not an RFC 3339 timestamp",
                path="$.sent/from",
            ) from None
        answer = self.starts.ask(req.seam_requests, sent_from, self.instance_id, time.time())
        log.info("action.starts.asked", seam_requests=len(req.seam_requests), answer=answer)
        return StartsAnswer(
            answer=answer,
            instance_id=self.instance_id,
            covered_from=rfc3339(self.starts.covered_from()),
        )

    def _admit(self, req: ConnectorInvoke) -> Admitted:
        """Every check a directive passes before it runs, sync or deferred."""
        directive = req.directive
        if not self.catalog.valid:
            raise CodedError(
                RuntimeErrorCode.CATALOG_INVALID,
                "the connector's catalog failed validation and is not exposed; "
                "`sensorium logs --process connector --event catalog` says why",
            )
        # Verified again before every dispatch (a stat-keyed cache makes this cheap).
        verdict = self._exposed()
        decl = self.catalog.declarations.get(directive.action_id)
        if decl is None:
            raise CodedError(
                OsErrorCode.ACTION_NOT_ALLOWLISTED,
                f"{directive.action_id!r} is not in this connector's catalog",
            )
        if req.config_hash != self.catalog.config_hash:
            raise CodedError(
                RuntimeErrorCode.CATALOG_STALE,
                "core resolved this directive against another catalog version; "
                "retry once core has refreshed",
                retry_after_ms=200,
            )
        state, gaps = self.state_of(decl)
        if state not in ("enabled", "degraded"):
            raise CodedError(
                RuntimeErrorCode.ACTION_NOT_ENABLED,
                f"{directive.action_id} is {state} on this node" + (f": {gaps[0]}" if gaps else ""),
                detail={"state": state},
            )
        mode, support = directive.timing.mode, decl.execution_mode_support
        # Core checks this too: a sync-only action never becomes a job, nor an async-only
        # one runs where nothing tracks it.
        if support == ("sync-only" if mode == "async" else "async-only"):
            raise CodedError(
                RuntimeErrorCode.EXECUTION_MODE_UNSUPPORTED,
                f"{directive.action_id} is {support}; timing.mode {mode!r} is refused",
                path="$.directive.timing.mode",
            )
        return Admitted(decl, verdict, state, gaps)

    async def on_invoke(self, req: ConnectorInvoke) -> Outcome | ConnectorDeferred:
        directive = req.directive
        if directive.timing.mode == "async":
            return await self.jobs.accept(req, lambda r: self._admit(r).decl)
        if req.operation_id is not None:
            raise CodedError(
                RuntimeErrorCode.REQUEST_MALFORMED,
                "operation/id names a deferred job; a sync directive has none",
                path="$.operation/id",
            )
        return await self.keyed.run(directive, req.rejoin, lambda: self._invoke_sync(req))

    async def _invoke_sync(self, req: ConnectorInvoke) -> Outcome:
        directive = req.directive
        decl, verdict, state, gaps = self._admit(req)
        timeout_ms = min(req.timeout_ms, decl.max_timeout_ms)
        # No queue: work that waited here would start after its caller gave up on it.
        if self.starting >= self.max_spawns:
            raise CodedError(
                RuntimeErrorCode.OVERLOADED,
                f"{self.starting} actions are running, the limit is {self.max_spawns}; "
                "retry shortly",
                retry_after_ms=250,
            )
        self.starting += 1
        try:
            outcome, run = await self.executor.execute(
                decl,
                directive,
                timeout_ms,
                verdict.authorized,
                signer_token=req.signer_token,
                # Its state as admitted a moment ago: what its envelope was built under.
                admitted_as=(state, gaps),
                before_spawn=lambda: self.starts.start(
                    req.request_id,
                    directive.directive_id,
                    directive.idempotency_key,
                    self.instance_id,
                    time.time(),
                ),
            )
        finally:
            self.starting -= 1
        log.info(
            "action.finished",
            action_id=directive.action_id,
            status=outcome.status,
            exit_code=outcome.exit_code,
            duration_ms=outcome.duration_ms,
            pid=run.pid,
            stdout_bytes=run.stdout.total,
            stragglers_killed=run.stragglers_killed,
            **{"directive/id": directive.directive_id, "outcome/id": outcome.outcome_id},
        )
        return outcome

    async def _run_job(self, job: Job, live: Live) -> Outcome:
        """A job runs exactly as a sync directive does, once what it was accepted
        against is checked again: time may have passed while it waited for a slot."""
        verdict = self._exposed()
        decl = self.catalog.declarations.get(job.action_id)
        if decl is None or job.config_hash != self.catalog.config_hash:
            stale = f"the catalog changed since this job was accepted for {job.action_id}"
            raise CodedError(RuntimeErrorCode.CATALOG_STALE, stale)
        directive = decode_stored(job.directive, job.timeout_ms)
        outcome, _run = await self.executor.execute(
            decl, directive, job.timeout_ms, verdict.authorized, live
        )
        return outcome


def log_catalog(service: ConnectorService) -> None:
    """Say at start what the catalog came to: its problems, or how it is authorized."""
    rep = service.report
    if not rep.catalog_exposed:
        for p in service.catalog.problems:
            log.error(
                "catalog.invalid",
                source=p.source,
                action_id=p.action_id,
                field=p.field,
                problem=p.message,
            )
    verdict = service.report_verdict
    if service.node_signed:
        log.info(
            "catalog.node-signed",
            config_hash=rep.config_hash,
            note="pristine factory defaults materialized this start, signed by the node key",
        )
    if verdict.tolerated:
        log.warning("catalog.unsigned", config_hash=rep.config_hash, detail=verdict.message)
    elif not verdict.authorized:
        log.error(
            "catalog.unauthorized",
            reason=verdict.reason,
            config_hash=rep.config_hash,
            detail=verdict.message,
        )
    else:
        log.info("catalog.authorized", config_hash=rep.config_hash, detail=verdict.message)
