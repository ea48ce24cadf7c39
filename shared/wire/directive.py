"""``sensorium-directive.v1``: what a caller asks core to do."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from sensorium.shared.wire.base import Message, Timestamp

TimingMode = Literal["sync", "async"]


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
