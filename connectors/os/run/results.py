"""Turning a finished spawn into a ``sensorium-directive-outcome.v1``."""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any

import msgspec

from sensorium.connectors.os.run.accounting import Usage
from sensorium.connectors.os.run.spawning import Capture, SpawnResult
from sensorium.shared.clock import rfc3339
from sensorium.shared.diagnostics import OsErrorCode, RuntimeErrorCode
from sensorium.shared.sensitivity import baseline_effects, baseline_sensitivity
from sensorium.shared.wire.declaration import Declaration
from sensorium.shared.wire.directive import Directive
from sensorium.shared.wire.outcome import (
    Accounting,
    Diagnostic,
    Outcome,
    OutcomeStatus,
    ResultBody,
    Sensitivity,
    StreamCapture,
)

# stderr's last line when the connector ended the action (ADR-008): at its deadline,
# or by a signal it sent for another reason (a stop, an interrupt).
TIMEOUT_NOTE = "process timed out"
INTERRUPTED_NOTE = "process interrupted by signal {name}"
if TYPE_CHECKING:
    from sensorium.connectors.os.effects.settle import Effects


def _note(run: SpawnResult) -> str | None:
    if run.timed_out:
        return TIMEOUT_NOTE
    if run.interrupted_by is not None:
        return INTERRUPTED_NOTE.format(name=signal.Signals(run.interrupted_by).name)
    return None


def _accounting(usage: Usage | None) -> Accounting | msgspec.UnsetType:
    if usage is None or usage.source not in ("rusage", "cgroup-v2"):
        return msgspec.UNSET
    return Accounting(
        source="cgroup-v2" if usage.source == "cgroup-v2" else "rusage",
        cpu_user_ms=usage.cpu_user_ms,
        cpu_system_ms=usage.cpu_system_ms,
        peak_memory_bytes=usage.peak_memory_bytes,
        io_read_bytes=usage.io_read_bytes,
        io_write_bytes=usage.io_write_bytes,
    )


def _stream(cap: Capture, note: str | None = None) -> StreamCapture:
    text = bytes(cap.data).decode("utf-8", errors="replace")
    if note:
        text = f"{text}{'' if not text or text.endswith(chr(10)) else chr(10)}{note}\n"
    return StreamCapture(
        text=text, bytes_total=cap.total, bytes_captured=len(cap.data), truncated=cap.truncated
    )


def _parse_result(
    decl: Declaration, cap: Capture, diagnostics: list[Diagnostic]
) -> ResultBody | None:
    contract = decl.result_contract
    if contract.stdout_format != "json":
        return None
    if cap.truncated:
        diagnostics.append(
            Diagnostic(
                code=OsErrorCode.RESULT_SCHEMA_INVALID,
                message=f"stdout was cut at {cap.cap} bytes, so it is not a whole JSON document; "
                "raise limits.stdout_max_bytes",
            )
        )
        return None
    try:
        payload: Any = msgspec.json.decode(bytes(cap.data))
    except msgspec.DecodeError as exc:
        diagnostics.append(
            Diagnostic(
                code=OsErrorCode.RESULT_SCHEMA_INVALID,
                message=f"stdout is declared JSON but does not parse: {exc}",
            )
        )
        return None
    source = payload.get("pointers") if isinstance(payload, dict) else None
    if not isinstance(source, dict):
        source = payload if isinstance(payload, dict) else {}
    pointers = {k: source[k] for k in contract.result_pointer_fields if k in source}
    missing = [k for k in contract.pointer_fields if k not in source]
    if missing:
        diagnostics.append(
            Diagnostic(
                code=OsErrorCode.RESULT_POINTER_MISSING,
                message=f"result lacks declared pointer field(s) {', '.join(missing)}",
            )
        )
    return ResultBody(json=payload, pointers=pointers)


