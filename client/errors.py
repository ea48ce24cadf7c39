"""Exceptions the client raises, one per kind of fault, each carrying the stable code.

::

    SensoriumError                 code, message, path, retry_after_ms
    ├── Rejected                   the request itself is wrong; fix it, do not retry
    │   ├── ActionNotAllowlisted   action-not-allowlisted
    │   ├── ParametersInvalid      parameters-invalid (path names the parameter)
    │   ├── ActionNotEnabled       action-not-enabled (detail["state"] names the ledger state)
    │   ├── ExecutionModeUnsupported  execution-mode-unsupported, deferred-not-accepted
    │   ├── UnknownId              operation-unknown, flow-unknown, observation-unknown
    │   ├── NotCancelable          operation-not-cancelable (message gives the reason)
    │   ├── FlowInvalid            flow-invalid (path names the step or field)
    │   ├── ConsentRequired        consent-required: the action is above the sensitivity
    │   │                          a caller may trigger without consent; nothing ran
    │   ├── GrantDenied            grant-denied: this client key may not invoke that action,
    │   │                          claim that issuer, or read another key's operation or
    │   │                          its raw outcome
    │   ├── NotAuthentic           signature-invalid, issuer-mismatch, delegation-expired,
    │   │                          delegation-not-granted: the directive's signature or
    │   │                          delegation does not hold; nothing ran
    │   └── IdempotencyConflict    idempotency-conflict: the key was first used for another
    │                              action or other parameters; nothing ran
    ├── InDoubt                    outcome-in-doubt: an earlier attempt under this key may
    │                              have run; it never runs twice under one key
    ├── FlowFailed                 flow-step-failed: a step ran and did not complete
    ├── DeadlineExceeded           deadline-exceeded: the caller's deadline passed first;
    │                              ``last`` is the last status seen (the work goes on)
    ├── Retryable                  nobody's fault for long; retry with the same idempotency/key
    │   ├── Unavailable            core-unavailable, connector-unavailable, shutting-down
    │   ├── Overloaded             overloaded (retry_after_ms says when)
    │   ├── StorageUnavailable     storage-unavailable (disk full, read-only state dir)
    │   └── ReplyTimeout           reply-timeout
    └── ProtocolError              request-malformed, internal, anything unknown
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sensorium.shared.errors import CodedError

if TYPE_CHECKING:
    from sensorium.shared.wire.deferred import DeferredOperationStatus
    from sensorium.shared.wire.flow import FlowStatus


class SensoriumError(CodedError):
    """Base of every error the client raises; ``code`` is the stable diagnostic code."""


class Rejected(SensoriumError):
    pass


class ActionNotAllowlisted(Rejected):
    pass


class ParametersInvalid(Rejected):
    pass


class ActionNotEnabled(Rejected):
    pass


class ExecutionModeUnsupported(Rejected):
    """The action cannot run in the asked mode (a sync-only action asked to defer, an
    async-only one asked to block), or a flow refused a step that would defer."""


class UnknownId(Rejected):
    """No such operation or flow on this node (never created, or collected after the
    retention); ``sensorium ops list`` shows the operations it has."""


class NotCancelable(Rejected):
    """The operation declared itself non-cancelable; the message carries its reason."""


class FlowInvalid(Rejected):
    pass


class GrantDenied(Rejected):
    """The CURVE key this client connected with is not granted the action's group."""


class ConsentRequired(Rejected):
    """The action is above the sensitivity a caller may trigger without consent:
    ``detail["sensitivity"]`` names it; resend with ``consent`` at least that strict."""


class IdempotencyConflict(Rejected):
    """The ``idempotency/key`` was first used (by this client) for another action or
    other parameters: nothing ran, and the first attempt's outcome is not given out.
    Use a fresh key for a different directive."""


class RecordingActive(Rejected):
    """A recording already runs (``record_start`` twice); its path is in ``detail``."""


class FlowFailed(SensoriumError):
    pass


class InDoubt(SensoriumError):
    """An earlier attempt under the same ``idempotency/key`` was dispatched and its
    outcome was lost (a process died mid-directive). It is not run again under that key:
    check its effect, then use a fresh key to run it again."""


class DeadlineExceeded(SensoriumError):
    """The caller's deadline passed before the operation or flow ended.

    The work is not cancelled by this: ``last`` is the last status seen
    (``DeferredOperationStatus`` or ``FlowStatus``; ``None`` when core refused a
    directive whose ``deadline_at`` had already passed). Wait again, or cancel.
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        path: str | None = None,
        retry_after_ms: int | None = None,
        detail: dict[str, str] | None = None,
        last: DeferredOperationStatus | FlowStatus | None = None,
    ) -> None:
        super().__init__(code, message, path=path, retry_after_ms=retry_after_ms, detail=detail)
        self.last = last


class Retryable(SensoriumError):
    pass


class Unavailable(Retryable):
    pass


class Overloaded(Retryable):
    pass


class ReplyTimeout(Retryable):
    pass


class NotAuthentic(Rejected):
    pass


class StorageUnavailable(Retryable):
    pass


class ProtocolError(SensoriumError):
    pass


_BY_CODE: dict[str, type[SensoriumError]] = {
    "action-not-allowlisted": ActionNotAllowlisted,
    "parameters-invalid": ParametersInvalid,
    "action-not-enabled": ActionNotEnabled,
    "action-catalog-unauthorized": ActionNotEnabled,
    "catalog-invalid": ActionNotEnabled,
    "execution-mode-unsupported": ExecutionModeUnsupported,
    "deferred-not-accepted": ExecutionModeUnsupported,
    "operation-unknown": UnknownId,
    "flow-unknown": UnknownId,
    "observation-unknown": UnknownId,
    "operation-not-cancelable": NotCancelable,
    "flow-invalid": FlowInvalid,
    "flow-step-failed": FlowFailed,
    "grant-denied": GrantDenied,
    "consent-required": ConsentRequired,
    "signature-invalid": NotAuthentic,
    "issuer-mismatch": NotAuthentic,
    "delegation-expired": NotAuthentic,
    "delegation-not-granted": NotAuthentic,
    "idempotency-conflict": IdempotencyConflict,
    "recording-active": RecordingActive,
    "recording-invalid": Rejected,
    "outcome-in-doubt": InDoubt,
    "storage-unavailable": StorageUnavailable,
    "deadline-exceeded": DeadlineExceeded,
    "core-unavailable": Unavailable,
    "connector-unavailable": Unavailable,
    "shutting-down": Unavailable,
    "catalog-stale": Unavailable,
    "overloaded": Overloaded,
    "reply-timeout": ReplyTimeout,
}


def from_coded(exc: CodedError) -> SensoriumError:
    cls = _BY_CODE.get(exc.code, ProtocolError)
    return cls(
        exc.code, exc.message, path=exc.path, retry_after_ms=exc.retry_after_ms, detail=exc.detail
    )
