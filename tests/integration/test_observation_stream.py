"""Observations end to end: emitted for declared signal kinds, stored with the outcome,
published on the stream `sensorium observe` follows."""

from __future__ import annotations

import json
import subprocess
import time

import apsw
from harness import SENSORIUM, Stack


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
    assert obs["signal/kind"] == "sensorium.demo/file-stat"
    assert obs["outcome/ref"] == f"outcome:{out.outcome_id}"
    assert obs["sensitivity"]["class"] == "operational-sensitive"
    assert set(obs["summary"]) == {"bytes", "mtime_s"}
    assert "stdout" not in line and "/etc/hostname" not in line  # no private payloads
    db = apsw.Connection(str(stack.paths.audit_db), flags=apsw.SQLITE_OPEN_READONLY)
    kinds = [
        r[0]
        for r in db.execute(
            "SELECT kind FROM observations WHERE directive_id = ?", (out.directive_id,)
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
    assert obs["signal/kind"] == "sensorium.core/action-invalid"
    assert obs["directive/id"] == out.directive_id