def build_outcome(
    *,
    outcome_id: str,
    directive: Directive,
    decl: Declaration,
    argv: list[str],
    timeout_ms: int,
    run: SpawnResult,
    unauthorized: bool,
    produced: Effects | None = None,
) -> Outcome:
    diagnostics: list[Diagnostic] = []
    if run.spawn_error is not None:
        diagnostics.append(
            Diagnostic(
                code=RuntimeErrorCode.SPAWN_FAILED,
                message=f"could not start the program: {run.spawn_error}",
            )
        )
    if run.timed_out:
        diagnostics.append(
            Diagnostic(
                code=OsErrorCode.ACTION_TIMEOUT,
                message=f"{TIMEOUT_NOTE} after {timeout_ms} ms; the process "
                "group got SIGTERM, then SIGKILL after the grace",
            )
        )
    result = None
    if not run.timed_out and run.spawn_error is None:
        result = _parse_result(decl, run.stdout, diagnostics)
    if produced is not None:
        diagnostics += produced.diagnostics
    status: OutcomeStatus
    if run.timed_out:
        status = "timed-out"
    elif run.exit_code == 0 and not diagnostics:
        status = "completed"
    else:
        status = "failed"
    # The class's baselines (C6: of the categories it names), never fewer (seed 048).
    composed = decl.composed.effects if decl.composed is not None else None
    effects = list(
        dict.fromkeys(baseline_effects(decl.class_, composed) + decl.connector_incidental_effects)
    )
    return Outcome(
        outcome_id=outcome_id,
        directive_id=directive.directive_id,
        action_id=directive.action_id,
        correlation_id=directive.correlation_id,
        status=status,
        argv=argv,
        exit_code=run.exit_code,
        signal=run.signal,
        started_at=rfc3339(run.started_at),
        duration_ms=round(run.duration_s * 1000, 3),
        timeout_ms=timeout_ms,
        stdout=_stream(run.stdout),
        stderr=_stream(run.stderr, _note(run)),
        result=result,
        incidental_effects=effects,
        sensitivity=Sensitivity(class_=baseline_sensitivity(decl.class_, composed)),
        diagnostics=diagnostics,
        connector_unauthorized=unauthorized,
        files_touched=produced.files_touched if produced else [],
        network_transcript=produced.transcript if produced else [],
        artifact_refs=produced.artifact_refs if produced else [],
        accounting=_accounting(run.usage),
    )


# Room for the reply envelope around the outcome.
_ENVELOPE_MARGIN = 64 * 1024


def _cut(text: str, max_bytes: int) -> str:
    raw = text.encode()
    return text if len(raw) <= max_bytes else raw[: max(max_bytes, 0)].decode("utf-8", "ignore")


def fit_outcome(outcome: Outcome, limit: int) -> Outcome:
    """Shrink the captured text so the encoded outcome fits one message of ``limit`` bytes.

    Undecodable output expands (each bad byte becomes a 3-byte replacement character), so
    byte caps alone do not bound the message; an outcome that does not fit would be lost.
    """
    budget = limit - _ENVELOPE_MARGIN
    size = len(msgspec.msgpack.encode(outcome))
    if size <= budget:
        return outcome
    out_b, err_b = len(outcome.stdout.text.encode()), len(outcome.stderr.text.encode())
    room = max(budget - (size - out_b - err_b), 0)
    err_room = min(err_b, room // 2)
    out_room = room - err_room
    stdout = msgspec.structs.replace(
        outcome.stdout, text=_cut(outcome.stdout.text, out_room), truncated=True
    )
    stderr = msgspec.structs.replace(
        outcome.stderr,
        text=_cut(outcome.stderr.text, err_room),
        truncated=outcome.stderr.truncated or err_room < err_b,
    )
    fitted = msgspec.structs.replace(outcome, stdout=stdout, stderr=stderr)
    if len(msgspec.msgpack.encode(fitted)) > budget and fitted.result is not None:
        fitted = msgspec.structs.replace(
            fitted,
            result=ResultBody(pointers=fitted.result.pointers),
            diagnostics=[
                *fitted.diagnostics,
                Diagnostic(
                    code=OsErrorCode.RESULT_SCHEMA_INVALID,
                    message=f"the parsed result does not fit a {limit}-byte message; "
                    "only its pointers are kept",
                ),
            ],
        )
    return fitted
