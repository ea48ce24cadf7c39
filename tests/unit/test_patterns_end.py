"""Every string pattern on the wire ends at the end of the text.

msgspec (like ``re.search``) lets ``$`` match before a final newline, so a pattern
written ``...$`` took ``"demo.fs.stat\\n"`` as an action id, a recording name with a
newline as a file name. The Structs end their patterns in ``\\Z``; the published
schemas say ``$`` (ECMA-262, where it already means the end)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest

from sensorium.shared.wire.client_api import RecordingName
from sensorium.shared.wire.directive import Directive
from sensorium.shared.wire.schemagen import SCHEMAS, generate


def _patterns(t: mi.Type, seen: set[int]) -> list[str]:
    if id(t) in seen:
        return []
    seen.add(id(t))
    found: list[str] = []
    if isinstance(t, mi.StrType) and t.pattern is not None:
        found.append(t.pattern)
    for attr in ("item_type", "key_type", "value_type"):
        if (sub := getattr(t, attr, None)) is not None:
            found += _patterns(sub, seen)
    for sub in getattr(t, "types", ()) or ():
        found += _patterns(sub, seen)
    for sub in getattr(t, "item_types", ()) or ():
        found += _patterns(sub, seen)
    for f in getattr(t, "fields", ()) or ():
        found += _patterns(f.type, seen)
    return found


def test_no_wire_pattern_lets_a_trailing_newline_through() -> None:
    patterns: set[str] = set()
    for struct in SCHEMAS.values():
        patterns.update(_patterns(mi.type_info(struct), set()))
    assert patterns
    # (An open prefix, ``^delegation:key:``, is meant to run on.)
    loose = sorted(p for p in patterns if p.endswith("$"))
    assert not loose, loose


def test_the_published_schemas_keep_the_ecma_form() -> None:
    for name in SCHEMAS:
        text = json.dumps(generate(name))
        assert "\\\\Z" not in text, name


@pytest.mark.parametrize(
    ("value", "type_"),
    [("rec-1\n", RecordingName)],
)
def test_a_trailing_newline_is_refused(value: str, type_: Any) -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(json.dumps(value).encode(), type=type_)


def test_an_action_id_with_a_newline_is_not_an_action_id() -> None:
    good = {
        "action_id": "demo.fs.stat",
        "parameters": {},
    }
    with pytest.raises(msgspec.ValidationError, match="action_id"):
        msgspec.convert({**good, "action_id": "demo.fs.stat\n"}, Directive)
