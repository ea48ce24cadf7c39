"""The host registry's state machine, on a real SQLite file and an explicit clock.

Every transition takes ``now``; the tests pass POSIX seconds of their choosing, so
leases, expiry, retention and the poll schedule are checked without sleeping. The
"drive" tests run a small discrete-event poller over the real registry and
``polling.apply`` and prove every operation ends by its effective expiry.
"""

from __future__ import annotations

import random
from pathlib import Path

import apsw
import msgspec
import pytest

from sensorium.shared.clock import rfc3339
from sensorium.shared.config import DeferredConfig
from sensorium.shared.deferred import polling
from sensorium.shared.deferred.policy import DeferredHostPolicy
from sensorium.shared.deferred.registry import Operation, Registry, Reservation, cancel_href
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.wire.deferred import (
    ConnectorDeferred,
    DeferredOperationStatus,
    OperationStatus,
)

T0 = 1_700_000_000.0
# The default deferred.final_poll_grace_s.
GRACE_S = DeferredConfig().final_poll_grace_s
POLICY = DeferredHostPolicy(
    min_retry_s=2.0, max_retry_s=60.0, max_ttl_s=900.0, max_attempts=5, jitter=0.2
)
SHORT = DeferredHostPolicy(
    min_retry_s=1.0, max_retry_s=30.0, max_ttl_s=120.0, max_attempts=6, jitter=0.2
)
OWNER = "poller:test"
LEASE_S = 30.0
REASON = "the job sends mail; it cannot be recalled"


def reservation(i: int | str, **overrides: object) -> Reservation:
    fields: dict[str, object] = {
        "operation_id": f"deferred:sensorium.directive.invoke:{i}",
        "operation_kind": "sensorium.directive.invoke",
        "owner_module_id": "sensorium-os",
        "capability_id": "sensorium.directive.invoke",
        "directive_id": f"directive-{i}",
        "action_id": "demo.slow.job",
        "correlation_id": "run:corr",
        "idempotency_key": None,
        "deadline_at": None,
        "preferred_ttl_s": None,
        "preferred_retry_s": None,
        "cancel_unavailable_reason": None,
        "audit_outcome_ref": f"outcome:{i}",
        "confirm_within_s": 15.0,
    }
    fields.update(overrides)
    return Reservation(**fields)  # type: ignore[arg-type]


def ack(op_id: str, **overrides: object) -> ConnectorDeferred:
    fields: dict[str, object] = {
        "operation_id": op_id,
        "status": "running",
        "created_at": "2023-11-14T22:13:20Z",
        "cancel_href": f"sensorium.connector.cancel?operation/id={op_id}",
    }
    fields.update(overrides)
    if "cancel_unavailable_reason" in overrides:
        fields.pop("cancel_href")
    return ConnectorDeferred(**fields)  # type: ignore[arg-type]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "storage" / "deferred-operations.sqlite"


@pytest.fixture
def short(db: Path) -> Registry:
    """A registry whose host maximum lifetime is two minutes (the drive tests)."""
    registry = Registry(db, SHORT)
    registry.rng.seed(6)
    return registry


@pytest.fixture
def reg(db: Path) -> Registry:
    registry = Registry(db, POLICY)
    registry.rng.seed(5)
    return registry


def admitted(reg: Registry, i: int | str, now: float = T0, **ack_fields: object) -> Operation:
    op, new = reg.reserve(reservation(i), now)
    assert new
    return reg.confirm(op.operation_id, ack(op.operation_id, **ack_fields), now)


# -- reserve / confirm / withdraw ------------------------------------------------------


def test_reserve_records_an_unconfirmed_pending_operation(reg: Registry) -> None:
    op, new = reg.reserve(reservation(1, preferred_ttl_s=120.0), T0)
    assert new
    assert op.status == "pending" and not op.admitted and op.open
    assert op.created_at == op.updated_at == T0
    assert op.expires_at == T0 + 120.0
    # The poller asks the connector if core never confirms.
    assert op.next_poll_at == T0 + 15.0
    assert op.attempts == 0 and op.max_attempts == POLICY.max_attempts
    assert op.cancel_href == cancel_href(op.operation_id)
    assert op.cancel_unavailable_reason is None and op.connector_cancel is None
    assert op.audit_outcome_ref == "outcome:1"


def test_reserve_never_schedules_past_a_short_expiry(reg: Registry) -> None:
    op, _ = reg.reserve(reservation(1, deadline_at=T0 + 4.0), T0)
    assert op.expires_at == T0 + 4.0
    assert op.next_poll_at == T0 + 4.0


