"""The caller's side of "is it done yet", the same for Sensorium and for huey.

One thread sweeps the jobs admitted so far: it reads each pending job's status once per
sweep (whatever the system's cheapest per-job read is), notes the first time a job reads
final, and sleeps ``SWEEP_S`` between sweeps. The time from a job's admission (its
handle returned) to that note is its completion time as the caller knows it. Imports
neither sensorium nor huey: both sides' interpreters load it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

SWEEP_S = 0.02

# Given a job's key: its final status, or None while it is not final.
Check = Callable[[Any], str | None]


class Sweeper(threading.Thread):
    """``connect`` runs in the sweeping thread and returns (check, close), so a client
    that must stay on one thread is made and closed there."""

    def __init__(
        self, connect: Callable[[], tuple[Check, Callable[[], None]]], total: int, timeout_s: float
    ) -> None:
        super().__init__(name="sweeper", daemon=True)
        self._connect = connect
        self.total = total
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._pending: dict[Any, int] = {}  # key -> admitted at (perf_counter_ns)
        self.completion_ns: list[int] = []
        self.statuses: Counter[str] = Counter()
        self.sweeps = 0
        self.error: BaseException | None = None

    def add(self, key: Any, admitted_ns: int) -> None:
        with self._lock:
            self._pending[key] = admitted_ns

    def run(self) -> None:
        try:
            check, close = self._connect()
        except BaseException as exc:
            self.error = exc
            return
        deadline = time.monotonic() + self.timeout_s
        try:
            while len(self.completion_ns) < self.total and time.monotonic() < deadline:
                with self._lock:
                    pending = list(self._pending.items())
                for key, admitted in pending:
                    status = check(key)
                    if status is None:
                        continue
                    self.completion_ns.append(time.perf_counter_ns() - admitted)
                    self.statuses[status] += 1
                    with self._lock:
                        del self._pending[key]
                self.sweeps += 1
                time.sleep(SWEEP_S)
        except BaseException as exc:
            self.error = exc
        finally:
            close()

    def result(self) -> dict[str, Any]:
        """Wait for the sweep to end; raise what broke it or say what did not finish."""
        self.join(self.timeout_s + 10)
        if self.error is not None:
            raise RuntimeError(f"sweeper failed: {self.error!r}") from self.error
        if len(self.completion_ns) < self.total:
            raise RuntimeError(
                f"only {len(self.completion_ns)} of {self.total} jobs final "
                f"within {self.timeout_s:.0f} s"
            )
        return {
            "completion_ns": self.completion_ns,
            "statuses": dict(self.statuses),
            "sweeps": self.sweeps,
        }
