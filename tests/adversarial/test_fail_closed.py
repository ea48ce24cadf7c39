"""Fail closed (ADR-011): a promise the kernel cannot keep stops the action, unless the
signed declaration gives it up by name — then the action is `degraded`, never `enabled`."""

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
from harness import ACTION_PYTHON, PROGRAMS, Stack, python_action, running_stack

from sensorium.client.errors import ActionNotEnabled, SensoriumError

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the envelopes need root here")


def _cat(action_id: str, **extra: Any) -> dict[str, Any]:
    path = PROGRAMS / "cat_file.py"
    path.write_text("import sys\nsys.stdout.write(open(sys.argv[1]).read())\n")
    path.chmod(0o755)
    return python_action(action_id, path.name, ["{{path}}"], {"path": {"type": "string"}}, **extra)


@pytest.fixture(scope="module")
def tree() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="sensorium-fc-", dir="/var/tmp"))
    d.chmod(0o755)
    (d / "app.secret").write_text("SECRET\n")
    (d / "app.secret").chmod(0o644)
    (d / "readme.txt").write_text("public\n")
    (d / "readme.txt").chmod(0o644)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def stack(tree: Path) -> Iterator[Stack]:
    policy = {
        "schema": "sensorium-os-config.v1",
        "action_catalog": [],
        "policy": {"schemaVersion": 2, "denyRead": ["**/*.secret"]},
    }
    actions = [_cat("fc.strict"), _cat("fc.opted", allow_fallback=["deny-glob"])]
    with running_stack(actions, {"60-policy": policy}) as s:
        yield s


def _ledger(stack: Stack) -> dict[str, Any]:
    res = stack.cli("ledger", "--json")
    assert res.returncode == 0, res.stderr
    return {e["capabilityRef"].rsplit(":", 1)[-1]: e for e in json.loads(res.stdout)["entries"]}


def test_a_deny_glob_the_kernel_cannot_hold_refuses_the_action(stack: Stack, tree: Path) -> None:
    entry = _ledger(stack)["fc.strict"]
    assert entry["effectiveState"] == "unsupported_by_runtime", entry
    assert any("**/*.secret" in r for r in entry["evidenceRefs"]), entry
    with stack.client() as c, pytest.raises(ActionNotEnabled):
        c.invoke("fc.strict", {"path": str(tree / "app.secret")})


def test_an_explicit_opt_in_runs_it_degraded_and_says_what_was_given_up(
    stack: Stack, tree: Path
) -> None:
    entry = _ledger(stack)["fc.opted"]
    assert entry["effectiveState"] == "degraded", entry
    assert any("allow_fallback deny-glob" in r for r in entry["evidenceRefs"]), entry
    with stack.client() as c:
        out = c.invoke("fc.opted", {"path": str(tree / "readme.txt")})
    assert out.status == "completed" and out.stdout.text == "public\n"


# --- every executable of every class is checked the C2 way -----------------------------


def _sha(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def scripts() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="sensorium-fc-scripts-", dir="/var/tmp"))
    d.chmod(0o755)
    (d / "ok.py").write_text("print('ran ok')\n")
    outside = Path(tempfile.mkdtemp(prefix="sensorium-fc-outside-", dir="/var/tmp"))
    outside.chmod(0o755)
    (outside / "evil.py").write_text("print('ran evil')\n")
    (d / "link.py").symlink_to(outside / "evil.py")
    (d / "swapped.py").write_text("print('signed bytes')\n")
    (d / "open.py").write_text("print('anyone may write me')\n")
    (d / "open.py").chmod(0o666)
    (d / "linked.py").write_text("print('hard')\n")
    os.link(d / "linked.py", outside / "other-name.py")
    yield d
    shutil.rmtree(d, ignore_errors=True)
    shutil.rmtree(outside, ignore_errors=True)


def _script_action(
    action_id: str, cls: str, root: Path, name: str, pin: str | None = None
) -> dict[str, Any]:
    path = str(root / name)
    decl: dict[str, Any] = {
        "action_id": action_id,
        "class": cls,
        "executable": {
            "kind": "script",
            "path": path,
            "interpreter": ACTION_PYTHON,
            "argv_shape": ["python3", path],
        },
        "script": {"allowed_roots": [str(root)]},
        "parameters_schema": {"type": "object"},
    }
    if pin:
        decl["executable"]["sha256"] = pin
    if cls == "artifact-producing-spawn":
        decl["artifact"] = {
            "max_count": 1,
            "max_bytes_per": 16,
            "max_bytes_total": 16,
            "allowed_media_types": ["text/plain"],
        }
    return decl


@pytest.fixture(scope="module")
def pinned(scripts: Path) -> Iterator[Stack]:
    c5 = "artifact-producing-spawn"
    actions = [
        python_action("pin.c1-right", "cat_file.py", ["{{path}}"], {"path": {"type": "string"}}),
        python_action("pin.c1-wrong", "cat_file.py", ["{{path}}"], {"path": {"type": "string"}}),
        _script_action("pin.c5-ok", c5, scripts, "ok.py", _sha(scripts / "ok.py")),
        _script_action("pin.c5-link", c5, scripts, "link.py"),
        _script_action("pin.c5-swapped", c5, scripts, "swapped.py", _sha(scripts / "swapped.py")),
        _script_action("pin.c5-open", c5, scripts, "open.py"),
        _script_action("pin.c5-hardlink", c5, scripts, "linked.py"),
    ]
    actions[0]["executable"]["sha256"] = _sha(os.path.realpath(ACTION_PYTHON))
    actions[1]["executable"]["sha256"] = "0" * 64
    _cat("unused")  # writes cat_file.py
    with running_stack(actions) as s:
        # After signing: the bytes change under the pin.
        (scripts / "swapped.py").write_text("print('swapped after signing')\n")
        yield s


def _run(stack: Stack, action_id: str, params: dict[str, Any] | None = None) -> Any:
    with stack.client() as c:
        return c.invoke(action_id, params or {})


def test_a_pinned_binary_runs_from_the_bytes_it_was_checked_on(pinned: Stack) -> None:
    out = _run(pinned, "pin.c1-right", {"path": "/etc/hostname"})
    assert out.status == "completed", (out.stderr.text, out.diagnostics)


def _refused(stack: Stack, action_id: str, params: dict[str, Any] | None = None) -> Any:
    with stack.client() as c, pytest.raises(SensoriumError) as info:
        c.invoke(action_id, params or {})
    return info.value


def test_a_binary_pin_that_does_not_match_refuses_the_run_in_any_class(pinned: Stack) -> None:
    err = _refused(pinned, "pin.c1-wrong", {"path": "/etc/hostname"})
    assert err.code == "script-hash-mismatch", (err.code, err.message)


@pytest.mark.parametrize(
    ("action_id", "code"),
    [
        ("pin.c5-link", "working-directory-forbidden"),
        ("pin.c5-swapped", "script-hash-mismatch"),
        ("pin.c5-open", "working-directory-forbidden"),
        ("pin.c5-hardlink", "working-directory-forbidden"),
    ],
)
def test_a_script_of_any_class_is_held_to_the_c2_rules(
    pinned: Stack, action_id: str, code: str
) -> None:
    err = _refused(pinned, action_id)
    assert err.code == code, (err.code, err.message)


def test_a_pinned_script_of_another_class_runs_sealed(pinned: Stack) -> None:
    out = _run(pinned, "pin.c5-ok")
    assert out.status == "completed", (out.stderr.text, out.diagnostics)
    assert out.stdout.text == "ran ok\n"
