"""``orbiplex-continuation.v1``: where a suspended flow resumes (seed 055 §6.2).

A value, never a stack: ids, a resume point, the flow's context as JSON, a trace.
Host-private: operator views show its digest and shape, never its context.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from sensorium.shared.wire.base import Message, Timestamp

EXECUTOR_ID = "json_e_flow"


class ResumePoint(Message, frozen=True, kw_only=True):
    executor_id: str = EXECUTOR_ID
    template_id: str
    step_index: int
    step_id: str
    output_binding: str


class Caller(Message, frozen=True, kw_only=True):
    module_id: str


class Continuation(Message, frozen=True, kw_only=True):
    schema: Literal["orbiplex-continuation.v1"] = "orbiplex-continuation.v1"
    continuation_id: str
    workflow_run_id: str
    step_id: str
    deferred_operation_id: str
    resume_kind: Literal["json_e_flow_step"] = "json_e_flow_step"
    resume_point: ResumePoint
    caller: Caller
    capability_id: str
    context: dict[str, Any] = msgspec.field(default_factory=dict)
    envelope: Any = None
    trace: dict[str, str] = msgspec.field(default_factory=dict)
    idempotency_key: str | None = None
    deadline_at: Timestamp | None = None
    attempts: int = 0
    last_diagnostic: str | None = None
    extensions: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET
