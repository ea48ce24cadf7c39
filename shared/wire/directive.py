"""``sensorium-directive.v1``: what a caller asks core to do."""

from __future__ import annotations

from itertools import chain
from typing import Annotated, Any, Literal

import msgspec

from sensorium.shared.diagnostics import OsErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.wire.base import Message, Timestamp

TimingMode = Literal["sync", "async"]

# Parameters are validated, logged and re-encoded on every hop, by code that recurses:
# values nested past this cap are refused where a directive is decoded or built, before
# any of that (at ~980 levels core's validator died in RecursionError, an `internal`).
# Their size is bounded by the request's (4 MiB) and, once rendered, by the argv's.
PARAMETERS_MAX_DEPTH = 64  # ``parameters`` itself is level 1
_SCALARS = frozenset({str, int, float, bool, type(None), bytes})
_NESTED = (dict, list, tuple)


class ParametersRefused(CodedError, ValueError):
    """``parameters-invalid`` for parameters no hop could carry. A ValueError too, so that
    decoding turns it into a ``msgspec.ValidationError`` (``request-malformed``) while
    code building a directive sees the coded error itself."""

    def __init__(self, message: str) -> None:
        super().__init__(OsErrorCode.PARAMETERS_INVALID, message, path="$.parameters")


def parameters_problem(parameters: dict[str, Any]) -> str | None:
    """Why ``parameters`` break the cap (or cannot travel at all), else ``None``."""
    try:
        msgspec.msgpack.encode(parameters)
    except RecursionError:
        return f"parameters are nested more than {PARAMETERS_MAX_DEPTH} levels deep"
    except (TypeError, ValueError, OverflowError) as exc:
        return f"parameters cannot be encoded: {exc!s:.200}"
    level: list[Any] = [parameters]
    for _ in range(PARAMETERS_MAX_DEPTH):
        level = _deeper(level)
        if not level:
            return None
    return f"parameters are nested more than {PARAMETERS_MAX_DEPTH} levels deep"


def _deeper(level: list[Any]) -> list[Any]:
    """The containers one level below ``level``, a whole level at a time at C speed."""
    dicts = [node for node in level if isinstance(node, dict)]
    if dicts:
        rest = [node for node in level if not isinstance(node, dict)]
        parts = [*rest, *dicts, *(d.values() for d in dicts)]
    else:
        parts = level
    items = list(chain.from_iterable(parts))
    if _SCALARS.issuperset(map(type, items)):
        return []
    return [item for item in items if isinstance(item, _NESTED)]


class Timing(Message, frozen=True, kw_only=True):
    mode: TimingMode = "sync"
    timeout_ms: Annotated[int, msgspec.Meta(ge=1, le=86_400_000)] | None = None
    deadline_at: Timestamp | None = None


class Directive(Message, frozen=True, kw_only=True):
    schema: Literal["sensorium-directive.v1"] = "sensorium-directive.v1"
    schema_v: Literal[1] = msgspec.field(name="schema/v", default=1)
    directive_id: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] = msgspec.field(
        name="directive/id"
    )
    action_id: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    parameters: dict[str, Any] = msgspec.field(default_factory=dict)
    timing: Timing = msgspec.field(default_factory=Timing)
    idempotency_key: Annotated[str, msgspec.Meta(min_length=1, max_length=128)] | None = (
        msgspec.field(name="idempotency/key", default=None)
    )
    correlation_id: Annotated[str, msgspec.Meta(max_length=128)] | None = msgspec.field(
        name="correlation/id", default=None
    )

    def __post_init__(self) -> None:
        if self.parameters and (problem := parameters_problem(self.parameters)) is not None:
            raise ParametersRefused(problem)
