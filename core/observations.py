"""Observations: built from an outcome, stored beside it with a TTL, published by kind.

* :func:`build` turns one outcome into zero or more ``sensorium-observation.v1``:
  one of the declared ``result_contract.signal_kind`` when there is one, and a
  ``sensorium.core/action-invalid`` one whenever the result broke its pointer
  contract (``result-pointer-missing``) — declared kind or not.
* The records live in the audit store's SQLite file (table ``observation_records``,
  DDL in :data:`SCHEMA`), written in the same transaction as their outcome. Each
  keeps until its ``admission.store.expires_at``: reads never return an expired one,
  and every insert prunes a bounded number of expired ones (a trigger), so the table
  holds what is live plus a small backlog, whatever the rate.
* :class:`ObservationPublisher` puts them on a ZeroMQ PUB socket as
  ``[local/sensorium/observations/{signal-kind}, msgpack body]``, so a subscriber's
  prefix picks a kind or a subtree; a slow subscriber loses messages, core never
  waits for it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, get_args

import apsw
import msgspec
import structlog
import zmq

from sensorium.shared.clock import parse_rfc3339, rfc3339
from sensorium.shared.config import ObservationConfig
from sensorium.shared.diagnostics import OsErrorCode
from sensorium.shared.ids import new_id
from sensorium.shared.rpc.sockets import prepare_ipc
from sensorium.shared.sensitivity import baseline_sensitivity, strictest
from sensorium.shared.wire.declaration import (
    SENSITIVITY_CLASSES,
    ResultContract,
    SensitivityClass,
)
from sensorium.shared.wire.directive import ARTIFACT_ID_PATTERN, ArtifactRef, ArtifactRole
from sensorium.shared.wire.observation import (
    Admission,
    Confidence,
    ConfidenceClass,
    Freshness,
    Observation,
    ObservedSensitivity,
    SourceRef,
    StoreRef,
    Summary,
    topic,
)
from sensorium.shared.wire.outcome import Diagnostic, EvidenceRef, Outcome
from sensorium.shared.wire.report import ConnectorAction

# Least to most restrictive: the published vocabulary in 045's order.
SENSITIVITY_ORDER: tuple[SensitivityClass, ...] = SENSITIVITY_CLASSES
ACTION_INVALID_KIND = "sensorium.core/action-invalid"
ACTION_INVALID_FAMILY = "sensorium/action-invalid"
CONNECTOR_KIND = "OS"  # 045's connector class table
PUBLISH_HWM = 10_000
# Expired records one insert removes: more than an insert adds, so a backlog drains.
PRUNE_PER_INSERT = 8
_ARTIFACT_ID = re.compile(ARTIFACT_ID_PATTERN)
_ROLES: dict[str, ArtifactRole] = {r: r for r in get_args(ArtifactRole)}

# Version 1 of this table replaced ``observations`` (pre-045 documents, which no
# reader decodes any more). Every statement is idempotent: the same script makes a
# fresh store and brings an older one up to date (:func:`ensure_schema`).
SCHEMA = f"""
DROP TABLE IF EXISTS observations;
CREATE TABLE IF NOT EXISTS observation_records (
    observation_id TEXT PRIMARY KEY,
    kind           TEXT NOT NULL,
    directive_id   TEXT,
    action_id      TEXT,
    connector_id   TEXT NOT NULL,
    subject_kind   TEXT,
    subject_id     TEXT,
    sensitivity    TEXT NOT NULL,
    observed_at    TEXT NOT NULL,
    ingested_at    TEXT NOT NULL,
    expires_at     TEXT NOT NULL,
    body           BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS observation_records_directive ON observation_records (directive_id);
CREATE INDEX IF NOT EXISTS observation_records_time
    ON observation_records (observed_at, observation_id);
CREATE INDEX IF NOT EXISTS observation_records_kind ON observation_records (kind, observed_at);
CREATE INDEX IF NOT EXISTS observation_records_expiry ON observation_records (expires_at);
CREATE TRIGGER IF NOT EXISTS observation_records_prune AFTER INSERT ON observation_records
BEGIN
    DELETE FROM observation_records WHERE rowid IN (
        SELECT rowid FROM observation_records WHERE expires_at <= NEW.ingested_at
        ORDER BY expires_at LIMIT {PRUNE_PER_INSERT}
    );
END;
"""
INSERT = "INSERT OR IGNORE INTO observation_records VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"

log = structlog.get_logger("sensorium.observations")
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Observation)

Row = tuple[
    str, str, str | None, str | None, str, str | None, str | None, str, str, str, str, bytes
]


def effective_sensitivity(baseline: str, declared: str | None) -> SensitivityClass:
    """``declared`` when it is stricter than ``baseline``; never anything laxer.

    Only the published five can be published: a baseline outside them cannot be
    ranked, so it fails closed to the strictest class; an unknown declared class is
    ignored (the catalog refuses one anyway).
    """
    order = SENSITIVITY_ORDER
    rank = order.index(baseline) if baseline in order else len(order) - 1
    if declared in order:
        rank = max(rank, order.index(declared))
    return order[rank]


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


def _evidence(refs: Sequence[EvidenceRef]) -> list[ArtifactRef]:
    """Produced files by content id; anything not addressable as an artifact is left out."""
    return [
        ArtifactRef(
            artifact_id=r.id,
            role=_ROLES.get(r.role, "produced-file"),  # the connector's "artifact" is a file
            media_type=r.media_type,
            size_bytes=r.size,
        )
        for r in refs
        if _ARTIFACT_ID.match(r.id)
    ]


def _finished_at(outcome: Outcome, fallback: str) -> str:
    """When the action ended: the instrument time of what it observed."""
    try:
        return rfc3339(parse_rfc3339(outcome.started_at) + float(outcome.duration_ms) / 1000)
    except (ValueError, OverflowError):
        return fallback


def build(
    outcome: Outcome,
    action: ConnectorAction,
    connector_id: str,
    *,
    declared_sensitivity: str | None = None,
    observed_at: str | None = None,
    policy: ObservationConfig | None = None,
    now: float | None = None,
) -> list[Observation]:
    """The observations one outcome gives rise to (possibly none).

    Only references, declared pointers and coded diagnostics are copied; stdout,
    stderr, argv and parameters never are.
    """
    contract = action.result_contract
    missing_diags = [d for d in outcome.diagnostics if d.code == OsErrorCode.RESULT_POINTER_MISSING]
    if contract.signal_kind is None and not missing_diags:
        return []
    cfg = policy or ObservationConfig()
    ingested = now if now is not None else parse_rfc3339(rfc3339())
    ingested_at = rfc3339(ingested)
    at = observed_at or _finished_at(outcome, ingested_at)
    freshness_s = min(cfg.freshness_ttl_s, cfg.store_ttl_s)
    # Never below the class's own baseline (C6: its strictest), whatever the outcome says.
    floor = baseline_sensitivity(action.class_, action.composed_effects)
    sensitivity = ObservedSensitivity(
        class_=strictest(
            (effective_sensitivity(outcome.sensitivity.class_, declared_sensitivity), floor)
        ),
        redaction="none",
    )
    evidence = _evidence(outcome.artifact_refs)
    pointers = _declared_pointers(outcome, contract)
    subject_id = pointers.get(contract.subject_pointer) if contract.subject_pointer else None

    def make(
        kind: str,
        family: str | None,
        summary: str,
        found: dict[str, Any],
        diags: list[Diagnostic],
        confidence: Confidence,
    ) -> Observation:
        oid = new_id()
        return Observation(
            schema="sensorium-observation.v1",
            schema_v=1,
            observation_id=oid,
            connector_id=connector_id,
            connector_kind=CONNECTOR_KIND,
            observed_at=at,
            ingested_at=ingested_at,
            signal_kind=kind,
            signal_family=family,
            confidence=confidence,
            freshness=Freshness(ttl_sec=freshness_s, expires_at=rfc3339(ingested + freshness_s)),
            sensitivity=sensitivity,
            # The outcome is the source: its id, never the action's parameters.
            source_ref=SourceRef(kind="sensorium/outcome", value=f"outcome:{outcome.outcome_id}"),
            admission=Admission(
                status="admitted",
                redaction_status="not-needed",  # built from references and pointers only
                memarium_admit=False,
                consumer_scopes=[],
                store=StoreRef(
                    record_id=f"module-store:sensorium-core:observation:{oid}",
                    ttl_sec=cfg.store_ttl_s,
                    expires_at=rfc3339(ingested + cfg.store_ttl_s),
                ),
                publish_topics=[topic(kind)],
            ),
            directive_id=outcome.directive_id,
            outcome_id=outcome.outcome_id,
            correlation_id=outcome.correlation_id,
            subject_kind=contract.subject_kind if subject_id is not None else None,
            subject_id=str(subject_id) if subject_id is not None else None,
            summary=Summary(lang="en", text=summary),
            evidence_refs=evidence,
            action_id=outcome.action_id,
            outcome_status=str(outcome.status),
            result_pointers=found,
            incidental_effects=list(outcome.incidental_effects),
            diagnostics=[Diagnostic(code=d.code, message=d.message, path=d.path) for d in diags],
        )

    out: list[Observation] = []
    if contract.signal_kind is not None:
        ended = str(outcome.status)
        level: ConfidenceClass = "high" if ended == "completed" else "low"
        out.append(
            make(
                contract.signal_kind,
                contract.signal_family,
                f"{outcome.action_id} {ended}"
                + (f": {', '.join(sorted(pointers))}" if pointers else ""),
                pointers,
                list(outcome.diagnostics),
                Confidence(
                    class_=level,
                    rationale=f"the declared action ran under its sandbox and {ended}",
                ),
            )
        )
    if missing_diags:
        missing = _missing_pointers(outcome, contract)
        out.append(
            make(
                ACTION_INVALID_KIND,
                ACTION_INVALID_FAMILY,
                f"{outcome.action_id} broke its result contract: missing "
                + (", ".join(missing) or "declared pointers"),
                {"missing_pointer_fields": missing},
                missing_diags,
                Confidence(class_="high", rationale="core checked the result's pointers"),
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
        (
            o.observation_id,
            o.signal_kind,
            o.directive_id,
            o.action_id,
            o.connector_id,
            o.subject_kind,
            o.subject_id,
            o.sensitivity.class_,
            o.observed_at,
            o.ingested_at,
            o.admission.store.expires_at or o.ingested_at,
            encode(o),
        )
        for o in observations
    ]


def ensure_schema(conn: apsw.Connection) -> None:
    """Bring the observation table of an existing store up to date (idempotent)."""
    conn.execute(SCHEMA)


def insert(conn: apsw.Connection, observations: Sequence[Observation]) -> None:
    """Write ``observations`` in whatever transaction the caller holds."""
    if observations:
        conn.executemany(INSERT, rows(observations))


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
            self._sock.send_multipart([obs.topic.encode(), encode(obs)], flags=zmq.NOBLOCK)
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
