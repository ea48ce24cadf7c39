"""One spawn per idempotency/key, on paths the random-kill suite rarely lines up:
a retry that reuses its directive after a refusal, then loses its connector."""

from __future__ import annotations

import os
import signal
import threading
import time

import apsw
import pytest
from harness import TEST_ACTIONS, Stack, log_events, running_stack, spawns_per_key

from sensorium.client import InDoubt, SensoriumError, Unavailable
from sensorium.connectors.os.run import starts
from sensorium.shared.clock import rfc3339
from sensorium.shared.ids import new_id

NODE = {"limits": {"connector_max_concurrent_spawns": 1}}


def test_a_refused_attempt_then_a_lost_one_never_lets_the_key_spawn_again() -> None:
    with running_stack(TEST_ACTIONS, node=NODE) as stack:
        # The only spawn slot is busy: the keyed directive's first attempts are refused
        # (overloaded) after core has written their dispatch intent.
        blocker = threading.Thread(
            target=lambda: stack.client().invoke("test.sleep", {"seconds": 1.0})
        )
        blocker.start()
        stack.action_pid("sleep.py")
        box: dict[str, object] = {}

        def keyed() -> None:
            with stack.client() as c:
                try:
                    box["outcome"] = c.invoke(
                        "test.stubborn",
                        {"seconds": 4},
                        timeout_ms=20_000,
                        idempotency_key="k-refused-then-lost",
                        retries=8,
                    )
                except SensoriumError as exc:
                    box["error"] = exc

        t = threading.Thread(target=keyed)
        t.start()
        stack.action_pid("stubborn.py")  # a later attempt, reusing the directive, runs
        connector = stack.pids()["connector"]
        assert connector is not None
        os.kill(connector, signal.SIGKILL)
        t.join(60)
        blocker.join(10)
        assert not t.is_alive()
        assert isinstance(box.get("error"), InDoubt), box
        assert spawns_per_key(stack.paths).get("k-refused-then-lost") == 1


def _intent_left_by_a_dead_core(stack: Stack, key: str, connector_instance: str) -> None:
    """What a core killed after writing a keyed directive's dispatch intent, and before
    sending it, leaves behind: the intent, unsettled, naming the connector instance its
    report named."""
    with apsw.Connection(str(stack.paths.audit_db)) as conn:
        conn.set_busy_timeout(5000)
        conn.execute(
            "INSERT INTO dispatches (directive_id, idempotency_key, action_id, "
            "correlation_id, seam_request_id, core_instance, dispatched_at, "
            "connector_instance) VALUES (?, ?, 'test.echo-args', NULL, ?, ?, ?, ?)",
            (new_id(), key, new_id(), "core-that-died", rfc3339(), connector_instance),
        )


@pytest.mark.parametrize("same_connector", [True, False])
def test_an_attempt_that_provably_never_reached_the_connector_is_not_in_doubt(
    same_connector: bool,
) -> None:
    """The earlier attempt was sent to the connector instance that still runs and does
    not know its key: it never started, so the retry runs it (once) and answers
    definitively. Sent to an instance that has since died, it may have run: in doubt."""
    with running_stack(TEST_ACTIONS) as stack:
        with stack.client() as c:
            health = c.health()
            assert health.connector is not None and health.connector.instance_id
            live = health.connector.instance_id
            key = f"k-never-started-{same_connector}"
            _intent_left_by_a_dead_core(stack, key, live if same_connector else new_id())
            try:
                got: object = c.invoke(
                    "test.echo-args", {"value": "once"}, idempotency_key=key, retries=0
                )
            except SensoriumError as exc:
                got = exc
        spawns = spawns_per_key(stack.paths).get(key, 0)
    if same_connector:
        assert not isinstance(got, SensoriumError), got
        assert getattr(got, "status", None) == "completed", got
        assert spawns == 1
    else:
        assert isinstance(got, InDoubt), got
        assert spawns == 0


