"""Late replies after a core restart are orphan events: reconciled into the outcome of
the directive core had dispatched, so a retry under its key gets it and nothing runs
twice; `sensorium orphans` shows them."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import Any

import pytest
from harness import Stack

from sensorium.client import InDoubt, SensoriumError


def _spawns(stack: Stack, key: str) -> int:
    log = stack.paths.root / "logs" / "connector.jsonl"
    n = 0
    for line in log.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("event") == "action.started" and rec.get("idempotency/key") == key:
            n += 1
    return n


def _orphans(stack: Stack) -> list[dict[str, Any]]:
    done = stack.cli("orphans", "list", "--json")
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


def _until(check: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"{what} within {timeout_s}s")


@pytest.mark.slow
def test_a_late_reply_after_a_core_restart_is_recovered_and_never_runs_twice(
    stack: Stack,
) -> None:
    key = "late-reply-1"
    box: dict[str, object] = {}

    def first() -> None:
        try:
            with stack.client() as c:
                box["outcome"] = c.invoke(
                    "test.sleep", {"seconds": 3}, idempotency_key=key, retries=0
                )
        except SensoriumError as exc:
            box["error"] = exc

    t = threading.Thread(target=first)
    t.start()
    stack.action_pid("sleep.py")
    old = stack.pids()["core"]
    assert old is not None
    os.kill(old, signal.SIGKILL)
    t.join(timeout=10)
    assert isinstance(box.get("error"), SensoriumError), box  # the caller heard, clearly
    stack.wait_replaced("core", old)

    # The action finishes under the new core: its reply is an orphan, reconciled.
    rows = _until(
        lambda: [r for r in _orphans(stack) if r["state"] == "recovered"],
        20,
        "no recovered orphan",
    )
    (row,) = rows
    assert row["kind"] == "outcome"
    assert row["attached_to"].startswith("outcome:")

    # A retry under the same key gets that outcome; the action ran once.
    with stack.client() as c:
        again = c.invoke("test.sleep", {"seconds": 3}, idempotency_key=key, retries=0)
    assert f"outcome:{again.outcome_id}" == row["attached_to"]
    assert again.status == "completed"
    assert _spawns(stack, key) == 1

    shown = stack.cli("orphans", "show", row["orphan/id"])
    assert shown.returncode == 0 and "attached to outcome:" in shown.stdout, shown.stdout


@pytest.mark.slow
def test_a_retry_after_the_connector_lost_the_attempt_is_in_doubt_not_a_second_spawn(
    stack: Stack,
) -> None:
    key = "lost-attempt-1"
    box: dict[str, object] = {}

    def first() -> None:
        try:
            with stack.client() as c:
                c.invoke("test.sleep", {"seconds": 30}, idempotency_key=key, retries=0)
        except SensoriumError as exc:
            box["error"] = exc

    t = threading.Thread(target=first)
    t.start()
    stack.action_pid("sleep.py")
    old = stack.pids()["connector"]
    assert old is not None
    os.kill(old, signal.SIGKILL)
    t.join(timeout=10)
    assert isinstance(box.get("error"), SensoriumError), box
    stack.wait_replaced("connector", old)
    with stack.client() as c, pytest.raises(InDoubt) as err:
        c.invoke("test.sleep", {"seconds": 30}, idempotency_key=key, retries=0)
    assert err.value.code == "outcome-in-doubt"
    assert "fresh key" in err.value.message
    assert _spawns(stack, key) == 1
