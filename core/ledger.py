"""The capability ledger (seed 003): an action is `enabled` only when every plane agrees.

Planes: ``config`` (declared and valid), ``authorization`` (the catalog's sidecar
verifies), ``connector-runtime`` (its class envelope is enforced here), ``schema`` (core
compiled its parameters schema) and ``core-policy`` (core admits its execution mode).
Core derives the entries from each module report it receives, remembers actions it has
seen so an unauthorized catalog shows them `blocked_by_policy` rather than vanishing, and
logs each transition as one compact line.
"""

from __future__ import annotations

import msgspec
import structlog

from sensorium.core.resolution import ResolutionMap
from sensorium.shared.clock import rfc3339
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.wire.client_api import LedgerEntry
from sensorium.shared.wire.report import LedgerState

log = structlog.get_logger("sensorium.core")


class CapabilityLedger:
    def __init__(self) -> None:
        self.entries: dict[str, LedgerEntry] = {}

    def __repr__(self) -> str:
        states = [e.effectiveState for e in self.entries.values()]
        return f"<CapabilityLedger {len(states)} actions, {states.count('enabled')} enabled>"

    def disconnected(self) -> list[LedgerEntry]:
        """The entries as they stand while the connector is unreachable: nothing runs."""
        return [
            msgspec.structs.replace(
                e,
                effectiveState="failed",
                negotiatedBy=[p for p in e.negotiatedBy if p != "connector-runtime"],
                evidenceRefs=[*e.evidenceRefs, "connector:unavailable"],
                capturedAt=rfc3339(),
            )
            for _aid, e in sorted(self.entries.items())
        ]

    def observe(self, resolution: ResolutionMap) -> None:
        report = resolution.report
        if report is None:
            return
        now = rfc3339()
        decision = (
            f"urn:sensorium:decision:{report.instance_id}:{report.config_hash[:16]}:"
            f"{report.config_authorization}"
        )
        invalid = any(d.code == RuntimeErrorCode.CATALOG_INVALID for d in report.diagnostics)
        current: dict[str, LedgerEntry] = {}
        for aid, resolved in resolution.actions.items():
            action = resolved.action
            planes = ["config", "authorization", "schema"]
            state: LedgerState = action.state
            if state in ("enabled", "degraded"):
                planes.append("connector-runtime")
            planes.append("core-policy")
            current[aid] = self._entry(
                aid,
                planes,
                state,
                decision,
                report.config_hash,
                report.config_authorization,
                action.gaps,
                now,
            )
        if not report.catalog_exposed:
            # Declared but not exposed: an invalid catalog has failed, an unauthorized one
            # is blocked — named with the reason either way.
            for aid in report.declared_actions:
                current[aid] = self._entry(
                    aid,
                    [] if invalid else ["config"],
                    "failed" if invalid else "blocked_by_policy",
                    decision,
                    report.config_hash,
                    report.config_authorization,
                    [],
                    now,
                )
        for aid, entry in current.items():
            before = self.entries.get(aid)
            if before is None or before.effectiveState != entry.effectiveState:
                log.info(
                    "ledger.transition",
                    action_id=aid,
                    before=before.effectiveState if before else None,
                    after=entry.effectiveState,
                    decision=decision,
                )
        for aid in set(self.entries) - set(current):
            log.info(
                "ledger.transition",
                action_id=aid,
                before=self.entries[aid].effectiveState,
                after=None,
                decision=decision,
            )
        self.entries = current

    @staticmethod
    def _entry(
        aid: str,
        planes: list[str],
        state: LedgerState,
        decision: str,
        config_hash: str,
        authorization: str,
        gaps: list[str],
        now: str,
    ) -> LedgerEntry:
        return LedgerEntry(
            id=f"urn:sensorium:capability-ledger:{aid}",
            capabilityRef=f"urn:sensorium:action:{aid}",
            declaredBy=["config"],
            negotiatedBy=planes,
            effectiveState=state,
            policyDecisionRef=decision,
            evidenceRefs=[
                f"config-hash:sha-256:{config_hash}",
                f"authorization:{authorization}",
                *(f"gap:{g}" for g in gaps),
            ],
            capturedAt=now,
        )
