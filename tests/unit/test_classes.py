"""Load-time class rules and the fs policy as part of the signed connector config."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sensorium.connectors.os.catalog import sources as catalog
from sensorium.connectors.os.catalog.sources import Problem

NO_PARAMS = {"type": "object", "properties": {}, "additionalProperties": False}


def _merge(*entries: dict[str, Any], policy: dict[str, Any] | None = None) -> list[Problem]:
    doc: dict[str, Any] = {"schema": "sensorium-os-config.v1", "action_catalog": list(entries)}
    if policy is not None:
        doc["policy"] = policy
    problems: list[Problem] = []
    cat = catalog.merge([("test", json.dumps(doc).encode())], problems)
    return cat.problems


def _decl(action_id: str = "test.one", **fields: Any) -> dict[str, Any]:
    return {
        "action_id": action_id,
        "class": "read-only-spawn",
        "executable": {"kind": "binary", "path": "/usr/bin/true", "argv_shape": ["true"]},
        "parameters_schema": NO_PARAMS,
        **fields,
    }


def _script(root: Path, **exe: Any) -> dict[str, Any]:
    path = str(root / "s.py")
    return _decl(
        class_="allowlisted-script",
        executable={
            "kind": "script",
            "path": path,
            "interpreter": "/usr/bin/python3",
            "argv_shape": ["python3", path, "--params-json", "{{params_json}}"],
            **exe,
        },
        script={"allowed_roots": [str(root)]},
    )


def _fields(problems: list[Problem]) -> set[str]:
    return {p.field for p in problems}


def _fix_class(entry: dict[str, Any]) -> dict[str, Any]:
    entry["class"] = entry.pop("class_", entry.get("class"))
    return entry


def test_paths_under_the_private_tmp_are_refused() -> None:
    problems = _merge(
        _decl(executable={"kind": "binary", "path": "/tmp/tool", "argv_shape": ["tool"]})
    )
    assert _fields(problems) == {"executable.path"}
    assert "own empty scratch" in problems[0].message


@pytest.fixture
def var_dir() -> Iterator[Path]:
    """A real directory not under /tmp (every action sees /tmp as its own empty scratch)."""
    root = Path(tempfile.mkdtemp(dir="/var/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_a_script_needs_its_interpreter_and_params_only_as_params_json(var_dir: Path) -> None:
    root = var_dir
    ok = _fix_class(_script(root))
    # The script must be there when the catalog loads (issue 18, item 10).
    assert [p.message for p in _merge(ok)] == [f"the script {root}/s.py is missing on this node"]
    (root / "s.py").write_text("print()\n")
    assert _merge(ok) == []
    no_interp = _fix_class(_script(root, interpreter=None))
    assert "executable.interpreter" in _fields(_merge(no_interp))
    shape = ["python3", str(root / "s.py"), "--x", "{{params_json}}"]
    wrong_flag = _fix_class(_script(root, argv_shape=shape))
    assert "executable.argv_shape[3]" in _fields(_merge(wrong_flag))
    outside = _fix_class(_script(root))
    outside["script"] = {"allowed_roots": ["/opt/elsewhere"]}
    assert "executable.path" in _fields(_merge(outside))


def test_policy_v1_is_rejected_with_a_migration_message() -> None:
    problems = _merge(_decl(), policy={"schemaVersion": 1, "rules": []})
    assert problems and all(p.field.startswith("policy") for p in problems)
    assert any("schemaVersion 2" in p.message for p in problems)


def test_an_unknown_fs_profile_is_a_load_error() -> None:
    policy = {"schemaVersion": 2, "fsProfiles": {"tools": {"read": ["/usr/**"]}}}
    assert _merge(_decl(fs_profile="tools"), policy=policy) == []
    problems = _merge(_decl(fs_profile="nope"), policy=policy)
    assert _fields(problems) == {"fs_profile"}


def test_the_policy_is_part_of_the_signed_effective_config() -> None:
    base = {"schema": "sensorium-os-config.v1", "action_catalog": [_decl()]}
    with_policy = {**base, "policy": {"schemaVersion": 2, "denyRead": ["/root/**"]}}
    a = catalog.merge([("t", json.dumps(base).encode())], [])
    b = catalog.merge([("t", json.dumps(with_policy).encode())], [])
    assert a.config_hash != b.config_hash
    assert b.config["policy"]["denyRead"] == ["/root/**"]
