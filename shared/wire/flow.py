"""A flow: a list of directive steps run in core, suspended on deferred steps (seed 055 §8).

Each step's parameters are a JSON-e template rendered against the flow's context;
its outcome is bound into the context under ``output_binding``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from sensorium.shared.wire.base import Message, OpenMessage, Timestamp
from sensorium.shared.wire.deferred import DeferredOperation
from sensorium.shared.wire.directive import TimingMode
from sensorium.shared.wire.outcome import Diagnostic

Name = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}\Z")]
DeferredResponseMode = Literal["surface-to-caller", "reject-as-failure"]
FlowState = Literal["runnable", "running", "suspended", "completed", "failed"]
MAX_STEPS = 64


class FlowStep(Message, frozen=True, kw_only=True):
    step_id: Name
    action_id: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    # A JSON-e template; rendered with the flow's context, it must give an object.
    parameters: Any = msgspec.field(default_factory=dict)
    output_binding: Name
    mode: TimingMode = "sync"
    timeout_ms: Annotated[int, msgspec.Meta(ge=1, le=86_400_000)] | None = None


class FlowDefinition(Message, frozen=True, kw_only=True):
    steps: Annotated[list[FlowStep], msgspec.Meta(min_length=1, max_length=MAX_STEPS)]
    deferred_response_mode: DeferredResponseMode = "surface-to-caller"


class FlowStatus(OpenMessage, frozen=True, kw_only=True):
    """Where a flow is. A suspended flow names the operation it waits on; with
    ``surface-to-caller`` that operation's handle is the deferred control outcome."""

    flow_id: str = msgspec.field(name="flow/id")
    template_id: str
    state: FlowState
    step_index: int
    steps: int
    context: dict[str, Any] = msgspec.field(default_factory=dict)
    deferred: DeferredOperation | None = None
    updated_at: Timestamp
    diagnostics: list[Diagnostic] = msgspec.field(default_factory=list)