@pytest.mark.parametrize(
    ("retry_hint", "fail_after", "preferred", "deadline_in", "retry", "ttl"),
    [
        (1, None, None, None, 2.0, 900.0),  # below the host minimum
        (None, None, None, None, 2.0, 900.0),  # no hint: the host minimum
        (7, None, None, None, 7.0, 900.0),
        (3600, None, None, None, 60.0, 900.0),  # above the host maximum
        (5, 30, None, None, 5.0, 30.0),  # fail_after narrows the lifetime
        (5, 10_000, None, None, 5.0, 900.0),  # ... but never widens it past the host's
        (5, 300, 120.0, None, 5.0, 120.0),  # the action's preferred ttl is smaller
        (5, 300, 600.0, 45.0, 5.0, 45.0),  # the caller's deadline is smaller still
        (5, None, None, -10.0, 5.0, 0.0),  # a deadline already past: expires now
    ],
)
def test_confirm_clamps_the_ack_hints(
    reg: Registry,
    retry_hint: int | None,
    fail_after: int | None,
    preferred: float | None,
    deadline_in: float | None,
    retry: float,
    ttl: float,
) -> None:
    r = reservation(
        1,
        preferred_ttl_s=preferred,
        deadline_at=None if deadline_in is None else T0 + deadline_in,
    )
    op, _ = reg.reserve(r, T0)
    hints: dict[str, object] = {}
    if retry_hint is not None:
        hints["retry_after_seconds"] = retry_hint
    if fail_after is not None:
        hints["fail_after_seconds"] = fail_after
    now = T0 + 0.25
    op = reg.confirm(op.operation_id, ack(op.operation_id, **hints), now)
    assert op.admitted and op.status == "running"
    assert op.retry_after_s == retry
    # The lifetime counts from creation, not from the acknowledgement.
    assert op.expires_at == pytest.approx(T0 + ttl)
    assert op.next_poll_at is not None
    assert op.next_poll_at <= op.expires_at
    assert op.next_poll_at >= min(now + retry, op.expires_at)
    assert op.next_poll_at <= now + retry * (1 + POLICY.jitter) + 1e-9
    assert op.updated_at == now


def test_confirm_pending_ack_keeps_pending(reg: Registry) -> None:
    op = admitted(reg, 1, status="pending", retry_after_seconds=3)
    assert op.status == "pending" and op.admitted


def test_confirm_with_a_final_ack_polls_at_once(reg: Registry) -> None:
    op, _ = reg.reserve(reservation(1), T0)
    op = reg.confirm(op.operation_id, ack(op.operation_id, status="completed"), T0 + 1)
    # The result is fetched by a poll, right away.
    assert op.status == "running" and op.next_poll_at == T0 + 1


def test_confirm_with_cancel_unavailable_reason_is_not_cancelable(reg: Registry) -> None:
    op = admitted(reg, 1, cancel_unavailable_reason=REASON)
    assert op.cancel_href is None
    assert op.cancel_unavailable_reason == REASON


def test_reservation_with_unavailable_reason_is_not_cancelable(reg: Registry) -> None:
    op, _ = reg.reserve(reservation(1, cancel_unavailable_reason=REASON), T0)
    assert op.cancel_href is None and op.cancel_unavailable_reason == REASON


def test_confirm_is_once(reg: Registry) -> None:
    op = admitted(reg, 1, retry_after_seconds=5)
    again = reg.confirm(op.operation_id, ack(op.operation_id, retry_after_seconds=50), T0 + 9)
    assert again == op
    with pytest.raises(CodedError) as info:
        reg.confirm("deferred:nope", ack("deferred:nope"), T0)
    assert info.value.code == RuntimeErrorCode.OPERATION_UNKNOWN


def test_confirm_after_a_poll_found_the_result_changes_nothing(reg: Registry) -> None:
    op, _ = reg.reserve(reservation(1), T0)
    done = reg.settle(op.operation_id, "completed", b"\x80", None, None, T0 + 1)
    assert done.changed
    after = reg.confirm(op.operation_id, ack(op.operation_id), T0 + 2)
    assert after.status == "completed" and after.next_poll_at is None


def test_idempotency_key_returns_the_first_row(reg: Registry) -> None:
    first, new = reg.reserve(reservation(1, idempotency_key="idem:1"), T0)
    assert new
    second, new2 = reg.reserve(reservation(2, idempotency_key="idem:1"), T0 + 5)
    assert not new2
    assert second == first
    assert reg.get(reservation(2).operation_id) is None
    assert reg.by_idempotency_key("idem:1") == first
    assert reg.counts() == {"pending": 1}


