"""Exceptions the client raises, one per kind of fault, each carrying the stable code.

::

    SensoriumError                 code, message, path, retry_after_ms
    ├── Rejected                   the directive itself is wrong; fix it, do not retry
    │   ├── ActionNotAllowlisted   action-not-allowlisted
    │   ├── ParametersInvalid      parameters-invalid (path names the parameter)
    │   ├── ActionNotEnabled       action-not-enabled (detail["state"] names the ledger state)
    │   └── ExecutionModeUnsupported
    ├── Retryable                  nobody's fault for long; retry with the same idempotency/key
    │   ├── Unavailable            core-unavailable, connector-unavailable, shutting-down
    │   ├── Overloaded             overloaded (retry_after_ms says when)
    │   └── ReplyTimeout           reply-timeout
    └── ProtocolError              request-malformed, internal, anything unknown
"""

from __future__ import annotations

from sensorium.shared.errors import CodedError


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
    pass


class Retryable(SensoriumError):
    pass


class Unavailable(Retryable):
    pass


class Overloaded(Retryable):
    pass


class ReplyTimeout(Retryable):
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
