"""shared/clock.py's RFC 3339 text, against the standard library's for the same instant."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from sensorium.shared.clock import parse_rfc3339, rfc3339


def _reference(ts: float) -> str:
    dt = datetime.fromtimestamp(ts, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def test_the_text_is_what_datetime_prints_also_at_rounding_edges() -> None:
    edges = [0.0, 1e-7, 0.0009999, 0.9995, 0.9999995, 0.9999996, 1.9999995, 86399.9999999]
    rng = random.Random(3339)
    instants = edges + [rng.uniform(0, 4e9) for _ in range(20_000)]
    instants += [rng.randint(1_700_000_000, 1_800_000_000) + e for e in edges for _ in range(50)]
    for ts in instants:
        assert rfc3339(ts) == _reference(ts), ts


def test_consecutive_seconds_and_the_cache_agree() -> None:
    base = 1_795_699_198.0
    seen = [rfc3339(base + i * 0.25) for i in range(12)]  # back and forth across seconds
    seen += [rfc3339(base - 1.0), rfc3339(base)]
    assert seen[-2] == "2026-11-26T13:19:57.000Z" and seen[-1] == "2026-11-26T13:19:58.000Z"
    for i, text in enumerate(seen[:12]):
        assert text == _reference(base + i * 0.25)
        assert abs(parse_rfc3339(text) - (base + i * 0.25)) < 0.001


def test_instants_outside_datetimes_years_raise_as_they_did() -> None:
    for ts in (253_402_300_800.0, -62_135_596_801.0, 1e15):
        with pytest.raises(ValueError):
            rfc3339(ts)
    assert rfc3339(253_402_300_799.0) == "9999-12-31T23:59:59.000Z"
