"""Reading core's answer to an invoke: a ``sensorium-directive-result.v1``.

The clients keep their API: a sync invoke returns the execution report (``Outcome``,
which the result carries as ``sensorium/outcome``), an async one the
``DeferredOperation`` handle (``sensorium/deferred``), and a ``rejected`` result raises
the same typed exception (``Rejected`` subclasses) the code always mapped to, with
``detail["outcome/id"]`` naming the audit record. A node older than the result
envelope answered the report or handle itself: still read.
"""

from __future__ import annotations

from typing import Any

import msgspec

from sensorium.client.errors import ProtocolError, SensoriumError, from_coded
from sensorium.shared.errors import CodedError
from sensorium.shared.wire.deferred import DeferredOperation
from sensorium.shared.wire.outcome import Outcome
from sensorium.shared.wire.result import SCHEMA_NAME, DirectiveResult

# What a client asks the RPC layer to decode an invoke's reply as.
Answer = dict[str, Any]


def directive_result(doc: Answer) -> DirectiveResult:
    """The reply as a result; ``ProtocolError`` for anything else."""
    try:
        return msgspec.convert(doc, DirectiveResult)
    except msgspec.ValidationError as exc:
        raise ProtocolError(
            "reply-malformed", f"core's answer is no directive result: {exc}"
        ) from None


def unwrap(doc: Answer) -> Outcome | DeferredOperation:
    """The report or handle an invoke returns; raises the rejection's typed exception."""
    schema = doc.get("schema") if isinstance(doc, dict) else None
    try:
        if schema == "deferred-operation.v1":  # an older node
            return msgspec.convert(doc, DeferredOperation)
        if schema != SCHEMA_NAME:
            return msgspec.convert(doc, Outcome)
    except msgspec.ValidationError as exc:
        raise ProtocolError("reply-malformed", f"core's answer does not decode: {exc}") from None
    res = directive_result(doc)
    if res.status == "rejected":
        raise rejection(res)
    if res.deferred is not None:
        return res.deferred
    if res.outcome is not None:
        return res.outcome
    raise ProtocolError(
        "reply-malformed",
        f"a {res.status} result carries neither sensorium/outcome nor sensorium/deferred "
        f"(outcome/id {res.outcome_id})",
    )


def rejection(res: DirectiveResult) -> SensoriumError:
    """The typed exception of a ``rejected`` result (its first diagnostic's code)."""
    first = res.diagnostics[0] if res.diagnostics else None
    detail = dict(first.detail) if first is not None and isinstance(first.detail, dict) else {}
    detail["outcome/id"] = res.outcome_id
    return from_coded(
        CodedError(
            first.code if first is not None else "rejected",
            first.message if first is not None else "the directive was rejected",
            path=first.path if first is not None and isinstance(first.path, str) else None,
            detail=detail,
        )
    )
