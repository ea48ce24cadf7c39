"""Observations: what ``build`` derives from an outcome, the wire schema, the table, the stream."""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import jsonschema
import msgspec
import pytest
import zmq

from sensorium.client.cli import observe
from sensorium.core import observation_query
from sensorium.core import observations as obs_mod
from sensorium.core.audit import AuditRecord, AuditStore
from sensorium.core.observations import (
    ACTION_INVALID_FAMILY,
    ACTION_INVALID_KIND,
    PRUNE_PER_INSERT,
    SENSITIVITY_ORDER,
    ObservationPublisher,
    build,
    effective_sensitivity,
    ensure_schema,
    insert,
    rows,
)
from sensorium.shared.clock import rfc3339
from sensorium.shared.config import ObservationConfig
from sensorium.shared.errors import CodedError
from sensorium.shared.paths import StatePaths
from sensorium.shared.wire.client_api import ObserveQuery, TopicSummaryRequest
from sensorium.shared.wire.declaration import ResultContract
from sensorium.shared.wire.directive import ArtifactRef
from sensorium.shared.wire.observation import TOPIC_PREFIX, Observation
from sensorium.shared.wire.outcome import (
    Diagnostic,
    EvidenceRef,
    Outcome,
    ResultBody,
    Sensitivity,
    StreamCapture,
)
from sensorium.shared.wire.report import ConnectorAction

SECRET_OUT = "stdout-SECRET-token-123"
SECRET_ERR = "stderr-PRIVATE-key-456"
SECRET_PARAM = "param-SECRET-argv-789"


def _action(**contract: Any) -> ConnectorAction:
    return ConnectorAction(
        action_id="demo.web.fetch",
        class_="read-only-spawn",
        parameters_schema={"type": "object"},
        default_timeout_ms=1000,
        max_timeout_ms=2000,
        result_contract=ResultContract(**contract),
        state="enabled",
    )


def _outcome(
    *,
    status: str = "completed",
    payload: Any = None,
    pointers: dict[str, Any] | None = None,
    diagnostics: list[Diagnostic] | None = None,
    sensitivity: str = "operational-sensitive",
) -> Outcome:
    return Outcome(
        outcome_id="01JOUTCOME00000000000000000",
        directive_id="01JDIRECTIVE000000000000000",
        action_id="demo.web.fetch",
        correlation_id="corr-1",
        status=status,  # type: ignore[arg-type]
        argv=["fetch", SECRET_PARAM],
        exit_code=0,
        started_at="2026-05-05T18:00:00.000Z",
        duration_ms=12.5,
        timeout_ms=1000,
        stdout=StreamCapture(text=SECRET_OUT, bytes_total=22, bytes_captured=22),
        stderr=StreamCapture(text=SECRET_ERR, bytes_total=22, bytes_captured=22),
        result=ResultBody(json=payload, pointers=pointers or {}),
        sensitivity=Sensitivity(class_=sensitivity),
        artifact_refs=[EvidenceRef(id="sha256:ab", role="artifact", media_type="text/plain")],
        diagnostics=diagnostics or [],
    )


def _missing_diag() -> Diagnostic:
    return Diagnostic(code="result-pointer-missing", message="result lacks declared pointer b")


# --- build ------------------------------------------------------------------------------


def test_declared_kind_gives_one_observation() -> None:
    action = _action(
        stdout_format="json",
        result_pointer_fields=["url"],
        signal_kind="ai.orbiplex.os/fetch-result",
        signal_family="os/fetch",
    )
    outcome = _outcome(
        payload={"url": "https://x", "body": SECRET_OUT}, pointers={"url": "https://x"}
    )
    [o] = build(outcome, action, "sensorium-os", observed_at="2026-05-05T18:00:01.000Z")
    assert o.signal_kind == "ai.orbiplex.os/fetch-result"
    assert o.signal_family == "os/fetch"
    assert o.connector_id == "sensorium-os" and o.action_id == "demo.web.fetch"
    assert o.connector_kind == "OS"
    assert o.directive_id == outcome.directive_id and o.correlation_id == "corr-1"
    assert o.outcome_id == outcome.outcome_id
    assert o.source_ref.value == f"outcome:{outcome.outcome_id}"
    assert o.outcome_status == "completed" and o.observed_at == "2026-05-05T18:00:01.000Z"
    assert o.result_pointers == {"url": "https://x"}
    assert o.summary is not None and o.summary.lang == "en" and "url" in o.summary.text
    # Artifacts by content id, in the published roles.
    assert o.evidence_refs == [
        ArtifactRef(artifact_id="sha256:ab", role="produced-file", media_type="text/plain")
    ]
    assert o.sensitivity.class_ == "operational-sensitive"
    assert o.admission.publish_topics == [TOPIC_PREFIX + "ai.orbiplex.os/fetch-result"]
    assert o.admission.store.ttl_sec >= o.freshness.ttl_sec
    assert len(o.observation_id) == 26


