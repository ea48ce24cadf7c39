"""The connector seam: core's private channel to the OS connector (DESIGN §2)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from sensorium.shared.wire.base import Message, OpenMessage, RequestId, Timestamp
from sensorium.shared.wire.deferred import DeferredOperationStatus
from sensorium.shared.wire.directive import Directive

# Core's identity on the seam: the connector holds replies core missed while it
# restarted and hands them to its next incarnation (late replies, reconciled there).
CORE_ROUTING_ID = b"sensorium-core"
# The poller's connections to core start with this (then its instance id): its polls
# and health probes are the node's own traffic, never a client's, and are not recorded.
POLLER_ROUTING_PREFIX = b"sensorium-poller:"


class SeamRequest(Message, frozen=True, kw_only=True, tag_field="method"):
    request_id: RequestId = msgspec.field(name="request/id")


class ConnectorInvoke(SeamRequest, frozen=True, kw_only=True, tag="sensorium.connector.invoke"):
    """A directive core has resolved, validated and clamped; ``timeout_ms`` is the effective one.

    A sync directive is answered with its outcome. An async one (``timing.mode``
    ``async``) names the ``operation/id`` core reserved for it and is answered with a
    ``sensorium-connector-deferred.v1`` as soon as the job is durable; submitting the
    same id again answers with the same job, never a second one.
    """

    directive: Directive
    timeout_ms: Annotated[int, msgspec.Meta(ge=1)]
    config_hash: str = msgspec.field(name="config/hash")
    operation_id: Annotated[str, msgspec.Meta(min_length=1, max_length=128)] | None = msgspec.field(
        name="operation/id", default=None
    )
    # Only join an attempt the connector already knows under this directive's
    # idempotency/key; never spawn. Core sets it when an earlier dispatch under the key
    # went unanswered: an unknown key is then `outcome-in-doubt`, not a second spawn.
    rejoin: bool = False
    # The directive's scoped signer grant (core/signer/), opaque to the connector: it
    # connects to core's signer socket and hands the action that channel and this token.
    signer_token: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{16,128}\Z")] | None = (
        msgspec.field(name="signer/token", default=None)
    )


class ConnectorStatus(SeamRequest, frozen=True, kw_only=True, tag="sensorium.connector.status"):
    operation_id: str = msgspec.field(name="operation/id")


class ConnectorStatusBatch(
    SeamRequest, frozen=True, kw_only=True, tag="sensorium.connector.status-batch"
):
    """``ConnectorStatus`` for many operations in one message (one read of the job
    store for all of them); answered with ``ConnectorStatuses`` in the order asked."""

    operation_ids: Annotated[list[str], msgspec.Meta(min_length=1, max_length=256)] = msgspec.field(
        name="operation/ids"
    )


class ConnectorStatuses(OpenMessage, frozen=True, kw_only=True):
    statuses: list[DeferredOperationStatus] = msgspec.field(default_factory=list)


class ConnectorCancel(SeamRequest, frozen=True, kw_only=True, tag="sensorium.connector.cancel"):
    operation_id: str = msgspec.field(name="operation/id")


class ConnectorReport(SeamRequest, frozen=True, kw_only=True, tag="sensorium.connector.report"):
    pass


class ConnectorStarts(SeamRequest, frozen=True, kw_only=True, tag="sensorium.connector.starts"):
    """Did any connector instance start these sync dispatches (their seam request ids,
    the earliest sent at ``sent/from``)? Asked by core after it lost the connector
    mid-flight. Answered from the connector's start journal (``connectors/os/starts.py``);
    ``never-started`` also fences them, so they can never start afterwards."""

    seam_requests: Annotated[tuple[RequestId, ...], msgspec.Meta(min_length=1, max_length=64)] = (
        msgspec.field(name="seam/requests")
    )
    sent_from: Timestamp = msgspec.field(name="sent/from")


class ConnectorWatch(SeamRequest, frozen=True, kw_only=True, tag="sensorium.connector.watch"):
    """Core's standing question: which deferred jobs ended after the ``seq`` of the last
    ``EndedJobs`` it had from connector ``instance/id``? Held until one has, or for
    ``wait_ms``. The answer lets core settle those operations at once rather than at
    their next poll; the poller still polls on its own schedule (the host's clamp), so
    a connector that never answers this (older, or restarted) loses nothing."""

    after: Annotated[int, msgspec.Meta(ge=0)] = 0
    instance_id: str | None = msgspec.field(name="instance/id", default=None)
    wait_ms: Annotated[int, msgspec.Meta(ge=0, le=60_000)] = 20_000


class EndedJobs(OpenMessage, frozen=True, kw_only=True):
    """The final status (raw result included) of each job that ended after ``after``,
    in the order they ended, up to ``seq``. ``complete`` is false when some fell out of
    the connector's memory first (or it restarted): their operations wait for a poll."""

    instance_id: str = msgspec.field(name="instance/id")
    seq: Annotated[int, msgspec.Meta(ge=0)]
    statuses: list[DeferredOperationStatus] = msgspec.field(default_factory=list)
    complete: bool = True


class StartsAnswer(OpenMessage, frozen=True, kw_only=True):
    """``started``: at least one of them started (it may have run); ``never-started``:
    none did, and none ever will; ``unknown``: beyond the journal's horizon."""

    answer: Literal["started", "never-started", "unknown"]
    instance_id: str = msgspec.field(name="instance/id")
    covered_from: Timestamp | None = msgspec.field(name="covered/from", default=None)


class ConnectorInterrupt(
    SeamRequest, frozen=True, kw_only=True, tag="sensorium.connector.interrupt"
):
    """Core is stopping and these sync directives are still running past its drain's
    grace: end them now (their process groups are killed), so that each is answered
    with a definite outcome — ``failed``, interrupted — rather than left in doubt."""

    directive_ids: Annotated[tuple[str, ...], msgspec.Meta(max_length=4096)] = msgspec.field(
        name="directive/ids"
    )


class InterruptAnswer(OpenMessage, frozen=True, kw_only=True):
    """How many of the named directives were running here and were ended."""

    interrupted: int


SeamRequestUnion = (
    ConnectorInvoke
    | ConnectorStatus
    | ConnectorStatusBatch
    | ConnectorCancel
    | ConnectorReport
    | ConnectorStarts
    | ConnectorWatch
    | ConnectorInterrupt
)
