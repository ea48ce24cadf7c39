"""The module report: what the connector publishes of its catalog, its authorization and
its runtime, and so what core's resolution map and the capability ledger are built from.

Executable paths and envelopes never leave the connector; a catalog that is invalid or
not authorized is not exposed at all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import get_args

from sensorium.connectors.os.catalog import sources as catalog_mod
from sensorium.connectors.os.catalog.authorization import Verdict
from sensorium.connectors.os.envelope.probe import Runtime
from sensorium.shared.diagnostics import OsErrorCode, RuntimeErrorCode
from sensorium.shared.wire.declaration import ActionClass, Declaration
from sensorium.shared.wire.outcome import Diagnostic
from sensorium.shared.wire.report import ConnectorAction, LedgerState, ModuleReport


def build_report(
    cat: catalog_mod.Catalog,
    verdict: Verdict,
    instance_id: str,
    started_at: str,
    state_of: Callable[[Declaration], tuple[LedgerState, list[str]]],
    runtime: Runtime,
) -> ModuleReport:
    diagnostics = [
        Diagnostic(code=p.code or RuntimeErrorCode.CATALOG_INVALID, message=str(p), path=p.field)
        for p in cat.problems
    ]
    if cat.problems and all(d.code != RuntimeErrorCode.CATALOG_INVALID for d in diagnostics):
        # Every problem had its own code (parameters-schema-invalid, say): the catalog as
        # a whole is still refused, and core and the ledger branch on this code.
        diagnostics.append(
            Diagnostic(
                code=RuntimeErrorCode.CATALOG_INVALID,
                message=f"the catalog failed validation ({len(cat.problems)} problems)",
            )
        )
    actions: list[ConnectorAction] = []
    if cat.valid and verdict.exposed:
        for aid, decl in cat.declarations.items():
            state, gaps = state_of(decl)
            missing = catalog_mod.executable_gap(decl)
            if missing and state in ("enabled", "degraded"):
                state, gaps = "unsupported_by_runtime", [missing]
            actions.append(
                ConnectorAction(
                    action_id=aid,
                    class_=decl.class_,
                    description=decl.description,
                    group=decl.group,
                    parameters_schema=decl.parameters_schema,
                    default_timeout_ms=decl.default_timeout_ms,
                    max_timeout_ms=decl.max_timeout_ms,
                    execution_mode_support=decl.execution_mode_support,
                    deferred_profile=decl.deferred_profile,
                    result_contract=decl.result_contract,
                    state=state,
                    gaps=gaps,
                    source=cat.sources.get(aid),
                    sensitivity_class=decl.sensitivity.class_ if decl.sensitivity else None,
                    signing=decl.signing,
                    composed_effects=list(decl.composed.effects) if decl.composed else None,
                )
            )
    if verdict.tolerated:
        diagnostics.append(
            Diagnostic(code=OsErrorCode.ACTION_CATALOG_UNAUTHORIZED, message=verdict.message)
        )
    if not verdict.exposed:
        diagnostics.append(
            Diagnostic(
                code=OsErrorCode.ACTION_CATALOG_UNAUTHORIZED,
                message=f"{verdict.reason}: {verdict.message}",
            )
        )
    return ModuleReport(
        module_id=catalog_mod.MODULE_ID,
        instance_id=instance_id,
        started_at=started_at,
        config_hash=cat.config_hash,
        config_authorized=verdict.authorized,
        config_authorization=verdict.reason,
        catalog_exposed=cat.valid and verdict.exposed,
        declared_actions=sorted(cat.sources),
        connector_actions=actions,
        runtime=runtime.report(
            sorted(c for c in get_args(ActionClass) if c != "operator-gated-spawn")
        ),
        diagnostics=diagnostics,
    )