def test_the_observed_time_is_when_the_action_ended() -> None:
    [o] = build(_outcome(), _action(signal_kind="a.b/c"), "c")
    assert o.observed_at == "2026-05-05T18:00:00.012Z"  # started_at + 12.5 ms


def test_undeclared_pointer_never_reaches_the_summary() -> None:
    action = _action(result_pointer_fields=["url"], signal_kind="a.b/c")
    outcome = _outcome(pointers={"url": 1, "smuggled": SECRET_OUT})
    [o] = build(outcome, action, "c")
    assert o.result_pointers == {"url": 1}
    assert o.summary is not None and "smuggled" not in o.summary.text


def test_no_declared_kind_gives_none() -> None:
    assert build(_outcome(status="failed"), _action(), "sensorium-os") == []


def test_pointer_missing_gives_action_invalid_even_without_kind() -> None:
    action = _action(stdout_format="json", result_pointer_fields=["a"], pointer_fields=["a", "b"])
    outcome = _outcome(
        status="failed",
        payload={"a": 1},
        pointers={"a": 1},
        diagnostics=[_missing_diag(), Diagnostic(code="other", message="x")],
    )
    [o] = build(outcome, action, "sensorium-os")
    assert o.signal_kind == ACTION_INVALID_KIND and o.signal_family == ACTION_INVALID_FAMILY
    assert o.result_pointers == {"missing_pointer_fields": ["b"]}
    assert [d.code for d in o.diagnostics] == ["result-pointer-missing"]
    assert o.outcome_status == "failed"


def test_pointer_missing_with_kind_gives_both() -> None:
    action = _action(pointer_fields=["a"], signal_kind="a.b/done")
    outcome = _outcome(
        status="failed", payload={"pointers": {"z": 1}}, diagnostics=[_missing_diag()]
    )
    kinds = [o.signal_kind for o in build(outcome, action, "c")]
    assert kinds == ["a.b/done", ACTION_INVALID_KIND]
    assert build(outcome, action, "c")[1].result_pointers == {"missing_pointer_fields": ["a"]}


@pytest.mark.parametrize(
    ("baseline", "declared", "expected"),
    [
        ("operational-sensitive", None, "operational-sensitive"),
        ("operational-sensitive", "private", "private"),
        ("operational-sensitive", "sensitive-personal", "sensitive-personal"),
        ("operational-sensitive", "public", "operational-sensitive"),
        ("operational-sensitive", "community", "operational-sensitive"),
        ("operational-sensitive", "top-secret-ish", "operational-sensitive"),
        ("private", "private", "private"),
        # Outside the published five: fails closed to the strictest.
        ("custom-class", "private", "sensitive-personal"),
        ("custom-class", None, "sensitive-personal"),
    ],
)
def test_sensitivity_is_raised_never_lowered(
    baseline: str, declared: str | None, expected: str
) -> None:
    assert effective_sensitivity(baseline, declared) == expected
    action = _action(signal_kind="a.b/c")
    [o] = build(_outcome(sensitivity=baseline), action, "c", declared_sensitivity=declared)
    assert o.sensitivity.class_ == expected


def test_sensitivity_order_is_monotonic() -> None:
    for i, lower in enumerate(SENSITIVITY_ORDER):
        for higher in SENSITIVITY_ORDER[i:]:
            assert effective_sensitivity(lower, higher) == higher
            assert effective_sensitivity(higher, lower) == higher


