"""Observations end to end: emitted for declared signal kinds, stored with the outcome,
published on the local topics `local/sensorium/observations/{signal-kind}` that
`sensorium observe` follows, and valid against the project's `sensorium-observation.v1`."""

from __future__ import annotations

import importlib.resources
import json
import subprocess
import time
from typing import Any

import apsw
import jsonschema
from harness import SENSORIUM, Stack

SCHEMA = json.loads(
    (
        importlib.resources.files("sensorium.schemas") / "sensorium-observation.v1.schema.json"
    ).read_text("utf-8")
)


def _valid(doc: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.FormatChecker()).validate(doc)


def _observe(stack: Stack, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [*SENSORIUM, "--state-dir", str(stack.paths.root), "observe", "--json", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Anything published before the subscription is in place is not seen: wait for it.
    assert proc.stderr is not None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if "following" in line or "not reachable" in line or not line:
            break
    assert "sensorium: following" in line, line
    return proc


def test_a_declared_signal_kind_is_observed_stored_and_streamed(stack: Stack) -> None:
    watcher = _observe(stack, "--kind", "sensorium.demo/", "--count", "1")
    try:
        with stack.client() as c:
            out = c.invoke("demo.fs.stat", {"path": "/etc/hostname"})
        line, _err = watcher.communicate(timeout=20)
    finally:
        watcher.kill()
    obs = json.loads(line.splitlines()[0])
    _valid(obs)
    assert obs["signal/kind"] == "sensorium.demo/file-stat"
    assert obs["outcome/id"] == out.outcome_id
    assert obs["sensitivity"]["class"] == "operational-sensitive"
    assert set(obs["result/pointers"]) == {"bytes", "mtime_s"}
    assert obs["admission"]["publish_topics"] == [
        "local/sensorium/observations/sensorium.demo/file-stat"
    ]
    assert "stdout" not in line and "/etc/hostname" not in line  # no private payloads
    db = apsw.Connection(str(stack.paths.audit_db), flags=apsw.SQLITE_OPEN_READONLY)
    kinds = [
        r[0]
        for r in db.execute(
            "SELECT kind FROM observation_records WHERE directive_id = ?", (out.directive_id,)
        )
    ]
    assert kinds == ["sensorium.demo/file-stat"]


def test_a_missing_pointer_field_yields_an_action_invalid_observation(stack: Stack) -> None:
    watcher = _observe(stack, "--kind", "sensorium.core/action-invalid", "--count", "1")
    try:
        with stack.client() as c:
            out = c.invoke("test.json", {"text": '{"b": 1}'})
        line, _err = watcher.communicate(timeout=20)
    finally:
        watcher.kill()
    assert [d.code for d in out.diagnostics] == ["result-pointer-missing"]
    obs = json.loads(line.splitlines()[0])
    _valid(obs)
    assert obs["signal/kind"] == "sensorium.core/action-invalid"
    assert obs["directive/id"] == out.directive_id


def test_a_kind_prefix_subscriber_gets_only_that_kind(stack: Stack) -> None:
    # Other kinds are published first: were they not filtered, one would come first.
    watcher = _observe(stack, "--kind", "sensorium.demo/file-stat", "--count", "1")
    try:
        with stack.client() as c:
            c.invoke("test.json", {"text": '{"b": 1}'})  # sensorium.core/action-invalid
            c.invoke("demo.system.uptime", {})  # sensorium.demo/uptime
            out = c.invoke("demo.fs.stat", {"path": "/etc/hostname"})
        lines, _err = watcher.communicate(timeout=20)
    finally:
        watcher.kill()
    [line] = lines.splitlines()
    obs = json.loads(line)
    _valid(obs)
    assert obs["signal/kind"] == "sensorium.demo/file-stat"
    assert obs["outcome/id"] == out.outcome_id
