"""Failure paths found by review: each once let something outlive, double-run or vanish."""

from __future__ import annotations

import os
import signal
import time

import apsw
import pytest
from harness import TEST_ACTIONS, Stack, gone, none_running, program, start_stack

from sensorium.shared.paths import StatePaths


@pytest.mark.slow
def test_an_action_ignoring_sigterm_dies_with_a_killed_supervisor(stack: Stack) -> None:
    import threading

    def run() -> None:
        try:
            with stack.client() as c:
                c.invoke("test.stubborn", {"seconds": 300}, timeout_ms=60_000)
        except Exception:
            pass

    threading.Thread(target=run, daemon=True).start()
    pid = stack.action_pid("stubborn.py")
    stack.proc.kill()
    assert gone(pid, 15), "the SIGTERM-ignoring action outlived its supervisor"


def test_a_grandchild_that_escapes_its_session_is_swept(state_dir: StatePaths) -> None:
    s = start_stack(state_dir, TEST_ACTIONS, node={"supervisor": {"sample_interval_s": 0.5}})
    try:
        s.wait_ready()
        with s.client() as c:
            out = c.invoke("test.escape")
        assert out.status == "completed"
        # Its pid is one of its own namespace; its command line finds it out here.
        assert none_running(program("escape.py"), 5), "the escaped grandchild survived"
    finally:
        s.stop()


@pytest.mark.slow
def test_a_watchdog_kill_never_hits_the_restarted_process(state_dir: StatePaths) -> None:
    s = start_stack(state_dir, TEST_ACTIONS, node={"supervisor": {"watchdog_s": 2}})
    try:
        s.wait_ready()
        old = s.pids()["poller"]
        assert old
        os.kill(old, signal.SIGSTOP)
        new = s.wait_replaced("poller", old, timeout_s=20)
        time.sleep(2.0)  # past the SIGKILL follow-up that was meant for the old one
        assert s.pids()["poller"] == new
        poller = {c.name: c for c in s.status().children}["poller"]
        assert poller.restarts == 1 and poller.state == "ready"
    finally:
        s.stop()


def test_a_retry_with_the_same_idempotency_key_never_spawns_twice(stack: Stack) -> None:
    with stack.client() as c:
        first = c.invoke("test.sleep", {"seconds": 0}, idempotency_key="k-1")
        again = c.invoke("test.sleep", {"seconds": 0}, idempotency_key="k-1")
        other = c.invoke("test.sleep", {"seconds": 0}, idempotency_key="k-2")
    assert again.outcome_id == first.outcome_id
    assert again.stdout.text == first.stdout.text  # the same pid: one spawn
    assert other.outcome_id != first.outcome_id


def test_concurrent_retries_join_the_attempt_in_flight(stack: Stack) -> None:
    import asyncio

    from sensorium.client import AsyncClient

    async def main() -> None:
        async with AsyncClient(state_dir=str(stack.paths.root)) as c:
            outs = await asyncio.gather(
                *(
                    c.invoke("test.sleep", {"seconds": 1}, idempotency_key="k-join")
                    for _ in range(5)
                )
            )
            assert all(not isinstance(o, BaseException) for o in outs), outs
            assert len({o.outcome_id for o in outs}) == 1

    asyncio.run(main())


def test_an_idempotency_key_reused_for_another_action_is_refused(stack: Stack) -> None:
    from sensorium.client import SensoriumError

    with stack.client() as c:
        c.invoke("demo.system.uptime", idempotency_key="k-3")
        with pytest.raises(SensoriumError) as err:
            c.invoke("test.sleep", {"seconds": 0}, idempotency_key="k-3")
    assert err.value.code == "idempotency-conflict"


@pytest.mark.slow
def test_a_directive_cut_off_by_shutdown_is_audited_not_forgotten(stack: Stack) -> None:
    import threading

    from sensorium.client import SensoriumError

    box: dict[str, object] = {}

    def run() -> None:
        try:
            with stack.client() as c:
                box["out"] = c.invoke("test.stubborn", {"seconds": 60}, timeout_ms=60_000)
        except SensoriumError as exc:
            box["err"] = exc

    t = threading.Thread(target=run)
    t.start()
    stack.action_pid("stubborn.py")
    stack.proc.send_signal(signal.SIGTERM)
    stack.proc.wait(timeout=30)
    t.join(10)
    assert "err" in box or "out" in box
    db = apsw.Connection(str(stack.paths.audit_db), flags=apsw.SQLITE_OPEN_READONLY)
    kinds = {
        r[0] for r in db.execute("SELECT kind FROM records WHERE action_id = ?", ("test.stubborn",))
    }
    assert kinds & {"outcome", "unknown"}, kinds