def test_no_private_payload_in_encoded_observation() -> None:
    action = _action(pointer_fields=["a", "b"], signal_kind="a.b/c")
    outcome = _outcome(
        status="failed",
        payload={"a": SECRET_OUT, "body": SECRET_ERR},
        diagnostics=[_missing_diag()],
    )
    found = build(outcome, action, "c")
    assert len(found) == 2
    for o in found:
        for blob in (msgspec.json.encode(o), obs_mod.encode(o)):
            for secret in (SECRET_OUT, SECRET_ERR, SECRET_PARAM):
                assert secret.encode() not in blob
            assert b"stdout" not in blob and b"stderr" not in blob and b"argv" not in blob


# --- wire schema ------------------------------------------------------------------------


def test_json_schema_round_trip() -> None:
    schema = msgspec.json.schema(Observation)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    action = _action(result_pointer_fields=["url"], pointer_fields=["x"], signal_kind="a.b/c")
    outcome = _outcome(pointers={"url": "u"}, diagnostics=[_missing_diag()])
    for o in build(outcome, action, "sensorium-os"):
        doc = msgspec.json.decode(msgspec.json.encode(o))
        validator.validate(doc)
        for key in ("schema/v", "observation/id", "signal/kind", "evidence/refs", "outcome/id"):
            assert key in doc
        assert doc["sensitivity"] == {"class": "operational-sensitive", "redaction": "none"}
        assert None not in doc.values()  # absent, never null
        assert msgspec.json.decode(msgspec.json.encode(doc), type=Observation) == o
        assert obs_mod.decode(obs_mod.encode(o)) == o
        bad = dict(doc, **{"signal/kind": "Not A Kind"})
        assert not validator.is_valid(bad)
        with pytest.raises(msgspec.ValidationError):
            msgspec.json.decode(msgspec.json.encode(bad), type=Observation)


# --- store ------------------------------------------------------------------------------


def _read(conn: apsw.Connection) -> observation_query.Read:
    return lambda sql, params: conn.execute(sql, params).fetchall()


def test_store_rows_and_queries(tmp_path: Path) -> None:
    conn = apsw.Connection(str(tmp_path / "audit.sqlite"))
    ensure_schema(conn)
    ensure_schema(conn)  # idempotent
    action = _action(pointer_fields=["x"], signal_kind="a.b/c")
    found = build(_outcome(diagnostics=[_missing_diag()]), action, "c")
    r = rows(found)
    assert [row[1] for row in r] == ["a.b/c", ACTION_INVALID_KIND]
    assert all(row[2] == found[0].directive_id and isinstance(row[-1], bytes) for row in r)
    insert(conn, found)
    insert(conn, found)  # same ids: ignored
    assert conn.execute("SELECT count(*) FROM observation_records").fetchone() == (2,)
    read = _read(conn)
    now = found[0].ingested_at

    def ask(**filters: Any) -> list[Observation]:
        q = ObserveQuery(request_id="r", **filters)
        return observation_query.query(read, q, max_page=50, actions=None, now=now).observations

    assert [o.signal_kind for o in ask(kind_prefix="sensorium.core/")] == [ACTION_INVALID_KIND]
    assert {o.observation_id for o in ask(directive_id=found[0].directive_id)} == {
        o.observation_id for o in found
    }
    assert ask(directive_id="nope") == []
    assert ask(sensitivity=["public"]) == []
    assert len(ask(sensitivity=["operational-sensitive", "private"])) == 2
    # Scoped: an action the caller may not read leaves nothing.
    q = ObserveQuery(request_id="r")
    assert observation_query.query(read, q, max_page=5, actions=set(), now=now).observations == []
    got = observation_query.get(read, found[0].observation_id, actions=None, now=now)
    assert got == found[0]
    [entry], truncated = observation_query.summary(
        read,
        TopicSummaryRequest(request_id="r", kind_prefix="a.b/"),
        max_topics=5,
        actions=None,
        now=now,
    )
    assert (entry.topic, entry.count, truncated) == (TOPIC_PREFIX + "a.b/c", 1, False)
    assert entry.last_observation_id == found[0].observation_id
    conn.close()


