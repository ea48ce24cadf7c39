"""The connector's job store on a real sqlite file: every transition, restart, retention."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import apsw
import msgspec
import pytest

from sensorium.connectors.os.jobs.store import (
    CANCEL_HREF,
    LOST_MESSAGE,
    Job,
    JobStore,
    NewJob,
    QueueFull,
    ack_of,
    status_of,
)
from sensorium.shared.clock import parse_rfc3339
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.store import immediate
from sensorium.shared.wire.declaration import DeferredProfile
from sensorium.shared.wire.deferred import ConnectorDeferred, DeferredOperationStatus
from sensorium.shared.wire.directive import LEGACY_ISSUER, Issuer, decode_stored, new_directive
from sensorium.shared.wire.outcome import Outcome

A, B = "instance-a", "instance-b"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    s = JobStore(tmp_path / "connectors" / "os" / "jobs.sqlite")
    try:
        yield s
    finally:
        s.close()


def new(op: str, action: str = "test.sleep", config_hash: str = "h1") -> NewJob:
    return NewJob(
        operation_id=op,
        action_id=action,
        directive_id=f"d-{op}",
        directive=msgspec.msgpack.encode({"op": op}),
        timeout_ms=3000,
        config_hash=config_hash,
        accepted_by=A,
    )


def test_store_pragmas_are_the_durable_ones(store: JobStore) -> None:
    conn = store.conn
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert repr(store).startswith("<JobStore ")


def test_submit_persists_pending_and_is_idempotent_on_the_operation_id(store: JobStore) -> None:
    job, created = store.submit(new("op1"), 100.0, max_pending=10)
    assert created and job.status == "pending" and job.open
    assert (job.created_at, job.updated_at, job.started_at, job.instance_id) == (
        100.0,
        100.0,
        None,
        None,
    )
    assert job.timeout_ms == 3000 and job.config_hash == "h1" and job.accepted_by == A
    again, created = store.submit(new("op1", action="other"), 200.0, max_pending=10)
    assert not created
    assert again == job  # the first job, untouched
    assert store.count("pending") == 1


def test_a_full_queue_refuses_and_stores_nothing(store: JobStore) -> None:
    for i in range(3):
        store.submit(new(f"op{i}"), float(i), max_pending=3)
    with pytest.raises(QueueFull) as exc:
        store.submit(new("op-late"), 9.0, max_pending=3)
    assert exc.value.pending == 3
    assert store.get("op-late") is None
    # A resubmission of an accepted id still answers, full queue or not.
    assert store.submit(new("op0"), 10.0, max_pending=3)[1] is False
    # Running jobs do not count against the waiting limit.
    assert store.claim_next(A, 11.0) is not None
    assert store.submit(new("op-late"), 12.0, max_pending=3)[1] is True


def test_claims_start_jobs_in_accepted_order(store: JobStore) -> None:
    for op, t in (("first", 5.0), ("second", 1.0), ("third", 3.0)):
        store.submit(new(op), t, max_pending=10)
    claimed = [store.claim_next(A, 20.0) for _ in range(4)]
    assert [j.operation_id if j else None for j in claimed] == ["first", "second", "third", None]
    first = claimed[0]
    assert first is not None
    assert (first.status, first.started_at, first.instance_id, first.updated_at) == (
        "running",
        20.0,
        A,
        20.0,
    )


def test_finish_is_for_the_instance_running_the_job_only(store: JobStore) -> None:
    store.submit(new("op"), 1.0, max_pending=10)
    store.claim_next(A, 2.0)
    assert not store.finish("op", B, "completed", 3.0, outcome=b"x")
    assert store.finish("op", A, "completed", 4.0, outcome=b"outcome")
    job = store.get("op")
    assert job is not None
    assert (job.status, job.outcome, job.updated_at, job.error_code) == (
        "completed",
        b"outcome",
        4.0,
        None,
    )
    # Final is final.
    assert not store.finish("op", A, "failed", 5.0)
    assert not store.cancel_pending("op", 5.0)
    with pytest.raises(ValueError):
        store.finish("op", A, "running", 5.0)


def test_a_failure_keeps_its_code_and_message(store: JobStore) -> None:
    store.submit(new("op"), 1.0, max_pending=10)
    store.claim_next(A, 2.0)
    assert store.finish("op", A, "failed", 3.0, code="parameters-invalid", message="no")
    job = store.get("op")
    assert job is not None
    assert (job.status, job.outcome, job.error_code, job.error_message) == (
        "failed",
        None,
        "parameters-invalid",
        "no",
    )


def test_cancel_pending_only_touches_jobs_that_never_started(store: JobStore) -> None:
    store.submit(new("waiting"), 1.0, max_pending=10)
    store.submit(new("started"), 2.0, max_pending=10)
    store.claim_next(A, 3.0)  # "waiting" was first
    assert not store.cancel_pending("waiting", 4.0)
    assert store.cancel_pending("started", 4.0)
    started = store.get("started")
    assert started is not None and started.status == "cancelled"
    assert store.claim_next(A, 5.0) is None  # a cancelled job never starts
    assert not store.cancel_pending("nope", 5.0)


def test_requeue_gives_a_claimed_job_back(store: JobStore) -> None:
    store.submit(new("op"), 1.0, max_pending=10)
    store.claim_next(A, 2.0)
    assert not store.requeue("op", B, 3.0)
    assert store.requeue("op", A, 3.0)
    job = store.get("op")
    assert job is not None
    assert (job.status, job.started_at, job.instance_id) == ("pending", None, None)
    again = store.claim_next(B, 4.0)
    assert again is not None and again.instance_id == B


def test_recover_ends_lost_jobs_and_requeues_or_drops_pending_ones(store: JobStore) -> None:
    store.submit(new("ran-before"), 1.0, max_pending=10)
    store.submit(new("ours"), 2.0, max_pending=10)
    store.claim_next("old-instance", 3.0)
    store.claim_next(B, 3.0)
    store.submit(new("still-good"), 4.0, max_pending=10)
    store.submit(new("stale", config_hash="h0"), 5.0, max_pending=10)
    store.submit(new("done"), 6.0, max_pending=10)
    store.cancel_pending("done", 7.0)

    found = store.recover(B, 10.0, lambda j: j.config_hash == "h1")
    assert found.lost == ["ran-before"]
    assert found.requeued == ["still-good"]
    assert found.stale == ["stale"]

    lost = store.get("ran-before")
    assert lost is not None
    assert (lost.status, lost.error_code, lost.error_message, lost.updated_at) == (
        "failed",
        RuntimeErrorCode.JOB_LOST,
        LOST_MESSAGE,
        10.0,
    )
    stale = store.get("stale")
    assert stale is not None
    assert (stale.status, stale.error_code) == ("failed", RuntimeErrorCode.CATALOG_STALE)
    ours = store.get("ours")
    assert ours is not None and ours.status == "running"  # this instance's own job
    done = store.get("done")
    assert done is not None and done.status == "cancelled" and done.updated_at == 7.0
    # Nothing open is left without an owner that will end it.
    assert [j.operation_id for j in store.list_open()] == ["ours", "still-good"]


def test_fail_running_ends_this_instances_jobs_with_a_code(store: JobStore) -> None:
    for op in ("a", "b", "c"):
        store.submit(new(op), 1.0, max_pending=10)
    store.claim_next(A, 2.0)
    store.claim_next(B, 2.0)
    assert store.fail_running(A, 3.0, RuntimeErrorCode.SHUTTING_DOWN, "stopped") == ["a"]
    statuses = {op: j.status for op in "abc" if (j := store.get(op)) is not None}
    assert statuses == {"a": "failed", "b": "running", "c": "pending"}


def test_collect_deletes_old_final_jobs_in_batches_and_never_open_ones(store: JobStore) -> None:
    for i in range(7):
        store.submit(new(f"old{i}"), 1.0, max_pending=100)
        store.cancel_pending(f"old{i}", 2.0)
    store.submit(new("old-but-open"), 1.0, max_pending=100)
    store.submit(new("young"), 1.0, max_pending=100)
    store.cancel_pending("young", 50.0)
    assert store.collect(before=10.0, batch=3) == 3
    assert store.collect(before=10.0, batch=3) == 3
    assert store.collect(before=10.0, batch=3) == 1
    assert store.collect(before=10.0, batch=3) == 0
    assert store.get("old-but-open") is not None
    assert store.get("young") is not None
    assert store.get("old0") is None


def test_reads_never_write(store: JobStore) -> None:
    store.submit(new("op"), 1.0, max_pending=10)
    changes = store.conn.total_changes()
    store.get("op")
    store.count("pending")
    store.list_open()
    assert store.conn.total_changes() == changes


def test_the_schema_refuses_a_running_job_without_its_owner(store: JobStore) -> None:
    store.submit(new("op"), 1.0, max_pending=10)
    with pytest.raises(apsw.ConstraintError), immediate(store.conn) as conn:
        conn.execute("UPDATE jobs SET status = 'running' WHERE operation_id = 'op'")
    with pytest.raises(apsw.ConstraintError), immediate(store.conn) as conn:
        conn.execute("UPDATE jobs SET status = 'expired' WHERE operation_id = 'op'")


def test_the_store_survives_reopening(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite"
    s = JobStore(path)
    s.submit(new("op"), 1.0, max_pending=10)
    s.close()
    s = JobStore(path)
    try:
        job = s.get("op")
        assert isinstance(job, Job) and job.status == "pending"
        assert "op" in repr(job)
    finally:
        s.close()


def test_the_ack_has_one_cancel_surface_and_a_fail_after_only_once_started(
    store: JobStore,
) -> None:
    profile = DeferredProfile(preferred_retry_after_seconds=7)
    waiting, _ = store.submit(new("w"), 1000.0, max_pending=10)
    ack = ack_of(waiting, profile, 5.0, 1000.0)
    assert (ack.status, ack.retry_after_seconds, ack.cancel_href) == ("pending", 7, CANCEL_HREF)
    assert ack.fail_after_seconds is msgspec.UNSET  # a waiting job's end is not known
    assert parse_rfc3339(ack.created_at) == 1000.0
    running = store.claim_next(A, 1000.0)
    assert running is not None
    # ceil(3 s timeout + 5 s grace) + 5, less what has already passed.
    assert ack_of(running, profile, 5.0, 1000.0).fail_after_seconds == 13
    assert ack_of(running, profile, 5.0, 1004.5).fail_after_seconds == 9
    assert ack_of(running, profile, 5.0, 5000.0).fail_after_seconds == 1
    # Non-cancelable: the reason instead of the link; the wire round-trips it.
    keep = DeferredProfile(cancel_unavailable_reason="it prints")
    ack = ack_of(running, keep, 5.0, 1000.0)
    assert ack.cancel_href is msgspec.UNSET and ack.cancel_unavailable_reason == "it prints"
    assert ack.retry_after_seconds is msgspec.UNSET
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(ack), type=ConnectorDeferred)
    assert wire == ack


def test_status_carries_the_outcome_or_the_coded_reason(store: JobStore) -> None:
    profile = DeferredProfile(preferred_retry_after_seconds=3)
    store.submit(new("ok"), 1.0, max_pending=10)
    store.submit(new("bad"), 1.0, max_pending=10)
    open_job = store.get("ok")
    assert open_job is not None
    st = status_of(open_job, profile)
    assert (st.status, st.retry_after_seconds, st.result, st.diagnostics) == (
        "pending",
        3,
        msgspec.UNSET,
        [],
    )
    outcome = Outcome(
        outcome_id="o1",
        directive_id="d-ok",
        action_id="test.sleep",
        status="completed",
        started_at="2026-05-05T18:00:00.000Z",
        duration_ms=12.0,
        timeout_ms=3000,
    )
    store.claim_next(A, 2.0)
    store.claim_next(A, 2.0)
    store.finish("ok", A, "completed", 3.0, outcome=msgspec.msgpack.encode(outcome))
    store.finish("bad", A, "failed", 3.0, code=RuntimeErrorCode.JOB_LOST, message="gone")
    ok, bad = store.get("ok"), store.get("bad")
    assert ok is not None and bad is not None
    st = status_of(ok, profile)
    assert st.status == "completed" and st.retry_after_seconds is msgspec.UNSET  # final: no retry
    assert st.result == msgspec.to_builtins(outcome) and st.result["outcome/id"] == "o1"
    assert parse_rfc3339(st.updated_at or "") == 3.0
    st = status_of(bad, None)
    assert st.result is msgspec.UNSET
    assert [(d.code, d.message) for d in st.diagnostics] == [(RuntimeErrorCode.JOB_LOST, "gone")]
    # (core names operations deferred:<kind>:<ulid>; the published pattern says so)
    st = msgspec.structs.replace(st, operation_id="deferred:sensorium.directive.invoke:bad")
    wire = msgspec.json.decode(msgspec.json.encode(st), type=DeferredOperationStatus)
    assert wire.terminal


def test_a_job_persisted_before_issuers_were_required_still_decodes() -> None:
    # What an earlier version stored: no issuer, no issued_at, nulls, a timeout of null.
    old = msgspec.msgpack.encode(
        {
            "schema": "sensorium-directive.v1",
            "schema/v": 1,
            "directive/id": "d-old",
            "action_id": "test.sleep",
            "parameters": {"seconds": 1},
            "timing": {"mode": "async", "timeout_ms": None, "deadline_at": None},
            "idempotency/key": None,
            "correlation/id": None,
        }
    )
    d = decode_stored(old, 3000)
    assert d.issuer.module_id == LEGACY_ISSUER and d.timing.timeout_ms == 3000
    assert d.timing.mode == "async" and d.parameters == {"seconds": 1}
    fresh = new_directive("test.sleep", issuer=Issuer(module_id="m"), timeout_ms=5)
    assert decode_stored(msgspec.msgpack.encode(fresh), 3000) == fresh
