"""``DeferredHostPolicy``: the seed-055 clamp formulas, checked on an explicit clock.

The oracle below is the seed's text transcribed verbatim; the policy must agree with
it on every hand-picked case and on a seeded random sweep. Jitter is checked for its
bounds (never early, never past ``retry·(1+jitter)``, never past expiry) and for what
it is for: a thousand operations deferred in one instant must not poll in lockstep.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from sensorium.shared.config import DeferredConfig
from sensorium.shared.deferred.policy import DeferredHostPolicy, clamp, min_present, whole_seconds

NOW = 1_700_000_000.0
HOST_MIN, HOST_MAX, HOST_MAX_TTL, JITTER = 1.0, 60.0, 900.0, 0.2
POLICY = DeferredHostPolicy(HOST_MIN, HOST_MAX, HOST_MAX_TTL, max_attempts=600, jitter=JITTER)


# -- the seed's formulas, verbatim (seed 055 §5, DESIGN §7) ----------------------------


def seed_effective_retry_after(
    connector_retry_after: float, host_min: float, host_max: float
) -> float:
    # effective_retry_after = clamp(connector_retry_after, host_min, host_max)
    return max(host_min, min(connector_retry_after, host_max))


def seed_effective_expires_at(
    now: float,
    connector_fail_after: float | None,
    action_preferred_max_ttl: float | None,
    caller_deadline_at: float | None,
    host_max_ttl: float,
) -> float:
    caller_deadline_remaining = None if caller_deadline_at is None else caller_deadline_at - now
    # effective_requested_ttl =
    #   min_present(connector_fail_after, action_preferred_max_ttl, caller_deadline_remaining)
    present = [
        v
        for v in (connector_fail_after, action_preferred_max_ttl, caller_deadline_remaining)
        if v is not None
    ]
    effective_requested_ttl = min(present) if present else None
    # effective_expires_at = now + min(effective_requested_ttl, host_max_ttl)
    if effective_requested_ttl is None:
        return now + host_max_ttl
    # a deadline already past leaves nothing: the operation expires now, never before it
    return now + max(0.0, min(effective_requested_ttl, host_max_ttl))


# -- clamp and min_present ------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "low", "high", "expected"),
    [
        (0.5, 1.0, 60.0, 1.0),
        (1.0, 1.0, 60.0, 1.0),
        (30.0, 1.0, 60.0, 30.0),
        (60.0, 1.0, 60.0, 60.0),
        (61.0, 1.0, 60.0, 60.0),
        (1e9, 1.0, 60.0, 60.0),
        (-5.0, 1.0, 60.0, 1.0),
        (0.0, 0.0, 0.0, 0.0),
        (7.0, 7.0, 7.0, 7.0),
    ],
)
def test_clamp(value: float, low: float, high: float, expected: float) -> None:
    assert clamp(value, low, high) == expected


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ((), None),
        ((None,), None),
        ((None, None, None), None),
        ((5.0, None, None), 5.0),
        ((None, 5.0, None), 5.0),
        ((None, None, 5.0), 5.0),
        ((3.0, None, 7.0), 3.0),
        ((9.0, 2.0, 7.0), 2.0),
        ((None, 8.0, 4.0), 4.0),
        # zero is present, not missing: a falsy check would drop it
        ((0.0, None, 7.0), 0.0),
        ((None, 0.0), 0.0),
        ((-1.0, 5.0), -1.0),
    ],
)
def test_min_present(values: tuple[float | None, ...], expected: float | None) -> None:
    assert min_present(*values) == expected


# -- effective_retry_after ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("hint", "expected"),
    [
        (None, HOST_MIN),  # no hint: the host minimum
        (0.0, HOST_MIN),
        (0.2, HOST_MIN),
        (1.0, 1.0),
        (1.5, 1.5),
        (15.0, 15.0),
        (60.0, 60.0),
        (60.001, HOST_MAX),
        (3600.0, HOST_MAX),
        (1e12, HOST_MAX),
    ],
)
def test_retry_after_is_clamped(hint: float | None, expected: float) -> None:
    assert POLICY.retry_after(hint) == expected
    if hint is not None:
        assert POLICY.retry_after(hint) == seed_effective_retry_after(hint, HOST_MIN, HOST_MAX)


def test_retry_after_with_a_higher_host_minimum() -> None:
    policy = DeferredHostPolicy(5.0, 30.0, 600.0, 10, 0.0)
    assert policy.retry_after(1.0) == 5.0
    assert policy.retry_after(None) == 5.0
    assert policy.retry_after(29.0) == 29.0
    assert policy.retry_after(31.0) == 30.0


# -- effective_expires_at -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fail_after", "preferred", "deadline_in", "expected_ttl"),
    [
        # nothing given: the host maximum (15 min)
        (None, None, None, 900.0),
        # each hint alone
        (30.0, None, None, 30.0),
        (None, 120.0, None, 120.0),
        (None, None, 45.0, 45.0),
        # hints above the host maximum are cut to it
        (10_000.0, None, None, 900.0),
        (None, 86_400.0, None, 900.0),
        (None, None, 7200.0, 900.0),
        (901.0, 5000.0, 3600.0, 900.0),
        # the smallest present hint wins
        (300.0, 120.0, None, 120.0),
        (60.0, 120.0, None, 60.0),
        (None, 600.0, 300.0, 300.0),
        (300.0, None, 50.0, 50.0),
        (300.0, 600.0, 5000.0, 300.0),
        # the caller's deadline is an upper bound on a longer connector/action hint
        (10_000.0, 10_000.0, 42.0, 42.0),
        # a deadline at now or already past: the operation expires now
        (300.0, None, 0.0, 0.0),
        (None, None, -1.0, 0.0),
        (300.0, 600.0, -3600.0, 0.0),
        # a short hint under a long deadline
        (5.0, None, 600.0, 5.0),
    ],
)
def test_expires_at(
    fail_after: float | None,
    preferred: float | None,
    deadline_in: float | None,
    expected_ttl: float,
) -> None:
    deadline = None if deadline_in is None else NOW + deadline_in
    got = POLICY.expires_at(NOW, fail_after, preferred, deadline)
    assert got == pytest.approx(NOW + expected_ttl, abs=1e-6)
    assert got == pytest.approx(
        seed_effective_expires_at(NOW, fail_after, preferred, deadline, HOST_MAX_TTL), abs=1e-6
    )
    assert NOW <= got <= NOW + HOST_MAX_TTL


def test_expires_at_agrees_with_the_seed_on_a_random_sweep() -> None:
    rng = random.Random(55)

    def maybe(low: float, high: float) -> float | None:
        return None if rng.random() < 0.35 else rng.uniform(low, high)

    for _ in range(5000):
        now = NOW + rng.uniform(0, 1e6)
        max_ttl = rng.choice([60.0, 900.0, 3600.0])
        policy = DeferredHostPolicy(1.0, 60.0, max_ttl, 600, 0.2)
        fail_after, preferred = maybe(0, 10_000), maybe(0, 10_000)
        deadline_in = maybe(-1000, 10_000)
        deadline = None if deadline_in is None else now + deadline_in
        got = policy.expires_at(now, fail_after, preferred, deadline)
        want = seed_effective_expires_at(now, fail_after, preferred, deadline, max_ttl)
        assert got == pytest.approx(want, abs=1e-6), (fail_after, preferred, deadline_in)
        assert now <= got <= now + max_ttl
        hint = maybe(-10, 1000)
        retry = policy.retry_after(hint)
        assert 1.0 <= retry <= 60.0
        if hint is not None:
            assert retry == seed_effective_retry_after(hint, 1.0, 60.0)


def test_requested_ttl_is_min_present() -> None:
    assert POLICY.requested_ttl(None, None, None) is None
    assert POLICY.requested_ttl(30.0, None, 10.0) == 10.0
    assert POLICY.requested_ttl(None, 600.0, None) == 600.0


# -- next_poll_at -------------------------------------------------------------------------


def test_next_poll_at_stays_inside_its_window() -> None:
    rng = random.Random(7)
    for _ in range(20_000):
        now = NOW + rng.uniform(0, 1e5)
        retry = POLICY.retry_after(rng.uniform(0, 120))
        expires = now + rng.choice([rng.uniform(0, 5), rng.uniform(0, 900), 900.0])
        at = POLICY.next_poll_at(now, retry, expires, rng)
        # never before the clamped interval (unless expiry comes first), never after
        # interval·(1+jitter), never past expiry
        assert at >= min(now + retry, expires)
        assert at <= now + retry * (1 + JITTER) + 1e-9
        assert at <= expires


def test_next_poll_at_with_the_default_rng() -> None:
    for _ in range(2000):
        at = POLICY.next_poll_at(NOW, 10.0, NOW + 900)
        assert NOW + 10.0 <= at <= NOW + 12.0


def test_next_poll_at_is_capped_at_expiry() -> None:
    rng = random.Random(1)
    assert POLICY.next_poll_at(NOW, 60.0, NOW + 5.0, rng) == NOW + 5.0
    # already expired: due now-ish (at expiry), so expiry is handled on time
    assert POLICY.next_poll_at(NOW, 60.0, NOW - 1.0, rng) == NOW - 1.0


def test_zero_jitter_polls_exactly_at_the_interval() -> None:
    policy = DeferredHostPolicy(1.0, 60.0, 900.0, 600, 0.0)
    assert {policy.next_poll_at(NOW, 3.0, NOW + 900) for _ in range(100)} == {NOW + 3.0}


def _histogram(times: list[float], start: float, width: float, bins: int) -> list[int]:
    counts = [0] * bins
    for t in times:
        counts[min(bins - 1, int((t - start) / width * bins))] += 1
    return counts


def test_a_thousand_operations_deferred_at_once_do_not_poll_in_lockstep() -> None:
    rng = random.Random(1000)
    retry, n = 1.0, 1000
    first = [POLICY.next_poll_at(NOW, retry, NOW + 900, rng) for _ in range(n)]
    # Distinct (up to the odd collision of POSIX-time floats, whose step is ~0.24 µs).
    assert len(set(first)) >= 0.99 * n
    assert all(NOW + retry <= t <= NOW + retry * (1 + JITTER) for t in first)
    # Spread over the whole jitter window: ten equal bins, each near n/10.
    hist = _histogram(first, NOW + retry, retry * JITTER, 10)
    assert all(60 <= c <= 140 for c in hist), hist
    assert max(first) - min(first) > 0.9 * retry * JITTER

    # Round after round, each polled when its poller tick (50 ms) reaches it and
    # rescheduled from there: they must not fall back into step.
    tick = 0.05
    due = first
    for round_no in range(1, 11):
        polled_at = [NOW + tick * -(-(t - NOW) // tick) for t in due]
        per_tick = Counter(round((t - NOW) / tick) for t in polled_at)
        assert max(per_tick.values()) <= n * 0.35, (round_no, per_tick.most_common(3))
        assert len(per_tick) >= 4, (round_no, sorted(per_tick))
        due = [POLICY.next_poll_at(t, retry, NOW + 900, rng) for t in polled_at]
        assert len(set(due)) >= 0.99 * n
        assert max(due) - min(due) >= retry * JITTER * 0.9
    # Ten rounds later they are spread wider than any single jitter window.
    assert max(due) - min(due) > 2 * retry * JITTER


# -- configuration and wire rounding ------------------------------------------------------


def test_from_config_defaults() -> None:
    policy = DeferredHostPolicy.from_config(DeferredConfig())
    assert policy == DeferredHostPolicy(1.0, 60.0, 900.0, 600, 0.2)


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        (0.0, 1),
        (0.001, 1),
        (0.999, 1),
        (1.0, 1),
        (1.0 + 1e-12, 1),  # float noise does not round a whole second up
        (1.001, 2),
        (1.5, 2),
        (2.0, 2),
        (59.9, 60),
        (60.0, 60),
        (900.0, 900),
        (-3.0, 1),
    ],
)
def test_whole_seconds(seconds: float, expected: int) -> None:
    got = whole_seconds(seconds)
    assert got == expected
    assert isinstance(got, int)
    assert got >= 1
    assert got >= seconds - 1e-9  # never shorter than meant
