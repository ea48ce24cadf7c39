"""``sensorium-directive-result.v1``: what every caller of ``sensorium.directive.invoke``
is answered (proposal 045's result envelope).

``status`` is final for a sync directive (``completed``, ``failed``, ``timed_out``), or
``admitted`` for an async one, or ``rejected`` when admission refused it: always with
``outcome/id`` (the audit record, ``sensorium audit show ID``) and ``observation/ids``.
The published schema is open; this node adds two fields under its own prefix:

- ``sensorium/outcome``: the connector's full execution report
  (``sensorium-os-execution.v1``: argv, exit code, stdout, stderr, files touched…) for
  a sync directive that ran, so the caller needs no second request;
- ``sensorium/deferred``: the ``deferred-operation.v1`` handle of an ``admitted`` one.

Availability failures (undecodable request, overloaded, core or connector unavailable,
storage unavailable, an outcome in doubt) are not results: they keep the coded error
envelope, with ``detail["outcome/id"]`` once the directive has an outcome record.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from sensorium.shared.wire.base import OpenMessage
from sensorium.shared.wire.deferred import DeferredOperation
from sensorium.shared.wire.directive import ArtifactRef
from sensorium.shared.wire.outcome import Outcome

SCHEMA_NAME = "sensorium-directive-result.v1"
ResultStatus = Literal["admitted", "completed", "failed", "timed_out", "rejected"]
Level = Literal["info", "warn", "error"]


def published_status(status: str) -> ResultStatus:
    """The published spelling of an execution status (``timed-out`` -> ``timed_out``);
    lenient, for records stored before the contract was followed."""
    spelled = status.replace("-", "_")
    if spelled in ("admitted", "completed", "failed", "timed_out", "rejected"):
        return spelled  # type: ignore[return-value]
    return "failed"


class ResultDiagnostic(OpenMessage, frozen=True, kw_only=True):
    """A published diagnostic (``level``, ``kind``, ``message``, ``retryable``) carrying the
    project's stable ``code`` beside them (``kind`` is that code too: one vocabulary)."""

    level: Level = "error"
    kind: str = ""
    code: str = ""
    message: str = ""
    retryable: bool = False
    path: str | UnsetType = UNSET
    detail: dict[str, str] | UnsetType = UNSET


class DirectiveResult(OpenMessage, frozen=True, kw_only=True, omit_defaults=True):
    # No defaults where the field must always be sent (omit_defaults would drop it).
    schema: Literal["sensorium-directive-result.v1"]
    schema_v: Literal[1] = msgspec.field(name="schema/v")
    directive_id: str = msgspec.field(name="directive/id")
    correlation_id: str | None = msgspec.field(name="correlation/id", default=None)
    status: ResultStatus
    # The action's structured result (its result contract); absent when rejected or
    # admitted, and when the action declares none.
    result: dict[str, Any] | None = None
    outcome_id: str = msgspec.field(name="outcome/id")
    observation_ids: list[str] = msgspec.field(name="observation/ids")
    artifacts: list[ArtifactRef] = msgspec.field(default_factory=list)
    diagnostics: list[ResultDiagnostic] = msgspec.field(default_factory=list)
    outcome: Outcome | None = msgspec.field(name="sensorium/outcome", default=None)
    deferred: DeferredOperation | None = msgspec.field(name="sensorium/deferred", default=None)
    # A signed directive's: sha256 of its signature (core/authenticity.py), as its record.
    signature_digest: str | UnsetType = msgspec.field(
        name="directive/signature_digest", default=UNSET
    )

    def __post_init__(self) -> None:
        if self.status in ("rejected", "admitted") and self.result is not None:
            raise ValueError(f"a {self.status} result carries no result")


# What __post_init__ checks, stated in the schema (schemagen adds it to the $def).
NO_RESULT_UNLESS_RAN: dict[str, Any] = {
    "allOf": [
        {
            "if": {
                "required": ["status"],
                "properties": {"status": {"enum": ["rejected", "admitted"]}},
            },
            "then": {"properties": {"result": {"type": "null"}}},
        }
    ]
}
