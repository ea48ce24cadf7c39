"""What a killed poller and a late poll leave behind, on the real registry and an
explicit clock: leases of a dead poller are released at once, no operation ends
``expired`` while its job holds a terminal result, and a poll that got no answer is
history in the attempt notes, never part of the final status."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import apsw
import pytest

from sensorium.shared.clock import rfc3339
from sensorium.shared.config import DeferredConfig
from sensorium.shared.deferred import leases, polling
from sensorium.shared.deferred.policy import DeferredHostPolicy
from sensorium.shared.deferred.records import SCHEMA, VERSION
from sensorium.shared.deferred.registry import Operation, Registry, Reservation
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.wire.deferred import ConnectorDeferred, DeferredOperationStatus

T0 = 1_700_000_000.0
# The default deferred.final_poll_grace_s.
GRACE_S = DeferredConfig().final_poll_grace_s
POLICY = DeferredHostPolicy(
    min_retry_s=2.0, max_retry_s=60.0, max_ttl_s=900.0, max_attempts=5, jitter=0.2
)
LEASE_S = 30.0
UNAVAILABLE = CodedError(RuntimeErrorCode.CONNECTOR_UNAVAILABLE, "the connector is down")


def reservation(i: int | str) -> Reservation:
    return Reservation(
        operation_id=f"deferred:sensorium.directive.invoke:{i}",
        operation_kind="sensorium.directive.invoke",
        owner_module_id="sensorium-os",
        capability_id="sensorium.directive.invoke",
        directive_id=f"directive-{i}",
        action_id="demo.slow.job",
        correlation_id=None,
        idempotency_key=None,
        deadline_at=None,
        preferred_ttl_s=None,
        preferred_retry_s=None,
        cancel_unavailable_reason=None,
        audit_outcome_ref=f"outcome:{i}",
        confirm_within_s=15.0,
    )


def ack(op_id: str, **hints: float) -> ConnectorDeferred:
    return ConnectorDeferred(
        operation_id=op_id,
        status="running",
        created_at="2023-11-14T22:13:20Z",
        cancel_href=f"sensorium.connector.cancel?operation/id={op_id}",
        **hints,  # type: ignore[arg-type]
    )


def admitted(reg: Registry, i: int | str, **hints: float) -> Operation:
    op, new = reg.reserve(reservation(i), T0)
    assert new
    return reg.confirm(op.operation_id, ack(op.operation_id, **hints), T0)


@pytest.fixture
def reg(tmp_path: Path) -> Registry:
    registry = Registry(tmp_path / "storage" / "deferred-operations.sqlite", POLICY)
    registry.rng.seed(5)
    return registry


def _status(op_id: str, status: str) -> DeferredOperationStatus:
    return DeferredOperationStatus(
        operation_id=op_id,
        status=status,  # type: ignore[arg-type]
        updated_at=rfc3339(),
        result={"done": status},
    )


def _dead_owner() -> str:
    """The lease owner a poller process had, once that process has exited."""
    code = (
        "from sensorium.shared.deferred.leases import owner_of; print(owner_of('poller', 'gone'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


# -- leases of a dead poller -----------------------------------------------------------


def test_owner_names_the_process_and_only_a_gone_one_is_dead() -> None:
    me = leases.owner_of("poller", "me")
    assert me.startswith(f"poller:me@{os.getpid()}:")
    assert leases.alive(me)
    assert not leases.alive(_dead_owner())
    # pid 1 runs, but not the process that started at tick 0: its pid was reused.
    assert not leases.alive("poller:x@1:0")
    # An owner that names no process is never judged dead; its lease lapses in time.
    assert leases.alive("poller:test") and leases.alive("ops-cli")


def test_a_killed_pollers_leases_are_released_at_once_not_after_lease_s(reg: Registry) -> None:
    op = admitted(reg, 1)
    now = op.next_poll_at or T0
    dead, me = _dead_owner(), leases.owner_of("poller", "me")
    assert [o.operation_id for o in reg.claim_due(dead, now, LEASE_S, 10, 10)] == [op.operation_id]
    # Before: the claim is held until lease_until, whoever asks.
    assert reg.claim_due(me, now + 1, LEASE_S, 10, 10) == []
    assert reg.release_dead_leases(me) == [dead]
    claimed = reg.claim_due(me, now + 1, LEASE_S, 10, 10)
    assert [o.operation_id for o in claimed] == [op.operation_id]
    assert reg.require(op.operation_id).lease_owner == me
    # The dead poller's answer, should it still be recorded, changes nothing.
    assert not reg.record_open(op.operation_id, dead, "running", None, now + 2).changed


def test_live_and_unnamed_owners_keep_their_leases(reg: Registry) -> None:
    a, b = admitted(reg, "a"), admitted(reg, "b")
    now = max(a.next_poll_at or T0, b.next_poll_at or T0)
    other_live = leases.owner_of("poller", "other")  # this process: alive
    reg.claim_due(other_live, now, LEASE_S, 1, 10)
    reg.claim_due("poller:legacy", now, LEASE_S, 1, 10)
    assert reg.release_dead_leases(leases.owner_of("poller", "me")) == []
    assert {reg.require(a.operation_id).lease_owner, reg.require(b.operation_id).lease_owner} == {
        other_live,
        "poller:legacy",
    }


# -- the final poll: never expired while the job holds a result ---------------------------


def test_a_job_completed_before_a_late_final_poll_ends_completed_not_expired(
    reg: Registry,
) -> None:
    op = admitted(reg, 1, fail_after_seconds=20)
    late = op.expires_at + 12.0  # the poll came late (its poller was killed)
    s = polling.apply(reg, op, None, _status(op.operation_id, "completed"), late, GRACE_S)
    assert s.changed and s.operation.status == "completed", s.operation
    assert s.operation.last_code is None


def test_a_final_poll_that_finds_the_job_open_expires_it(reg: Registry) -> None:
    op = admitted(reg, 1, fail_after_seconds=20)
    s = polling.apply(
        reg, op, None, _status(op.operation_id, "running"), op.expires_at + 1, GRACE_S
    )
    assert s.changed and s.operation.status == "expired"
    assert s.operation.last_code == RuntimeErrorCode.OPERATION_EXPIRED


def test_an_unanswered_final_poll_waits_out_its_grace_before_expiring(reg: Registry) -> None:
    op = admitted(reg, 1, fail_after_seconds=20)
    at = op.expires_at + 1
    s = polling.apply(reg, op, None, UNAVAILABLE, at, GRACE_S)
    after = s.operation
    assert after.open, "expired without a final poll that was answered"
    assert after.next_poll_at is not None and after.next_poll_at >= at + POLICY.min_retry_s
    # The connector comes back within the grace: its terminal result is recorded.
    back = polling.apply(reg, after, None, _status(op.operation_id, "completed"), at + 5, GRACE_S)
    assert back.operation.status == "completed" and back.operation.last_code is None
    # One that never answers is expired once the grace has passed, saying so.
    other = admitted(reg, 2, fail_after_seconds=20)
    end = other.expires_at + GRACE_S
    gone = polling.apply(reg, other, None, UNAVAILABLE, end, GRACE_S)
    assert gone.operation.status == "expired"
    assert "final poll got no answer" in (gone.operation.last_diagnostic or "")


# -- stale notes ---------------------------------------------------------------------


def test_an_unanswered_poll_is_history_not_the_final_status(reg: Registry) -> None:
    op = admitted(reg, 1)
    busy = reg.record_busy(op.operation_id, None, "core-unavailable", "core is down", None, T0 + 2)
    # While open, the note says why the operation is not moving.
    assert busy.operation.last_code == "core-unavailable"
    polled = reg.record_open(op.operation_id, None, "running", None, T0 + 5)
    assert polled.operation.last_code is None and polled.operation.last_diagnostic is None
    reg.record_busy(op.operation_id, None, "connector-unavailable", "down", None, T0 + 8)
    done = reg.settle(op.operation_id, "completed", b"\x80", None, None, T0 + 9).operation
    assert done.status == "completed"
    assert done.last_code is None and done.last_diagnostic is None
    notes = reg.notes(op.operation_id)
    assert [(n.attempt, n.code) for n in notes] == [
        (0, "core-unavailable"),
        (1, "connector-unavailable"),
    ]
    # A terminal answer's own diagnostic is kept.
    other = admitted(reg, 2)
    reg.record_busy(other.operation_id, None, "overloaded", "busy", None, T0 + 2)
    failed = reg.settle(other.operation_id, "failed", None, "action-failed", "exit 3", T0 + 3)
    assert (failed.operation.last_code, failed.operation.last_diagnostic) == (
        "action-failed",
        "exit 3",
    )


def test_attempt_notes_are_bounded_and_collected_with_their_operation(reg: Registry) -> None:
    op = admitted(reg, 1)
    for i in range(50):
        reg.record_busy(op.operation_id, None, "overloaded", f"busy {i}", None, T0 + 1 + i * 0.01)
    notes = reg.notes(op.operation_id)
    assert len(notes) == 20 and notes[-1].message == "busy 49"
    reg.settle(op.operation_id, "completed", None, None, None, T0 + 2)
    assert reg.collect(T0 + 2 + 86_400 * 3, 86_400, 100) >= 1
    assert reg.notes(op.operation_id) == []


def test_a_version_2_registry_is_upgraded_in_place(tmp_path: Path) -> None:
    db = tmp_path / "storage" / "deferred-operations.sqlite"
    db.parent.mkdir(parents=True)
    old_schema = SCHEMA.split("CREATE TABLE IF NOT EXISTS attempt_notes")[0]
    with apsw.Connection(str(db)) as conn:
        conn.execute(old_schema)
        conn.execute("PRAGMA user_version=2")
    first = Registry(db, POLICY)
    op, _ = first.reserve(reservation(1), T0)
    first.confirm(op.operation_id, ack(op.operation_id), T0)
    first.close()
    with apsw.Connection(str(db)) as conn:
        conn.execute("DROP TABLE attempt_notes")
        # ...and what version 4 added (who asked, the parameters' digest).
        conn.execute("DROP INDEX operations_caller")
        conn.execute("ALTER TABLE operations DROP COLUMN caller_key")
        conn.execute("ALTER TABLE operations DROP COLUMN params_digest")
        conn.execute("ALTER TABLE flows DROP COLUMN caller_key")
        conn.execute("PRAGMA user_version=2")
    again = Registry(db, POLICY)
    assert again.require(op.operation_id).status == "running"  # kept, not rebuilt
    again.record_busy(op.operation_id, None, "overloaded", "busy", None, T0 + 1)
    assert len(again.notes(op.operation_id)) == 1
    with apsw.Connection(str(db)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (VERSION,)
