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

import psutil
import pytest
from harness import ACTION_PYTHON, DEFER_PROFILE, PROGRAMS, Stack, python_action, running_stack

from sensorium.client.errors import ActionNotEnabled, ExecutionModeUnsupported, SensoriumError

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
    actions = [
        _cat("fc.strict"),
        _cat(
            "fc.opted",
            allow_fallback=["deny-glob"],
            execution_mode_support="either",
            deferred_profile=DEFER_PROFILE,
        ),
    ]
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
    # The outcome says what was given up, as the ledger does.
    (degraded,) = [d for d in out.diagnostics if d.code == "envelope-degraded"]
    assert "allow_fallback deny-glob" in degraded.message and "*.secret" in degraded.message


def test_a_degraded_action_is_never_run_deferred(stack: Stack, tree: Path) -> None:
    """Its declaration allows deferral, but a degraded run is one the caller sees."""
    with stack.client() as c, pytest.raises(ExecutionModeUnsupported) as refused:
        c.invoke("fc.opted", {"path": str(tree / "readme.txt")}, mode="async")
    assert "degraded" in str(refused.value)


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


# --- every action's resources are its own ------------------------------------------------

RESOURCE_PROGRAM = """import json, os, sys, time
mode = sys.argv[1]
if mode == "memory":
    try:
        hold = bytearray(1536 * 1024 * 1024)
        print(json.dumps({"held": len(hold)}))
    except MemoryError:
        print(json.dumps({"held": 0}))
elif mode == "hold-forks":
    kids = 0
    while True:
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        kids += 1
    open("/tmp/ready", "w").close()
    print(json.dumps({"kids": kids}), flush=True)
    time.sleep(float(sys.argv[2]))
elif mode == "one-fork":
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    print(json.dumps({"forked": True}))
elif mode == "inodes":
    made = 0
    try:
        for i in range(120_000):
            open(f"/tmp/f{i}", "w").close()
            made += 1
    except OSError:
        pass
    print(json.dumps({"made": made}))
elif mode == "many-files":
    made = 0
    try:
        for i in range(3000):
            open(f"e{i}", "w").close()
            made += 1
    except OSError:
        pass
    print(json.dumps({"made": made}))
"""


RESOURCE_WRITE_ROOT = Path(tempfile.mktemp(prefix="sensorium-fc-wr-", dir="/var/tmp"))


@pytest.fixture(scope="module")
def resources(tree: Path) -> Iterator[Stack]:
    path = PROGRAMS / "resources.py"
    path.write_text(RESOURCE_PROGRAM)
    path.chmod(0o755)
    wr = RESOURCE_WRITE_ROOT
    wr.mkdir(mode=0o755)
    wr.chmod(0o755)
    os.chown(wr, 65534, 65534)

    def act(aid: str, **extra: Any) -> dict[str, Any]:
        return python_action(
            aid,
            path.name,
            ["{{mode}}", "{{seconds}}"],
            {"mode": {"type": "string"}, "seconds": {"type": "string"}},
            result_contract={"stdout_format": "json"},
            **extra,
        )

    actions = [
        act("res.c1"),
        act("res.small", limits={"memory_max_bytes": 256 * 1024 * 1024}),
        {
            **act("res.c3"),
            "class": "scoped-fs-write",
            "fs_write": {
                "write_root": str(wr),
                "max_bytes_total": 65536,
                "max_bytes_per_file": 4096,
                "max_files": 100,
            },
        },
    ]
    with running_stack(actions) as s:
        yield s
    shutil.rmtree(wr, ignore_errors=True)


def test_an_action_cannot_hold_more_memory_than_its_cap(resources: Stack) -> None:
    with resources.client() as c:
        out = c.invoke("res.small", {"mode": "memory", "seconds": "0"})
    assert out.result is not None and out.result.json == {"held": 0}, out.stdout.text


def test_a_fork_bomb_in_one_action_leaves_others_able_to_fork(resources: Stack) -> None:
    """RLIMIT_NPROC is counted per user namespace, and every action has its own."""
    import threading

    held: dict[str, Any] = {}

    def hold() -> None:
        with resources.client() as c:
            held["out"] = c.invoke("res.c1", {"mode": "hold-forks", "seconds": "3"})

    t = threading.Thread(target=hold)
    t.start()
    try:
        resources.action_pid("resources.py hold-forks")
        # Wait (by count of processes, not time) until the holder reached its limit.
        for _ in range(2000):
            n = sum(
                1
                for p in psutil.process_iter(["cmdline"])
                if "hold-forks" in " ".join(p.info["cmdline"] or [])
            )
            if n >= 200:
                break
        with resources.client() as c:
            other = c.invoke("res.c1", {"mode": "one-fork", "seconds": "0"})
        assert other.status == "completed", (other.stderr.text, other.diagnostics)
        assert other.result is not None and other.result.json == {"forked": True}
    finally:
        t.join(60)
    out = held["out"]
    assert out.result is not None and out.result.json["kids"] < 256, out.stdout.text


def test_a_scratch_has_an_inode_cap(resources: Stack) -> None:
    with resources.client() as c:
        out = c.invoke("res.c1", {"mode": "inodes", "seconds": "0"})
    assert out.result is not None
    assert out.result.json["made"] <= 65536, out.result.json  # 64 MiB scratch / 1 KiB


def test_a_c3_run_past_its_file_count_commits_nothing(resources: Stack) -> None:
    with resources.client() as c:
        out = c.invoke("res.c3", {"mode": "many-files", "seconds": "0"})
    assert out.result is not None and out.result.json["made"] < 3000, out.result.json
    assert out.status == "failed", out.diagnostics
    assert "envelope-violation" in [d.code for d in out.diagnostics], out.diagnostics
    assert list(RESOURCE_WRITE_ROOT.iterdir()) == [], "a capped run committed files"
