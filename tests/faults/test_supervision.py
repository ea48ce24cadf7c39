"""The supervisor under kills: in-flight directives fail clearly, processes come back READY,
restart storms end in a visible `failed`, and SIGTERM leaves nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest
from harness import SENSORIUM, TEST_ACTIONS, Stack, log_events, start_stack

from sensorium.client import SensoriumError, Unavailable
from sensorium.shared.paths import StatePaths


def _invoke_in_background(
    stack: Stack, seconds: float
) -> tuple[threading.Thread, dict[str, object]]:
    box: dict[str, object] = {}

    def run() -> None:
        t0 = time.monotonic()
        try:
            with stack.client() as c:
                box["outcome"] = c.invoke("test.sleep", {"seconds": seconds})
        except SensoriumError as exc:
            box["error"] = exc
        box["elapsed"] = time.monotonic() - t0

    t = threading.Thread(target=run)
    t.start()
    return t, box


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["connector", "core"])
def test_kill_9_with_a_directive_in_flight_gives_a_clear_error_and_recovers(
    stack: Stack, victim: str
) -> None:
    thread, box = _invoke_in_background(stack, 30)
    action_pid = stack.action_pid("sleep.py")
    old = stack.pids()[victim]
    assert old is not None
    os.kill(old, signal.SIGKILL)
    thread.join(timeout=10)
    assert not thread.is_alive(), "the in-flight directive hung"
    err = box.get("error")
    assert isinstance(err, Unavailable), box
    assert err.code in ("connector-unavailable", "core-unavailable")
    assert float(box["elapsed"]) < 5  # type: ignore[arg-type]
    stack.wait_replaced(victim, old)
    # The orphaned action did not outlive its connector (the supervisor reaps it).
    if victim == "connector":
        assert (
            not psutil.pid_exists(action_pid)
            or psutil.Process(action_pid).status() == psutil.STATUS_ZOMBIE
        )
    with stack.client() as c:
        assert c.invoke("demo.system.uptime").status == "completed"
    status = {c.name: c for c in stack.status().children}
    assert status[victim].restarts == 1
    assert "SIGKILL" in (status[victim].last_exit or "")


def test_kill_9_of_the_poller_comes_back_ready(stack: Stack) -> None:
    old = stack.pids()["poller"]
    assert old
    os.kill(old, signal.SIGKILL)
    stack.wait_replaced("poller", old)


@pytest.mark.slow
def test_restart_burst_marks_failed_keeps_the_rest_and_resume_recovers(stack: Stack) -> None:
    killed: set[int] = set()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        states = {c.name: c for c in stack.status().children}
        conn = states["connector"]
        if conn.state == "failed":
            break
        if conn.pid and conn.pid not in killed:
            killed.add(conn.pid)
            os.kill(conn.pid, signal.SIGKILL)
        time.sleep(0.02)
    states = {c.name: c for c in stack.status().children}
    assert states["connector"].state == "failed", states
    assert len(killed) == 5
    assert states["core"].state == "ready" and states["poller"].state == "ready"
    res = stack.cli("status")
    assert res.returncode == 1 and "failed" in res.stdout
    res = stack.cli("resume", "connector")
    assert res.returncode == 0, res.stdout + res.stderr
    stack.wait_ready()


def test_sigterm_of_the_supervisor_leaves_no_process_behind(stack: Stack) -> None:
    thread, _box = _invoke_in_background(stack, 60)
    stack.action_pid("sleep.py")
    tree = stack.tree()
    assert len(tree) >= 4  # three children and the action
    t0 = time.monotonic()
    stack.proc.send_signal(signal.SIGTERM)
    stack.proc.wait(timeout=20)
    assert time.monotonic() - t0 < 15
    _gone, alive = psutil.wait_procs(tree, timeout=2)
    assert not alive, f"left behind: {[(p.pid, p.cmdline()) for p in alive]}"
    thread.join(timeout=10)
    assert not thread.is_alive()


def test_a_second_supervisor_on_the_same_state_is_refused(stack: Stack) -> None:
    res = subprocess.run(
        [*SENSORIUM, "up", "--state-dir", str(stack.paths.root)],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert res.returncode == 1
    assert "already runs" in res.stderr
    stack.wait_ready()


def test_status_without_a_supervisor_says_how_to_start_one(state_dir: StatePaths) -> None:
    res = subprocess.run(
        [*SENSORIUM, "status", "--state-dir", str(state_dir.root)],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert res.returncode == 3
    assert "sensorium up" in res.stdout


def test_status_shows_each_process(stack: Stack) -> None:
    res = stack.cli("status")
    assert res.returncode == 0, res.stdout
    for name in ("core", "connector", "poller"):
        assert name in res.stdout
    for child in stack.status().children:
        assert child.state == "ready" and child.pid and child.rss_bytes


def test_invalid_catalog_keeps_control_plane_up_and_says_why(state_dir: StatePaths) -> None:
    bad = dict(TEST_ACTIONS[0], action_id="Bad ID")
    s = start_stack(state_dir, [bad])
    try:
        s.wait_ready(actions=False)
        s.wait_connected()
        res = s.cli("actions")
        assert res.returncode == 1 and "no actions" in res.stdout
        logs = (state_dir.logs / "connector.jsonl").read_text()
        assert "catalog.invalid" in logs and "Bad ID" in logs
        from sensorium.client import SensoriumError

        with s.client() as c, pytest.raises(SensoriumError) as err:
            c.invoke("demo.system.uptime")
        assert err.value.code == "catalog-invalid"
    finally:
        s.stop()


@pytest.mark.slow
def test_a_hung_process_is_restarted_by_the_watchdog(state_dir: StatePaths) -> None:
    s = start_stack(state_dir, node={"supervisor": {"watchdog_s": 2}})
    try:
        s.wait_ready()
        old = s.pids()["core"]
        assert old
        os.kill(old, signal.SIGSTOP)  # alive, but its event loop no longer pings
        s.wait_replaced("core", old, timeout_s=20)
        core = {c.name: c for c in s.status().children}["core"]
        assert "watchdog" in (core.last_exit or ""), core
    finally:
        s.stop()


def test_kill_9_of_the_supervisor_takes_its_children_with_it(stack: Stack) -> None:
    _thread, _box = _invoke_in_background(stack, 60)
    stack.action_pid("sleep.py")
    tree = stack.tree()
    stack.proc.kill()
    stack.proc.wait(timeout=5)
    # Each child gets SIGTERM from the kernel (PR_SET_PDEATHSIG) and stops in its budget.
    _gone, alive = psutil.wait_procs(tree, timeout=15)
    assert not alive, f"left behind: {[(p.pid, p.cmdline()) for p in alive]}"


WEDGE_HOOK = Path(__file__).parent / "wedge"


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["core", "connector", "poller"])
def test_a_process_whose_socket_is_gone_is_restarted_by_the_watchdog(
    state_dir: StatePaths, victim: str
) -> None:
    """Alive, loop turning, but its ipc socket unlinked: clients cannot reach it. Its
    health check (a probe of its own endpoint) fails, the pings stop, it is restarted."""
    s = start_stack(state_dir, node={"supervisor": {"watchdog_s": 2}})
    try:
        s.wait_ready()
        old = s.pids()[victim]
        assert old
        (state_dir.run / f"{victim}.sock").unlink()
        s.wait_replaced(victim, old, timeout_s=60)
        child = {c.name: c for c in s.status().children}[victim]
        assert "watchdog" in (child.last_exit or ""), child
        assert (state_dir.run / f"{victim}.sock").exists()
        with s.client() as c:
            assert c.invoke("demo.system.uptime").status == "completed"
        withheld = log_events(state_dir, victim, "watchdog.ping.withheld")
        assert withheld and "is gone" in str(withheld[0]["problems"]), withheld
    finally:
        s.stop()


@pytest.mark.slow
def test_a_wedged_event_loop_is_restarted_by_the_watchdog(
    state_dir: StatePaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real wedge (tests/faults/wedge/: a signal handler that never returns, running on
    the loop's thread): the process is alive and holds its sockets, yet answers nothing."""
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(WEDGE_HOOK), os.environ.get("PYTHONPATH")]))
    )
    s = start_stack(state_dir, node={"supervisor": {"watchdog_s": 2}})
    try:
        s.wait_ready()
        old = s.pids()["core"]
        assert old
        os.kill(old, signal.SIGUSR2)
        s.wait_replaced("core", old, timeout_s=60)
        core = {c.name: c for c in s.status().children}["core"]
        assert "watchdog" in (core.last_exit or ""), core
        with s.client() as c:
            assert c.invoke("demo.system.uptime").status == "completed"
    finally:
        s.stop()


