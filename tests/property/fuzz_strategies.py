"""Hostile inputs for the property tests and ``bench/fuzz_inputs.py``: arbitrary bytes,
JSON-ish values with the numbers and nesting parsers trip on, and valid documents with a
few fields broken."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import msgspec
from hypothesis import strategies as st

# --- values ---------------------------------------------------------------------------

HUGE_NUMBERS: list[Any] = [
    10**400,
    -(10**400),
    2**64,
    2**64 - 1,
    -(2**63) - 1,
    2**53 + 1,
    1e308,
    -1e308,
    5e-324,
    float("nan"),
    float("inf"),
    float("-inf"),
]
# Text that is valid str but odd: NUL, controls, a lone surrogate, RTL, very long.
ODD_TEXT = st.sampled_from(
    ["", "\x00", "a\x00b", "\ud800", "\u202e", "-rf", "--", "../..", "{{x}}", "}}{{", "x" * 5000]
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    ODD_TEXT,
    st.sampled_from(HUGE_NUMBERS),
)
jsonish = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=25,
)


def nested_text(depth: int, kind: str) -> str:
    """``depth`` lists or objects, one inside the other, as JSON text."""
    if kind == "list":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


# Depths around the limits that matter: the caps (64), Python's recursion limit (~1000)
# and far past it.
DEPTHS = st.sampled_from([63, 64, 65, 200, 900, 990, 1000, 1100, 10_000, 100_000])
JSON_NUMBER_TEXT = st.sampled_from(
    ["1" + "0" * 400, "-" + "9" * 400, "1e400", "-1e400", "1e-400", "18446744073709551616",
     "NaN", "Infinity", "-Infinity", "0." + "0" * 5000 + "1", "1" * 20_000]
)  # fmt: skip


@st.composite
def json_bytes(draw: st.DrawFn, valid: Any = None) -> bytes:
    """Bytes a JSON file could hold: garbage, a mutated valid document, deep nesting,
    numbers no float holds, text that is not UTF-8, or a truncated document."""
    kind = draw(st.sampled_from(["binary", "jsonish", "mutated", "deep", "number", "utf8", "cut"]))
    if kind == "binary":
        return draw(st.binary(max_size=300))
    if kind == "deep":
        text = nested_text(draw(DEPTHS), draw(st.sampled_from(["list", "object"])))
        return text.encode() if valid is None else _splice(valid, text)
    if kind == "number":
        text = draw(JSON_NUMBER_TEXT)
        return text.encode() if valid is None else _splice(valid, text)
    if kind == "jsonish" or valid is None:
        return json.dumps(draw(jsonish)).encode()
    doc = mutate(draw, valid) if kind == "mutated" else valid
    raw = json.dumps(doc).encode()
    if kind == "utf8":
        at = draw(st.integers(0, len(raw)))
        return (
            raw[:at]
            + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00"]))
            + raw[at:]
        )
    if kind == "cut":
        return raw[: draw(st.integers(0, max(len(raw) - 1, 0)))]
    return raw


def _splice(valid: Any, text: str) -> bytes:
    """``valid`` as JSON with its first string value replaced by raw JSON ``text``."""
    marker = "\u2603splice\u2603"
    doc = copy.deepcopy(valid)
    for path, value in _paths(doc):
        if isinstance(value, str) and path:
            _set(doc, path, marker)
            break
    return (
        json.dumps(doc, ensure_ascii=False)
        .replace(json.dumps(marker, ensure_ascii=False), text, 1)
        .encode()
    )


# --- MessagePack ---------------------------------------------------------------------

# Encoded verbatim inside a document: what no Python encoder would write.
RAW_MSGPACK = st.one_of(
    DEPTHS.map(lambda n: msgspec.Raw(b"\x91" * n + b"\xc0")),
    DEPTHS.map(lambda n: msgspec.Raw(b"\x81\xa1a" * n + b"\xc0")),
    st.sampled_from(
        [
            msgspec.Raw(b"\xa2\xff\xfe"),  # str that is not UTF-8
            msgspec.Raw(b"\xd4\x05\x01"),  # ext type 5
            msgspec.Raw(b"\xd6\xff\x00\x00\x00\x01"),  # timestamp ext
            msgspec.Raw(b"\xc4\x03abc"),  # bin
            msgspec.Raw(b"\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00"),  # NaN
            msgspec.Raw(b"\xcb\x7f\xf0\x00\x00\x00\x00\x00\x00"),  # +inf
            msgspec.Raw(b"\xcf" + b"\xff" * 8),  # 2**64 - 1
            msgspec.Raw(b"\xd3\x80" + b"\x00" * 7),  # -2**63
            msgspec.Raw(b"\x81\xc0\x01"),  # map with a nil key
            msgspec.Raw(b"\x81\x90\x01"),  # map with an array key
            msgspec.Raw(b"\x81\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00\x01"),  # NaN key
        ]
    ),
)
packable = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**64 - 1),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=40),
        st.binary(max_size=20),
        RAW_MSGPACK,
    ),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@st.composite
def msgpack_bytes(draw: st.DrawFn, valid: Any) -> bytes:
    """A frame's payload: garbage, a mutated valid document, or one cut short."""
    kind = draw(st.sampled_from(["binary", "mutated", "mutated", "cut", "lie"]))
    if kind == "binary":
        return draw(st.binary(max_size=300))
    if kind == "lie":  # a container header claiming 2**32 - 1 entries, then nothing
        return draw(st.sampled_from([b"\xdd", b"\xdf", b"\xdb", b"\xc6"])) + b"\xff\xff\xff\xff"
    raw = msgspec.msgpack.encode(mutate(draw, valid, packable))
    if kind == "cut":
        return raw[: draw(st.integers(0, max(len(raw) - 1, 0)))]
    return raw


# --- mutation -------------------------------------------------------------------------

Path = tuple[str | int, ...]


def _paths(doc: Any, prefix: Path = ()) -> Iterator[tuple[Path, Any]]:
    yield prefix, doc
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*prefix, i))


def _parent(doc: Any, path: Path) -> Any:
    for part in path[:-1]:
        doc = doc[part]
    return doc


def _set(doc: Any, path: Path, value: Any) -> None:
    _parent(doc, path)[path[-1]] = value


def mutate(draw: st.DrawFn, valid: Any, values: st.SearchStrategy[Any] = jsonish) -> Any:
    """``valid`` with one to three edits: a value replaced by a hostile one, a field
    dropped, or an unknown field added. A plain function over ``draw``, so no strategy is
    built per example (hypothesis validates each new one, which is slow)."""
    where = [path for path, _ in _paths(valid) if path]
    doc = copy.deepcopy(valid)
    for _ in range(draw(st.integers(1, 3))):
        path = where[draw(st.integers(0, len(where) - 1))]
        op = draw(OPS)
        try:
            parent = _parent(doc, path)
            if op == "replace":
                parent[path[-1]] = draw(values)
            elif op == "drop":
                del parent[path[-1]]
            elif isinstance(parent, dict):
                parent[draw(st.text(max_size=12))] = draw(values)
            elif isinstance(parent, list):
                parent.append(draw(values))
        except (KeyError, IndexError, TypeError):
            pass  # an earlier edit removed or retyped this path
    return doc


OPS = st.sampled_from(["replace", "replace", "drop", "add"])


def mutated(valid: Any, values: st.SearchStrategy[Any] = jsonish) -> st.SearchStrategy[Any]:
    """``mutate`` as a strategy; build it once, at import."""
    return st.composite(lambda draw: mutate(draw, valid, values))()
