"""The sensorium-core process's parts, wired: the client API's handlers and the
connector seam's caller. A directive's way is ``core/directives.py``; the catalog
views are ``core/catalog_desk.py``."""

from __future__ import annotations

from typing import Any

import zmq.asyncio

from sensorium import __version__
from sensorium.core.access import Access
from sensorium.core.answers import Answers
from sensorium.core.audit import AuditStore
from sensorium.core.auditread import AuditDesk
from sensorium.core.catalog_desk import CatalogDesk
from sensorium.core.completions import Completions
from sensorium.core.consumer_reads import ConsumerReads
from sensorium.core.deferral import Deferrals
from sensorium.core.directives import Directives
from sensorium.core.dispatch import Dispatcher
from sensorium.core.flows import FlowRunner
from sensorium.core.idempotency import Idempotency
from sensorium.core.observations import ObservationPublisher
from sensorium.core.operations import OperationsView
from sensorium.core.orphans import OrphanDesk
from sensorium.core.recorder import Recorder
from sensorium.core.render import Renderer
from sensorium.core.resolution import ResolutionMap
from sensorium.core.scoped import ScopedDeferred
from sensorium.core.signer.server import Signer
from sensorium.shared.clock import rfc3339
from sensorium.shared.config import NodeConfig, connector_endpoint
from sensorium.shared.deferred.policy import DeferredHostPolicy
from sensorium.shared.deferred.registry import Registry
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.ids import new_id
from sensorium.shared.paths import StatePaths
from sensorium.shared.rpc.client import RpcClient
from sensorium.shared.rpc.curve import seam_client_curve
from sensorium.shared.rpc.server import RpcServer
from sensorium.shared.sdnotify import Notifier
from sensorium.shared.wire.client_api import (
    AuditGet,
    AuditQuery,
    CatalogDescribe,
    ConnectorHealth,
    FlowRun,
    FlowStatusRequest,
    Health,
    HealthReply,
    Invoke,
    LedgerQuery,
    OperationCancel,
    OperationListRequest,
    OperationStatusBatch,
    OperationStatusRequest,
    OperationWait,
    SensoriumHealth,
)
from sensorium.shared.wire.seam import CORE_ROUTING_ID


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
            on_connect=lambda: self.catalog.refresh_report(),
            # Replies meant for an earlier core (or a call given up on) are orphan events.
            on_unmatched=self.orphans.receive,
            routing_id=CORE_ROUTING_ID,
            max_message=cfg.limits.max_message_bytes,
            curve=seam_client_curve(cfg, paths),
        )
        # The connector's report, and describe and the ledger from it.
        self.catalog = CatalogDesk(self.connector, self.resolution, self.notifier)
        self.operations = OperationsView(
            self.registry,
            self.connector,
            cfg.limits.sigterm_grace_s,
            cfg.deferred.final_poll_grace_s,
        )
        self.answers = Answers(self.audit, self.resolution, paths)
        self.deferrals = Deferrals(self.registry, self.audit, self.connector, self.answers.written)
        self.observer = ObservationPublisher(f"ipc://{paths.run / 'observations.sock'}", ctx)
        self.server: RpcServer | None = None
        self.recorder = Recorder(paths.recordings, cfg.record, self.instance_id, __version__)
        # Who may read what (core/access.py); serve() gives it the CURVE allowlist.
        self.access = Access(self.audit, self.group_of, lambda: list(self.resolution.actions))
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
            fetch_report=self.catalog.fetch_report,
        )
        # A directive's way through core (serve() gives it the caller's grant check).
        self.directives = Directives(
            cfg,
            resolution=self.resolution,
            connector=self.connector,
            audit=self.audit,
            answers=self.answers,
            access=self.access,
            idempotency=Idempotency(self.audit, cfg.limits.idempotency_window_s),
            deferrals=self.deferrals,
            dispatcher=self.dispatcher,
            observer=self.observer,
            fetch_report=self.catalog.fetch_report,
        )
        self.flows = FlowRunner(
            self.registry,
            self.directives.run_directive,
            self.directives.async_only,
            self.directives.default_timeout_ms,
            owner=f"core:{self.instance_id}",
            # Longer than any one step may take, so a live runner is never robbed.
            lease_s=(cfg.limits.max_action_timeout_ms + cfg.limits.reply_margin_ms) / 1000 + 60,
            renderer=Renderer(
                cfg.limits.flow_render_timeout_s, cfg.limits.flow_render_budget_steps
            ),
        )
        self.completions = Completions(
            self.registry, self.connector, cfg.deferred.final_poll_grace_s
        )
        self.scoped = ScopedDeferred(
            self.registry, self.operations, self.flows, self.access, self.completions
        )
        self.audit_desk = AuditDesk(
            self.audit, self.registry, self.access, cfg.limits.audit_page_max
        )

    def group_of(self, action_id: str) -> str | None:
        resolved = self.resolution.get(action_id)
        return resolved.action.group if resolved is not None else None

    def __repr__(self) -> str:
        return f"<CoreService {self.instance_id} {self.resolution!r} {self.connector!r}>"

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
            Invoke: self.directives.on_invoke,
            CatalogDescribe: self.catalog.on_describe,
            LedgerQuery: self.catalog.on_ledger,
            Health: self.on_health,
            SensoriumHealth: self.on_health,
            **ConsumerReads(
                self.audit,
                self.access,
                self.group_of,
                self.catalog.on_describe,
                self.cfg.observations,
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