IN_FLIGHT = 100
THREADS = 10


@pytest.mark.slow
def test_an_orderly_stop_under_load_answers_every_directive_and_doubts_none(
    state_dir: StatePaths,
) -> None:
    """100 keyed directives (3 s sleeps) in flight through 10 client sockets, then SIGTERM to the
    supervisor: core stops admitting and answers each one (the connector, stopped only
    after core, still runs them), so every caller gets an outcome or a retryable refusal
    that ran nothing; none is lost, none `outcome-in-doubt`."""
    import asyncio

    from sensorium.client import AsyncClient, InDoubt

    # The drain's grace is a safety net far beyond what 100 one-second sleeps need on
    # a loaded machine: the verdict must not turn on how fast they spawn.
    node = {
        "limits": {
            "connector_max_concurrent_spawns": 128,
            "sigterm_grace_s": 150.0,
            "reply_margin_ms": 160_000,
        },
        "supervisor": {"shutdown_budget_s": 300.0},
    }
    s = start_stack(state_dir, TEST_ACTIONS, node=node)
    answers: list[tuple[str, str, object]] = []
    lock = threading.Lock()

    async def sender(n: int) -> None:
        async with AsyncClient(state_dir=str(state_dir.root)) as client:

            async def one(i: int) -> None:
                key = f"drain-{n}-{i}"
                try:
                    got: object = await client.invoke(
                        "test.sleep",
                        {"seconds": 3.0},
                        idempotency_key=key,
                        retries=0,
                        reply_timeout_s=300,
                    )
                except InDoubt as exc:
                    got = ("in-doubt", exc.code, dict(exc.detail))
                except SensoriumError as exc:
                    got = ("error", exc.code, dict(exc.detail))
                with lock:
                    answers.append((key, type(got).__name__, got))

            await asyncio.gather(*(one(i) for i in range(IN_FLIGHT // THREADS)))

    try:
        s.wait_ready()
        threads = [threading.Thread(target=asyncio.run, args=(sender(n),)) for n in range(THREADS)]
        for t in threads:
            t.start()
        # All of them in core's hands (a count, polled; the bound is only a safety net).
        deadline = time.monotonic() + 120
        # (The count seen, not asked again: the first may have ended since.)
        seen = 0
        with s.client() as c:
            while (seen := c.health().inflight) < IN_FLIGHT and time.monotonic() < deadline:
                time.sleep(0.02)
        assert seen >= IN_FLIGHT
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(timeout=600) == 0
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads)
    finally:
        s.stop()
    assert len(answers) == IN_FLIGHT, f"lost: {IN_FLIGHT - len(answers)}"
    doubted = [a for a in answers if a[1] == "tuple" and a[2][0] == "in-doubt"]  # type: ignore[index]
    assert not doubted, doubted
    others = [a for a in answers if a[1] != "Outcome"]
    # Anything but an outcome is a refusal that ran nothing, which a retry may resend.
    for _key, _kind, (_what, code, detail) in others:  # type: ignore[misc]
        assert code in ("shutting-down", "overloaded") and "in_flight" not in detail, others
    outcomes = [a[2] for a in answers if a[1] == "Outcome"]
    unfinished = [
        (
            o.directive_id,
            o.status,
            [(d.code, d.message) for d in o.diagnostics],
            o.stderr.text[-200:],
        )  # type: ignore[attr-defined]
        for o in outcomes
        if o.status != "completed"  # type: ignore[attr-defined]
    ]
    assert not unfinished, unfinished
    # The node agrees: each directive that started has its outcome recorded, and
    # nothing was left `unknown` in the audit.
    started = {e["idempotency/key"] for e in log_events(state_dir, "connector", "action.started")}
    answered = {a[0] for a in answers if a[1] == "Outcome"}
    assert {k for k in started if k and k.startswith("drain-")} <= answered
    import sqlite3

    with sqlite3.connect(state_dir.audit_db) as db:
        unknown = db.execute("SELECT count(*) FROM records WHERE kind = 'unknown'").fetchone()
        open_or_doubted = db.execute(
            "SELECT count(*) FROM dispatches WHERE settled IS NULL OR settled = 'unknown'"
        ).fetchone()
    assert unknown == (0,) and open_or_doubted == (0,), (unknown, open_or_doubted)


@pytest.mark.slow
def test_an_action_running_past_the_stop_grace_is_ended_and_answered_not_doubted(
    stack: Stack,
) -> None:
    """An orderly stop gives running actions the SIGTERM grace; one still running then
    is ended by the connector at core's request, and its caller gets a definite
    `failed` outcome that says it was interrupted — never `outcome-in-doubt`."""
    from sensorium.client import Outcome

    got: list[object] = []

    def call() -> None:
        with stack.client() as c:
            try:
                got.append(c.invoke("test.sleep", {"seconds": 55}, timeout_ms=58_000))
            except SensoriumError as exc:
                got.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    stack.action_pid("sleep.py")  # running now
    stack.proc.send_signal(signal.SIGTERM)
    assert stack.proc.wait(timeout=60) == 0
    caller.join(timeout=60)
    assert not caller.is_alive() and len(got) == 1
    (answer,) = got
    assert isinstance(answer, Outcome), answer
    assert answer.status == "failed"
    assert answer.diagnostics[0].code == "shutting-down", answer.diagnostics
    assert "interrupted" in answer.diagnostics[0].message
    # Core's interrupt kills it outright; its stderr says so (ADR-008).
    assert answer.stderr.text.endswith("process interrupted by signal SIGKILL\n"), answer.stderr