def test_withdraw_only_an_unconfirmed_reservation(reg: Registry) -> None:
    op, _ = reg.reserve(reservation(1), T0)
    assert reg.withdraw(op.operation_id)
    assert reg.get(op.operation_id) is None
    assert not reg.withdraw(op.operation_id)
    confirmed = admitted(reg, 2)
    assert not reg.withdraw(confirmed.operation_id)
    assert reg.get(confirmed.operation_id) == confirmed


# -- claims and leases ----------------------------------------------------------------


def _due(reg: Registry, n: int, module: str = "sensorium-os", start: int = 0) -> list[str]:
    ids = []
    with reg.batch():
        for i in range(start, start + n):
            op, _ = reg.reserve(
                reservation(f"{module}-{i}", owner_module_id=module), T0 + i * 0.001
            )
            ids.append(op.operation_id)
    return ids


def test_claim_due_takes_only_what_is_due_in_order(reg: Registry) -> None:
    ids = _due(reg, 10)
    assert reg.claim_due(OWNER, T0 + 14.0, LEASE_S, 100, 100) == []
    claimed = reg.claim_due(OWNER, T0 + 15.0 + 0.0035, LEASE_S, 3, 100)
    assert [o.operation_id for o in claimed] == ids[:3]
    for o in claimed:
        row = reg.require(o.operation_id)
        assert row.lease_owner == OWNER and row.lease_until == T0 + 15.0035 + LEASE_S


def test_claim_due_respects_leases_and_reclaims_lapsed_ones(reg: Registry) -> None:
    ids = _due(reg, 4)
    now = T0 + 20.0
    a = reg.claim_due("poller:a", now, LEASE_S, 100, 100)
    assert len(a) == 4
    # Held: another poller gets nothing, now or just before the lease ends.
    assert reg.claim_due("poller:b", now, LEASE_S, 100, 100) == []
    assert reg.claim_due("poller:b", now + LEASE_S - 0.001, LEASE_S, 100, 100) == []
    # Poller a died: at lease_until its claims are b's.
    b = reg.claim_due("poller:b", now + LEASE_S, LEASE_S, 100, 100)
    assert sorted(o.operation_id for o in b) == sorted(ids)
    # The dead poller's late answer is not recorded; the live one's is.
    late = reg.record_open(ids[0], "poller:a", "running", 5, now + LEASE_S + 1)
    assert not late.changed and late.operation.attempts == 0
    live = reg.record_open(ids[0], "poller:b", "running", 5, now + LEASE_S + 1)
    assert live.changed and live.operation.attempts == 1
    assert live.operation.lease_owner is None and live.operation.lease_until is None


def test_claim_due_limit_and_per_module_limit(reg: Registry) -> None:
    a = _due(reg, 5, "mod-a")
    b = _due(reg, 5, "mod-b", start=100)
    now = T0 + 20.0
    first = reg.claim_due("poller:1", now, LEASE_S, 10, 2)
    assert sorted(o.operation_id for o in first) == sorted(a[:2] + b[:2])
    # Leases held by another poller count against the module's limit.
    assert reg.claim_due("poller:2", now, LEASE_S, 10, 2) == []
    reg.record_open(a[0], "poller:1", "running", None, now)
    again = reg.claim_due("poller:2", now, LEASE_S, 10, 2)
    assert [o.operation_id for o in again] == [a[2]]
    assert reg.claim_due("poller:2", now, LEASE_S, 0, 2) == []


def test_a_saturated_module_does_not_starve_another(reg: Registry) -> None:
    _due(reg, 100, "mod-busy")
    other, _ = reg.reserve(reservation("late", owner_module_id="mod-quiet"), T0 + 1.0)
    claimed = reg.claim_due(OWNER, T0 + 20.0, LEASE_S, 4, 1)
    assert other.operation_id in {o.operation_id for o in claimed}


def test_next_due_accounts_for_leases(reg: Registry) -> None:
    assert reg.next_due() is None
    (op_id,) = _due(reg, 1)
    assert reg.next_due() == T0 + 15.0
    reg.claim_due(OWNER, T0 + 16.0, LEASE_S, 1, 1)
    assert reg.next_due() == T0 + 16.0 + LEASE_S
    reg.settle(op_id, "completed", None, None, None, T0 + 17.0)
    assert reg.next_due() is None


# -- record_open / record_busy / expire --------------------------------------------------


def test_record_open_counts_attempts_and_schedules_by_policy(reg: Registry) -> None:
    op = admitted(reg, 1)
    now = T0 + 3.0
    s = reg.record_open(op.operation_id, None, "running", 5, now)
    assert s.changed
    after = s.operation
    assert after.attempts == 1 and after.status == "running" and after.retry_after_s == 5.0
    assert after.next_poll_at is not None
    assert now + 5.0 <= after.next_poll_at <= now + 6.0
    assert after.updated_at == now
    # A huge hint is clamped; pending is recorded as pending.
    s = reg.record_open(op.operation_id, None, "pending", 10_000, now + 10)
    assert s.operation.retry_after_s == 60.0 and s.operation.status == "pending"
    assert s.operation.next_poll_at is not None
    assert now + 70.0 <= s.operation.next_poll_at <= now + 10 + 72.0


