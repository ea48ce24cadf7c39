"""The supervisor's control socket: status, resume of a failed process, stop."""

from __future__ import annotations

from typing import Literal

import msgspec

from sensorium.shared.wire.base import Message, OpenMessage, RequestId, Timestamp

ChildState = Literal["starting", "ready", "backoff", "failed", "stopping", "stopped"]


class ControlRequest(Message, frozen=True, kw_only=True, tag_field="method"):
    request_id: RequestId = msgspec.field(name="request/id")


class SupervisorStatus(ControlRequest, frozen=True, kw_only=True, tag="supervisor.status"):
    pass


class SupervisorResume(ControlRequest, frozen=True, kw_only=True, tag="supervisor.resume"):
    process: str


class SupervisorStop(ControlRequest, frozen=True, kw_only=True, tag="supervisor.stop"):
    pass


class SupervisorRestart(ControlRequest, frozen=True, kw_only=True, tag="supervisor.restart"):
    """An operator restart: stop the process and start it again; not a failure."""

    process: str


ControlRequestUnion = SupervisorStatus | SupervisorResume | SupervisorStop | SupervisorRestart


class ChildStatus(OpenMessage, frozen=True, kw_only=True):
    name: str
    state: ChildState
    pid: int | None = None
    uptime_s: float | None = None
    restarts: int = 0
    rss_bytes: int | None = None
    cpu_percent: float | None = None
    fds: int | None = None
    last_exit: str | None = None
    status_text: str | None = None


class SupervisorStatusReply(OpenMessage, frozen=True, kw_only=True):
    pid: int
    started_at: Timestamp
    state_dir: str
    children: list[ChildStatus] = msgspec.field(default_factory=list)


class Ack(OpenMessage, frozen=True, kw_only=True):
    ok: bool = True
    message: str = ""
