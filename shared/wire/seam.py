"""The connector seam: core's private channel to the OS connector (DESIGN §2)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from sensorium.shared.wire.base import Message, RequestId
from sensorium.shared.wire.directive import Directive


class SeamRequest(Message, frozen=True, kw_only=True, tag_field="method"):
    request_id: RequestId = msgspec.field(name="request/id")


class ConnectorInvoke(SeamRequest, frozen=True, kw_only=True, tag="sensorium.connector.invoke"):
    """A directive core has resolved, validated and clamped; ``timeout_ms`` is the effective one."""

    directive: Directive
    timeout_ms: Annotated[int, msgspec.Meta(ge=1)]
    config_hash: str = msgspec.field(name="config/hash")


class ConnectorStatus(SeamRequest, frozen=True, kw_only=True, tag="sensorium.connector.status"):
    operation_id: str = msgspec.field(name="operation/id")


class ConnectorCancel(SeamRequest, frozen=True, kw_only=True, tag="sensorium.connector.cancel"):
    operation_id: str = msgspec.field(name="operation/id")


class ConnectorReport(SeamRequest, frozen=True, kw_only=True, tag="sensorium.connector.report"):
    pass


SeamRequestUnion = ConnectorInvoke | ConnectorStatus | ConnectorCancel | ConnectorReport
