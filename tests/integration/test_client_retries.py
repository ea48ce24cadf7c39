"""The retrying client against a real node: it outlasts a node that is not up yet, and a
retry after kill -9 mid-directive answers the first attempt's fate, never a second spawn."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest
from harness import TEST_ACTIONS, Stack, log_events, spawns_per_key, start_stack

from sensorium.client import Client, InDoubt, Outcome, SensoriumError
from sensorium.shared.clock import parse_rfc3339
from sensorium.shared.paths import StatePaths


def test_a_client_started_before_the_node_gets_its_answer_once_core_is_up(
    state_dir: StatePaths,
) -> None:
    box: dict[str, Any] = {}

    def call() -> None:
        with Client(state_dir=str(state_dir.root)) as client:
            try:
                box["outcome"] = client.invoke(
                    "test.echo-args", {"value": "early"}, retries=6, reply_timeout_s=20
                )
            except SensoriumError as exc:
                box["error"] = exc

    thread = threading.Thread(target=call)
    thread.start()
    time.sleep(0.5)  # the first attempts find nobody
    stack = start_stack(state_dir, TEST_ACTIONS)
    try:
        thread.join(60)
        assert not thread.is_alive()
        assert "error" not in box, box
        outcome = box["outcome"]
        assert outcome.status == "completed" and "early" in outcome.stdout.text
        started = log_events(state_dir, "connector", "action.started")
        mine = [e for e in started if e.get("directive/id") == outcome.directive_id]
        assert len(mine) == 1 and mine[0].get("idempotency/key")  # the client made one up
    finally:
        stack.stop()


@pytest.mark.parametrize("victim", ["connector", "core"])
def test_a_retry_after_kill_9_mid_directive_never_spawns_twice(stack: Stack, victim: str) -> None:
    box: dict[str, Any] = {}
    key = f"k-kill-{victim}"

    def call() -> None:
        with stack.client() as client:
            try:
                box["answer"] = client.invoke(
                    "test.sleep", {"seconds": 1.5}, idempotency_key=key, retries=6
                )
            except SensoriumError as exc:
                box["answer"] = exc

    thread = threading.Thread(target=call)
    thread.start()
    stack.action_pid("sleep.py")
    old = stack.pids()[victim]
    assert old is not None
    killed_at = time.time()
    os.kill(old, signal.SIGKILL)
    thread.join(60)
    assert not thread.is_alive(), "the retrying call hung"
    answer = box["answer"]
    if isinstance(answer, Outcome):
        # The first attempt's outcome (core rejoined the connector's attempt), never a
        # fresh run started after the kill.
        assert parse_rfc3339(answer.started_at) < killed_at, answer
    else:
        assert isinstance(answer, InDoubt), answer
        assert answer.code == "outcome-in-doubt"
    if victim == "connector":
        assert isinstance(answer, InDoubt), "the action died with its connector"
    stack.wait_ready()
    assert spawns_per_key(stack.paths).get(key) == 1
    with stack.client() as client:  # a later retry under the key gives the same answer
        try:
            again: Any = client.invoke("test.sleep", {"seconds": 1.5}, idempotency_key=key)
        except SensoriumError as exc:
            again = exc
    assert type(again) is type(answer)
    assert spawns_per_key(stack.paths).get(key) == 1
