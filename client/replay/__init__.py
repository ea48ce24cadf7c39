"""Open-loop load from a recording or a synthetic plan (``sensorium replay``).

from sensorium.client.replay import replay_synthetic
report = replay_synthetic("demo.system.uptime", rate=200, duration_s=2)
print(report.latency_ms.p99, report.errors)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from sensorium.client.endpoint import core_curve, core_endpoint
from sensorium.client.replay.engine import Engine
from sensorium.client.replay.plan import PlanInfo, from_recording, synthetic
from sensorium.client.replay.report import ReplayReport, Tally, percentiles
from sensorium.shared.clock import rfc3339
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.rpc.curve import ClientKeys
from sensorium.shared.wire.directive import TimingMode
from sensorium.shared.wire.recording import RecordingError

Progress = Callable[[float, Tally, int], None]

__all__ = ["ReplayReport", "replay_recording", "replay_synthetic"]


def _report(
    engine: Engine,
    info: PlanInfo,
    started_at: str,
    *,
    speed: float | None = None,
    offered_rps: float | None = None,
) -> ReplayReport:
    t = engine.tally
    window = max((engine.last_sent_ns - engine.started_ns) / 1e9, 0.0)
    wall = max((engine.finished_ns - engine.started_ns) / 1e9, 1e-9)
    return ReplayReport(
        source=info.source,
        endpoint=engine.endpoint,
        concurrency=engine.concurrency,
        started_at=started_at,
        send_window_s=window,
        wall_s=wall,
        sent=t.sent,
        answered=t.answered,
        ok=t.ok,
        errors=dict(t.errors),
        skipped=info.skipped,
        unmatched=t.unmatched,
        by_method=dict(t.by_method),
        outcomes=dict(t.outcomes),
        sent_rps=t.sent / window if window > 0 else float(t.sent),
        throughput_rps=t.answered / wall,
        latency_ms=percentiles(t.latency),
        send_lag_ms=percentiles(t.lag),
        speed=speed,
        offered_rps=offered_rps,
    )


def _engine(
    endpoint: str | None,
    state_dir: str | None,
    curve: ClientKeys | None,
    concurrency: int,
    max_inflight: int,
    reply_timeout_s: float,
) -> Engine:
    where = core_endpoint(endpoint, state_dir)
    return Engine(
        where,
        concurrency=concurrency,
        max_inflight=max_inflight,
        reply_timeout_s=reply_timeout_s,
        curve=core_curve(where, state_dir, curve),
    )


def replay_recording(
    path: str | Path,
    *,
    speed: float = 1.0,
    endpoint: str | None = None,
    state_dir: str | None = None,
    curve: ClientKeys | None = None,
    concurrency: int = 4,
    max_inflight: int = 10_000,
    reply_timeout_s: float = 30.0,
    progress: Progress | None = None,
) -> ReplayReport:
    """Send a ``sensorium-recording.v1`` file at ``speed`` times its recorded pace.
    ``recording-invalid`` when the file is not a recording."""
    if not speed > 0:
        raise ValueError("speed must be greater than 0")
    engine = _engine(endpoint, state_dir, curve, concurrency, max_inflight, reply_timeout_s)
    info = PlanInfo(source=str(path))
    started_at = rfc3339()
    with open(path, "rb") as fh:
        try:
            plan = from_recording(fh, speed, info, lambda: engine.started_wall)
            engine.run(plan, progress)
        except RecordingError as exc:
            raise CodedError(
                RuntimeErrorCode.RECORDING_INVALID, f"{path}: {exc}", detail={"path": str(path)}
            ) from None
    return _report(engine, info, started_at, speed=speed)


def replay_synthetic(
    action_id: str,
    parameters: dict[str, Any] | None = None,
    *,
    rate: float,
    duration_s: float,
    mode: TimingMode = "sync",
    timeout_ms: int | None = None,
    endpoint: str | None = None,
    state_dir: str | None = None,
    curve: ClientKeys | None = None,
    concurrency: int = 4,
    max_inflight: int = 10_000,
    reply_timeout_s: float = 30.0,
    progress: Progress | None = None,
) -> ReplayReport:
    """Invoke ``action_id`` ``rate`` times a second for ``duration_s``, open loop."""
    if not rate > 0 or not duration_s > 0:
        raise ValueError("rate and duration must be greater than 0")
    engine = _engine(endpoint, state_dir, curve, concurrency, max_inflight, reply_timeout_s)
    info = PlanInfo(source=f"synthetic {action_id}")
    started_at = rfc3339()
    plan = synthetic(
        action_id,
        dict(parameters or {}),
        rate=rate,
        duration_s=duration_s,
        mode=mode,
        timeout_ms=timeout_ms,
    )
    engine.run(plan, progress)
    return _report(engine, info, started_at, offered_rps=rate)
