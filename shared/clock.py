"""Wall-clock helpers; RFC 3339 timestamps as the seeds write them."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime

# The last whole second formatted, and its text up to the milliseconds: several
# timestamps are written per directive, almost always within one second.
_second: tuple[int | None, str] = (None, "")
# 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z: datetime's range.
_FIRST, _LAST = -62_135_596_800, 253_402_300_799


def rfc3339(ts: float | None = None) -> str:
    """``2026-05-05T18:00:00.123Z`` for a POSIX timestamp (now by default).

    Exactly what ``datetime.fromtimestamp(ts, UTC)`` would print (its rounding to the
    microsecond, then milliseconds truncated), at a seventh of its cost."""
    global _second
    frac, whole = math.modf(time.time() if ts is None else ts)
    us = round(frac * 1e6)
    if us >= 1_000_000:
        whole, us = whole + 1, us - 1_000_000
    elif us < 0:
        whole, us = whole - 1, us + 1_000_000
    sec = int(whole)
    if not _FIRST <= sec <= _LAST:  # years 1-9999 only, as datetime raises for others
        dt = datetime.fromtimestamp(time.time() if ts is None else ts, tz=UTC)
        return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"
    cached = _second
    if cached[0] != sec:
        cached = (sec, time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(sec)))
        _second = cached  # one tuple: a racing thread sees the old pair or the new
    return f"{cached[1]}{us // 1000:03d}Z"


def parse_rfc3339(text: str) -> float:
    """POSIX seconds for an RFC 3339 timestamp; ``ValueError`` when it is not one."""
    dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if dt.tzinfo is None:
        raise ValueError(f"timestamp {text!r} has no UTC offset")
    return dt.timestamp()