def test_expired_records_are_never_read_and_are_pruned_in_bounded_steps(tmp_path: Path) -> None:
    conn = apsw.Connection(str(tmp_path / "audit.sqlite"))
    ensure_schema(conn)
    action = _action(signal_kind="a.b/c")
    short = ObservationConfig(store_ttl_s=10, freshness_ttl_s=10)
    old = [build(_outcome(), action, "c", policy=short, now=1000.0)[0] for _ in range(30)]
    insert(conn, old)
    read = _read(conn)
    later = rfc3339(1011.0)
    with pytest.raises(CodedError) as err:
        observation_query.get(read, old[0].observation_id, actions=None, now=later)
    assert err.value.code == "observation-unknown"
    q = ObserveQuery(request_id="r")
    assert observation_query.query(read, q, max_page=50, actions=None, now=later).observations == []
    # Each insert prunes at most PRUNE_PER_INSERT expired rows; the backlog drains.
    fresh = build(_outcome(), action, "c", policy=short, now=1011.0)
    insert(conn, fresh)
    left = conn.execute("SELECT count(*) FROM observation_records").fetchone()[0]
    assert left == 30 + 1 - PRUNE_PER_INSERT
    for _ in range(4):
        insert(conn, build(_outcome(), action, "c", policy=short, now=1011.0))
    assert conn.execute("SELECT count(*) FROM observation_records").fetchone()[0] == 5
    conn.close()


def test_a_huge_page_is_bounded_and_the_cursor_walks_every_record(tmp_path: Path) -> None:
    conn = apsw.Connection(str(tmp_path / "audit.sqlite"))
    ensure_schema(conn)
    action = _action(signal_kind="a.b/c")
    made = [
        build(_outcome(), action, "c", observed_at=rfc3339(2000.0 + i), now=3000.0)[0]
        for i in range(25)
    ]
    insert(conn, made)
    read = _read(conn)
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        q = ObserveQuery(
            request_id="r",
            since="1970-01-01T00:00:00Z",
            until="9999-01-01T00:00:00Z",
            limit=1_000_000,
            cursor=cursor,
        )
        page = observation_query.query(read, q, max_page=10, actions=None, now=rfc3339(3001.0))
        assert page.limit == 10 and len(page.observations) <= 10
        seen += [o.observation_id for o in page.observations]
        pages += 1
        cursor = page.next_cursor
        if cursor is None:
            break
    assert pages == 3
    assert seen == [o.observation_id for o in reversed(made)]  # newest first, none twice
    with pytest.raises(CodedError) as err:
        observation_query.query(
            read,
            ObserveQuery(request_id="r", cursor="garbage!"),
            max_page=10,
            actions=None,
            now="x",
        )
    assert err.value.code == "request-malformed"
    conn.close()


# --- the stream -------------------------------------------------------------------------


@pytest.fixture
def run_dir() -> Iterator[Path]:
    # Short, because AF_UNIX socket paths are limited to 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="obs-", dir="/tmp"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _two_kinds() -> tuple[Observation, Observation]:
    declared = build(_outcome(), _action(signal_kind="ai.orbiplex.os/fetch-result"), "c")[0]
    invalid = build(_outcome(diagnostics=[_missing_diag()]), _action(pointer_fields=["q"]), "c")[0]
    return declared, invalid


def test_pub_sub_filters_by_kind_prefix(run_dir: Path) -> None:
    endpoint = f"ipc://{run_dir}/run/observations.sock"
    ctx = zmq.Context()
    pub = ObservationPublisher(endpoint, ctx)
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, (TOPIC_PREFIX + "sensorium.core/").encode())
    sub.connect(endpoint)
    declared, invalid = _two_kinds()
    try:
        # Slow joiner: keep publishing until the subscription has propagated.
        deadline = time.monotonic() + 5
        frames: list[bytes] | None = None
        while frames is None and time.monotonic() < deadline:
            assert pub.publish(declared)
            assert pub.publish(invalid)
            if sub.poll(50):
                frames = sub.recv_multipart()
        assert frames is not None, "no observation arrived"
        assert frames[0] == (TOPIC_PREFIX + ACTION_INVALID_KIND).encode()
        assert obs_mod.decode(frames[1]) == invalid
        # Everything else queued for us is of the subscribed kind, never the other one.
        while sub.poll(100):
            topic, _body = sub.recv_multipart()
            assert topic == (TOPIC_PREFIX + ACTION_INVALID_KIND).encode()
        assert pub.published >= 2 and pub.dropped == 0
    finally:
        sub.close(linger=0)
        pub.close()
        ctx.term()
    assert not pub.publish(invalid) and pub.dropped == 1  # closed: counted, never raised


