"""Orphan lifecycle events and their quarantine receipt (seed 003, section 4).

Every lifecycle event core hears — an outcome, a job's status, a job update — must
attach to a directive or operation it knows. One that does not waits in the orphan
queue, is reconciled by ``correlation/id``, ``directive/id``, ``operation/id`` (and
the seam ``request/id``), and after a TTL is quarantined with an
``OrphanEventReceipt`` that carries references to its evidence.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from sensorium.shared.wire.base import Message, Timestamp

OrphanKind = Literal["outcome", "job-update", "error"]
OrphanState = Literal["queued", "recovered", "quarantined"]
# ambiguous-owner: its keys name several owners; it is flagged, never filed by guess.
QuarantineReason = Literal["no-owner-within-ttl", "queue-full", "ambiguous-owner"]


class ReconcileKeys(Message, frozen=True, kw_only=True):
    """The identifiers an orphan event carried, by which it could attach."""

    correlation_id: str | None = msgspec.field(name="correlation/id", default=None)
    directive_id: str | None = msgspec.field(name="directive/id", default=None)
    operation_id: str | None = msgspec.field(name="operation/id", default=None)
    request_id: str | None = msgspec.field(name="request/id", default=None)


class OrphanEventReceipt(Message, frozen=True, kw_only=True):
    """What is left of an event no owner claimed: enough to find and judge it later.

    ``evidenceRefs`` name the stored event body by its digest
    (``urn:sensorium:orphan-event:<id>#sha256:<hex>``, printed by ``sensorium orphans
    show ID --body``; not kept when quarantined past the queue's bound) and the log
    lines that mention its ids.
    """

    id: str
    type: Literal["OrphanEventReceipt"] = "OrphanEventReceipt"
    specVersion: str = "0.1.0"  # noqa: N815 - field names from the seed
    eventKind: OrphanKind  # noqa: N815
    source: str
    reconcileKeys: ReconcileKeys  # noqa: N815
    receivedAt: Timestamp  # noqa: N815
    quarantinedAt: Timestamp  # noqa: N815
    attempts: int
    reason: QuarantineReason
    evidenceRefs: list[str]  # noqa: N815
    capturedAt: Timestamp  # noqa: N815
    extensions: dict[str, str] = msgspec.field(default_factory=dict)


class OrphanView(Message, frozen=True, kw_only=True):
    """One row of the orphan queue or quarantine, as ``sensorium orphans`` shows it."""

    orphan_id: str = msgspec.field(name="orphan/id")
    kind: OrphanKind
    source: str
    state: OrphanState
    received_at: Timestamp
    resolved_at: Timestamp | None = None
    keys: ReconcileKeys
    attached_to: str | None = None
    attempts: int
    digest: str
    receipt: OrphanEventReceipt | None = None
