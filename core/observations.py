"""Observations: built from an outcome, stored beside it, published to subscribers.

* :func:`build` turns one outcome into zero or more ``sensorium-observation.v1``:
  one of the declared ``result_contract.signal_kind`` when there is one, and a
  ``sensorium.core/action-invalid`` one whenever the result broke its pointer
  contract (``result-pointer-missing``) — declared kind or not.
* :class:`ObservationStore` keeps them in the audit store's SQLite file
  (table ``observations``, DDL in :data:`SCHEMA`).
* :class:`ObservationPublisher` puts them on a ZeroMQ PUB socket as
  ``[signal/kind, msgpack body]``, so a subscriber filters by kind prefix; a slow
  subscriber loses messages, core never waits for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import apsw
import msgspec
import structlog
import zmq

from sensorium.shared.clock import rfc3339
from sensorium.shared.diagnostics import OsErrorCode
from sensorium.shared.ids import new_id
from sensorium.shared.rpc.sockets import prepare_ipc
from sensorium.shared.wire.declaration import ResultContract
from sensorium.shared.wire.observation import Observation, ObservationSource
from sensorium.shared.wire.outcome import Diagnostic, EvidenceRef, Outcome, Sensitivity
from sensorium.shared.wire.report import ConnectorAction

# Least to most restrictive.
SENSITIVITY_ORDER: tuple[str, ...] = (
    "public",
    "operational",
    "operational-sensitive",
    "private",
    "secret",
)
ACTION_INVALID_KIND = "sensorium.core/action-invalid"
ACTION_INVALID_FAMILY = "sensorium/action-invalid"
PUBLISH_HWM = 10_000

SCHEMA = """
CREATE TABLE IF NOT EXISTS observations (
    observation_id TEXT PRIMARY KEY,
    kind           TEXT NOT NULL,
    directive_id   TEXT NOT NULL,
    observed_at    TEXT NOT NULL,
    body           BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS observations_directive ON observations (directive_id);
CREATE INDEX IF NOT EXISTS observations_time ON observations (observed_at);
"""
INSERT = "INSERT OR IGNORE INTO observations VALUES (?,?,?,?,?)"

log = structlog.get_logger("sensorium.observations")
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Observation)

Row = tuple[str, str, str, str, bytes]


def effective_sensitivity(baseline: str, declared: str | None) -> str:
    """``declared`` when it is stricter than ``baseline``; never anything laxer.

    An unknown declared class cannot be ranked and is ignored; an unknown baseline is
    kept as it is, since nothing can be shown to be stricter than it.
    """
    if declared is None or declared not in SENSITIVITY_ORDER:
        return baseline
    if baseline not in SENSITIVITY_ORDER:
        return baseline
    if SENSITIVITY_ORDER.index(declared) > SENSITIVITY_ORDER.index(baseline):
        return declared
    return baseline


def _declared_pointers(outcome: Outcome, contract: ResultContract) -> dict[str, Any]:
    """The outcome's pointers, re-filtered to the names the declaration lists."""
    if outcome.result is None:
        return {}
    names = set(contract.result_pointer_fields) | set(contract.pointer_fields)
    return {k: v for k, v in outcome.result.pointers.items() if k in names}


def _missing_pointers(outcome: Outcome, contract: ResultContract) -> list[str]:
    """Required pointer names absent from the result (the connector's own rule)."""
    payload = outcome.result.json if outcome.result is not None else None
    source = payload.get("pointers") if isinstance(payload, dict) else None
    if not isinstance(source, dict):
        source = payload if isinstance(payload, dict) else {}
    return [k for k in contract.pointer_fields if k not in source]


def build(
    outcome: Outcome,
    action: ConnectorAction,
    connector_id: str,
    *,
    declared_sensitivity: str | None = None,
    observed_at: str | None = None,
) -> list[Observation]:
    """The observations one outcome gives rise to (possibly none).

    Only references, declared pointers and coded diagnostics are copied; stdout,
    stderr, argv and parameters never are.
    """
    contract = action.result_contract
    missing_diags = [d for d in outcome.diagnostics if d.code == OsErrorCode.RESULT_POINTER_MISSING]
    if contract.signal_kind is None and not missing_diags:
        return []
    outcome_ref = f"outcome:{outcome.outcome_id}"
    sensitivity = Sensitivity(
        class_=effective_sensitivity(outcome.sensitivity.class_, declared_sensitivity)
    )
    evidence = [EvidenceRef(id=outcome_ref, role="outcome"), *outcome.artifact_refs]
    at = observed_at or rfc3339()

    def make(
        kind: str, family: str | None, summary: dict[str, Any], diags: list[Diagnostic]
    ) -> Observation:
        return Observation(
            observation_id=new_id(),
            signal_kind=kind,
            signal_family=family,
            sensitivity=sensitivity,
            source=ObservationSource(connector_id=connector_id, action_id=outcome.action_id),
            directive_id=outcome.directive_id,
            correlation_id=outcome.correlation_id,
            outcome_ref=outcome_ref,
            observed_at=at,
            status=outcome.status,
            summary=summary,
            evidence_refs=evidence,
            diagnostics=[Diagnostic(code=d.code, message=d.message, path=d.path) for d in diags],
        )

    out: list[Observation] = []
    if contract.signal_kind is not None:
        out.append(
            make(
                contract.signal_kind,
                contract.signal_family,
                _declared_pointers(outcome, contract),
                list(outcome.diagnostics),
            )
        )
    if missing_diags:
        out.append(
            make(
                ACTION_INVALID_KIND,
                ACTION_INVALID_FAMILY,
                {"missing_pointer_fields": _missing_pointers(outcome, contract)},
                missing_diags,
            )
        )
    return out


def encode(obs: Observation) -> bytes:
    """The msgpack body, as stored and as published."""
    return _encoder.encode(obs)


def decode(body: bytes) -> Observation:
    return _decoder.decode(body)


def rows(observations: Sequence[Observation]) -> list[Row]:
    """Rows for :data:`INSERT`, in the column order of :data:`SCHEMA`."""
    return [
        (o.observation_id, o.signal_kind, o.directive_id, o.observed_at, encode(o))
        for o in observations
    ]


class ObservationStore:
    """The ``observations`` table on a connection the caller opened (and owns).

    ``insert`` writes in whatever transaction the caller holds; the audit writer
    thread can run it inside the same batch as the outcome it came from.
    """

    def __init__(self, conn: apsw.Connection) -> None:
        self.conn = conn

    def ensure_schema(self) -> None:
        self.conn.execute(SCHEMA)

    def insert(self, observations: Sequence[Observation]) -> None:
        if observations:
            self.conn.executemany(INSERT, rows(observations))

    def recent(
        self,
        *,
        kind_prefix: str | None = None,
        directive_id: str | None = None,
        limit: int = 100,
    ) -> list[Observation]:
        """The latest ``limit`` observations, oldest first, optionally filtered."""
        where: list[str] = []
        params: list[Any] = []
        if kind_prefix:
            where.append("substr(kind, 1, ?) = ?")
            params += [len(kind_prefix), kind_prefix]
        if directive_id:
            where.append("directive_id = ?")
            params.append(directive_id)
        sql = "SELECT body FROM observations"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY observed_at DESC, observation_id DESC LIMIT ?"
        params.append(limit)
        found = [
            decode(body)
            for (body,) in self.conn.execute(sql, params).fetchall()
            if isinstance(body, bytes)
        ]
        found.reverse()
        return found


class ObservationPublisher:
    """A bound PUB socket; ``publish`` never blocks (a full queue drops, and counts it).

    ``ctx`` may be a ``zmq.asyncio.Context``: the socket is made on a plain shadow of
    it, so a send is a direct, non-blocking libzmq call with no future to await.
    """

    def __init__(
        self, endpoint: str, ctx: zmq.Context[Any] | None = None, *, hwm: int = PUBLISH_HWM
    ) -> None:
        self.endpoint = endpoint
        base = ctx if ctx is not None else zmq.Context.instance()
        self._ctx: zmq.Context[Any] = zmq.Context.shadow(base.underlying)
        self._sock: zmq.Socket[Any] = self._ctx.socket(zmq.PUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, hwm)
        prepare_ipc(endpoint)
        self._sock.bind(endpoint)
        self.published = 0
        self.dropped = 0
        self.closed = False

    def __repr__(self) -> str:
        return (
            f"<ObservationPublisher {self.endpoint} published={self.published} "
            f"dropped={self.dropped}>"
        )

    def publish(self, obs: Observation) -> bool:
        """Queue ``obs`` for subscribers; False (and counted) when it was dropped."""
        if self.closed:
            self.dropped += 1
            return False
        try:
            self._sock.send_multipart([obs.signal_kind.encode(), encode(obs)], flags=zmq.NOBLOCK)
        except zmq.Again:
            self._drop(obs, "queue-full")
            return False
        except zmq.ZMQError as exc:
            self._drop(obs, str(exc))
            return False
        self.published += 1
        return True

    def _drop(self, obs: Observation, reason: str) -> None:
        self.dropped += 1
        # The first drop, then one line per thousand: a stuck subscriber must not flood the log.
        if self.dropped == 1 or self.dropped % 1000 == 0:
            log.warning(
                "observation.dropped",
                kind=obs.signal_kind,
                reason=reason,
                dropped=self.dropped,
            )

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._sock.close(linger=0)
