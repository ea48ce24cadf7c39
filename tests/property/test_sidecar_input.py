"""Signature sidecars built to break verification: garbage, the genuine sidecar with
fields broken, nesting, numbers no float holds, bytes that are not UTF-8.

Invariant: ``authorization.verify`` never raises for what is on disk; every sidecar but
the genuine one is refused with a Reason, which the connector reports as
action-catalog-unauthorized on every dispatch.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import fuzz_strategies as hs
import msgspec
import pytest
from fuzz_targets import ACCEPTED, PROPERTY, SidecarWorld, bounded
from hypothesis import given, settings

from sensorium.shared.wire.signature import ConfigSignature

_world_dir = Path(tempfile.mkdtemp(prefix="fz-sidecar-"))
WORLD = SidecarWorld(_world_dir)
REFUSED = "action-catalog-unauthorized"


@pytest.fixture(scope="module", autouse=True)
def _cleanup() -> Iterator[None]:
    yield
    import shutil

    shutil.rmtree(_world_dir, ignore_errors=True)


def test_the_genuine_sidecar_verifies() -> None:
    assert WORLD.verdict(json.dumps(WORLD.genuine).encode()) == ACCEPTED


@settings(PROPERTY, max_examples=200)
@given(hs.json_bytes(WORLD.genuine))
def test_any_other_sidecar_is_refused_with_a_reason_never_an_exception(raw: bytes) -> None:
    with bounded():
        verdict = WORLD.verdict(raw)
    if verdict == ACCEPTED:  # only the genuine sidecar verifies, however it is spelled
        genuine = msgspec.convert(WORLD.genuine, ConfigSignature)
        assert msgspec.json.decode(raw, type=ConfigSignature) == genuine
    else:
        assert verdict.startswith(REFUSED)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b'{"connector_id": "\xff"}', "signature-invalid"),
        (b"[" * 100_000 + b"]" * 100_000, "signature-invalid"),
        (b'{"signed_at": ' + b"9" * 5000 + b"}", "signature-invalid"),
        (b'{"schema/v": 1e400}', "signature-invalid"),
        (b'{"schema/v": NaN}', "signature-invalid"),
        (b"x" * (64 * 1024 + 1), "signature-invalid"),
    ],
)
def test_hostile_sidecars_are_signature_invalid(raw: bytes, reason: str) -> None:
    assert WORLD.verdict(raw) == f"{REFUSED} ({reason})"


def test_a_signature_value_of_every_length_is_refused_cleanly() -> None:
    for n in range(0, 130):
        doc = {**WORLD.genuine, "signature": {"alg": "ed25519", "value": "A" * n}}
        assert WORLD.verdict(json.dumps(doc).encode()).startswith(REFUSED)
