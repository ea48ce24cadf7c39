"""``sensorium.audit.get`` and ``sensorium.audit.query``: reading the outcome records.

Restricted (045 §7: outcomes are reachable only through host-owned audit
capabilities): the local operator — an ipc caller, or the node's own key — reads
them; a CURVE client only when the operator granted its key ``audit`` by name
(``sensorium keys client grant NAME audit``; ``*`` does not imply it). A refused
read is ``grant-denied`` and leaves a rejection in the journal.

An async directive's record says ``admitted`` until its deferred operation ends;
core brings it to its final state (same record, same ``outcome/id``) from the
registry, in a sweep every few seconds and before any read that would show it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from typing import Any

import msgspec
import structlog

from sensorium.core import outcomes
from sensorium.core.access import Access, Caller
from sensorium.core.audit import AuditStore
from sensorium.shared.clock import parse_rfc3339, rfc3339
from sensorium.shared.deferred.registry import Registry
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.wire.audit import AuditPage, OutcomeRecord
from sensorium.shared.wire.client_api import AuditGet, AuditQuery

log = structlog.get_logger("sensorium.core")
AUDIT_GRANT = "audit"
SWEEP_BATCH = 100
_BY_OUTCOME = "SELECT body FROM outcomes WHERE outcome_id = ?"
_BY_DIRECTIVE = "SELECT body FROM outcomes WHERE directive_id = ?"
# An older receipt (a journal row of an earlier attempt) names the directive.
_BY_JOURNAL = (
    "SELECT o.body FROM records r JOIN outcomes o ON o.directive_id = r.directive_id "
    "WHERE r.record_id = ? LIMIT 1"
)


def find(store: AuditStore, ident: str, *, inline: bool = False) -> OutcomeRecord | None:
    """The outcome record an id names: an ``outcome/id`` (``outcome:`` prefix allowed),
    a ``directive/id``, or a journal record of one of the directive's attempts.
    ``inline``: on the event loop's thread (``AuditStore.lookup``), for a record just
    written; each query is a lookup by an indexed key."""
    ident = ident.removeprefix("outcome:")
    read = store.lookup if inline else store.read
    for sql in (_BY_OUTCOME, _BY_DIRECTIVE, _BY_JOURNAL):
        rows = read(sql, (ident,))
        if rows:
            return outcomes.decode(rows[0][0])
    return None


def query(store: AuditStore, q: AuditQuery, page_max: int) -> AuditPage:
    """A page of records, newest first (by ``outcome/recorded_at``, then id)."""
    limit = min(q.limit, page_max)
    where: list[str] = []
    params: list[Any] = []
    for column, value in (("action_id", q.action_id), ("status", q.status), ("issuer", q.issuer)):
        if value is not None:
            where.append(f"{column} = ?")
            params.append(value)
    if q.since is not None:
        where.append("recorded_at >= ?")
        params.append(_stored_time(q.since, "$.since"))
    if q.until is not None:
        where.append("recorded_at < ?")
        params.append(_stored_time(q.until, "$.until"))
    if q.cursor is not None:
        at, oid = _cursor(q.cursor)
        where.append("(recorded_at, outcome_id) < (?, ?)")
        params += [at, oid]
    sql = (
        "SELECT recorded_at, outcome_id, body FROM outcomes"
        + (f" WHERE {' AND '.join(where)}" if where else "")
        + " ORDER BY recorded_at DESC, outcome_id DESC LIMIT ?"
    )
    rows = store.read(sql, (*params, limit + 1))
    more = len(rows) > limit
    rows = rows[:limit]
    return AuditPage(
        records=[outcomes.decode(body) for _at, _id, body in rows],
        next_cursor=_encode_cursor(str(rows[-1][0]), str(rows[-1][1])) if more else None,
        limit=limit,
    )


def _stored_time(text: str, path: str) -> str:
    """``text`` as records spell their times (UTC, ms, ``Z``), so strings compare."""
    try:
        return rfc3339(parse_rfc3339(text))
    except ValueError:
        raise CodedError(
            RuntimeErrorCode.REQUEST_MALFORMED,
            f"{path.removeprefix('$.')} is not an RFC 3339 timestamp with an offset",
            path=path,
        ) from None


def _encode_cursor(recorded_at: str, outcome_id: str) -> str:
    return base64.urlsafe_b64encode(f"{recorded_at}|{outcome_id}".encode()).decode()


def _cursor(text: str) -> tuple[str, str]:
    try:
        at, _, oid = base64.urlsafe_b64decode(text.encode()).decode().partition("|")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        at, oid = "", ""
    if not at or not oid:
        raise CodedError(
            RuntimeErrorCode.REQUEST_MALFORMED,
            "cursor is not one a page of sensorium.audit.query gave; start without one",
            path="$.cursor",
        )
    return at, oid


class AuditDesk:
    """The handlers, the access check and the sweep that ends admitted records."""

    def __init__(
        self, store: AuditStore, registry: Registry, access: Access, page_max: int
    ) -> None:
        self._store = store
        self._registry = registry
        self._access = access
        self._page_max = page_max

    def __repr__(self) -> str:
        return f"<AuditDesk page_max={self._page_max}>"

    def _allow(self, caller: Caller, what: str, subject: str, request_id: str) -> None:
        if caller.operator or AUDIT_GRANT in caller.grants:
            return
        self._access.deny(
            caller,
            what,
            subject,
            "-",
            request_id,
            f"reading outcome records needs the {AUDIT_GRANT!r} grant, given by name "
            f"(`sensorium keys client grant NAME {AUDIT_GRANT}`)",
        )

    async def get(self, req: AuditGet) -> OutcomeRecord:
        self._allow(self._access.caller(), "read the audit record", req.id, req.request_id)
        await self._store.settled()  # a refusal's receipt is answered before it is written
        rec = await asyncio.to_thread(find, self._store, req.id)
        if rec is None:
            raise CodedError(
                RuntimeErrorCode.OPERATION_UNKNOWN,
                f"no outcome record has id {req.id[:80]!r} (an outcome/id or directive/id); "
                "`sensorium audit list` shows the latest",
                path="$.id",
            )
        if rec.status == "admitted":
            rec = await self._settle(rec) or rec
        return rec

    async def query(self, req: AuditQuery) -> AuditPage:
        self._allow(self._access.caller(), "query the audit records", "audit", req.request_id)
        await self._store.settled()
        await self.sweep()
        return await asyncio.to_thread(query, self._store, req, self._page_max)

    async def sweep(self) -> int:
        """End every admitted record whose operation has ended; how many were."""
        rows = await asyncio.to_thread(
            self._store.read,
            "SELECT body FROM outcomes WHERE status = 'admitted' ORDER BY recorded_at LIMIT ?",
            (SWEEP_BATCH,),
        )
        ended = 0
        for (body,) in rows:
            try:
                rec = outcomes.decode(body)
            except msgspec.DecodeError:  # ValidationError too
                log.exception("audit.record.unreadable")
                continue
            if await self._settle(rec) is not None:
                ended += 1
        return ended

    async def _settle(self, rec: OutcomeRecord) -> OutcomeRecord | None:
        if rec.operation is None:
            return None
        op = await asyncio.to_thread(self._registry.get, rec.operation)
        if op is None:
            return None
        final = outcomes.finished(rec, op)
        if final is None:
            return None
        await self._store.record(outcomes.row(final))
        log.info(
            "directive.outcome.final",
            status=final.status,
            receipt=f"outcome:{final.outcome_id}",
            **{"directive/id": final.directive_id, "operation/id": rec.operation},
        )
        return final

    async def serve(self, stop: asyncio.Event, interval_s: float) -> None:
        """Sweep until ``stop``; a failed sweep is logged and tried again."""
        while not stop.is_set():
            try:
                await self.sweep()
            except CodedError as exc:
                log.warning("audit.sweep.failed", code=exc.code)
            except Exception:
                # A record or operation that does not read must not end the sweep.
                log.exception("audit.sweep.failed")
            try:
                await asyncio.wait_for(stop.wait(), interval_s)
            except TimeoutError:
                pass
