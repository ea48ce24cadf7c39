"""Operator patterns against hostile text (issue 16, items 13 and 14).

A backtracking ``pattern`` froze core's loop for every caller, and a file name a C3
action chose froze the connector against a backtracking ``path_pattern``; the
factory's path guard let ``//proc/...`` through. Matching is linear now, patterns
that need backtracking are refused at catalog load, and the guard refuses paths
that are not normalized.

A run against the old engine never ends (2^40 steps), so the hostile matches run in
a child with a CPU-seconds rlimit: it is killed instead of the suite hanging.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sensorium.connectors.os.catalog import sources as catalog
from sensorium.connectors.os.catalog.sources import Catalog
from sensorium.shared import patterns
from sensorium.shared.paths import StatePaths
from sensorium.shared.schemapatterns import parameters_validator

HOSTILE = "a" * 40 + "b"  # (a+)+ tries 2^40 ways to fail on it

_CORE = """
import sys
schema = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^(a+)+$"},
          "tags": {"type": "object", "patternProperties": {"^(a+)+$": {"type": "integer"}},
                   "additionalProperties": False}}}
import sensorium.core.resolution as r
v = r.parameters_validator(schema)
errors = [e.message for e in v.iter_errors({"name": sys.argv[1], "tags": {sys.argv[1]: 1}})]
print(len(errors))
"""

_CONNECTOR = """
import os, sys
from pathlib import Path
from sensorium.connectors.os.effects import fswrite
root, upper = Path(sys.argv[1]), Path(sys.argv[2])
found = fswrite.inspect(upper, write_root=root, max_bytes_total=1 << 20,
    max_bytes_per_file=1 << 20, path_pattern="^(a+)+$", may_modify=lambda p: True)
print(len(found.problems))
"""


def _bounded(code: str, *args: str) -> str:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (20, 20))

    run = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, preexec_fn=limit
    )
    assert run.returncode == 0, f"killed or failed ({run.returncode}): {run.stderr[-2000:]}"
    return run.stdout.strip()


def test_a_backtracking_parameter_pattern_does_not_hold_core() -> None:
    # Both the value and the property name fail their patterns: two errors, promptly.
    assert _bounded(_CORE, HOSTILE) == "2"


def test_a_file_name_against_a_backtracking_path_pattern_does_not_hold_the_connector(
    tmp_path: Path,
) -> None:
    root, upper = tmp_path / "root", tmp_path / "upper"
    root.mkdir()
    upper.mkdir()
    (upper / HOSTILE).write_bytes(b"x")
    assert _bounded(_CONNECTOR, str(root), str(upper)) == "1"


# --- the catalog refuses what a linear-time matcher cannot run ---------------------------------


@pytest.fixture
def paths(tmp_path: Path) -> StatePaths:
    p = StatePaths(tmp_path / "state")
    p.ensure()
    return p


def _load_with(paths: StatePaths, entry: dict[str, Any]) -> Catalog:
    catalog.materialize(paths)
    d = catalog.dropin_dir(paths)
    d.mkdir(parents=True, exist_ok=True)
    body = {"schema": "sensorium-os-config.v1", "action_catalog": [entry]}
    (d / "50-test.json").write_text(json.dumps(body))
    return catalog.load(paths)


def _decl(**fields: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "action_id": "test.patterns",
        "class": "read-only-spawn",
        "executable": {"kind": "binary", "path": "/usr/bin/true", "argv_shape": ["true"]},
        "parameters_schema": {"type": "object", "properties": {}, "additionalProperties": False},
    }
    return entry | fields


def test_patterns_a_linear_matcher_cannot_run_are_catalog_problems(paths: StatePaths) -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "string", "pattern": "^(?!x)"},
            "b": {"type": "string", "pattern": "(a)\\1"},
            "c": {"type": "object", "patternProperties": {"(?<=a)b": {}}},
        },
        "unevaluatedProperties": False,
    }
    cat = _load_with(paths, _decl(parameters_schema=schema))
    found = sorted(f"{p.field}: {p.message}" for p in cat.problems)
    assert found == [
        "parameters_schema.properties.a.pattern: "
        "uses negative lookahead/lookbehind, which a linear-time matcher cannot run",
        "parameters_schema.properties.b.pattern: "
        "uses a backreference, which a linear-time matcher cannot run",
        "parameters_schema.properties.c.patternProperties: "
        "'(?<=a)b' uses lookahead/lookbehind, which a linear-time matcher cannot run",
        "parameters_schema.unevaluatedProperties: "
        "cannot be used with patternProperties; use additionalProperties",
    ]


def test_a_path_pattern_that_needs_backtracking_is_a_catalog_problem(paths: StatePaths) -> None:
    entry = _decl(
        **{
            "class": "scoped-fs-write",
            "fs_write": {
                "write_root": "/var/lib/sensorium-test",
                "max_bytes_total": 1024,
                "max_bytes_per_file": 1024,
                "path_pattern": "(?P<d>[a-z]+)/(?P=d)",
            },
        }
    )
    cat = _load_with(paths, entry)
    assert [(p.field, p.message) for p in cat.problems if p.field != "fs_write.write_root"] == [
        (
            "fs_write.path_pattern",
            "uses a backreference, which a linear-time matcher cannot run",
        )
    ]


def test_the_factory_catalog_loads_with_its_patterns(paths: StatePaths) -> None:
    cat = catalog.load(paths)
    assert cat.valid, cat.problems


# --- the factory's path guard ------------------------------------------------------------------


def _factory_path_schema() -> dict[str, Any]:
    factory = json.loads(catalog.factory_text())
    [stat] = [d for d in factory["action_catalog"] if d["action_id"] == "demo.fs.stat"]
    schema: dict[str, Any] = stat["parameters_schema"]
    return schema


@pytest.mark.parametrize(
    "path",
    [
        "//proc/self/environ",  # before: accepted, and the kernel reads /proc/self/environ
        "/./proc/self/environ",
        "/etc/../proc/self/environ",
        "/proc",
        "/proc/",
        "/sys/kernel/notes",
        "/etc/./passwd",
        "/etc/..",
        "relative",
    ],
)
def test_the_factory_guard_refuses_proc_sys_and_unnormalized_paths(path: str) -> None:
    validator = parameters_validator(_factory_path_schema())
    assert list(validator.iter_errors({"path": path})), path


@pytest.mark.parametrize("path", ["/", "/etc/hostname", "/etc/", "/processes", "/a/.hidden"])
def test_the_factory_guard_keeps_ordinary_paths(path: str) -> None:
    assert not list(parameters_validator(_factory_path_schema()).iter_errors({"path": path}))


def test_the_engine_refuses_what_it_cannot_bound() -> None:
    assert patterns.problem("^[a-z]{1,4096}$") is not None  # a length is maxLength's job
    assert patterns.problem("(?i)abc") == "uses inline flags, which are not supported"
    assert patterns.compile("^(a+)+$").fullmatch("a" * 10_000) is True
    assert patterns.compile("a$").search("a\n") is None  # $ is the end, as in RE2