def test_record_open_never_schedules_past_expiry(reg: Registry) -> None:
    op = admitted(reg, 1, fail_after_seconds=10)
    s = reg.record_open(op.operation_id, None, "running", 60, T0 + 5)
    assert s.operation.next_poll_at == op.expires_at == T0 + 10


def test_max_attempts_times_out_and_owes_a_cancel(reg: Registry) -> None:
    op = admitted(reg, 1)
    for n in range(1, POLICY.max_attempts):
        s = reg.record_open(op.operation_id, None, "running", None, T0 + n * 10)
        assert s.changed and s.operation.open and s.operation.attempts == n
    s = reg.record_open(op.operation_id, None, "running", None, T0 + 100)
    after = s.operation
    assert s.changed and after.status == "timed-out"
    assert after.attempts == POLICY.max_attempts
    assert after.last_code == "poll-attempts-exhausted"  # the seed's code, verbatim
    assert after.connector_cancel == "owed"
    assert after.next_poll_at is None and after.lease_owner is None
    assert [o.operation_id for o in reg.owed_cancels(10)] == [op.operation_id]
    # Nothing more is recorded on a terminal operation.
    assert not reg.record_open(op.operation_id, None, "running", None, T0 + 200).changed


def test_max_attempts_on_a_non_cancelable_operation_owes_nothing(reg: Registry) -> None:
    op = admitted(reg, 1, cancel_unavailable_reason=REASON)
    for n in range(POLICY.max_attempts):
        reg.record_open(op.operation_id, None, "running", None, T0 + n)
    after = reg.require(op.operation_id)
    assert after.status == "timed-out" and after.connector_cancel is None
    assert reg.owed_cancels(10) == []


def test_record_busy_is_not_an_attempt(reg: Registry) -> None:
    op = admitted(reg, 1)
    for n in range(3 * POLICY.max_attempts):
        now = T0 + n
        s = reg.record_busy(op.operation_id, None, "overloaded", "core is busy", 4.0, now)
        assert s.changed
        after = s.operation
        assert after.attempts == 0 and after.status == "running" and after.open
        assert after.last_code == "overloaded" and after.last_diagnostic == "core is busy"
        assert after.next_poll_at is not None
        assert now + 4.0 <= after.next_poll_at <= now + 4.8
    # A busy answer with no hint waits the host minimum.
    s = reg.record_busy(op.operation_id, None, "connector-unavailable", "down", None, T0 + 50)
    assert s.operation.next_poll_at is not None
    assert T0 + 52.0 <= s.operation.next_poll_at <= T0 + 52.4


def test_expire_only_at_or_after_expiry(reg: Registry) -> None:
    op = admitted(reg, 1, fail_after_seconds=30)
    assert op.expires_at == T0 + 30
    early = reg.expire(op.operation_id, T0 + 29.999)
    assert not early.changed and early.operation.open
    s = reg.expire(op.operation_id, T0 + 30)
    assert s.changed
    assert s.operation.status == "expired"
    assert s.operation.last_code == RuntimeErrorCode.OPERATION_EXPIRED
    assert s.operation.connector_cancel == "owed"
    assert s.operation.updated_at == T0 + 30
    assert not reg.expire(op.operation_id, T0 + 31).changed


# -- the whole life, on a simulated clock ------------------------------------------------

_BUSY = CodedError(RuntimeErrorCode.OVERLOADED, "core is busy", retry_after_ms=3000)


def _populate(reg: Registry, rng: random.Random, n: int) -> dict[str, str]:
    """``n`` admitted operations with mixed hints; each gets a connector behaviour."""
    behaviours: dict[str, str] = {}
    with reg.batch():
        for i in range(n):
            created = T0 + rng.uniform(0, 5)
            r = reservation(
                i,
                preferred_ttl_s=rng.choice([None, rng.uniform(3, 200)]),
                deadline_at=rng.choice([None, created + rng.uniform(-1, 300)]),
                owner_module_id=rng.choice(["mod-a", "mod-b", "mod-c"]),
            )
            op, _ = reg.reserve(r, created)
            hints: dict[str, object] = {}
            if rng.random() < 0.7:
                hints["retry_after_seconds"] = rng.randint(1, 90)
            if rng.random() < 0.5:
                hints["fail_after_seconds"] = rng.randint(1, 2000)
            if rng.random() < 0.2:
                hints["cancel_unavailable_reason"] = REASON
            reg.confirm(op.operation_id, ack(op.operation_id, **hints), created + 0.01)
            behaviours[op.operation_id] = rng.choice(
                ["forever", "forever", "busy", "complete", "fail", "unknown", "flaky"]
            )
    return behaviours


