"""Deferred operations under kill -9: no operation lost, none resumed twice, none stuck.

Each test kills one process of a real node at the worst moment it can arrange and
then checks the registry, the connector's job store and the flows against each other.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import apsw
import pytest
from harness import Stack, deferrable_sleep, log_events, python_action, running_stack

from sensorium.client import SensoriumError

ACTIONS: list[dict[str, Any]] = [
    deferrable_sleep("test.defer.sleep"),
    python_action(
        "test.echo-args", "echo_args.py", ["--", "{{value}}"], {"value": {"type": "string"}}
    ),
]
NODE = {"deferred": {"min_retry_s": 0.2, "connector_max_running_jobs": 16}}
OPEN = ("pending", "running")


@pytest.fixture
def node() -> Iterator[Stack]:
    with running_stack(ACTIONS, node=NODE) as s:
        yield s


def _rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READONLY) as conn:
        conn.set_busy_timeout(5000)
        return list(conn.execute(sql).fetchall())


def _registry(node: Stack) -> dict[str, str]:
    return dict(_rows(node.paths.registry_db, "SELECT operation_id, status FROM operations"))


def _jobs(node: Stack) -> dict[str, str]:
    return dict(_rows(node.paths.connector_jobs_db, "SELECT operation_id, status FROM jobs"))


def _settled(node: Stack, within_s: float) -> dict[str, str]:
    """The registry once no operation is open (or what it is at the deadline)."""
    deadline = time.monotonic() + within_s
    while True:
        ops = _registry(node)
        if all(s not in OPEN for s in ops.values()) or time.monotonic() > deadline:
            return ops
        time.sleep(0.2)


def _kill(node: Stack, name: str) -> None:
    old = node.pids()[name]
    assert old is not None
    os.kill(old, signal.SIGKILL)
    node.wait_replaced(name, old)


FLOW = {
    "steps": [
        {
            "step_id": "wait",
            "action_id": "test.defer.sleep",
            "parameters": {"seconds": {"$eval": "seconds"}},
            "output_binding": "slept",
            "mode": "async",
        },
        {
            "step_id": "after",
            "action_id": "test.echo-args",
            "parameters": {"value": "${tag}"},
            "output_binding": "after",
        },
    ]
}


def _evidence(node: Stack) -> str:
    """Every operation as the registry and the connector's job store see it: id, status,
    attempts, the last note, the lease, when it ended and expires (seconds after it was
    created), and the job's status; then the attempt notes (the history of polls that
    got no answer). A failed assertion prints all of it."""
    ops = _rows(
        node.paths.registry_db,
        "SELECT operation_id, status, attempts, last_code, lease_owner, "
        "round(updated_at - created_at, 2), round(expires_at - created_at, 2) "
        "FROM operations ORDER BY created_at",
    )
    jobs = _jobs(node)
    lines = [
        f"{op} registry={st} attempts={n} last_code={code} lease={lease} "
        f"ended_after={ended}s expires_after={exp}s job={jobs.get(op, '-')}"
        for op, st, n, code, lease, ended, exp in ops
    ]
    notes = _rows(
        node.paths.registry_db,
        "SELECT operation_id, attempt, code FROM attempt_notes ORDER BY operation_id, at",
    )
    lines += [f"  note {op} after attempt {n}: {code}" for op, n, code in notes]
    return "\n" + "\n".join(lines)


@pytest.mark.slow
def test_kill_9_poller_mid_poll_loses_nothing_and_resumes_once(node: Stack) -> None:
    flows = []
    with node.client() as c:
        for i in range(6):
            flows.append(c.run_flow(FLOW, {"seconds": 1.0 + i * 0.3, "tag": f"tag-{i}"}))
        ops = [c.invoke("test.defer.sleep", {"seconds": 1.5}, mode="async") for _ in range(6)]
    for _ in range(3):  # the poller dies with polls claimed and in flight
        time.sleep(0.4)
        _kill(node, "poller")
    final = _settled(node, 60)
    evidence = _evidence(node)
    # Lost: an operation the registry no longer has, or one still open. Late is fine;
    # an end other than completed (expired with a completed job) is not.
    lost = [o.operation_id for o in ops if final.get(o.operation_id) is None]
    assert not lost, f"lost {lost}:{evidence}"
    assert all(s not in OPEN for s in final.values()), f"still open:{evidence}"
    assert all(final[o.operation_id] == "completed" for o in ops), evidence
    assert all(s == "completed" for s in final.values()), evidence
    # The completed jobs' status carries no stale note of a poll that got no answer.
    stale = _rows(
        node.paths.registry_db,
        "SELECT operation_id, last_code FROM operations WHERE status = 'completed' "
        "AND last_code IS NOT NULL",
    )
    assert not stale, f"stale notes {stale}:{evidence}"
    with node.client() as c:
        for i, f in enumerate(flows):
            done = c.wait_flow(f.flow_id, 30)
            assert done.state == "completed", (done.diagnostics, evidence)
            assert done.context["after"]["stdout"]["text"].strip() == f'["--", "tag-{i}"]'

    # Resumed exactly once: one consumed continuation per flow, one run of each next step.
    resumed = _rows(
        node.paths.registry_db,
        "SELECT count(*), count(resumed_at) FROM continuations",
    )[0]
    assert resumed == (6, 6), f"continuations (all, resumed) {resumed}:{evidence}"
    runs = _rows(
        node.paths.audit_db,
        "SELECT idempotency_key, count(*) FROM records WHERE kind = 'outcome' AND "
        "idempotency_key LIKE 'flow:%:1' GROUP BY idempotency_key",
    )
    assert len(runs) == 6 and all(n == 1 for _k, n in runs), f"{runs}:{evidence}"


def _poller_connected(node: Stack, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while not any(
        e.get("client") == "core" for e in log_events(node.paths, "poller", "rpc.peer.connected")
    ):
        assert time.monotonic() < deadline, "the poller never connected to core"
        time.sleep(0.05)


def _wait_leased(node: Stack, op_ids: list[str], within_s: float) -> str | None:
    """The lease owner once every one of ``op_ids`` still open is claimed by one poller;
    None when none is open any more (core settles a job's end itself as soon as the
    connector tells it, which on a slow machine can be before core was stopped)."""
    deadline = time.monotonic() + within_s
    while True:
        rows = _rows(
            node.paths.registry_db, "SELECT operation_id, lease_owner, status FROM operations"
        )
        owners = {owner for op, owner, status in rows if op in op_ids and status in OPEN}
        if not owners:
            return None
        if len(owners) == 1 and None not in owners:
            return str(owners.pop())
        assert time.monotonic() < deadline, f"never all leased: {rows}"
        time.sleep(0.05)


@pytest.mark.slow
def test_a_killed_pollers_leases_are_taken_over_at_once_and_nothing_completed_expires(
    node: Stack,
) -> None:
    """The poller dies holding leases (core is stopped, so its polls hang) on operations
    whose expiry (8 s) comes long before the leases' ``lease_s`` (30 s). Its restart
    must take the leases over at once; an operation whose job completed must end
    ``completed``, never ``expired`` unpolled."""
    core = node.pids()["core"]
    poller = node.pids()["poller"]
    connector = node.pids()["connector"]
    assert core is not None and poller is not None and connector is not None
    # A poller still connecting when core is stopped could not even send its polls
    # (they would fail at once, leases released): start from a connected one.
    _poller_connected(node, 20)
    # Ordered by signals, not by timing: the poller cannot poll (and so end) the
    # operations before core is stopped, and the connector, stopped before core, cannot
    # tell core that a job ended (core would settle it at once, mid-write when stopped),
    # however slow or fast this machine is.
    os.kill(poller, signal.SIGSTOP)
    try:
        deadline = datetime.now(UTC) + timedelta(seconds=8)
        with node.client() as c:
            ops = [
                c.invoke("test.defer.sleep", {"seconds": 0.5}, mode="async", deadline_at=deadline)
                for _ in range(4)
            ]
        os.kill(connector, signal.SIGSTOP)
        os.kill(core, signal.SIGSTOP)
    finally:
        os.kill(poller, signal.SIGCONT)
    ids = [o.operation_id for o in ops]
    try:
        owner = _wait_leased(node, ids, 20)
        if owner is not None:
            os.kill(poller, signal.SIGKILL)
    finally:
        os.kill(core, signal.SIGCONT)
        os.kill(connector, signal.SIGCONT)
    if owner is not None:
        node.wait_replaced("poller", poller)
    final = _settled(node, 60)
    evidence = f"\nkilled poller's leases: {owner}" + _evidence(node)
    assert all(final.get(i) == "completed" for i in ids), evidence


@pytest.mark.slow
def test_a_status_read_past_expiry_polls_the_connector_before_expiring(node: Stack) -> None:
    """With the poller frozen, nobody polls: an operation whose job completed long
    before its expiry is read after it. The read polls the connector one final time
    and records ``completed``; it never ends the operation ``expired`` unpolled."""
    poller = node.pids()["poller"]
    assert poller is not None
    os.kill(poller, signal.SIGSTOP)
    try:
        deadline = datetime.now(UTC) + timedelta(seconds=3)
        with node.client() as c:
            op = c.invoke("test.defer.sleep", {"seconds": 0.2}, mode="async", deadline_at=deadline)
            while _jobs(node).get(op.operation_id) != "completed":
                time.sleep(0.05)
            while datetime.now(UTC) < deadline + timedelta(seconds=0.5):
                time.sleep(0.1)
            seen = c.status(op)
        evidence = _evidence(node)
    finally:
        os.kill(poller, signal.SIGCONT)
    assert seen.status == "completed", (seen, evidence)
    assert _registry(node)[op.operation_id] == "completed", evidence


@pytest.mark.slow
def test_kill_9_core_mid_admission_leaves_no_orphan_and_nothing_stuck(node: Stack) -> None:
    errors: list[str] = []
    accepted: list[str] = []

    def submit() -> None:
        with node.client() as c:
            for _ in range(40):
                try:
                    op = c.invoke("test.defer.sleep", {"seconds": 0.2}, mode="async")
                    accepted.append(op.operation_id)
                except SensoriumError as exc:
                    errors.append(exc.code)
                    if exc.code == "core-unavailable":
                        return

    thread = threading.Thread(target=submit)
    thread.start()
    # Killed once admissions are under way (the first acknowledged), whatever the speed.
    deadline = time.monotonic() + 60
    while not accepted and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    _kill(node, "core")
    thread.join(timeout=60)
    assert accepted, "no directive was accepted before the kill"
    final = _settled(node, 60)
    # Every acknowledged operation is registered and ended; none is left open.
    assert all(final.get(op) == "completed" for op in accepted), final
    assert all(s not in OPEN for s in final.values()), final
    # No job runs unregistered: whatever the connector accepted, the registry knows.
    assert set(_jobs(node)) <= set(final)
    # Polls that went unanswered while core was down are history (attempt notes), not
    # part of a completed operation's status.
    stale = _rows(
        node.paths.registry_db,
        "SELECT operation_id, last_code FROM operations WHERE status = 'completed' "
        "AND last_code IS NOT NULL",
    )
    assert not stale, f"stale notes {stale}:{_evidence(node)}"


@pytest.mark.slow
def test_kill_9_connector_mid_job_reports_the_job_lost(node: Stack) -> None:
    with node.client() as c:
        op = c.invoke("test.defer.sleep", {"seconds": 20.5}, mode="async")
    node.action_pid("20.5")
    _kill(node, "connector")
    with node.client() as c:
        final = c.wait(op, 30)
    assert final.status == "failed"
    assert final.diagnostics and final.diagnostics[0].code == "job-lost"
    assert _jobs(node)[op.operation_id] == "failed"
