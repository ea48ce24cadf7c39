"""Restart policy: exponential backoff with jitter and a cap, and the burst limit.

Pure arithmetic over times handed in by the caller, so tests move the clock
instead of sleeping.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from sensorium.shared.config import SupervisorConfig


@dataclass
class RestartPolicy:
    """Decides, after each unexpected exit, whether to restart and after how long."""

    cfg: SupervisorConfig
    rng: random.Random = field(default_factory=random.Random)
    failures: deque[float] = field(default_factory=deque)
    consecutive: int = 0

    def __repr__(self) -> str:
        return (
            f"<RestartPolicy consecutive={self.consecutive} "
            f"in_window={len(self.failures)}/{self.cfg.burst_limit}>"
        )

    def on_exit(self, now: float, uptime_s: float) -> float | None:
        """Seconds to wait before the restart, or None: the burst limit is hit, give up."""
        window = self.cfg.burst_window_s
        self.failures.append(now)
        while self.failures and self.failures[0] < now - window:
            self.failures.popleft()
        if len(self.failures) >= self.cfg.burst_limit:
            return None
        # A process that stayed up a whole window starts its backoff afresh.
        self.consecutive = 1 if uptime_s >= window else self.consecutive + 1
        # The exponent is capped too: a slow crash loop must not overflow a float.
        base = min(
            self.cfg.backoff_max_s, self.cfg.backoff_initial_s * 2 ** min(self.consecutive - 1, 62)
        )
        return float(base * (1 + self.cfg.backoff_jitter * self.rng.random()))

    def reset(self) -> None:
        """An operator resumed the process: forget its failures."""
        self.failures.clear()
        self.consecutive = 0
