"""Reading the observation store: bounded pages with a cursor, one record, per-topic counts.

Every read leaves out expired records (``expires_at`` past) and, for a caller that
may not see everything, records of actions it is not granted (``actions``). Pages are
ordered by ``(observed/at, observation/id)``; the cursor is that pair of the last
record handed out, so a page never repeats or skips one, however records arrive.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import msgspec

from sensorium.core.observations import decode
from sensorium.shared.clock import parse_rfc3339, rfc3339
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.wire.client_api import ObserveQuery, TopicEntry, TopicSummaryRequest
from sensorium.shared.wire.observation import Observation, topic

Read = Callable[[str, tuple[Any, ...]], list[Any]]


@dataclass(frozen=True)
class Page:
    observations: list[Observation]
    next_cursor: str | None
    limit: int


def _timestamp(value: str | None, field: str) -> str | None:
    """``value`` in the store's own spelling (so text order is time order)."""
    if value is None:
        return None
    try:
        return rfc3339(parse_rfc3339(value))
    except (ValueError, OverflowError):
        raise CodedError(
            RuntimeErrorCode.REQUEST_MALFORMED,
            f"{field} is not an RFC 3339 timestamp with an offset: {value[:64]!r}",
            path=f"$.{field}",
        ) from None


def encode_cursor(observed_at: str, observation_id: str) -> str:
    raw = json.dumps([observed_at, observation_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[str, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        at, oid = msgspec.json.decode(raw, type=tuple[str, str])
    except (ValueError, msgspec.DecodeError):
        raise CodedError(
            RuntimeErrorCode.REQUEST_MALFORMED,
            "cursor is not one this node handed out; start again without it",
            path="$.cursor",
        ) from None
    return at, oid


class Filters:
    """A WHERE clause, built one condition at a time."""

    def __init__(self, now: str, actions: Collection[str] | None) -> None:
        self.where = ["expires_at > ?"]
        self.params: list[Any] = [now]
        if actions is not None:
            self.where.append(f"action_id IN ({','.join('?' * len(actions))})")
            self.params += sorted(actions)

    def add(self, sql: str, *params: Any) -> None:
        self.where.append(sql)
        self.params += params

    def equal(self, column: str, value: Any) -> None:
        if value is not None:
            self.add(f"{column} = ?", value)

    def prefix(self, column: str, value: str | None) -> None:
        if value:
            self.add(f"substr({column}, 1, ?) = ?", len(value), value)

    def window(self, since: str | None, until: str | None) -> None:
        if (s := _timestamp(since, "since")) is not None:
            self.add("observed_at >= ?", s)
        if (u := _timestamp(until, "until")) is not None:
            self.add("observed_at < ?", u)

    @property
    def sql(self) -> str:
        return " AND ".join(self.where)


def query(
    read: Read, q: ObserveQuery, *, max_page: int, actions: Collection[str] | None, now: str
) -> Page:
    """One page of records matching ``q`` (``actions``: the only ones visible; None: all)."""
    limit = min(q.limit, max_page)
    f = Filters(now, actions)
    f.window(q.since, q.until)
    f.equal("kind", q.signal_kind)
    f.prefix("kind", q.kind_prefix)
    f.equal("subject_kind", q.subject_kind)
    f.equal("subject_id", q.subject_id)
    f.equal("connector_id", q.connector_id)
    f.equal("directive_id", q.directive_id)
    if q.sensitivity:
        f.add(f"sensitivity IN ({','.join('?' * len(q.sensitivity))})", *q.sensitivity)
    direction, after = ("DESC", "<") if q.order == "desc" else ("ASC", ">")
    if q.cursor is not None:
        at, oid = decode_cursor(q.cursor)
        f.add(f"(observed_at, observation_id) {after} (?, ?)", at, oid)
    # One more than the page: whether another page follows, without counting them all.
    found = read(
        f"SELECT observed_at, observation_id, body FROM observation_records WHERE {f.sql} "
        f"ORDER BY observed_at {direction}, observation_id {direction} LIMIT ?",
        (*f.params, limit + 1),
    )
    page = [decode(body) for _at, _oid, body in found[:limit]]
    more = len(found) > limit
    cursor = encode_cursor(found[limit - 1][0], found[limit - 1][1]) if more else None
    return Page(page, cursor, limit)


def get(
    read: Read, observation_id: str, *, actions: Collection[str] | None, now: str
) -> Observation:
    f = Filters(now, actions)
    f.equal("observation_id", observation_id)
    found = read(f"SELECT body FROM observation_records WHERE {f.sql}", tuple(f.params))
    if not found:
        raise CodedError(
            RuntimeErrorCode.OBSERVATION_UNKNOWN,
            f"no live observation {observation_id[:64]!r} this caller may read "
            "(never admitted, expired, or of an action it is not granted)",
            path="$.observation/id",
        )
    return decode(found[0][0])


def summary(
    read: Read,
    q: TopicSummaryRequest,
    *,
    max_topics: int,
    actions: Collection[str] | None,
    now: str,
) -> tuple[list[TopicEntry], bool]:
    """Per signal kind: live records, first and last ``observed/at``, the last id."""
    f = Filters(now, actions)
    f.window(q.since, q.until)
    f.prefix("kind", q.kind_prefix)
    f.equal("subject_kind", q.subject_kind)
    # The store writes one fixed-width timestamp spelling, so the greatest "at|id" is
    # the last record (its id included).
    found = read(
        "SELECT kind, count(*), min(observed_at), max(observed_at || '|' || observation_id) "
        f"FROM observation_records WHERE {f.sql} GROUP BY kind ORDER BY kind LIMIT ?",
        (*f.params, max_topics + 1),
    )
    entries = [
        TopicEntry(
            topic=topic(kind),
            signal_kind=kind,
            count=count,
            first_observed_at=first,
            last_observed_at=last.partition("|")[0],
            last_observation_id=last.partition("|")[2],
        )
        for kind, count, first, last in found[:max_topics]
    ]
    return entries, len(found) > max_topics
