"""Seed 048 / ADR-002 rules of the catalog (issue 18): policy layering, `/usr/bin/env`
interpreters pinned at load, the seed's example catalog, parameters-schema-invalid,
executables resolved at load, and connector_id checked."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sensorium.connectors.os.catalog import interpreters
from sensorium.connectors.os.catalog import sources as catalog
from sensorium.connectors.os.catalog.authorization import (
    Authorizer,
    node_signer,
    sign,
    verify,
    write_sidecar,
)
from sensorium.connectors.os.catalog.report import build_report
from sensorium.connectors.os.catalog.sources import Catalog
from sensorium.connectors.os.envelope.probe import Runtime
from sensorium.shared.config import NodeConfig
from sensorium.shared.keys import node_key
from sensorium.shared.paths import StatePaths

NO_PARAMS = {"type": "object", "properties": {}, "additionalProperties": False}
PYTHON = "/usr/bin/python3"


@pytest.fixture
def paths(tmp_path: Path) -> StatePaths:
    p = StatePaths(tmp_path / "state")
    p.ensure()
    return p


@pytest.fixture
def var_dir() -> Iterator[Path]:
    """A real directory outside /tmp (an action sees /tmp as its own empty scratch)."""
    root = Path(tempfile.mkdtemp(dir="/var/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _decl(action_id: str = "test.one", **fields: Any) -> dict[str, Any]:
    return {
        "action_id": action_id,
        "class": "read-only-spawn",
        "executable": {"kind": "binary", "path": "/usr/bin/true", "argv_shape": ["true"]},
        "parameters_schema": NO_PARAMS,
        **fields,
    }


def _script(root: Path, first: str = "python3", **fields: Any) -> dict[str, Any]:
    """The seed's C2 shape: `"interpreter": "/usr/bin/env"`, the program named first."""
    script = root / "refine.py"
    script.write_text("print('{}')\n")
    return _decl(
        **{"class": "allowlisted-script"},
        executable={
            "kind": "script",
            "path": str(script),
            "interpreter": "/usr/bin/env",
            "argv_shape": [first, str(script), "--params-json", "{{params_json}}"],
        },
        script={"allowed_roots": [str(root)]},
        **fields,
    )


def _merge(*docs: dict[str, Any]) -> Catalog:
    return catalog.merge([(f"s{i}", json.dumps(d).encode()) for i, d in enumerate(docs)], [])


