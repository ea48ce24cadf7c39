"""A connector told to stop signals its running actions at once (issue 18 item 6,
ADR-008): SIGTERM now, SIGKILL after the short ``limits.stop_grace_s``; each caller is
answered with the action's outcome (failed, interrupted), whose stderr ends with the
seed's ``process interrupted by signal SIG…``, and nothing of the action is left.

Bounded by events (the answer arrives, the process is gone), with generous limits
that only catch a hang.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import pytest
from harness import TEST_ACTIONS, Stack, gone, ignoring_sigterm, none_running, running_stack

from sensorium.client import Outcome, SensoriumError

HANG_S = 60


@pytest.fixture(scope="module")
def node() -> Iterator[Stack]:
    with running_stack(TEST_ACTIONS) as s:
        yield s


def _stop_connector_while(node: Stack, action: str, script: str) -> tuple[object, int]:
    """Start ``action`` (sleeping long), SIGTERM the connector once it runs; the answer
    its caller got and the action's host pid."""
    got: list[object] = []

    def call() -> None:
        with node.client() as c:
            try:
                got.append(c.invoke(action, {"seconds": 55}, timeout_ms=58_000))
            except SensoriumError as exc:
                got.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    pid = node.action_pid(script)
    if script == "stubborn.py":
        ignoring_sigterm(pid, HANG_S)
    connector = node.pids()["connector"]
    assert connector is not None
    os.kill(connector, signal.SIGTERM)
    caller.join(timeout=HANG_S)
    assert not caller.is_alive() and len(got) == 1
    node.wait_replaced("connector", connector, timeout_s=HANG_S)
    return got[0], pid


@pytest.mark.parametrize(
    ("action", "script", "signame"),
    [("test.sleep", "sleep.py", "SIGTERM"), ("test.stubborn", "stubborn.py", "SIGKILL")],
)
def test_a_stopping_connector_ends_its_actions_at_once_and_answers_them(
    node: Stack, action: str, script: str, signame: str
) -> None:
    answer, pid = _stop_connector_while(node, action, script)
    assert isinstance(answer, Outcome), answer
    assert answer.status == "failed"
    assert answer.diagnostics[0].code == "shutting-down", answer.diagnostics
    assert "interrupted" in answer.diagnostics[0].message
    # The seed's annotation, naming the signal that ended it: SIGTERM for one that
    # obeys it, SIGKILL (after the stop grace) for one that ignores it.
    assert answer.stderr.text.endswith(f"process interrupted by signal {signame}\n"), (
        answer.stderr.text
    )
    assert gone(pid, HANG_S)
    assert none_running(script, HANG_S)
