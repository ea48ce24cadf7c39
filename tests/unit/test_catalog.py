"""The OS connector's catalog: materialization, merging, validation, hashing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sensorium.connectors.os.catalog import sources as catalog
from sensorium.connectors.os.catalog.sources import Catalog, Problem
from sensorium.shared.paths import StatePaths
from sensorium.shared.wire.declaration import Declaration

FACTORY_IDS = {
    "demo.fs.list-directory",
    "demo.fs.read-head",
    "demo.fs.hash-file",
    "demo.fs.stat",
    "demo.system.uptime",
    "demo.fs.find-large",
}


@pytest.fixture
def paths(tmp_path: Path) -> StatePaths:
    p = StatePaths(tmp_path / "state")
    p.ensure()
    return p


def _decl(action_id: str = "test.echo", **fields: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "action_id": action_id,
        "class": "read-only-spawn",
        "executable": {"kind": "binary", "path": "/usr/bin/true", "argv_shape": ["true"]},
        "parameters_schema": {"type": "object", "properties": {}, "additionalProperties": False},
    }
    entry.update(fields)
    return entry


def _dropin(paths: StatePaths, name: str, entries: list[dict[str, Any]]) -> Path:
    d = catalog.dropin_dir(paths)
    d.mkdir(parents=True, exist_ok=True)
    path = d / name
    path.write_text(json.dumps({"schema": "sensorium-os-config.v1", "action_catalog": entries}))
    return path


def _load_with(paths: StatePaths, *entries: dict[str, Any]) -> Catalog:
    catalog.materialize(paths)
    _dropin(paths, "50-test.json", list(entries))
    return catalog.load(paths)


def _problems_for(cat: Catalog, action_id: str) -> list[Problem]:
    return [p for p in cat.problems if p.action_id == action_id]


def _where(problem: Problem) -> str:
    return f"{problem.field} {problem.message}"


# --- materialization and the factory catalog --------------------------------------------


def test_first_load_materializes_factory_file(paths: StatePaths) -> None:
    cat = catalog.load(paths)
    target = paths.connectors_config / "sensorium-os.json"
    assert cat.materialized is True
    assert target.read_bytes() == catalog.factory_text()
    assert catalog.dropin_dir(paths).is_dir()


def test_second_load_does_not_materialize_again(paths: StatePaths) -> None:
    catalog.load(paths)
    assert catalog.load(paths).materialized is False


def test_existing_operator_file_is_not_overwritten(paths: StatePaths) -> None:
    target = catalog.operator_file(paths)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps({"action_catalog": [_decl()]}))
    cat = catalog.load(paths)
    assert cat.materialized is False
    assert set(cat.declarations) == {"test.echo"}


def test_factory_catalog_is_valid_with_six_actions(paths: StatePaths) -> None:
    cat = catalog.load(paths)
    assert cat.valid, [str(p) for p in cat.problems]
    assert set(cat.declarations) == FACTORY_IDS
    assert cat.allow_unsigned_bootstrap is False


# --- merging ----------------------------------------------------------------------------


def test_dropins_add_actions_and_record_their_source(paths: StatePaths) -> None:
    catalog.materialize(paths)
    src = _dropin(paths, "10-extra.json", [_decl("test.extra")])
    cat = catalog.load(paths)
    assert cat.valid
    assert set(cat.declarations) == FACTORY_IDS | {"test.extra"}
    assert cat.sources["test.extra"] == str(src)
    assert cat.sources["demo.fs.stat"] == str(catalog.operator_file(paths))


def test_later_dropin_in_name_order_wins(paths: StatePaths) -> None:
    catalog.materialize(paths)
    late = _dropin(paths, "20-late.json", [_decl("test.echo", description="late")])
    _dropin(paths, "10-early.json", [_decl("test.echo", description="early")])
    cat = catalog.load(paths)
    assert cat.declarations["test.echo"].description == "late"
    assert cat.sources["test.echo"] == str(late)


def test_later_source_replaces_an_entry_whole(paths: StatePaths) -> None:
    catalog.materialize(paths)
    factory = catalog.load(paths).declarations["demo.fs.stat"]
    assert factory.result_contract.signal_kind is not None
    replacement = _decl("demo.fs.stat", description="mine")
    _dropin(paths, "10-stat.json", [replacement])
    cat = catalog.load(paths)
    decl = cat.declarations["demo.fs.stat"]
    assert decl.description == "mine"
    # Nothing of the factory entry survives: no deep merge.
    assert decl.result_contract.signal_kind is None
    assert decl.executable.path == "/usr/bin/true"
    assert decl.limits.stdout_max_bytes == 65536


def test_environment_and_limits_within_bounds_are_valid(paths: StatePaths) -> None:
    entry = _decl(
        "test.bounds",
        environment={"set": {"LC_ALL": "C", "_X1": ""}},
        limits={"stdout_max_bytes": 1024 * 1024, "stderr_max_bytes": 0},
    )
    cat = _load_with(paths, entry)
    assert cat.valid, [str(p) for p in cat.problems]
    assert cat.declarations["test.bounds"].environment.set == {"LC_ALL": "C", "_X1": ""}


@pytest.mark.parametrize(
    "environment",
    [{"set": {"1X": "v"}}, {"set": {"A B": "v"}}, {"set": {"": "v"}}, {"set": {"X": "a\0"}}],
)
def test_environment_rules_hold_in_the_wire_type_too(environment: dict[str, Any]) -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert(_decl(environment=environment), type=Declaration)


def test_output_limit_over_one_mib_is_refused_by_the_wire_type() -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert(_decl(limits={"stdout_max_bytes": 2 * 1024 * 1024}), type=Declaration)


def test_non_json_files_in_dropin_dir_are_ignored(paths: StatePaths) -> None:
    catalog.materialize(paths)
    (catalog.dropin_dir(paths) / "README.txt").write_text("{not json")
    assert catalog.load(paths).valid


# --- validation -------------------------------------------------------------------------


def test_duplicate_action_id_in_one_file_is_a_problem(paths: StatePaths) -> None:
    cat = _load_with(paths, _decl("test.dup"), _decl("test.dup"))
    assert not cat.valid
    (problem,) = _problems_for(cat, "test.dup")
    assert problem.field == "action_catalog[1].action_id"
    assert "duplicate" in problem.message


def test_same_action_id_in_two_files_is_not_a_duplicate(paths: StatePaths) -> None:
    catalog.materialize(paths)
    _dropin(paths, "10-a.json", [_decl("test.same")])
    _dropin(paths, "20-b.json", [_decl("test.same")])
    assert catalog.load(paths).valid


INVALID = [
    pytest.param(_decl("Bad_ID"), "Bad_ID", "action_id", id="action-id-uppercase"),
    pytest.param(_decl("nodots"), "nodots", "action_id", id="action-id-without-dot"),
    pytest.param(
        _decl("test.gated", **{"class": "operator-gated-spawn"}),
        "test.gated",
        "class",
        id="reserved-class",
    ),
    pytest.param(
        _decl("test.unknown", **{"class": "teleport"}), "test.unknown", "class", id="unknown-class"
    ),
    pytest.param(
        _decl("test.schema", parameters_schema={"type": 12}),
        "test.schema",
        "parameters_schema",
        id="invalid-json-schema",
    ),
    pytest.param(
        _decl("test.array", parameters_schema={"type": "array"}),
        "test.array",
        "parameters_schema.type",
        id="array-parameters",
    ),
    pytest.param(
        _decl("test.timeout", default_timeout_ms=5000, max_timeout_ms=1000),
        "test.timeout",
        "default_timeout_ms",
        id="default-over-max-timeout",
    ),
    pytest.param(
        _decl("test.signal", result_contract={"signal_kind": "Not A Kind"}),
        "test.signal",
        "signal_kind",
        id="bad-signal-kind",
    ),
    pytest.param(
        _decl("test.script", **{"class": "allowlisted-script"}),
        "test.script",
        "script",
        id="script-class-without-script-block",
    ),
    pytest.param(
        _decl("test.write", **{"class": "scoped-fs-write"}),
        "test.write",
        "fs_write",
        id="fs-write-class-without-fs-write-block",
    ),
    pytest.param(
        _decl(
            "test.composed",
            composed={"effects": ["read", "egress-network"]},
            **{"class": "composed-spawn"},
        ),
        "test.composed",
        "egress_network",
        id="composed-egress-without-block",
    ),
    pytest.param(
        _decl("test.extra", surprise=True), "test.extra", "surprise", id="unknown-top-level-field"
    ),
    pytest.param(
        _decl("test.env", environment={"set": {"BAD-NAME": "x"}}),
        "test.env",
        "environment.set",
        id="environment-name-not-an-identifier",
    ),
    pytest.param(
        _decl("test.env", environment={"set": {"=X": "x"}}),
        "test.env",
        "environment.set",
        id="environment-name-with-equals",
    ),
    pytest.param(
        _decl("test.env", environment={"set": {"X": "a\0b"}}),
        "test.env",
        "environment.set.X",
        id="environment-value-with-nul",
    ),
    pytest.param(
        _decl("test.cap", limits={"stdout_max_bytes": 1024 * 1024 + 1}),
        "test.cap",
        "limits.stdout_max_bytes",
        id="stdout-cap-over-one-mib",
    ),
    pytest.param(
        _decl("test.cap", limits={"stderr_max_bytes": 64 * 1024 * 1024}),
        "test.cap",
        "limits.stderr_max_bytes",
        id="stderr-cap-over-one-mib",
    ),
    pytest.param(
        _decl(
            "test.launcher",
            executable={
                "kind": "binary",
                "path": "/usr/bin/timeout",
                "argv_shape": ["timeout", "5", "cat", "/proc/uptime"],
            },
        ),
        "test.launcher",
        "executable.path",
        id="launcher-as-executable",
    ),
    pytest.param(
        _decl(
            "test.code",
            executable={
                "kind": "binary",
                "path": "/usr/bin/python3",
                "argv_shape": ["python3", "-c", "{{code}}"],
            },
            parameters_schema={"type": "object", "properties": {"code": {"type": "string"}}},
        ),
        "test.code",
        "executable.argv_shape[2]",
        id="caller-code-after-code-flag",
    ),
]


@pytest.mark.parametrize(("entry", "action_id", "field"), INVALID)
def test_invalid_declaration_is_reported(
    paths: StatePaths, entry: dict[str, Any], action_id: str, field: str
) -> None:
    cat = _load_with(paths, entry)
    assert not cat.valid
    problems = _problems_for(cat, action_id)
    assert problems, [str(p) for p in cat.problems]
    assert any(field in _where(p) for p in problems), [str(p) for p in problems]
    assert action_id not in cat.declarations


def test_malformed_json_file_is_reported(paths: StatePaths) -> None:
    catalog.materialize(paths)
    bad = catalog.dropin_dir(paths) / "10-broken.json"
    bad.write_text('{"action_catalog": [')
    cat = catalog.load(paths)
    assert not cat.valid
    (problem,) = cat.problems
    assert problem.source == str(bad)
    assert problem.action_id is None
    assert problem.field == "$"


def test_every_broken_declaration_is_reported(paths: StatePaths) -> None:
    cat = _load_with(
        paths,
        _decl("test.one", **{"class": "operator-gated-spawn"}),
        _decl("test.two", default_timeout_ms=9000, max_timeout_ms=10),
        _decl("test.three", parameters_schema={"type": "array"}),
        _decl("test.fine"),
    )
    assert {p.action_id for p in cat.problems} == {"test.one", "test.two", "test.three"}
    assert "test.fine" in cat.declarations


def test_every_problem_of_one_declaration_is_reported(paths: StatePaths) -> None:
    entry = _decl(
        "test.many",
        default_timeout_ms=9000,
        max_timeout_ms=10,
        parameters_schema={"type": "array"},
        **{"class": "operator-gated-spawn"},
    )
    cat = _load_with(paths, entry)
    fields = {p.field for p in _problems_for(cat, "test.many")}
    assert fields == {"class", "default_timeout_ms", "parameters_schema.type"}


def test_out_of_range_integer_is_a_problem_not_a_crash(paths: StatePaths) -> None:
    cat = _load_with(paths, _decl("test.huge", max_timeout_ms=2**60))
    assert _problems_for(cat, "test.huge")


def test_list_valued_parameter_type_does_not_crash_load(paths: StatePaths) -> None:
    entry = _decl(
        "test.nullable",
        executable={"kind": "binary", "path": "/usr/bin/cat", "argv_shape": ["cat", "{{v}}"]},
        parameters_schema={"type": "object", "properties": {"v": {"type": ["string", "null"]}}},
    )
    assert isinstance(_load_with(paths, entry), Catalog)


# --- the config hash --------------------------------------------------------------------


def _hash_with(root: Path, entry: dict[str, Any], *, reverse_keys: bool = False) -> str:
    paths = StatePaths(root)
    paths.ensure()
    catalog.materialize(paths)
    if reverse_keys:
        entry = dict(reversed(list(entry.items())))
    _dropin(paths, "10.json", [entry])
    return catalog.load(paths).config_hash


def test_config_hash_is_deterministic(tmp_path: Path) -> None:
    assert _hash_with(tmp_path / "a", _decl()) == _hash_with(tmp_path / "b", _decl())


def test_config_hash_ignores_key_order(tmp_path: Path) -> None:
    assert _hash_with(tmp_path / "a", _decl()) == _hash_with(
        tmp_path / "b", _decl(), reverse_keys=True
    )


def test_config_hash_changes_with_a_value(tmp_path: Path) -> None:
    assert _hash_with(tmp_path / "a", _decl()) != _hash_with(
        tmp_path / "b", _decl(default_timeout_ms=1234)
    )


def test_config_hash_is_stable_across_loads(paths: StatePaths) -> None:
    assert catalog.load(paths).config_hash == catalog.load(paths).config_hash


# --- executable_gap ---------------------------------------------------------------------


def _declaration(path: str) -> Declaration:
    return msgspec.convert(
        _decl(executable={"kind": "binary", "path": path, "argv_shape": ["x"]}), type=Declaration
    )


def test_executable_gap_names_a_missing_program() -> None:
    gap = catalog.executable_gap(_declaration("/nonexistent/sensorium-no-such-program"))
    assert gap is not None
    assert "/nonexistent/sensorium-no-such-program" in gap


def test_executable_gap_is_none_for_an_existing_program() -> None:
    assert catalog.executable_gap(_declaration("/usr/bin/true")) is None


# --- sensitivity and the observation contract (sensorium-observation.v1) -----------------

PUBLISHED_SENSITIVITY = (
    "public",
    "community",
    "operational-sensitive",
    "private",
    "sensitive-personal",
)


@pytest.mark.parametrize("word", ["secret", "operational"])
def test_a_sensitivity_outside_the_published_five_is_refused_naming_them(
    paths: StatePaths, word: str
) -> None:
    cat = _load_with(paths, _decl("test.secret", sensitivity={"class": word}))
    assert not cat.valid
    [problem] = _problems_for(cat, "test.secret")
    assert problem.field == "sensitivity.class"
    assert word in problem.message
    for accepted in PUBLISHED_SENSITIVITY:
        assert accepted in problem.message, problem.message


@pytest.mark.parametrize("word", PUBLISHED_SENSITIVITY)
def test_each_published_sensitivity_is_accepted(paths: StatePaths, word: str) -> None:
    cat = _load_with(paths, _decl("test.sensitive", sensitivity={"class": word}))
    assert cat.valid, [str(p) for p in cat.problems]


@pytest.mark.parametrize(
    "kind", ["release", "github-release", "com.apple.ios.accelerometer/x-axis"]
)
def test_a_signal_kind_the_published_pattern_allows_is_declarable(
    paths: StatePaths, kind: str
) -> None:
    cat = _load_with(paths, _decl("test.kind", result_contract={"signal_kind": kind}))
    assert cat.valid, [str(p) for p in cat.problems]


@pytest.mark.parametrize(
    "contract",
    [
        {"signal_kind": "a/b", "signal_family": "vendor.dotted/family"},  # a family has no dots
        {"result_pointer_fields": ["x"], "subject_kind": "host"},  # subject needs its pointer
        {"result_pointer_fields": ["x"], "subject_kind": "host", "subject_pointer": "y"},
    ],
    ids=["dotted-family", "subject-without-pointer", "subject-pointer-undeclared"],
)
def test_an_observation_contract_the_published_schema_refuses_is_refused(
    paths: StatePaths, contract: dict[str, Any]
) -> None:
    cat = _load_with(paths, _decl("test.contract", result_contract=contract))
    assert not cat.valid
    assert _problems_for(cat, "test.contract")
