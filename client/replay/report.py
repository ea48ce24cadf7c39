"""What a replay measured: counts, errors by diagnostic code, latency percentiles.

Latency runs from the moment a request was *due*, not the moment the tool got
round to sending it, so a load tool that falls behind shows up in the numbers
instead of hiding in them (coordinated omission). Percentiles come from an HDR
histogram in microseconds (1 µs to 1 h, 3 significant digits).
"""

from __future__ import annotations

from collections import Counter
from typing import Literal

import msgspec
from hdrh.histogram import HdrHistogram

REPORT_SCHEMA: Literal["sensorium-replay-report.v1"] = "sensorium-replay-report.v1"
_MAX_US = 3_600_000_000
PERCENTILES = (("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p99_9", 99.9))


def histogram() -> HdrHistogram:
    return HdrHistogram(1, _MAX_US, 3)


class Percentiles(msgspec.Struct, frozen=True, kw_only=True):
    """Milliseconds."""

    p50: float
    p90: float
    p99: float
    p99_9: float
    max: float
    mean: float


def percentiles(h: HdrHistogram) -> Percentiles | None:
    if h.get_total_count() == 0:
        return None
    values = {name: h.get_value_at_percentile(p) / 1000 for name, p in PERCENTILES}
    return Percentiles(**values, max=h.get_max_value() / 1000, mean=h.get_mean_value() / 1000)


class ReplayReport(msgspec.Struct, frozen=True, kw_only=True):
    """``sensorium replay --json``: one run, as text and as this document."""

    schema: Literal["sensorium-replay-report.v1"] = REPORT_SCHEMA
    source: str  # the recording's path, or "synthetic ACTION"
    endpoint: str
    concurrency: int
    speed: float | None = None  # a recording's pace multiplier
    offered_rps: float | None = None  # a synthetic plan's rate
    started_at: str
    # From the first request due to the last one sent, and to the last reply.
    send_window_s: float
    wall_s: float
    sent: int
    answered: int
    ok: int
    # Every request that did not succeed, by diagnostic code: the server's error
    # codes; for an outcome or operation that ended failed, timed-out, cancelled,
    # expired or unknown, its first diagnostic's code (`outcome-STATUS` when it has
    # none); and the tool's own `reply-timeout` (no reply within --reply-timeout)
    # and `core-unavailable` (could not be queued to core at all).
    errors: dict[str, int]
    # Results that carry a status (invoke results, operations), by status.
    outcomes: dict[str, int]
    skipped: int  # recorded requests that did not decode (nothing to rewrite)
    unmatched: int  # replies to no request of this run
    by_method: dict[str, int]
    sent_rps: float
    throughput_rps: float  # answered / wall
    latency_ms: Percentiles | None
    # How late the tool itself sent against the plan: its own limit, not the server's.
    send_lag_ms: Percentiles | None


class Tally:
    """Counts as the engine goes; turned into a report at the end."""

    def __init__(self) -> None:
        self.sent = 0
        self.answered = 0
        self.ok = 0
        self.errors: Counter[str] = Counter()
        self.unmatched = 0
        self.by_method: Counter[str] = Counter()
        # Results that carry a status (outcomes, operations), by status.
        self.outcomes: Counter[str] = Counter()
        self.latency = histogram()
        self.lag = histogram()

    def __repr__(self) -> str:
        return (
            f"<Tally sent={self.sent} answered={self.answered} errors={sum(self.errors.values())}>"
        )

    def record_latency(self, ns: int) -> None:
        self.latency.record_value(min(max(ns // 1000, 1), _MAX_US))

    def record_lag(self, ns: int) -> None:
        self.lag.record_value(min(max(ns // 1000, 1), _MAX_US))


def render_text(r: ReplayReport) -> str:
    lines = [
        f"replay of {r.source} against {r.endpoint} · concurrency {r.concurrency}"
        + (f" · speed ×{r.speed:g}" if r.speed is not None else "")
        + (f" · offered {r.offered_rps:g}/s" if r.offered_rps is not None else ""),
        f"  sent {r.sent} in {r.send_window_s:.2f} s ({r.sent_rps:.0f}/s) · answered "
        f"{r.answered} in {r.wall_s:.2f} s ({r.throughput_rps:.0f}/s) · ok {r.ok}",
    ]
    if r.latency_ms is not None:
        p = r.latency_ms
        lines.append(
            f"  latency ms  p50 {p.p50:.2f}  p90 {p.p90:.2f}  p99 {p.p99:.2f}  "
            f"p99.9 {p.p99_9:.2f}  max {p.max:.2f}  mean {p.mean:.2f}"
        )
    if r.send_lag_ms is not None:
        lines.append(
            f"  send lag ms p99 {r.send_lag_ms.p99:.2f}  max {r.send_lag_ms.max:.2f}"
            "  (the tool's own lateness)"
        )
    errors = sum(r.errors.values())
    lines.append(f"  errors {errors}" + (":" if errors else ""))
    lines += [f"    {code:<28} {n}" for code, n in sorted(r.errors.items(), key=lambda kv: -kv[1])]
    if r.skipped or r.unmatched:
        lines.append(f"  skipped {r.skipped} (did not decode) · unmatched replies {r.unmatched}")
    if r.outcomes:
        lines.append("  outcomes: " + ", ".join(f"{k} {n}" for k, n in sorted(r.outcomes.items())))
    lines.append("  by method: " + ", ".join(f"{m} {n}" for m, n in sorted(r.by_method.items())))
    return "\n".join(lines)


def progress_line(elapsed_s: float, t: Tally, inflight: int) -> str:
    p99 = t.latency.get_value_at_percentile(99.0) / 1000 if t.latency.get_total_count() else 0.0
    errors = sum(t.errors.values())
    return (
        f"{elapsed_s:6.1f}s  sent {t.sent}  answered {t.answered}  in flight {inflight}  "
        f"ok {t.ok}  errors {errors}  p99 {p99:.2f} ms"
    )
