"""Restart policy: exponential backoff with jitter and a cap, and the burst limit.

Times are handed in; nothing sleeps.
"""

from __future__ import annotations

import random

import pytest

from sensorium.shared.config import SupervisorConfig
from sensorium.supervisor.policy import RestartPolicy

CFG = SupervisorConfig(
    backoff_initial_s=1.0, backoff_max_s=8.0, backoff_jitter=0.5, burst_limit=5, burst_window_s=10.0
)
APART = 10.5  # further apart than the burst window
SHORT = 0.5  # an uptime well below the window


class _FixedRandom(random.Random):
    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


def _policy(cfg: SupervisorConfig = CFG, seed: int = 7) -> RestartPolicy:
    return RestartPolicy(cfg=cfg, rng=random.Random(seed))


def test_backoff_grows_exponentially_within_the_jitter_band() -> None:
    policy = _policy()
    for n, base in enumerate([1.0, 2.0, 4.0, 8.0], start=1):
        delay = policy.on_exit(now=n * APART, uptime_s=SHORT)
        assert delay is not None
        assert base <= delay <= base * (1 + CFG.backoff_jitter)


def test_backoff_is_capped_at_backoff_max() -> None:
    policy = _policy()
    delays = [policy.on_exit(now=n * APART, uptime_s=SHORT) for n in range(1, 12)]
    for delay in delays[3:]:
        assert delay is not None
        assert CFG.backoff_max_s <= delay <= CFG.backoff_max_s * (1 + CFG.backoff_jitter)


@pytest.mark.parametrize(("draw", "factor"), [(0.0, 1.0), (0.5, 1.25), (0.999999, 1.5)])
def test_jitter_scales_the_base_by_one_plus_jitter_times_draw(draw: float, factor: float) -> None:
    policy = RestartPolicy(cfg=CFG, rng=_FixedRandom(draw))
    delay = policy.on_exit(now=0.0, uptime_s=SHORT)
    assert delay == pytest.approx(CFG.backoff_initial_s * factor, rel=1e-5)


def test_zero_jitter_gives_exact_delays() -> None:
    cfg = SupervisorConfig(
        backoff_initial_s=0.5,
        backoff_max_s=3.0,
        backoff_jitter=0.0,
        burst_limit=5,
        burst_window_s=10.0,
    )
    policy = _policy(cfg)
    delays = [policy.on_exit(now=n * APART, uptime_s=SHORT) for n in range(1, 6)]
    assert delays == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_same_seed_gives_same_delays() -> None:
    a, b = _policy(seed=42), _policy(seed=42)
    for n in range(1, 5):
        assert a.on_exit(now=n * APART, uptime_s=SHORT) == b.on_exit(n * APART, SHORT)


def test_gives_up_at_the_burst_limit_inside_the_window() -> None:
    policy = _policy()
    results = [policy.on_exit(now=float(t), uptime_s=SHORT) for t in range(CFG.burst_limit)]
    assert all(r is not None for r in results[:-1])
    assert results[-1] is None


def test_exits_older_than_the_window_do_not_count() -> None:
    policy = _policy()
    for t in (0.0, 3.0, 6.0, 9.0):
        assert policy.on_exit(now=t, uptime_s=SHORT) is not None
    # The exit at 0.0 has left the window by 10.5: four in the window, not five.
    assert policy.on_exit(now=10.5, uptime_s=SHORT) is not None


def test_exits_spread_wider_than_the_window_never_give_up() -> None:
    policy = _policy()
    for n in range(100):
        assert policy.on_exit(now=n * APART, uptime_s=SHORT) is not None


def test_long_uptime_restarts_backoff_at_the_initial_delay() -> None:
    policy = RestartPolicy(cfg=CFG, rng=_FixedRandom(0.0))
    for n in range(1, 4):
        policy.on_exit(now=n * APART, uptime_s=SHORT)
    assert policy.on_exit(now=4 * APART, uptime_s=SHORT) == 8.0
    assert policy.on_exit(now=5 * APART, uptime_s=CFG.burst_window_s) == CFG.backoff_initial_s
    assert policy.on_exit(now=6 * APART, uptime_s=SHORT) == 2 * CFG.backoff_initial_s


def test_reset_clears_failures_and_backoff() -> None:
    policy = RestartPolicy(cfg=CFG, rng=_FixedRandom(0.0))
    for t in range(CFG.burst_limit - 1):
        policy.on_exit(now=float(t), uptime_s=SHORT)
    policy.reset()
    assert policy.consecutive == 0
    assert not policy.failures
    # Backoff starts over and the burst count has room again.
    now = float(CFG.burst_limit)
    assert policy.on_exit(now=now, uptime_s=SHORT) == CFG.backoff_initial_s
    for t in range(1, CFG.burst_limit - 1):
        assert policy.on_exit(now=now + t * 0.1, uptime_s=SHORT) is not None


def test_reset_after_giving_up_allows_restart() -> None:
    policy = _policy()
    results = [policy.on_exit(now=float(t), uptime_s=SHORT) for t in range(CFG.burst_limit)]
    assert results[-1] is None
    policy.reset()
    assert policy.on_exit(now=float(CFG.burst_limit), uptime_s=SHORT) is not None


def test_slow_crash_loop_never_overflows() -> None:
    cfg = SupervisorConfig()
    policy = RestartPolicy(cfg=cfg, rng=random.Random(1))
    now = 0.0
    for _ in range(1100):
        delay = policy.on_exit(now=now, uptime_s=5.0)
        assert delay is not None
        assert delay <= cfg.backoff_max_s * (1 + cfg.backoff_jitter)
        now += delay + 5.0
