"""The consumer read paths of proposal 045 §7 on a real node, core on tcp under CURVE:
``sensorium.directive.list``, ``sensorium.observe.query``, ``sensorium.observation.get``,
``sensorium.topic.summary`` and ``sensorium.health``.

alice is granted the group ``test``, mallory only ``other``; the node's own key
(``Stack.client()``) is the operator. Pages are capped by ``observations.max_page``.
"""

from __future__ import annotations

import importlib.resources
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest
from harness import Stack, free_port, keys_cli, python_action, start_stack, write_dropin

from sensorium.client import Client
from sensorium.client.errors import UnknownId
from sensorium.shared.paths import StatePaths
from sensorium.shared.rpc.curve import ClientKeys
from sensorium.shared.rpc.curvekeys import CurveStore

MAX_PAGE = 3


def _observed(action_id: str, kind: str, **extra: Any) -> dict[str, Any]:
    """An action printing its JSON argument, observed as ``kind`` about subject ``name``."""
    return python_action(
        action_id,
        "emit.py",
        ["{{text}}"],
        {"text": {"type": "string"}},
        result_contract={
            "stdout_format": "json",
            "result_pointer_fields": ["name"],
            "signal_kind": kind,
            "signal_family": "test/observed",
            "subject_kind": "test-subject",
            "subject_pointer": "name",
        },
        **extra,
    )


ACTIONS = [
    _observed("test.obs.a", "test.obs/a"),
    _observed("other.obs.b", "release", group="other", sensitivity={"class": "private"}),
]
SCHEMA_DIR = importlib.resources.files("sensorium.schemas")


def _schema(name: str) -> jsonschema.Draft202012Validator:
    doc = json.loads((SCHEMA_DIR / f"{name}.schema.json").read_text("utf-8"))
    return jsonschema.Draft202012Validator(doc, format_checker=jsonschema.FormatChecker())


@pytest.fixture(scope="module")
def node() -> Iterator[Stack]:
    paths = StatePaths(Path(tempfile.mkdtemp(prefix="st-", dir="/tmp")))
    paths.ensure()
    root = str(paths.root)
    # Grants are checked against the catalog: it is written before the keys.
    write_dropin(paths, "50-tests", ACTIONS)
    keys_cli(root, "curve", "init")
    for name, grant in (("alice", "test"), ("mallory", "other")):
        keys_cli(root, "client", "add", name, "--grant", grant)
    config = {
        "endpoints": {
            "core": f"tcp://127.0.0.1:{free_port()}",
            "connector": f"tcp://127.0.0.1:{free_port()}",
        },
        "observations": {"max_page": MAX_PAGE},
    }
    stack = start_stack(paths, ACTIONS, config)
    try:
        stack.wait_ready()
        with stack.client() as op:
            for i in range(MAX_PAGE + 1):
                op.invoke("test.obs.a", {"text": json.dumps({"name": f"n{i}"})})
            op.invoke("other.obs.b", {"text": json.dumps({"name": "b0"})})
        yield stack
    finally:
        stack.stop()
        shutil.rmtree(paths.root, ignore_errors=True)


def _client(node: Stack, name: str) -> Client:
    endpoint = json.loads(node.paths.node_config.read_text())["endpoints"]["core"]
    issued = CurveStore(node.paths).issued_dir / f"{name}.key_secret"
    return Client(endpoint, curve=ClientKeys.load(issued))


def test_stored_observations_are_valid_and_carry_the_declared_subject(node: Stack) -> None:
    with node.client() as op:
        page = op.observe_query(signal_kind="test.obs/a", subject_id="n2")
        [obs] = page.observations
        doc = msgspec.to_builtins(obs)
        _schema("sensorium-observation.v1").validate(doc)
        assert doc["subject/kind"] == "test-subject" and doc["subject/id"] == "n2"
        assert doc["admission"]["publish_topics"] == ["local/sensorium/observations/test.obs/a"]
        assert doc["admission"]["store"]["ttl_sec"] >= doc["freshness"]["ttl_sec"]
        assert op.observation(obs.observation_id) == obs
        [other] = op.observe_query(signal_kind="release").observations
        assert other.sensitivity.class_ == "private"  # raised by its declaration
        assert [o.signal_kind for o in op.observe_query(sensitivity=["private"]).observations] == [
            "release"
        ]


def test_a_huge_range_returns_a_bounded_page_and_the_cursor_continues(node: Stack) -> None:
    with node.client() as op:
        wide: dict[str, Any] = {
            "since": "1970-01-01T00:00:00Z",
            "until": "9999-12-31T23:59:59Z",
            "limit": 10**9,
            "signal_kind": "test.obs/a",
        }
        first = op.observe_query(**wide)
        _schema("sensorium-observation-page.v1").validate(msgspec.to_builtins(first))
        assert first.limit == MAX_PAGE and len(first.observations) == MAX_PAGE
        assert first.next_cursor is not None
        rest = op.observe_query(**wide, cursor=first.next_cursor)
        assert len(rest.observations) == 1 and rest.next_cursor is None
        names = [o.subject_id for o in (*first.observations, *rest.observations)]
        assert names == [f"n{i}" for i in reversed(range(MAX_PAGE + 1))]  # newest first


def test_topic_summary_counts_live_records_per_topic(node: Stack) -> None:
    with node.client() as op:
        summary = op.topic_summary()
    by_kind = {t.signal_kind: t for t in summary.topics}
    assert by_kind["test.obs/a"].count == MAX_PAGE + 1
    assert by_kind["test.obs/a"].topic == "local/sensorium/observations/test.obs/a"
    assert by_kind["release"].count == 1 and not summary.truncated


def test_directive_list_and_observations_respect_grants(node: Stack) -> None:
    with node.client() as op:
        everything = {a.action_id for a in op.directives().actions}
        assert {"test.obs.a", "other.obs.b"} <= everything
        release = op.observe_query(signal_kind="release").observations[0]
    with _client(node, "alice") as alice:
        listed = alice.directives()
        ids = {a.action_id for a in listed.actions}
        assert "test.obs.a" in ids and "other.obs.b" not in ids
        schema = next(a for a in listed.actions if a.action_id == "test.obs.a").parameters_schema
        assert schema["required"] == ["text"]
        kinds = {o.signal_kind for o in alice.observe_query(limit=MAX_PAGE).observations}
        assert kinds == {"test.obs/a"}
        with pytest.raises(UnknownId):
            alice.observation(release.observation_id)
        assert {t.signal_kind for t in alice.topic_summary().topics} == {"test.obs/a"}
        assert alice.health().process == "core"  # sensorium.health: any allowlisted key
    with _client(node, "mallory") as mallory:
        assert {a.action_id for a in mallory.directives().actions} == {"other.obs.b"}
        assert [o.signal_kind for o in mallory.observe_query().observations] == ["release"]


def test_the_cli_queries_and_gets(node: Stack) -> None:
    done = node.cli("observe", "query", "--kind", "test.obs/", "--limit", "2", "--json")
    assert done.returncode == 0, done.stderr
    page = json.loads(done.stdout)
    assert len(page["observations"]) == 2 and page["next/cursor"]
    oid = page["observations"][0]["observation/id"]
    got = node.cli("observe", "get", oid)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["observation/id"] == oid
    missing = node.cli("observe", "get", "01NOSUCHOBSERVATION0000000")
    assert missing.returncode == 1 and "observation-unknown" in missing.stderr