def _doc(*decls: dict[str, Any], policy: dict[str, Any] | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {"schema": "sensorium-os-config.v1", "action_catalog": list(decls)}
    if policy is not None:
        doc["policy"] = policy
    return doc


# --- item 3: policy layering (ADR-002) -----------------------------------------------------

OPERATOR_POLICY = {
    "schemaVersion": 2,
    "fsProfiles": {"tools": {"read": ["/usr/**"]}},
    "denyRead": ["/root/**", "**/*.env"],
    "denyModify": ["/etc/**"],
}


def _with_files(paths: StatePaths, operator: dict[str, Any], dropin: dict[str, Any]) -> Catalog:
    catalog.operator_file(paths).parent.mkdir(parents=True, exist_ok=True)
    catalog.operator_file(paths).write_text(json.dumps(operator))
    catalog.dropin_dir(paths).mkdir(parents=True, exist_ok=True)
    (catalog.dropin_dir(paths) / "50-extra.json").write_text(json.dumps(dropin))
    return catalog.load(paths, materialize_defaults=False)


def test_a_dropin_that_only_adds_a_profile_keeps_the_operators_denies(paths: StatePaths) -> None:
    extra = {"schemaVersion": 2, "fsProfiles": {"extra": {"read": ["/opt/**"]}}}
    cat = _with_files(
        paths,
        _doc(_decl(fs_profile="tools"), policy=OPERATOR_POLICY),
        _doc(_decl("test.two", fs_profile="extra"), policy=extra),
    )
    assert cat.valid, cat.problems
    assert cat.policy.denyRead == ["/root/**", "**/*.env"]
    assert cat.policy.denyModify == ["/etc/**"]
    assert set(cat.policy.fsProfiles) == {"tools", "extra"}
    # What is signed is the layered policy: the denies are in the effective config.
    assert cat.config["policy"]["denyRead"] == ["/root/**", "**/*.env"]


def test_profiles_override_by_name_and_denies_accumulate(paths: StatePaths) -> None:
    later = {
        "schemaVersion": 2,
        "fsProfiles": {"tools": {"read": ["/opt/**"]}},
        "denyRead": ["/srv/secret/**", "/root/**"],
    }
    cat = _with_files(
        paths, _doc(_decl(fs_profile="tools"), policy=OPERATOR_POLICY), _doc(policy=later)
    )
    assert cat.valid, cat.problems
    assert cat.policy.fsProfiles["tools"].read == ["/opt/**"]  # the drop-in's, by name
    assert cat.policy.denyRead == ["/root/**", "**/*.env", "/srv/secret/**"]  # every source's


def test_a_single_policy_is_taken_as_written(paths: StatePaths) -> None:
    cat = _merge(_doc(_decl(), policy=OPERATOR_POLICY))
    assert cat.config["policy"] == OPERATOR_POLICY


def test_a_bad_dropin_policy_is_reported_against_its_own_file(paths: StatePaths) -> None:
    cat = _with_files(
        paths,
        _doc(_decl(), policy=OPERATOR_POLICY),
        _doc(policy={"schemaVersion": 1}),
    )
    assert not cat.valid
    assert {p.source for p in cat.problems} == {str(catalog.dropin_dir(paths) / "50-extra.json")}


# --- item 7: "interpreter": "/usr/bin/env", resolved once at load --------------------------


def test_env_python3_resolves_on_the_fixed_path_and_is_pinned(
    var_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Whatever $PATH says: a python3 found first there is not the one pinned.
    decoy = var_dir / "bin"
    decoy.mkdir()
    (decoy / "python3").write_text("#!/bin/sh\n")
    (decoy / "python3").chmod(0o755)
    monkeypatch.setenv("PATH", f"{decoy}:{os.environ.get('PATH', '')}")
    cat = _merge(_doc(_script(var_dir)))
    assert cat.valid, cat.problems
    real = os.path.realpath(PYTHON)
    pin = cat.pins["test.one"]
    assert (pin.declared, pin.name, pin.path) == ("/usr/bin/env", "python3", real)
    assert pin.sha256 == hashlib.sha256(Path(real).read_bytes()).hexdigest()
    # The spawn runs the resolved program directly, never env.
    assert cat.declarations["test.one"].executable.interpreter == real
    # The signed configuration is what the operator wrote.
    assert cat.config["action_catalog"][0]["executable"]["interpreter"] == "/usr/bin/env"


@pytest.mark.parametrize(
    ("first", "why"),
    [
        ("-S", "not a plain program name"),
        ("A=b", "not a plain program name"),
        ("/usr/bin/python3", "not a plain program name"),
        ("sensorium-no-such-interpreter", "/usr/local/bin:/usr/bin:/bin"),
        ("bash", "is a shell"),
        ("nice", "is a launcher"),
    ],
)
def test_env_with_anything_but_a_plain_program_is_refused(
    var_dir: Path, first: str, why: str
) -> None:
    cat = _merge(_doc(_script(var_dir, first)))
    assert not cat.valid and not cat.pins
    messages = [p.message for p in cat.problems if p.field == "executable.interpreter"]
    assert len(messages) == 1 and why in messages[0], cat.problems


def test_env_as_a_binary_is_still_a_launcher(var_dir: Path) -> None:
    exe = {"kind": "binary", "path": "/usr/bin/env", "argv_shape": ["env", "true"]}
    cat = _merge(_doc(_decl(executable=exe)))
    assert any("launcher" in p.message for p in cat.problems)


def test_a_pinned_interpreter_that_changes_stops_the_authorization(
    paths: StatePaths, var_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bindir = var_dir / "bin"
    bindir.mkdir()
    fake = bindir / "python3"
    shutil.copy("/usr/bin/true", fake)
    monkeypatch.setattr(interpreters, "SEARCH_PATH", (str(bindir),))
    catalog.dropin_dir(paths).mkdir(parents=True, exist_ok=True)
    (catalog.dropin_dir(paths) / "50-env.json").write_text(json.dumps(_doc(_script(var_dir))))
    cat = catalog.load(paths)
    assert cat.valid, cat.problems
    assert cat.pins["test.one"].path == str(fake)
    pair = node_key(paths, create=True)
    assert pair is not None
    write_sidecar(paths, sign(cat.config_hash, pair, node_signer(pair)), cat.config)
    authz = Authorizer(paths, cat, verify(paths, NodeConfig(), cat.config_hash))
    assert authz.check().authorized
    with fake.open("ab") as f:
        f.write(b"\0changed")
    verdict = authz.check()
    assert not verdict.authorized and verdict.reason == "hash-mismatch"
    assert "pinned interpreter changed" in verdict.message and str(fake) in verdict.message


def test_the_seeds_own_example_catalog_loads(var_dir: Path) -> None:
    """Seed 048's "three hand-declared actions", placeholders filled with real paths."""
    scripts = var_dir / "scripts"
    scripts.mkdir()
    workspace = var_dir / "workspace"
    workspace.mkdir()
    script = scripts / "run.py"
    script.write_text("print('{}')\n")
    env_script = {
        "kind": "script",
        "path": str(script),
        "interpreter": "/usr/bin/env",
        "argv_shape": ["python3", str(script), "--params-json", "{{params_json}}"],
    }
    example = {
        "action_catalog": [
            {
                "action_id": "node.fetch.remote-refs",
                "class": "read-only-spawn",
                "group": "publishing",
                "description": "Fetches remote references for a named working tree.",
                "executable": {
                    "kind": "binary",
                    "path": "/usr/bin/true",
                    "argv_shape": [
                        *("true", "--op", "fetch", "--path", "{{workspace}}"),
                        *("--ref", "{{ref}}"),
                    ],
                },
                "parameters_schema": {
                    "type": "object",
                    "required": ["workspace", "ref"],
                    "properties": {
                        "workspace": {"type": "string", "minLength": 1},
                        "ref": {"type": "string", "pattern": "^[A-Za-z0-9._/-]+$"},
                    },
                    "additionalProperties": False,
                },
                "default_timeout_ms": 30000,
                "max_timeout_ms": 60000,
                "limits": {"stdout_max_bytes": 65536, "stderr_max_bytes": 65536},
                "environment": {"inherit": False, "set": {}},
                "result_contract": {
                    "stdout_format": "text",
                    "signal_kind": "ai.orbiplex.os/fetch-result",
                    "signal_family": "os/fetch-result",
                },
            },
            {
                "action_id": "node.text.refine-local",
                "class": "allowlisted-script",
                "group": "research",
                "executable": env_script,
                "script": {"allowed_roots": [str(scripts)]},
                "parameters_schema": {
                    "type": "object",
                    "required": ["input_path"],
                    "properties": {
                        "input_path": {"type": "string", "minLength": 1},
                        "max_tokens": {"type": "integer", "minimum": 1, "maximum": 4096},
                    },
                    "additionalProperties": False,
                },
                "default_timeout_ms": 45000,
                "max_timeout_ms": 120000,
                "limits": {"stdout_max_bytes": 262144, "stderr_max_bytes": 65536},
                "environment": {"inherit": False, "set": {"NODE_MODEL_HOME": str(var_dir)}},
                "result_contract": {
                    "stdout_format": "json",
                    "result_pointer_fields": ["revision_path", "token_count"],
                    "signal_kind": "ai.orbiplex.os/text-refined",
                    "signal_family": "os/text-refined",
                },
            },
            {
                "action_id": "node.workspace.compose-and-publish",
                "class": "composed-spawn",
                "group": "publishing",
                "composed": {"effects": ["scoped-fs-write", "egress-network"]},
                "executable": env_script,
                "script": {"allowed_roots": [str(scripts)]},
                "signing": {
                    "allowed_domains": ["git.commit.v1"],
                    "key_ref": {"kind": "primary-participant"},
                    "max_signatures": 1,
                },
                "fs_write": {
                    "write_root": str(workspace),
                    "max_bytes_total": 8388608,
                    "max_bytes_per_file": 1048576,
                },
                "egress_network": {
                    "endpoints": [
                        {"host": "publish.example.org", "port": 443, "protocol": "https"}
                    ],
                    "max_bytes_total": 4194304,
                    "max_bytes_per_connection": 4194304,
                },
                "parameters_schema": {
                    "type": "object",
                    "required": ["workspace", "source_path", "endpoint_ref"],
                    "properties": {
                        "workspace": {"type": "string", "minLength": 1},
                        "source_path": {"type": "string", "minLength": 1},
                        "endpoint_ref": {"type": "string", "minLength": 1},
                    },
                    "additionalProperties": False,
                },
                "default_timeout_ms": 60000,
                "max_timeout_ms": 180000,
                "limits": {"stdout_max_bytes": 262144, "stderr_max_bytes": 131072},
                "environment": {"inherit": False, "set": {}},
                "result_contract": {
                    "stdout_format": "json",
                    "result_pointer_fields": ["artifact_ref", "endpoint_response_hash"],
                    "signal_kind": "ai.orbiplex.os/workspace-published",
                    "signal_family": "os/workspace-published",
                },
            },
        ]
    }
    cat = _merge(example)
    assert cat.valid, [str(p) for p in cat.problems]
    assert set(cat.pins) == {"node.text.refine-local", "node.workspace.compose-and-publish"}


# --- item 9: parameters-schema-invalid ------------------------------------------------------


def test_an_invalid_parameters_schema_is_reported_per_action_with_its_code() -> None:
    bad = _decl("test.bad", parameters_schema={"type": "object", "properties": 5})
    cat = _merge(_doc(_decl(), bad))
    assert not cat.valid
    [problem] = cat.problems
    assert (problem.action_id, problem.field) == ("test.bad", "parameters_schema")
    assert problem.code == "parameters-schema-invalid"
    report = build_report(
        cat,
        verify_missing(),
        "instance",
        "2026-01-01T00:00:00Z",
        lambda d: ("enabled", []),
        Runtime(root=False, landlock_abi=0, seccomp=False, overlay=False),
    )
    codes = [(d.code, d.path) for d in report.diagnostics]
    assert ("parameters-schema-invalid", "parameters_schema") in codes
    [coded] = [d for d in report.diagnostics if d.code == "parameters-schema-invalid"]
    assert "[test.bad]" in coded.message
    # The catalog as a whole is still refused, as every invalid catalog is.
    assert "catalog-invalid" in {c for c, _ in codes} and not report.catalog_exposed


def verify_missing() -> Any:
    from sensorium.connectors.os.catalog.authorization import Verdict

    return Verdict(True, "ok", "signed")


# --- item 10: an executable that cannot be resolved refuses the catalog --------------------


def test_unresolvable_executables_refuse_the_catalog_with_every_problem() -> None:
    gone = {"kind": "binary", "path": "/usr/bin/sensorium-no-such-tool", "argv_shape": ["t"]}
    also = {"kind": "binary", "path": "/opt/sensorium-none/tool", "argv_shape": ["t"]}
    cat = _merge(
        _doc(
            _decl("test.ok"),
            _decl("test.gone", executable=gone),
            _decl("test.also", executable=also),
            _decl("test.bad", parameters_schema={"type": "string"}),
        )
    )
    assert not cat.valid
    assert {p.action_id for p in cat.problems} == {"test.gone", "test.also", "test.bad"}
    assert any(
        "sensorium-no-such-tool is missing or not executable" in p.message for p in cat.problems
    )
    assert "test.gone" not in cat.declarations


def test_a_file_that_is_not_executable_is_refused(var_dir: Path) -> None:
    plain = var_dir / "tool"
    plain.write_text("")
    exe = {"kind": "binary", "path": str(plain), "argv_shape": ["tool"]}
    cat = _merge(_doc(_decl(executable=exe)))
    assert [p.field for p in cat.problems] == ["executable.path"]


# --- item 12: connector_id -------------------------------------------------------------------


def test_a_declaration_for_another_connector_is_refused_naming_both() -> None:
    cat = _merge(_doc(_decl(connector_id="sensorium-web")))
    [problem] = cat.problems
    assert problem.field == "connector_id"
    assert "'sensorium-web'" in problem.message and "'sensorium-os'" in problem.message
    assert _merge(_doc(_decl(connector_id="sensorium-os"))).valid
