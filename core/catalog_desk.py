"""The connector's catalog as core serves it: the module report fetched on every
(re)connection, and the two views of it a client asks for (describe, the ledger)."""

from __future__ import annotations

import asyncio

import structlog

from sensorium.core.dispatch import REPORT_TIMEOUT_S
from sensorium.core.ledger import CapabilityLedger
from sensorium.core.resolution import ResolutionMap
from sensorium.shared.errors import CodedError
from sensorium.shared.rpc.client import RpcClient, new_request_id
from sensorium.shared.sdnotify import Notifier
from sensorium.shared.wire.client_api import (
    ActionView,
    CatalogDescribe,
    CatalogView,
    Ledger,
    LedgerQuery,
)
from sensorium.shared.wire.report import ModuleReport
from sensorium.shared.wire.seam import ConnectorReport

log = structlog.get_logger("sensorium.core")


class CatalogDesk:
    """Keeps ``resolution`` (what core admits against) and the capability ledger in step
    with the connector's report; never shows an action available that it would refuse."""

    def __init__(self, connector: RpcClient, resolution: ResolutionMap, notifier: Notifier) -> None:
        self.connector = connector
        self.resolution = resolution
        self.notifier = notifier
        self.ledger = CapabilityLedger()
        self._refreshing: asyncio.Lock = asyncio.Lock()
        # Set by the first report that arrives: what core's READY=1 waits for.
        self.reported = asyncio.Event()

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
        self.reported.set()
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

    async def first_report(self, within_s: float, stop: asyncio.Event) -> bool:
        """Wait until a report came (True), or ``within_s`` passed or ``stop`` was set."""
        if self.reported.is_set() or within_s <= 0:
            return self.reported.is_set()
        waits = [asyncio.ensure_future(self.reported.wait()), asyncio.ensure_future(stop.wait())]
        try:
            await asyncio.wait(waits, timeout=within_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            await asyncio.wait(waits)  # ended, not only told to: nothing left behind
        return self.reported.is_set()
