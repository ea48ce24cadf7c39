"""The orphan-event desk (seed 003, section 4): every lifecycle event attaches to a
directive or operation core knows, or waits in the orphan queue.

The natural source is the connector seam: a reply whose caller is gone — core
restarted while the action ran, or gave up waiting — arrives with a request/id no
call is waiting on. The desk reconciles it by ``directive/id``, the seam
``request/id``, ``operation/id`` and ``correlation/id``. An outcome whose directive
core had dispatched is recorded as that directive's outcome (so a retry under its
``idempotency/key`` gets it, and nothing runs twice) and the orphan is marked
``recovered``. One with no owner is retried every ``reconcile_interval_s`` — its
owner's record may still be on its way to disk — and after ``ttl_s`` is quarantined
with an ``OrphanEventReceipt``.

Every step runs in the audit store's writer thread, inside its transaction: the
orphan row, the outcome it becomes and the dispatch it settles change together.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import apsw
import msgspec
import structlog

from sensorium.core.audit import AuditStore
from sensorium.shared.clock import rfc3339
from sensorium.shared.config import OrphanConfig
from sensorium.shared.errors import CodedError
from sensorium.shared.ids import new_id
from sensorium.shared.wire.envelope import Reply
from sensorium.shared.wire.orphan import OrphanEventReceipt, QuarantineReason, ReconcileKeys

log = structlog.get_logger("sensorium.orphans")
_encoder = msgspec.json.Encoder()
_msgpack = msgspec.msgpack.Encoder()
RECONCILE_BATCH = 500
GC_BATCH = 500
GC_PASSES = 20


class Ambiguous(Exception):
    """An event whose keys name more than one owner."""

    def __init__(self, owners: list[str]) -> None:
        super().__init__(f"owned by {len(owners)} directives")
        self.owners = owners


@dataclass(frozen=True)
class Event:
    kind: str
    keys: ReconcileKeys
    body: bytes
    # For an outcome: what its record needs.
    status: str | None = None
    action_id: str | None = None
    outcome_id: str | None = None
    code: str | None = None


def parse(reply: Reply) -> Event | None:
    """The lifecycle event an unmatched seam reply carries; ``None`` for answers that
    change nothing (a catalog report nobody waited for)."""
    if not reply.ok:
        body = _msgpack.encode(reply.error)
        return Event("error", ReconcileKeys(request_id=reply.request_id[:64]), body)
    raw = bytes(reply.result)
    try:
        doc = msgspec.msgpack.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None

    def text(name: str) -> str | None:
        value = doc.get(name)
        return value[:128] if isinstance(value, str) else None

    keys = ReconcileKeys(
        correlation_id=text("correlation/id"),
        directive_id=text("directive/id"),
        operation_id=text("operation/id"),
        request_id=reply.request_id[:64],
    )
    if "outcome/id" in doc:
        diagnostics = doc.get("diagnostics")
        first = diagnostics[0] if isinstance(diagnostics, list) and diagnostics else None
        return Event(
            "outcome",
            keys,
            raw,
            status=text("status"),
            action_id=text("action_id"),
            outcome_id=text("outcome/id"),
            code=first.get("code") if isinstance(first, dict) else None,
        )
    if keys.operation_id is not None:
        return Event("job-update", keys, raw)
    return None


class OrphanDesk:
    def __init__(
        self,
        audit: AuditStore,
        cfg: OrphanConfig,
        known_operation: Callable[[str], bool],
        *,
        idempotency_window_s: float,
        source: str = "connector-seam",
    ) -> None:
        self._audit = audit
        self._cfg = cfg
        self._known_operation = known_operation
        self._window_s = idempotency_window_s
        self._source = source
        self.received = 0
        self.dropped = 0

    def __repr__(self) -> str:
        return f"<OrphanDesk received={self.received} ttl_s={self._cfg.ttl_s}>"

    # -- intake (the RpcClient's reader calls this for every unmatched reply) ----

    def receive(self, reply: Reply) -> None:
        event = parse(reply)
        if event is None:
            log.info("orphan.ignored", **{"request/id": reply.request_id})
            return
        self.received += 1
        if not self._audit.enqueue(lambda conn: self._take(conn, event)):
            self.dropped += 1
            log.error(
                "orphan.dropped",
                kind=event.kind,
                dropped=self.dropped,
                note="the audit writer's queue is full; the event is only in this log",
                **_key_fields(event.keys),
            )

    def _take(self, conn: apsw.Connection, event: Event) -> None:
        now = time.time()
        oid = new_id()
        k = event.keys
        conn.execute(
            "INSERT INTO orphans (orphan_id, kind, source, state, received_at, expires_at, "
            "correlation_id, directive_id, operation_id, request_id, digest, body) "
            "VALUES (?, ?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                oid,
                event.kind,
                self._source,
                rfc3339(now),
                rfc3339(now + self._cfg.ttl_s),
                k.correlation_id,
                k.directive_id,
                k.operation_id,
                k.request_id,
                hashlib.sha256(event.body).hexdigest(),
                event.body,
            ),
        )
        owner = self._owner_or_quarantine(conn, oid, event.kind, k, now)
        if owner is False:
            return
        if owner is not None:
            self._attach(conn, oid, event, owner, now)
            return
        counted: Any = conn.execute(
            "SELECT count(*) FROM orphans WHERE state = 'queued'"
        ).fetchone()
        queued = counted[0]
        if queued > self._cfg.max_queued:
            self._quarantine(conn, oid, now, "queue-full")
            return
        log.warning(
            "orphan.queued",
            kind=event.kind,
            orphan=oid,
            ttl_s=self._cfg.ttl_s,
            **_key_fields(k),
        )

    # -- reconciliation ---------------------------------------------------

    def _owner(self, conn: apsw.Connection, kind: str, k: ReconcileKeys) -> tuple[str, str] | None:
        """``(directive_id, ref)`` or ``("", ref)`` of what this event belongs to.

        Raises :class:`Ambiguous` when its keys name more than one owner: the strong
        keys (``directive/id``, the seam ``request/id``) two different directives, or,
        with neither, a ``correlation/id`` several directives share. Attaching to the
        first match would file the event under a guess (seed 003: ambiguous ownership
        fails validation)."""
        strong: dict[str, str] = {}
        if k.directive_id is not None:
            for sql in (
                "SELECT 1 FROM dispatches WHERE directive_id = ?",
                "SELECT 1 FROM records WHERE directive_id = ? LIMIT 1",
            ):
                if conn.execute(sql, (k.directive_id,)).fetchone():
                    strong[k.directive_id] = f"directive:{k.directive_id}"
                    break
        if k.request_id is not None:
            row = conn.execute(
                "SELECT directive_id FROM dispatches WHERE seam_request_id = ?", (k.request_id,)
            ).fetchone()
            if row:
                strong.setdefault(row[0], f"directive:{row[0]}")
        if len(strong) > 1:
            raise Ambiguous(sorted(strong))
        if strong:
            ((directive_id, ref),) = strong.items()
            return directive_id, ref
        if k.operation_id is not None and self._known_operation(k.operation_id):
            return "", f"operation:{k.operation_id}"
        if k.correlation_id is not None and kind != "outcome":
            rows = conn.execute(
                "SELECT DISTINCT directive_id FROM dispatches WHERE correlation_id = ? LIMIT 2",
                (k.correlation_id,),
            ).fetchall()
            owners = [str(r[0]) for r in rows]
            if len(owners) > 1:
                raise Ambiguous(owners)
            if owners:
                return owners[0], f"correlation:{k.correlation_id}"
        return None

    def _owner_or_quarantine(
        self, conn: apsw.Connection, oid: str, kind: str, k: ReconcileKeys, now: float
    ) -> tuple[str, str] | Literal[False] | None:
        """The owner; None when there is none yet; False when the event was quarantined
        because it names several (it will not become less ambiguous by waiting)."""
        try:
            return self._owner(conn, kind, k)
        except Ambiguous as exc:
            log.warning("orphan.ambiguous", orphan=oid, owners=exc.owners, **_key_fields(k))
            self._quarantine(conn, oid, now, "ambiguous-owner")
            return False

    def _attach(
        self, conn: apsw.Connection, oid: str, event: Event, owner: tuple[str, str], now: float
    ) -> None:
        directive_id, ref = owner
        attached = ref
        if event.kind == "outcome" and directive_id and event.outcome_id is not None:
            # The late outcome becomes its directive's outcome, unless one is on record.
            row = conn.execute(
                "SELECT idempotency_key, action_id FROM dispatches WHERE directive_id = ?",
                (directive_id,),
            ).fetchone()
            key, action = (row[0], row[1]) if row else (None, event.action_id or "")
            at = rfc3339(now)
            conn.execute(
                "INSERT OR IGNORE INTO records (record_id, kind, directive_id, action_id, "
                "status, code, request_id, idempotency_key, recorded_at, body) "
                "VALUES (?,?,?,?,?,?,?,?,?,?)",
                (
                    event.outcome_id,
                    "outcome",
                    directive_id,
                    action,
                    event.status or "unknown",
                    event.code,
                    event.keys.request_id,
                    key,
                    at,
                    event.body,
                ),
            )
            conn.execute(
                "UPDATE dispatches SET settled = 'outcome', settled_at = ? "
                "WHERE directive_id = ? AND (settled IS NULL OR settled = 'unknown')",
                (at, directive_id),
            )
            attached = f"outcome:{event.outcome_id}"
        # The body now lives where it attached (an outcome's record); the digest stays.
        conn.execute(
            "UPDATE orphans SET state = 'recovered', attached_to = ?, resolved_at = ?, "
            "body = x'' WHERE orphan_id = ?",
            (attached, rfc3339(now), oid),
        )
        log.info(
            "orphan.recovered",
            kind=event.kind,
            orphan=oid,
            attached_to=attached,
            **_key_fields(event.keys),
        )

    def _quarantine(
        self, conn: apsw.Connection, oid: str, now: float, reason: QuarantineReason
    ) -> None:
        row: Any = conn.execute(
            "SELECT kind, received_at, correlation_id, directive_id, operation_id, "
            "request_id, attempts, digest FROM orphans WHERE orphan_id = ?",
            (oid,),
        ).fetchone()
        kind, received_at, cid, did, opid, rid, attempts, digest = row
        keys = ReconcileKeys(
            correlation_id=cid, directive_id=did, operation_id=opid, request_id=rid
        )
        evidence = [f"urn:sensorium:orphan-event:{oid}#sha256:{digest}"]
        evidence += [f"log:core?{name}={value}" for name, value in _key_fields(keys).items()]
        at = rfc3339(now)
        receipt = OrphanEventReceipt(
            id=f"urn:sensorium:receipt:orphan-event:{oid}",
            eventKind=kind,
            source=self._source,
            reconcileKeys=keys,
            receivedAt=received_at,
            quarantinedAt=at,
            attempts=attempts,
            reason=reason,
            evidenceRefs=evidence,
            capturedAt=at,
        )
        # Past the queue's bound the body is not kept (the digest is): quarantine must
        # not become the unbounded store the bound exists to prevent.
        conn.execute(
            "UPDATE orphans SET state = 'quarantined', resolved_at = ?, receipt = ?, "
            "body = CASE WHEN ? THEN x'' ELSE body END WHERE orphan_id = ?",
            (at, _encoder.encode(receipt), reason == "queue-full", oid),
        )
        log.warning(
            "orphan.quarantined",
            kind=kind,
            orphan=oid,
            reason=reason,
            attempts=attempts,
            receipt=receipt.id,
            **_key_fields(keys),
        )

    def reconcile(self, conn: apsw.Connection) -> None:
        """One pass over the queue: attach what now has an owner, quarantine what has
        waited past its TTL, count an attempt on the rest; then collect old rows."""
        now = time.time()
        rows: list[Any] = conn.execute(
            "SELECT orphan_id, kind, correlation_id, directive_id, operation_id, request_id, "
            "body, expires_at FROM orphans WHERE state = 'queued' ORDER BY received_at LIMIT ?",
            (RECONCILE_BATCH,),
        ).fetchall()
        for oid, kind, cid, did, opid, rid, body, expires_at in rows:
            keys = ReconcileKeys(
                correlation_id=cid, directive_id=did, operation_id=opid, request_id=rid
            )
            conn.execute("UPDATE orphans SET attempts = attempts + 1 WHERE orphan_id = ?", (oid,))
            owner = self._owner_or_quarantine(conn, oid, kind, keys, now)
            if owner is False:
                continue
            if owner is not None:
                event = _event_of(kind, keys, body)
                self._attach(conn, oid, event, owner, now)
            elif expires_at <= rfc3339(now):
                self._quarantine(conn, oid, now, "no-owner-within-ttl")
        self._collect(conn, now)

    def _collect(self, conn: apsw.Connection, now: float) -> None:
        cfg = self._cfg
        for sql, before in (
            (
                "DELETE FROM orphans WHERE orphan_id IN (SELECT orphan_id FROM orphans "
                "WHERE state = 'recovered' AND resolved_at < ? LIMIT ?)",
                now - cfg.retention_s,
            ),
            (
                "DELETE FROM orphans WHERE orphan_id IN (SELECT orphan_id FROM orphans "
                "WHERE state = 'quarantined' AND resolved_at < ? LIMIT ?)",
                now - cfg.quarantine_retention_s,
            ),
            (
                "DELETE FROM dispatches WHERE directive_id IN (SELECT directive_id FROM "
                "dispatches WHERE dispatched_at < ? LIMIT ?)",
                now - max(cfg.retention_s, self._window_s),
            ),
        ):
            # Batches until done, within a bound per pass (the next pass goes on).
            for _ in range(GC_PASSES):
                conn.execute(sql, (rfc3339(before), GC_BATCH))
                if conn.changes() < GC_BATCH:
                    break

    async def serve(self, stop: asyncio.Event) -> None:
        """Reconcile every ``reconcile_interval_s`` until ``stop``."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._cfg.reconcile_interval_s)
            if stop.is_set():
                return
            try:
                await self._audit.record(self.reconcile)
            except CodedError as exc:
                log.warning("orphan.reconcile.failed", code=exc.code, error=exc.message)
            except Exception:
                log.exception("orphan.reconcile.failed")


def _event_of(kind: str, keys: ReconcileKeys, body: bytes) -> Event:
    if kind != "outcome":
        return Event(kind, keys, body)
    doc: Any = msgspec.msgpack.decode(body)
    diagnostics = doc.get("diagnostics")
    first = diagnostics[0] if isinstance(diagnostics, list) and diagnostics else None
    return Event(
        kind,
        keys,
        body,
        status=doc.get("status"),
        action_id=doc.get("action_id"),
        outcome_id=doc.get("outcome/id"),
        code=first.get("code") if isinstance(first, dict) else None,
    )


def _key_fields(k: ReconcileKeys) -> dict[str, str]:
    return {
        name: value
        for name, value in (
            ("correlation/id", k.correlation_id),
            ("directive/id", k.directive_id),
            ("operation/id", k.operation_id),
            ("request/id", k.request_id),
        )
        if value is not None
    }