def _wait_dispatched(stack: Stack, key: str, within_s: float = 20.0) -> None:
    """Until core's dispatch intent for ``key`` is on disk (it is sent right after)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        with apsw.Connection(str(stack.paths.audit_db), flags=apsw.SQLITE_OPEN_READONLY) as conn:
            conn.set_busy_timeout(5000)
            if conn.execute(
                "SELECT 1 FROM dispatches WHERE idempotency_key = ?", (key,)
            ).fetchall():
                return
        time.sleep(0.02)
    raise AssertionError(f"no dispatch intent for {key}")


def _journal_covers_now(stack: Stack) -> None:
    """Until a dispatch sent now falls inside the start journal's horizon (it answers
    for dispatches from its creation on, less a margin)."""
    with apsw.Connection(
        str(stack.paths.connector_starts_db), flags=apsw.SQLITE_OPEN_READONLY
    ) as conn:
        conn.set_busy_timeout(5000)
        row = conn.execute("SELECT covered_from FROM horizon").fetchone()
    assert row is not None
    while time.time() <= float(row[0]) + starts.MARGIN_S:
        time.sleep(0.05)


def _first_attempt(
    stack: Stack, box: dict[str, object], action: str, params: dict[str, object], key: str
) -> threading.Thread:
    def run() -> None:
        with stack.client() as c:
            try:
                box["first"] = c.invoke(action, params, idempotency_key=key, retries=0)
            except SensoriumError as exc:
                box["first"] = exc

    t = threading.Thread(target=run)
    t.start()
    return t


def test_a_directive_lost_with_its_connector_before_it_started_is_not_in_doubt() -> None:
    """The connector is frozen, then killed, with the directive sent to it and not yet
    started: its start journal has no row, so the retry answers definitively
    (retryable, nothing ran) and the retry after that runs it, once."""
    key = "k-lost-before-start"
    with running_stack(TEST_ACTIONS) as stack:
        _journal_covers_now(stack)
        connector = stack.pids()["connector"]
        assert connector is not None
        os.kill(connector, signal.SIGSTOP)
        box: dict[str, object] = {}
        t = _first_attempt(stack, box, "test.echo-args", {"value": "once"}, key)
        try:
            _wait_dispatched(stack, key)
        finally:
            os.kill(connector, signal.SIGKILL)
        t.join(60)
        assert not t.is_alive()
        assert isinstance(box.get("first"), SensoriumError), box
        stack.wait_replaced("connector", connector)
        with stack.client() as c:
            try:
                retry: object = c.invoke(
                    "test.echo-args", {"value": "once"}, idempotency_key=key, retries=0
                )
            except SensoriumError as exc:
                retry = exc
            assert isinstance(retry, Unavailable), (
                retry,
                log_events(stack.paths, "connector", "action.starts.asked"),
                log_events(stack.paths, "connector", "action.started"),
                log_events(stack.paths, "core", "directive.starts.unanswered"),
            )
            assert retry.code == "connector-unavailable", retry
            again = c.invoke("test.echo-args", {"value": "once"}, idempotency_key=key, retries=0)
        assert again.status == "completed", again
        assert spawns_per_key(stack.paths).get(key) == 1


def test_a_directive_lost_with_its_connector_after_it_started_stays_in_doubt() -> None:
    key = "k-lost-after-start"
    with running_stack(TEST_ACTIONS) as stack:
        connector = stack.pids()["connector"]
        assert connector is not None
        box: dict[str, object] = {}
        t = _first_attempt(stack, box, "test.stubborn", {"seconds": 30}, key)
        stack.action_pid("stubborn.py")
        os.kill(connector, signal.SIGKILL)
        t.join(60)
        assert not t.is_alive()
        assert isinstance(box.get("first"), SensoriumError), box
        stack.wait_replaced("connector", connector)
        with stack.client() as c:
            for _ in range(2):
                with pytest.raises(InDoubt):
                    c.invoke("test.stubborn", {"seconds": 30}, idempotency_key=key, retries=0)
        assert spawns_per_key(stack.paths).get(key) == 1
