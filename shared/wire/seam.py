"""The connector seam: core's private channel to the OS connector (DESIGN §2)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from sensorium.shared.wire.base import Message, RequestId
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


class ConnectorStatus(SeamRequest, frozen=True, kw_only=True, tag="sensorium.connector.status"):
    operation_id: str = msgspec.field(name="operation/id")


class ConnectorCancel(SeamRequest, frozen=True, kw_only=True, tag="sensorium.connector.cancel"):
    operation_id: str = msgspec.field(name="operation/id")


class ConnectorReport(SeamRequest, frozen=True, kw_only=True, tag="sensorium.connector.report"):
    pass


SeamRequestUnion = ConnectorInvoke | ConnectorStatus | ConnectorCancel | ConnectorReport
