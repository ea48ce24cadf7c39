"""``middleware-module-report.v1``: how a connector publishes its catalog and its state."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from sensorium.shared.wire.base import OpenMessage, Timestamp
from sensorium.shared.wire.declaration import (
    ActionClass,
    DeferredProfile,
    ExecutionModeSupport,
    ResultContract,
    Signing,
)
from sensorium.shared.wire.outcome import Diagnostic

# Capability-ledger states (seed 003).
LedgerState = Literal[
    "declared",
    "requested",
    "negotiating",
    "available",
    "enabled",
    "degraded",
    "blocked_by_policy",
    "unsupported_by_runtime",
    "unsupported_by_server",
    "missing_plugin",
    "missing_schema",
    "failed",
]
# States in which core admits a directive.
RUNNABLE_STATES: frozenset[str] = frozenset({"enabled", "degraded"})


class ConnectorAction(OpenMessage, frozen=True, kw_only=True):
    """What core needs to resolve, validate and clamp — never the executable or its envelope."""

    action_id: str
    class_: ActionClass = msgspec.field(name="class")
    description: str | None = None
    group: str | None = None
    parameters_schema: dict[str, Any]
    default_timeout_ms: int
    max_timeout_ms: int
    execution_mode_support: ExecutionModeSupport = "sync-only"
    deferred_profile: DeferredProfile | None = None
    result_contract: ResultContract = msgspec.field(default_factory=ResultContract)
    state: LedgerState
    gaps: list[str] = msgspec.field(default_factory=list)
    source: str | None = None
    # The declaration's own sensitivity class, if it raised the baseline.
    sensitivity_class: str | None = None
    # The declaration's signing block: core arranges its scoped signer grant.
    signing: Signing | None = None
    # C6: the effect categories it composes (its baselines are theirs, seed 048).
    composed_effects: list[str] | None = None


class RuntimeProbe(OpenMessage, frozen=True, kw_only=True):
    """Which kernel mechanisms this connector found, and which classes it can enforce."""

    platform: str
    uid: int
    mechanisms: dict[str, bool] = msgspec.field(default_factory=dict)
    classes: dict[str, str] = msgspec.field(default_factory=dict)


class ModuleReport(OpenMessage, frozen=True, kw_only=True):
    schema: Literal["middleware-module-report.v1"] = "middleware-module-report.v1"
    schema_v: Literal[1] = msgspec.field(name="schema/v", default=1)
    module_id: str
    instance_id: str = msgspec.field(name="instance/id")
    started_at: Timestamp
    config_hash: str = msgspec.field(name="config/hash")
    config_authorized: bool = msgspec.field(name="config/authorized")
    config_authorization: str = msgspec.field(name="config/authorization")
    catalog_exposed: bool = msgspec.field(name="catalog/exposed")
    connector_actions: list[ConnectorAction] = msgspec.field(default_factory=list)
    # Every declared action id, even when the catalog is not exposed: ids alone reveal no
    # envelope, and they let the ledger say what is blocked and why.
    declared_actions: list[str] = msgspec.field(default_factory=list)
    runtime: RuntimeProbe
    diagnostics: list[Diagnostic] = msgspec.field(default_factory=list)
