"""Every code the client can raise by name is a code of a published vocabulary."""

from __future__ import annotations

from sensorium.client import errors
from sensorium.shared.diagnostics import ALL_CODES, OsErrorCode, RuntimeErrorCode


def test_the_client_names_no_code_outside_the_vocabularies() -> None:
    assert set(errors._BY_CODE) <= ALL_CODES


def test_the_two_vocabularies_do_not_overlap() -> None:
    assert not {c.value for c in OsErrorCode} & {c.value for c in RuntimeErrorCode}