def test_publish_without_subscribers_never_blocks(run_dir: Path) -> None:
    pub = ObservationPublisher(f"ipc://{run_dir}/o.sock", hwm=10)
    declared, _ = _two_kinds()
    # A publish that blocked would wait forever for a subscriber: a hang, not a delay.
    publisher = threading.Thread(
        target=lambda: [pub.publish(declared) for _ in range(1000)], daemon=True
    )
    publisher.start()
    publisher.join(60)
    assert not publisher.is_alive(), "a publish blocked without subscribers"
    pub.close()


def test_cli_observe_prints_matching_lines(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = StatePaths(run_dir)
    pub = ObservationPublisher(f"ipc://{paths.run / 'observations.sock'}")
    declared, invalid = _two_kinds()
    args = argparse.Namespace(state_dir=str(run_dir), kind="ai.orbiplex.os/", json=False, count=1)
    result: list[int] = []
    t = threading.Thread(target=lambda: result.append(observe.run(args)))
    t.start()
    try:
        deadline = time.monotonic() + 5
        while t.is_alive() and time.monotonic() < deadline:
            pub.publish(invalid)
            pub.publish(declared)
            time.sleep(0.02)
        t.join(timeout=5)
    finally:
        pub.close()
    assert result == [0]
    [line] = capsys.readouterr().out.splitlines()
    assert "ai.orbiplex.os/fetch-result" in line and "demo.web.fetch" in line
    assert f"outcome:{declared.outcome_id}" in line and "completed" in line
    assert ACTION_INVALID_KIND not in line

    # --json prints the wire document.
    pub = ObservationPublisher(f"ipc://{paths.run / 'observations.sock'}")
    args = argparse.Namespace(state_dir=str(run_dir), kind="", json=True, count=1)
    result.clear()
    t = threading.Thread(target=lambda: result.append(observe.run(args)))
    t.start()
    try:
        deadline = time.monotonic() + 5
        while t.is_alive() and time.monotonic() < deadline:
            pub.publish(declared)
            time.sleep(0.02)
        t.join(timeout=5)
    finally:
        pub.close()
    assert result == [0]
    [line] = capsys.readouterr().out.splitlines()
    assert msgspec.json.decode(line.encode(), type=Observation).signal_kind == declared.signal_kind


# --- an older store ---------------------------------------------------------------------

OLD_TABLE = """
CREATE TABLE observations (
    observation_id TEXT PRIMARY KEY, kind TEXT NOT NULL, directive_id TEXT NOT NULL,
    observed_at TEXT NOT NULL, body BLOB NOT NULL
);
INSERT INTO observations VALUES ('old', 'a.b/c', 'd', '2026-01-01T00:00:00.000Z', x'00');
"""


def test_a_store_from_before_045_is_brought_up_to_date_before_the_first_write(
    tmp_path: Path,
) -> None:
    path = tmp_path / "audit.sqlite"
    store = AuditStore(path)
    store.close()
    # As a version-7 store written before this table existed left it.
    conn = apsw.Connection(str(path))
    conn.execute("DROP TRIGGER observation_records_prune; DROP TABLE observation_records;")
    conn.execute(OLD_TABLE)
    conn.close()

    found = build(_outcome(), _action(signal_kind="a.b/c"), "c")

    async def run() -> None:
        store = AuditStore(path)
        try:
            store.enqueue(ensure_schema)  # what core's read paths do when they start
            await store.record(
                AuditRecord(
                    record_id="r1",
                    kind="outcome",
                    directive_id=found[0].directive_id or "",
                    action_id="demo.web.fetch",
                    status="completed",
                    code=None,
                    request_id=None,
                    recorded_at=found[0].ingested_at,
                    body=b"",
                    observations=tuple(rows(found)),
                )
            )
            q = ObserveQuery(request_id="r")
            page = observation_query.query(
                store.read, q, max_page=5, actions=None, now=found[0].ingested_at
            )
            assert page.observations == found
            tables = {r[0] for r in store.read("SELECT name FROM sqlite_master", ())}
            assert "observations" not in tables and "observation_records" in tables
        finally:
            store.close()

    asyncio.run(run())