def _answer(
    behaviour: str, op: Operation, rng: random.Random
) -> DeferredOperationStatus | CodedError:
    hint = rng.choice([rng.randint(1, 8), rng.randint(1, 120)])
    if behaviour == "busy" or (behaviour == "flaky" and rng.random() < 0.5):
        return _BUSY
    if behaviour in ("complete", "fail", "unknown") and op.attempts >= 2:
        final: dict[str, OperationStatus] = {
            "complete": "completed",
            "fail": "failed",
            "unknown": "unknown",
        }
        return DeferredOperationStatus(
            operation_id=op.operation_id,
            status=final[behaviour],
            updated_at=rfc3339(),
            result={"n": op.attempts},
        )
    return DeferredOperationStatus(
        operation_id=op.operation_id,
        status="running",
        updated_at=rfc3339(),
        retry_after_seconds=hint,
    )


def _other_connection(db: Path) -> apsw.Connection:
    """A second connection to the registry's file. apsw, like the registry: two SQLite
    libraries in one process break each other's POSIX locks (sqlite.org/howtocorrupt)."""
    conn = apsw.Connection(str(db))
    conn.set_busy_timeout(5000)
    return conn


# The latest an operation may end: a final poll unanswered through the grace, then
# one more retry interval.
LATEST_S = GRACE_S + SHORT.max_retry_s * (1 + SHORT.jitter)


def _no_poll_past_expiry(db: Path) -> None:
    """No poll is scheduled past an operation's expiry, except the retried final poll
    of one whose poll at expiry got no answer (it carries that note), and that one
    no later than the grace allows."""
    conn = _other_connection(db)
    try:
        bad = conn.execute(
            "SELECT count(*) FROM operations WHERE next_poll_at > expires_at AND "
            "(last_code IS NULL OR next_poll_at > expires_at + ?)",
            (LATEST_S,),
        ).fetchone()
    finally:
        conn.close()
    assert bad == (0,)


def _ended_in_time(op: Operation, expires: float, behaviour: str, slack: float = 0.0) -> None:
    """An operation whose connector always answers ends by its expiry (``expired`` at
    it exactly, after the final poll said still open); one whose polls may go
    unanswered is given the final poll's grace, and is ``expired`` unheard only past it."""
    assert not op.open and op.next_poll_at is None, op
    answers_always = behaviour not in ("busy", "flaky")
    if answers_always:
        assert op.updated_at <= expires + slack, (op.operation_id, op.status)
        if op.status == "expired":
            assert expires <= op.updated_at <= expires + slack
    else:
        assert op.updated_at <= expires + LATEST_S + slack, (op.operation_id, op.status)
        if op.status == "expired" and "no answer" in (op.last_diagnostic or ""):
            assert op.updated_at >= expires + GRACE_S


def test_every_operation_ends_by_its_expiry_event_driven(short: Registry, db: Path) -> None:
    """A punctual poller (the clock jumps to the next due time): each operation reaches
    a terminal status no later than its effective ``expires_at``."""
    reg, rng = short, random.Random(11)
    behaviours = _populate(reg, rng, 60)
    expiry = {i: reg.require(i).expires_at for i in behaviours}
    steps = 0
    while (now := reg.next_due()) is not None:
        steps += 1
        assert steps < 5000, "the registry kept scheduling polls"
        claims = reg.claim_due(OWNER, now, LEASE_S, 1000, 1000)
        assert claims, now
        with reg.batch():
            for op in claims:
                assert op.next_poll_at is not None and op.next_poll_at <= now
                polling.apply(
                    reg, op, OWNER, _answer(behaviours[op.operation_id], op, rng), now, GRACE_S
                )
        if steps % 50 == 0:
            _no_poll_past_expiry(db)
    _no_poll_past_expiry(db)
    statuses: set[str] = set()
    for op_id, expires in expiry.items():
        op = reg.require(op_id)
        statuses.add(op.status)
        _ended_in_time(op, expires, behaviours[op_id])
        assert op.attempts <= op.max_attempts
    assert {"expired", "timed-out", "completed", "failed", "unknown"} <= statuses, statuses


