"""Admission: everything core checks before a directive may reach the connector."""

from __future__ import annotations

import time

from sensorium.core.consent import check_consent
from sensorium.core.resolution import ResolutionMap
from sensorium.shared.clock import parse_rfc3339
from sensorium.shared.config import ConsentConfig, Limits
from sensorium.shared.diagnostics import OsErrorCode, RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.wire.directive import Directive

# Long enough to name what is wrong, short enough that a huge parameter is not echoed.
MAX_MESSAGE_CHARS = 600


def shorten(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def admit(
    d: Directive,
    resolution: ResolutionMap,
    limits: Limits,
    *,
    connected: bool,
    now: float | None = None,
    consent: ConsentConfig | None = None,
) -> int:
    """The effective timeout in ms for an admissible directive; ``CodedError`` otherwise."""
    if not connected:
        raise CodedError(
            RuntimeErrorCode.CONNECTOR_UNAVAILABLE,
            "the OS connector is not connected; retry shortly",
            retry_after_ms=500,
        )
    report = resolution.report
    if report is None:
        # Connected, but the catalog has not arrived yet (a restart moments ago): an
        # unknown action now would be a wrong, final answer.
        raise CodedError(
            RuntimeErrorCode.CATALOG_STALE,
            "core has not yet received the connector's catalog; retry shortly",
            retry_after_ms=200,
        )
    if any(d.code == RuntimeErrorCode.CATALOG_INVALID for d in report.diagnostics):
        raise CodedError(
            RuntimeErrorCode.CATALOG_INVALID,
            "the connector's catalog failed validation and is not exposed; "
            "`sensorium catalog show` lists every problem",
        )
    if not report.catalog_exposed:
        raise CodedError(
            OsErrorCode.ACTION_CATALOG_UNAUTHORIZED,
            f"the connector's catalog is not authorized ({report.config_authorization}); "
            "`sensorium catalog verify` says why and what to do",
            detail={"reason": report.config_authorization},
        )
    resolved = resolution.get(d.action_id)
    if resolved is None:
        raise CodedError(
            OsErrorCode.ACTION_NOT_ALLOWLISTED,
            f"{shorten(repr(d.action_id), 140)} is not an action of this node's catalog; "
            "`sensorium actions` lists the ones it has",
            path="$.action_id",
        )
    action = resolved.action
    if not resolved.runnable:
        raise CodedError(
            RuntimeErrorCode.ACTION_NOT_ENABLED,
            f"{d.action_id} is {action.state}: {'; '.join(action.gaps)}",
            detail={"state": action.state},
        )
    mode, support = d.timing.mode, action.execution_mode_support
    if mode == "async" and support == "sync-only":
        raise CodedError(
            RuntimeErrorCode.EXECUTION_MODE_UNSUPPORTED,
            f"{d.action_id} is sync-only: it cannot be deferred; send timing.mode=sync",
            path="$.timing.mode",
        )
    if mode == "async" and action.state == "degraded":
        # A degraded run is one the caller must see as it happens: a deferred one
        # would carry its given-up protections past the moment of asking.
        raise CodedError(
            RuntimeErrorCode.EXECUTION_MODE_UNSUPPORTED,
            f"{d.action_id} is degraded ({'; '.join(action.gaps)}): it runs only "
            "synchronously; send timing.mode=sync",
            path="$.timing.mode",
            detail={"state": action.state},
        )
    if mode == "sync" and support == "async-only":
        raise CodedError(
            RuntimeErrorCode.EXECUTION_MODE_UNSUPPORTED,
            f"{d.action_id} is async-only: send timing.mode=async and poll the operation",
            path="$.timing.mode",
        )
    problems = resolved.check(d.parameters)
    if problems:
        raise CodedError(
            OsErrorCode.PARAMETERS_INVALID,
            shorten("; ".join(f"{p.path}: {shorten(p.message, 200)}" for p in problems)),
            path=problems[0].path,
        )
    check_consent(d, action, consent or ConsentConfig())
    timeout = min(
        d.timing.timeout_ms,
        action.max_timeout_ms,
        limits.max_action_timeout_ms,
    )
    deadline = d.caller_deadline_at
    if deadline is not None:
        where = "$.deadline_at" if deadline == d.deadline_at else "$.timing.deadline_at"
        timeout = min(timeout, _remaining_ms(deadline, now, where))
    return timeout


def _remaining_ms(deadline_at: str, now: float | None, where: str = "$.deadline_at") -> int:
    try:
        deadline = parse_rfc3339(deadline_at)
    except ValueError:
        raise CodedError(
            RuntimeErrorCode.REQUEST_MALFORMED,
            f"{where.removeprefix('$.')} {shorten(repr(deadline_at), 80)} is not an RFC 3339 "
            "timestamp "
            "with an offset (e.g. 2026-05-05T18:00:00Z)",
            path=where,
        ) from None
    left = int((deadline - (time.time() if now is None else now)) * 1000)
    if left <= 0:
        raise CodedError(
            RuntimeErrorCode.DEADLINE_EXCEEDED,
            f"the caller's deadline {deadline_at} has already passed",
            path=where,
        )
    return left
