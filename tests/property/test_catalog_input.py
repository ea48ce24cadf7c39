"""Catalog files built to break the loader: garbage, broken declarations, numbers no
float holds, nesting past the recursion limit, bytes that are not UTF-8, and too much.

Invariant: ``catalog.merge``/``catalog.load`` never raise; a catalog is valid or lists
bounded problems, which the module report turns into catalog-invalid diagnostics.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import fuzz_examples as ex
import fuzz_strategies as hs
import pytest
from fuzz_targets import ACCEPTED, PROPERTY, bounded, catalog
from hypothesis import given, settings
from hypothesis import strategies as st

from sensorium.connectors.os.catalog import sources as catalog_mod
from sensorium.shared.paths import StatePaths


def _problems(raw: bytes) -> list[str]:
    cat = catalog_mod.merge([("f.json", raw)], [])
    return [str(p) for p in cat.problems]


def _with(**decl: Any) -> bytes:
    return json.dumps({**ex.CATALOG, "action_catalog": [{**ex.DECLARATION, **decl}]}).encode()


def test_the_example_catalog_is_valid() -> None:
    assert catalog(json.dumps(ex.CATALOG).encode()) == ACCEPTED


@PROPERTY
@given(hs.json_bytes(ex.CATALOG))
def test_any_bytes_are_a_valid_catalog_or_catalog_invalid(raw: bytes) -> None:
    with bounded():
        assert catalog(raw) in {ACCEPTED, "catalog-invalid"}


@settings(PROPERTY, max_examples=200)
@given(hs.mutated(ex.DECLARATION))
def test_broken_declarations_are_catalog_invalid_never_a_crash(decl: Any) -> None:
    raw = json.dumps({"action_catalog": [decl]}).encode()
    with bounded():
        assert catalog(raw) in {ACCEPTED, "catalog-invalid"}


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        (b'{"action_catalog": [{"action_id": "a.\xff"}]}', "is not UTF-8"),
        (b'{"policy": {"a": ' + b"[" * 10_000 + b"]" * 10_000 + b"}}", "nested too deeply"),
        (b'{"policy": ' + b'{"a":' * 5000 + b"1" + b"}" * 5001, "nested too deeply"),
        (b'{"action_catalog": [], "x": 1e400}', "unknown field"),
        (b'{"action_catalog": [{"action_id": "a.b", "n": 1e400}]}', "Number out of range"),
        (b'{"action_catalog": [{"action_id": "a.b", "n": NaN}]}', "malformed"),
        (b'{"action_catalog": [{"action_id": "a.b", "n": Infinity}]}', "malformed"),
        (b'{"action_catalog": [{"action_id": "a.b", "n": ' + b"9" * 400 + b"}]}", "canonical"),
        (b'{"action_catalog": [{"action_id": "a.b", "n": 18446744073709551616}]}', "canonical"),
    ],
)
def test_hostile_json_is_a_named_problem(raw: bytes, said: str) -> None:
    problems = _problems(raw)
    assert problems and any(said in p for p in problems), problems


def test_a_huge_value_is_not_echoed_into_the_problems() -> None:
    problems = _problems(_with(group="x" * 3_000_000, action_id="y" * 1_000_000))
    assert problems and all(len(p) < 4 * catalog_mod.MAX_PROBLEM_CHARS for p in problems)


def test_problems_are_capped_so_the_module_report_fits_one_reply() -> None:
    bad = {"action_id": "a.b", "class": "nope", "executable": {}, "parameters_schema": 1}
    decls = [{**bad, "action_id": f"a.b{i}"} for i in range(300)]
    cat = catalog_mod.merge([("f.json", json.dumps({"action_catalog": decls}).encode())], [])
    assert len(cat.problems) == catalog_mod.MAX_PROBLEMS + 1
    assert "more problems" in cat.problems[-1].message


def test_more_declarations_than_the_cap_are_refused_without_validating_them() -> None:
    decls = [
        {**ex.DECLARATION, "action_id": f"fuzz.a{i}"}
        for i in range(catalog_mod.MAX_DECLARATIONS + 1)
    ]
    raw = json.dumps({"action_catalog": decls}).encode()
    t0 = time.monotonic()
    problems = _problems(raw)
    assert time.monotonic() - t0 < 10
    assert len(problems) == 1 and f"at most {catalog_mod.MAX_DECLARATIONS}" in problems[0]


def test_the_sources_together_are_capped(tmp_path: Path) -> None:
    paths = StatePaths(tmp_path)
    paths.ensure()
    catalog_mod.materialize(paths)
    dropins = catalog_mod.dropin_dir(paths)
    # Each drop-in is under the per-file cap; together they pass the catalog's.
    filler = {"schema": "sensorium-os-config.v1", "action_catalog": [], "policy": None}
    text = json.dumps(filler)[:-1] + ', "x": "' + "x" * (3 * 1024 * 1024) + '"}'
    for i in range(3):
        (dropins / f"{i:02d}.json").write_text(text)
    cat = catalog_mod.load(paths, materialize_defaults=False)
    assert not cat.valid
    assert any("together pass" in p.message for p in cat.problems), cat.problems


@pytest.mark.parametrize(
    ("ref", "ok"),
    [
        ("#/$defs/unused", True),
        ("#", True),
        ("#/$defs/missing", False),
        ("https://schemas.example/x.json", False),
        ("other.json#/a", False),
    ],
)
def test_a_ref_core_could_not_resolve_is_refused_at_load(ref: str, ok: bool) -> None:
    schema = json.loads(json.dumps(ex.DECLARATION["parameters_schema"]))
    schema["properties"]["extra"] = {"$ref": ref}
    problems = _problems(_with(parameters_schema=schema))
    assert (problems == []) is ok, problems
    if not ok:
        assert any("does not resolve" in p for p in problems)


@settings(PROPERTY, max_examples=150)
@given(st.text(max_size=30).map(lambda s: "#" + s) | st.text(max_size=30))
def test_any_ref_text_is_checked_without_raising(ref: str) -> None:
    schema = {"type": "object", "properties": {"x": {"$ref": ref}}}
    with bounded():
        assert catalog(_with(parameters_schema=schema)) in {ACCEPTED, "catalog-invalid"}
