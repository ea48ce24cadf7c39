"""``DeferredHostPolicy``: the host's clamp on every connector and caller hint (seed 055 §5).

::

    effective_retry_after   = clamp(connector_retry_after, host_min, host_max)
    effective_requested_ttl = min_present(connector_fail_after,
                                          action_preferred_max_ttl,
                                          caller_deadline_remaining)
    effective_expires_at    = now + min(effective_requested_ttl, host_max_ttl)
    next_poll_at            ∈ [now + retry, now + retry · (1 + jitter)], never past expiry

Pure arithmetic over explicit ``now`` values, so it is checked with a controllable
clock; the poller and core both call it, so the host has one policy.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from sensorium.shared.config import DeferredConfig


def clamp(value: float, low: float, high: float) -> float:
    return max(low, min(value, high))


def min_present(*values: float | None) -> float | None:
    """The smallest of the values that are present; ``None`` when none is."""
    present = [v for v in values if v is not None]
    return min(present) if present else None


@dataclass(frozen=True, slots=True)
class DeferredHostPolicy:
    min_retry_s: float
    max_retry_s: float
    max_ttl_s: float
    max_attempts: int
    jitter: float

    @classmethod
    def from_config(cls, cfg: DeferredConfig) -> DeferredHostPolicy:
        return cls(cfg.min_retry_s, cfg.max_retry_s, cfg.max_ttl_s, cfg.max_attempts, cfg.jitter)

    def retry_after(self, connector_retry_after: float | None) -> float:
        """``effective_retry_after``; a connector that gives no hint gets the host minimum."""
        hint = self.min_retry_s if connector_retry_after is None else connector_retry_after
        return clamp(hint, self.min_retry_s, self.max_retry_s)

    def requested_ttl(
        self,
        connector_fail_after: float | None,
        action_preferred_max_ttl: float | None,
        caller_deadline_remaining: float | None,
    ) -> float | None:
        return min_present(
            connector_fail_after, action_preferred_max_ttl, caller_deadline_remaining
        )

    def expires_at(
        self,
        now: float,
        connector_fail_after: float | None = None,
        action_preferred_max_ttl: float | None = None,
        caller_deadline_at: float | None = None,
    ) -> float:
        """``effective_expires_at``: the caller's deadline and the host maximum both bound it."""
        remaining = None if caller_deadline_at is None else max(0.0, caller_deadline_at - now)
        ttl = self.requested_ttl(connector_fail_after, action_preferred_max_ttl, remaining)
        return now + (self.max_ttl_s if ttl is None else min(ttl, self.max_ttl_s))

    def next_poll_at(
        self, now: float, retry_after: float, expires_at: float, rng: random.Random | None = None
    ) -> float:
        """When to poll next: jittered after the clamped interval, never before it, and
        never after expiry (so expiry is checked on time)."""
        spread = (rng or _rng).uniform(0.0, self.jitter) if self.jitter > 0 else 0.0
        return min(now + retry_after * (1.0 + spread), expires_at)


def whole_seconds(seconds: float) -> int:
    """A wire ``retry_after_seconds``: whole seconds, at least 1, never shorter than meant."""
    return max(1, math.ceil(seconds - 1e-9))


_rng = random.Random()
