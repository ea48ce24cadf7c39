"""One spawn per idempotency/key, on paths the random-kill suite rarely lines up:
a retry that reuses its directive after a refusal, then loses its connector."""

from __future__ import annotations

import os
import signal
import threading

from harness import TEST_ACTIONS, running_stack, spawns_per_key

from sensorium.client import InDoubt, SensoriumError

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