def test_every_operation_ends_by_its_expiry_with_a_ticking_poller(
    short: Registry, db: Path
) -> None:
    """A poller that wakes every 250 ms: every operation is over by expiry plus one tick
    (plus the final poll's grace for one whose polls went unanswered)."""
    reg, rng = short, random.Random(12)
    behaviours = _populate(reg, rng, 300)
    expiry = {i: reg.require(i).expires_at for i in behaviours}
    tick, now = 0.25, T0
    while reg.next_due() is not None:
        now += tick
        assert now < T0 + 200 + LATEST_S, "operations outlived the host maximum ttl"
        claims = reg.claim_due(OWNER, now, LEASE_S, 1000, 1000)
        if not claims:
            continue
        with reg.batch():
            for op in claims:
                polling.apply(
                    reg, op, OWNER, _answer(behaviours[op.operation_id], op, rng), now, GRACE_S
                )
        _no_poll_past_expiry(db)
    for op_id, expires in expiry.items():
        _ended_in_time(reg.require(op_id), expires, behaviours[op_id], slack=tick)


def test_a_thousand_operations_confirmed_at_once_are_spread(reg: Registry) -> None:
    with reg.batch():
        for i in range(1000):
            op, _ = reg.reserve(reservation(i), T0)
            reg.confirm(op.operation_id, ack(op.operation_id, retry_after_seconds=2), T0)
    dues = [o.next_poll_at for o in reg.recent(1000) if o.next_poll_at is not None]
    assert len(dues) == 1000
    assert all(T0 + 2.0 <= t <= T0 + 2.4 for t in dues)
    bins = [0] * 8
    for t in dues:
        bins[min(7, int((t - T0 - 2.0) / 0.05))] += 1
    assert all(70 <= b <= 180 for b in bins), bins


# -- cancel ----------------------------------------------------------------------------


def test_cancel_a_pending_reservation(reg: Registry) -> None:
    op, _ = reg.reserve(reservation(1), T0)
    s = reg.cancel(op.operation_id, T0 + 1)
    assert s.changed and s.operation.status == "cancelled"
    assert s.operation.connector_cancel == "owed" and s.operation.next_poll_at is None


def test_cancel_a_running_operation(reg: Registry) -> None:
    op = admitted(reg, 1)
    reg.record_open(op.operation_id, None, "running", None, T0 + 2)
    s = reg.cancel(op.operation_id, T0 + 3)
    assert s.changed and s.operation.status == "cancelled"
    assert s.operation.connector_cancel == "owed"
    assert s.operation.attempts == 1
    assert [o.operation_id for o in reg.owed_cancels(5)] == [op.operation_id]


def test_cancel_a_non_cancelable_operation_is_refused(reg: Registry) -> None:
    op = admitted(reg, 1, cancel_unavailable_reason=REASON)
    with pytest.raises(CodedError) as info:
        reg.cancel(op.operation_id, T0 + 1)
    assert info.value.code == "operation-not-cancelable"
    assert REASON in info.value.message
    assert reg.require(op.operation_id) == op


def test_cancel_a_terminal_operation_changes_nothing(reg: Registry) -> None:
    op = admitted(reg, 1)
    done = reg.settle(op.operation_id, "completed", b"\xa2ok", None, None, T0 + 1).operation
    s = reg.cancel(op.operation_id, T0 + 2)
    assert not s.changed and s.operation == done
    assert done.connector_cancel is None


def test_cancel_unknown_operation(reg: Registry) -> None:
    with pytest.raises(CodedError) as info:
        reg.cancel("deferred:missing", T0)
    assert info.value.code == RuntimeErrorCode.OPERATION_UNKNOWN


def test_cancel_delivered(reg: Registry) -> None:
    op = admitted(reg, 1)
    reg.cancel(op.operation_id, T0 + 1)
    reg.cancel_delivered(op.operation_id, "the job had already ended completed")
    after = reg.require(op.operation_id)
    assert after.connector_cancel == "sent"
    assert after.last_diagnostic == "the job had already ended completed"
    assert reg.owed_cancels(5) == []
    # Delivered twice, or for an operation that owed none: nothing changes.
    reg.cancel_delivered(op.operation_id, "again")
    assert reg.require(op.operation_id) == after
    other = admitted(reg, 2)
    reg.cancel_delivered(other.operation_id)
    assert reg.require(other.operation_id) == other


def test_poke_makes_an_open_operation_due_now(reg: Registry) -> None:
    op = admitted(reg, 1, retry_after_seconds=60)
    poked = reg.poke(op.operation_id, T0 + 1)
    assert poked.next_poll_at == T0 + 1 and poked.attempts == 0
    done = reg.settle(op.operation_id, "failed", None, "action-failed", "exit 1", T0 + 2)
    assert reg.poke(op.operation_id, T0 + 3) == done.operation


# -- settle ----------------------------------------------------------------------------


