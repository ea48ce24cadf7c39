"""Wall-clock helpers; RFC 3339 timestamps as the seeds write them."""

from __future__ import annotations

import time
from datetime import UTC, datetime


def rfc3339(ts: float | None = None) -> str:
    """``2026-05-05T18:00:00.123Z`` for a POSIX timestamp (now by default)."""
    dt = datetime.fromtimestamp(time.time() if ts is None else ts, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def parse_rfc3339(text: str) -> float:
    """POSIX seconds for an RFC 3339 timestamp; ``ValueError`` when it is not one."""
    dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if dt.tzinfo is None:
        raise ValueError(f"timestamp {text!r} has no UTC offset")
    return dt.timestamp()