def test_settle_is_once(reg: Registry) -> None:
    op = admitted(reg, 1)
    first = reg.settle(op.operation_id, "completed", b"\x01", None, None, T0 + 1)
    assert first.changed and first.operation.status == "completed"
    assert first.operation.result == b"\x01" and first.operation.connector_cancel is None
    second = reg.settle(op.operation_id, "failed", b"\x02", "x", "y", T0 + 2)
    assert not second.changed
    assert second.operation == first.operation


def test_settle_completed_keeps_no_owed_cancel(reg: Registry) -> None:
    op = admitted(reg, 1)
    for status in ("completed", "failed", "unknown"):
        fresh = admitted(reg, f"{status}-x")
        s = reg.settle(fresh.operation_id, status, None, None, None, T0 + 1)
        assert s.operation.connector_cancel is None, status
    s = reg.settle(op.operation_id, "timed-out", None, None, None, T0 + 1)
    assert s.operation.connector_cancel == "owed"


# -- retention -------------------------------------------------------------------------


RETENTION = 72 * 3600.0


def test_collect_deletes_only_old_terminal_rows_in_bounded_batches(reg: Registry) -> None:
    old = [admitted(reg, f"old-{i}").operation_id for i in range(25)]
    with reg.batch():
        for op_id in old:
            reg.settle(op_id, "completed", None, None, None, T0 + 10)
    recent = admitted(reg, "recent").operation_id
    reg.settle(recent, "failed", None, None, None, T0 + RETENTION)
    open_old = admitted(reg, "open-old").operation_id  # open, untouched since T0
    owed = admitted(reg, "owed").operation_id
    reg.cancel(owed, T0 + 10)
    sent = admitted(reg, "sent").operation_id
    reg.cancel(sent, T0 + 10)
    reg.cancel_delivered(sent)

    now = T0 + RETENTION + 100
    # Reads never delete, however old the rows.
    before = reg.counts()
    for op_id in [*old, recent, open_old, owed, sent]:
        reg.get(op_id)
        reg.require(op_id)
    reg.recent(1000)
    reg.recent(1000, open_only=True)
    reg.owed_cancels(100)
    reg.next_due()
    reg.by_idempotency_key("nope")
    assert reg.counts() == before

    assert reg.collect(now, RETENTION, 10) == 10
    assert reg.collect(now, RETENTION, 10) == 10
    assert reg.collect(now, RETENTION, 10) == 6  # 5 old + the delivered cancel
    assert reg.collect(now, RETENTION, 10) == 0
    assert all(reg.get(i) is None for i in old)
    assert reg.get(sent) is None
    assert reg.get(recent) is not None  # inside the retention
    assert reg.get(open_old) is not None and reg.require(open_old).open  # never open ones
    assert reg.require(owed).connector_cancel == "owed"  # never an owed cancel
    assert reg.collect(T0 + 10 * RETENTION, RETENTION, 10) == 1  # only `recent` was due
    assert reg.get(open_old) is not None and reg.get(owed) is not None


# -- batch -----------------------------------------------------------------------------


def _status_seen_elsewhere(db: Path, op_id: str) -> str:
    """The committed status, read through a second connection."""
    conn = _other_connection(db)
    try:
        row = conn.execute(
            "SELECT status FROM operations WHERE operation_id = ?", (op_id,)
        ).fetchone()
    finally:
        conn.close()
    assert row is not None
    return str(row[0])


def test_batch_is_one_transaction(reg: Registry, db: Path) -> None:
    a, b = admitted(reg, "a").operation_id, admitted(reg, "b").operation_id
    with reg.batch():
        assert reg.settle(a, "completed", None, None, None, T0 + 1).changed
        assert reg.record_open(b, None, "running", None, T0 + 1).changed
        # Inside the batch each transition still sees the ones before it ...
        assert not reg.settle(a, "failed", None, None, None, T0 + 1).changed
        # ... and no other connection sees any of them yet.
        assert _status_seen_elsewhere(db, a) == "running"
    assert _status_seen_elsewhere(db, a) == "completed"
    assert reg.require(b).attempts == 1


def test_a_failing_transition_inside_a_batch_does_not_break_the_others(reg: Registry) -> None:
    a = admitted(reg, "a").operation_id
    stuck = admitted(reg, "stuck", cancel_unavailable_reason=REASON)
    c = admitted(reg, "c").operation_id
    with reg.batch():
        reg.settle(a, "completed", None, None, None, T0 + 1)
        with pytest.raises(CodedError):
            reg.cancel(stuck.operation_id, T0 + 1)
        with pytest.raises(CodedError):
            reg.settle("deferred:collected-meanwhile", "completed", None, None, None, T0 + 1)
        reg.record_busy(c, None, "overloaded", "busy", None, T0 + 1)
    assert reg.require(a).status == "completed"
    assert reg.require(stuck.operation_id) == stuck
    assert reg.require(c).last_code == "overloaded"
    # The registry is usable afterwards (no transaction left open).
    assert reg.settle(c, "completed", None, None, None, T0 + 2).changed


def test_an_exception_escaping_a_batch_rolls_it_all_back(reg: Registry) -> None:
    a = admitted(reg, "a")
    with pytest.raises(RuntimeError), reg.batch():
        reg.settle(a.operation_id, "completed", None, None, None, T0 + 1)
        raise RuntimeError("the recorder crashed")
    assert reg.require(a.operation_id) == a
    assert reg.settle(a.operation_id, "completed", None, None, None, T0 + 2).changed


def test_batch_of_reserves(reg: Registry) -> None:
    with reg.batch():
        for i in range(100):
            reg.reserve(reservation(i), T0)
    assert reg.counts() == {"pending": 100}


# -- the table's own constraints (SQL level) -------------------------------------------

_INSERT = (
    "INSERT INTO operations (operation_id, operation_kind, owner_module_id, capability_id, "
    "directive_id, action_id, status, admitted, created_at, updated_at, expires_at, "
    "retry_after_s, next_poll_at, max_attempts, cancel_href, cancel_unavailable_reason) "
    "VALUES (?, 'k', 'm', 'c', 'd', 'a.b', ?, 1, 0, 0, 100, 1, ?, 5, ?, ?)"
)


@pytest.mark.parametrize(
    ("status", "next_poll_at", "href", "reason"),
    [
        ("running", 5.0, "sensorium.operation.cancel?x", "cannot"),  # both surfaces
        ("running", 5.0, None, None),  # neither
        ("completed", None, "h", "r"),
        ("running", None, "h", None),  # open but nothing scheduled
        ("completed", 5.0, "h", None),  # terminal but still scheduled
        ("deferred", 5.0, "h", None),  # not a status
    ],
)
def test_table_constraints(
    reg: Registry,
    db: Path,
    status: str,
    next_poll_at: float | None,
    href: str | None,
    reason: str | None,
) -> None:
    conn = _other_connection(db)
    try:
        conn.execute(_INSERT, ("ok", "running", 5.0, "h", None))
        with pytest.raises(apsw.ConstraintError, match="CHECK constraint failed"):
            conn.execute(_INSERT, ("bad", status, next_poll_at, href, reason))
    finally:
        conn.close()
    assert reg.get("ok") is not None and reg.get("bad") is None


@pytest.mark.parametrize(
    "assignment",
    [
        "cancel_unavailable_reason = 'nope'",  # a cancelable row gains a reason: both
        "cancel_href = NULL",  # neither
        "connector_cancel = 'maybe'",
        "admitted = 2",
    ],
)
def test_table_constraints_on_update(reg: Registry, db: Path, assignment: str) -> None:
    op = admitted(reg, 1)
    conn = _other_connection(db)
    try:
        with pytest.raises(apsw.ConstraintError, match="constraint failed"):
            conn.execute(
                f"UPDATE operations SET {assignment} WHERE operation_id = ?", (op.operation_id,)
            )
    finally:
        conn.close()
    assert reg.require(op.operation_id) == op


def test_result_blob_round_trips(reg: Registry) -> None:
    op = admitted(reg, 1)
    body = msgspec.msgpack.encode({"status": "completed", "result": {"json": {"n": 1}}})
    reg.settle(op.operation_id, "completed", body, None, None, T0 + 1)
    assert reg.require(op.operation_id).result == body


def test_a_transition_failing_inside_a_batch_leaves_nothing_of_itself(reg: Registry) -> None:
    from sensorium.shared.wire.continuation import Caller, Continuation, ResumePoint

    def continuation(op_id: str) -> Continuation:
        return Continuation(
            continuation_id="continuation:same",
            workflow_run_id="run:1",
            step_id="s",
            deferred_operation_id=op_id,
            resume_point=ResumePoint(
                template_id="t", step_index=0, step_id="s", output_binding="o"
            ),
            caller=Caller(module_id="m"),
            capability_id="sensorium.directive.invoke",
        )

    reg.flows.start("run:1", "t", b"{}", {}, "surface-to-caller", "core:x", T0, 60.0)
    first = reservation(1)
    reg.reserve(first, T0, continuation(first.operation_id))
    second = reservation(2)
    # The operation row is inserted, then the continuation's insert fails.
    with reg.batch(), pytest.raises(apsw.ConstraintError):
        reg.reserve(second, T0, continuation(second.operation_id))
    assert reg.get(second.operation_id) is None
