"""Filesystem escapes from inside the kernel envelope of C1, C2, C3 and C5, end to end.

Each test runs a hostile program as a real action and asserts twice: the program's
own report says the attempt failed (with the errno it got), and what lies outside
the envelope (a canary tree, write_root, the artifact lane, /etc/passwd, the
connector process) is exactly as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from harness import ACTION_PYTHON, PROGRAMS, Stack, python_action, running_stack

from sensorium.client import SensoriumError
from sensorium.connectors.os.run.sandbox.script import ScriptError, seal
from sensorium.shared.diagnostics import OsErrorCode
from sensorium.shared.wire.outcome import Outcome

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the kernel envelopes need root here")

SANDBOX_UID = 65534
NO_PARAMS: dict[str, Any] = {"type": "object", "additionalProperties": False}
PREFIX = "escfs"
# Every probe program starts with this: it records each attempt's errno, never raises.
PRELUDE = """\
import errno, json, os, sys, time
report = {}
def attempt(name, fn):
    try:
        value = fn()
    except OSError as exc:
        report[name] = {"ok": False, "errno": errno.errorcode.get(exc.errno, str(exc.errno))}
    else:
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        report[name] = {"ok": True, "value": value if isinstance(value, (str, int, list)) else None}
def read(path):
    with open(path, "rb") as f:
        return f.read()
def write(path, data, mode="wb"):
    with open(path, mode) as f:
        return f.write(data)
"""
DONE = "print(json.dumps(report))\n"
DENIED = {"EACCES", "EPERM", "EXDEV", "EROFS"}
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108020000009077"
    "53de0000000c4944415408d763f8ffff3f0005fe02fea7d6a4bd0000000049454e44ae426082"
)


# --- fixtures' helpers ------------------------------------------------------------------


def _dir(prefix: str, mode: int = 0o755, owner: int | None = None) -> Path:
    d = Path(tempfile.mkdtemp(prefix=f"sensorium-{prefix}-", dir="/var/tmp"))
    d.chmod(mode)
    if owner is not None:
        os.chown(d, owner, owner)
    return d


def _file(path: Path, data: bytes, mode: int = 0o644, owner: int | None = None) -> Path:
    path.write_bytes(data)
    path.chmod(mode)
    if owner is not None:
        os.chown(path, owner, owner)
    return path


def _action(
    action_id: str, code: str, params: dict[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    """A declaration running PRELUDE + ``code`` from a world-readable file.

    ``params`` name string parameters passed as argv[1:], in order.
    """
    path = PROGRAMS / f"{action_id.replace('.', '_')}.py"
    path.write_text(PRELUDE + code + DONE)
    path.chmod(0o755)
    names = list(params or {})
    decl = python_action(action_id, path.name, [f"{{{{{n}}}}}" for n in names], params, **extra)
    if not names:
        decl["parameters_schema"] = NO_PARAMS
    decl["default_timeout_ms"] = extra.get("default_timeout_ms", 5000)
    decl["max_timeout_ms"] = extra.get("max_timeout_ms", 10_000)
    return decl


def _script(action_id: str, root: Path, path: str, sha256: str | None = None) -> dict[str, Any]:
    """An allowlisted-script declaration for ``path`` under the script root ``root``."""
    exe: dict[str, Any] = {
        "kind": "script",
        "path": path,
        "interpreter": ACTION_PYTHON,
        "argv_shape": ["python3", path, "--params-json", "{{params_json}}"],
    }
    if sha256 is not None:
        exe["sha256"] = sha256
    return {
        "action_id": action_id,
        "class": "allowlisted-script",
        "executable": exe,
        "script": {"allowed_roots": [str(root)]},
        "parameters_schema": NO_PARAMS,
        "default_timeout_ms": 5000,
        "max_timeout_ms": 10_000,
    }


def snapshot(root: Path) -> dict[str, tuple[Any, ...]]:
    """Everything observable about a tree: type, owner, mode, size, mtime, bytes, xattrs."""
    out: dict[str, tuple[Any, ...]] = {}
    for path in [root, *sorted(root.rglob("*"))]:
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            body: Any = os.readlink(path)
        elif stat.S_ISREG(st.st_mode):
            body = path.read_bytes()
        elif stat.S_ISDIR(st.st_mode):
            body = sorted(os.listdir(path))
        else:
            body = None
        try:
            xattrs = sorted(os.listxattr(path, follow_symlinks=False))
        except OSError:
            xattrs = []
        out[str(path.relative_to(root))] = (
            st.st_mode,
            st.st_uid,
            st.st_gid,
            st.st_size,
            st.st_mtime_ns,
            st.st_nlink,
            body,
            xattrs,
        )
    return out


def lane_files(stack: Stack) -> dict[str, bytes]:
    lane = stack.paths.root / "artifacts"
    return {
        str(p.relative_to(lane)): p.read_bytes()
        for p in sorted(lane.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def report(out: Outcome) -> dict[str, Any]:
    """The probe program's JSON report (its last stdout line)."""
    assert out.stdout.text.strip(), (out.status, out.stderr.text, out.diagnostics)
    doc: dict[str, Any] = json.loads(out.stdout.text.strip().splitlines()[-1])
    return doc


def violations(out: Outcome) -> list[str]:
    return [d.message for d in out.diagnostics if d.code == "envelope-violation"]


def _failed(entry: dict[str, Any], allowed: set[str] = DENIED) -> bool:
    return not entry["ok"] and entry["errno"] in allowed


class World:
    """Every fixture the actions see, outside /tmp, and cleaned up afterwards."""

    def __init__(self) -> None:
        self.dirs: list[Path] = []
        token = secrets.token_hex(8)
        # C1: world-writable, so only the sandbox (never DAC) stands in the way.
        self.canary = self._mk("canary", 0o777)
        self.victim = _file(self.canary / "victim.txt", b"canary bytes\n", 0o666)
        # And a tree the sandbox uid owns (as it owns every C3 write root).
        self.owned = self._mk("owned", owner=SANDBOX_UID)
        for op in META_OPS:
            _file(self.canary / f"meta-{op}", f"meta {op}\n".encode(), 0o666)
            _file(self.owned / f"meta-{op}", f"meta {op}\n".encode(), owner=SANDBOX_UID)
        for d in (self.canary, self.owned):
            os.setxattr(d / "meta-removexattr", "user.keep", b"1")
        # Reads: a world-readable file no profile grants, and a granted tree with holes.
        self.outside = self._mk("outside")
        self.outside_secret = f"OUTSIDE-{token}".encode()
        _file(self.outside / "world.txt", self.outside_secret)
        self.granted = self._mk("granted")
        self.allowed_bytes = f"ALLOWED-{token}".encode()
        self.masked_bytes = f"MASKED-{token}".encode()
        _file(self.granted / "allowed.txt", self.allowed_bytes)
        _file(self.granted / "secret.txt", self.masked_bytes + b"-file")
        (self.granted / "secret").mkdir(mode=0o755)
        _file(self.granted / "secret" / "inner.txt", self.masked_bytes + b"-dir")
        # C2: a script root with ways out of it, and what they lead to.
        self.marker = f"SCRIPT-ESCAPED-{token}"
        self.elsewhere = self._mk("elsewhere")
        _file(self.elsewhere / "evil.py", f"print({self.marker!r})\n".encode())
        self.scripts = self._mk("scripts")
        (self.scripts / "link.py").symlink_to(self.elsewhere / "evil.py")
        (self.scripts / "linkdir").symlink_to(self.elsewhere, target_is_directory=True)
        self.pinned = _file(self.scripts / "pinned.py", b"print('original script')\n")
        # C3: one write root per action, the sandbox uid's to write (DAC allows it all).
        self.roots = {name: self._write_root(name) for name in C3_ACTIONS}
        # C5: a root-only secret an artifact may point at.
        self.secret_dir = self._mk("secret", 0o700)
        self.secret_bytes = f"ROOT-ONLY-{token}".encode()
        self.secret = _file(self.secret_dir / "key", self.secret_bytes, 0o600)
        # Written by a C3 action that escaped into /var/tmp (1777: DAC would allow it).
        self.escapee = Path(f"/var/tmp/sensorium-escapee-{token}")

    def _mk(self, prefix: str, mode: int = 0o755, owner: int | None = None) -> Path:
        d = _dir(prefix, mode, owner)
        self.dirs.append(d)
        return d

    def _write_root(self, name: str) -> Path:
        root = self._mk(f"wr-{name}", owner=SANDBOX_UID)
        _file(root / "keep.txt", b"kept\n", owner=SANDBOX_UID)
        (root / "sub").mkdir()
        os.chown(root / "sub", SANDBOX_UID, SANDBOX_UID)
        _file(root / "sub" / "old.txt", b"old\n", owner=SANDBOX_UID)
        _file(root / "large.bin", b"L" * 8192, owner=SANDBOX_UID)
        return root

    def cleanup(self) -> None:
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)
        self.escapee.unlink(missing_ok=True)


META_OPS = ("chmod", "chown", "utime-set", "utime-now", "setxattr", "removexattr")
C1_OPS = (
    "create",
    "mkdir",
    "mkfifo",
    "overwrite",
    "append",
    "truncate",
    "unlink",
    "rename-within",
    "rename-in",
    "link-within",
    "link-in",
    "symlink",
)
C3_ACTIONS = ("total", "perfile", "pattern", "outside", "symlink", "timeout", "noop", "owner")


def _c1_write_program(w: World) -> str:
    c, v = str(w.canary), str(w.victim)
    return f"""\
C, V = {c!r}, {v!r}
op = sys.argv[1]
write("/tmp/src.txt", b"from scratch\\n")
ops = {{
    "create": lambda: write(C + "/new.txt", b"x", "xb"),
    "mkdir": lambda: os.mkdir(C + "/newdir"),
    "mkfifo": lambda: os.mkfifo(C + "/fifo"),
    "overwrite": lambda: write(V, b"PWNED", "r+b"),
    "append": lambda: write(V, b"PWNED", "ab"),
    "truncate": lambda: os.truncate(V, 0),
    "unlink": lambda: os.unlink(V),
    "rename-within": lambda: os.rename(V, C + "/renamed.txt"),
    "rename-in": lambda: os.rename("/tmp/src.txt", C + "/moved.txt"),
    "link-within": lambda: os.link(V, C + "/linked.txt"),
    "link-in": lambda: os.link("/tmp/src.txt", C + "/linked-in.txt"),
    "symlink": lambda: os.symlink("/etc/passwd", C + "/sym"),
}}
attempt(op, ops[op])
"""


def _c1_meta_program(w: World) -> str:
    return f"""\
op, target = sys.argv[1:]
mine = target == "owned"
V = ({str(w.owned)!r} if mine else {str(w.canary)!r}) + "/meta-" + op
ops = {{
    "chmod": lambda: os.chmod(V, 0o777 if mine else 0o600),
    # Give it away, or take it.
    "chown": lambda: os.chown(V, 0, 0) if mine else os.chown(V, 65534, 65534),
    "utime-set": lambda: os.utime(V, (0, 0)),
    "utime-now": lambda: os.utime(V, None),
    "setxattr": lambda: os.setxattr(V, "user.x", b"1"),
    "removexattr": lambda: os.removexattr(V, "user.keep"),
}}
attempt(op, ops[op])
"""


def _read_program(paths: dict[str, str]) -> str:
    return f"""\
for name, path in {paths!r}.items():
    if name.endswith("-dir"):
        attempt(name, lambda: sorted(os.listdir(path)))
    else:
        attempt(name, lambda: read(path))
"""


def _declarations(w: World) -> list[dict[str, Any]]:
    op = {"op": {"type": "string"}}
    reads = {
        "allowed": str(w.granted / "allowed.txt"),
        "outside": str(w.outside / "world.txt"),
        "outside-dir": str(w.outside),
        "secret-file": str(w.granted / "secret.txt"),
        "secret-dir": str(w.granted / "secret"),
        "secret-inner": str(w.granted / "secret" / "inner.txt"),
    }
    roots = {k: str(v) for k, v in w.roots.items()}

    def c3(name: str, code: str, timeout_ms: int = 5000, **fs: Any) -> dict[str, Any]:
        decl = _action(f"{PREFIX}.c3-{name}", code, default_timeout_ms=timeout_ms)
        decl["class"] = "scoped-fs-write"
        decl["fs_write"] = {
            "write_root": roots[name],
            "max_bytes_total": 64 * 1024,
            "max_bytes_per_file": 16 * 1024,
            **fs,
        }
        return decl

    def c5(name: str, code: str, **art: Any) -> dict[str, Any]:
        decl = _action(f"{PREFIX}.c5-{name}", code)
        decl["class"] = "artifact-producing-spawn"
        decl["artifact"] = {
            "max_count": 4,
            "max_bytes_per": 4096,
            "max_bytes_total": 16384,
            "allowed_media_types": ["text/plain"],
            **art,
        }
        return decl

    token = secrets.token_hex(4)
    return [
        _action(f"{PREFIX}.c1-write", _c1_write_program(w), op),
        _action(f"{PREFIX}.c1-meta", _c1_meta_program(w), {**op, "target": {"type": "string"}}),
        _action(f"{PREFIX}.read-narrow", _read_program(reads), fs_profile="narrow"),
        _action(f"{PREFIX}.read-default", _read_program(reads)),
        _script(f"{PREFIX}.c2-symlink", w.scripts, str(w.scripts / "link.py")),
        _script(f"{PREFIX}.c2-linkdir", w.scripts, str(w.scripts / "linkdir" / "evil.py")),
        _script(
            f"{PREFIX}.c2-pinned",
            w.scripts,
            str(w.pinned),
            hashlib.sha256(w.pinned.read_bytes()).hexdigest(),
        ),
        c3(
            "total",
            # 16 KiB files, each within max_bytes_per_file, until the upper layer is full.
            "n = 0\n"
            "def fill():\n"
            "    global n\n"
            "    while n < 64:\n"
            "        write(f'fill-{n}.bin', b'F' * 16384)\n"
            "        n += 1\n"
            "attempt('fill', fill)\n"
            "report['files'] = n\n",
        ),
        c3(
            "perfile",
            # Every way to a file over the cap: one big write, an extension, copy-ups
            # of a lower file already over it.
            "fd = os.open('big.bin', os.O_WRONLY | os.O_CREAT, 0o644)\n"
            "attempt('write', lambda: os.write(fd, b'B' * 4096))\n"
            "attempt('write-more', lambda: os.write(fd, b'B' * 4096))\n"
            "attempt('extend', lambda: os.ftruncate(fd, 4096))\n"
            "attempt('seek-write', lambda: os.pwrite(fd, b'B', 4096))\n"
            "os.close(fd)\n"
            "attempt('size', lambda: os.stat('big.bin').st_size)\n"
            "attempt('append', lambda: write('large.bin', b'more', 'ab'))\n"
            "attempt('chmod', lambda: os.chmod('large.bin', 0o600))\n"
            "attempt('link', lambda: os.link('large.bin', 'large-link.bin'))\n"
            "attempt('rename', lambda: os.rename('large.bin', 'large-moved.bin'))\n"
            "attempt('listing', lambda: sorted(os.listdir('.')))\n",
            max_bytes_per_file=1024,
        ),
        c3(
            "pattern",
            "os.makedirs('out', exist_ok=True)\n"
            "attempt('fits', lambda: write('out/fine.txt', b'fine\\n'))\n"
            "attempt('misses', lambda: write('evil.sh', b'#!/bin/sh\\n'))\n",
            path_pattern=r"out/[a-z]+\.txt",
        ),
        c3(
            "outside",
            f"C, ESC = {str(w.canary)!r}, {str(w.escapee)!r}\n"
            "attempt('canary', lambda: write(C + '/from-c3.txt', b'x', 'xb'))\n"
            "attempt('var-tmp', lambda: write(ESC, b'x', 'xb'))\n"
            "up = '../escaped-' + os.path.basename(os.getcwd())\n"
            "attempt('parent', lambda: write(up, b'x'))\n"
            "write('inside.txt', b'inside\\n')\n"
            "attempt('rename-out', lambda: os.rename('inside.txt', C + '/moved.txt'))\n"
            "attempt('link-out', lambda: os.link('inside.txt', C + '/linked.txt'))\n"
            "os.unlink('inside.txt')\n",
        ),
        c3(
            "symlink",
            f"C = {str(w.canary)!r}\n"
            "attempt('symlink', lambda: os.symlink('/etc/passwd', 'pw'))\n"
            "attempt('to-canary', lambda: os.symlink(C + '/victim.txt', 'victim'))\n"
            "attempt('through', lambda: write('victim', b'PWNED', 'r+b'))\n"
            "attempt('regular', lambda: write('ok.txt', b'ok\\n'))\n",
        ),
        c3(
            "timeout",
            "write('partial.txt', b'P' * 1000)\n"
            "write('keep.txt', b'changed\\n')\n"
            "print('written', flush=True)\n"
            "time.sleep(60)\n",
            timeout_ms=1000,
        ),
        c3("noop", "attempt('read', lambda: read('keep.txt'))\n"),
        c3(
            "owner",
            "attempt('append', lambda: write('keep.txt', b'more\\n', 'ab'))\n"
            "attempt('create', lambda: write('sub/mine.txt', b'mine\\n', 'ab'))\n",
        ),
        c5(
            "symlink",
            f"S = {str(w.secret)!r}\n"
            "attempt('read-secret', lambda: read(S))\n"
            "attempt('link', lambda: os.symlink(S, '/tmp/artifacts/leak.txt'))\n"
            f"write('/tmp/artifacts/note.txt', b'note {token} symlink\\n')\n",
        ),
        c5(
            "fifo",
            "attempt('fifo', lambda: os.mkfifo('/tmp/artifacts/pipe'))\n"
            f"write('/tmp/artifacts/note.txt', b'note {token} fifo\\n')\n",
        ),
        c5(
            "media",
            f"write('/tmp/artifacts/a.txt', b'text {token} media\\n')\n"
            f"write('/tmp/artifacts/b.png', {PNG!r})\n",
        ),
        c5(
            "count",
            "for i in range(3):\n"
            f"    write(f'/tmp/artifacts/{{i}}.txt', f'count {token} {{i}}\\n'.encode())\n",
            max_count=2,
        ),
    ]


def _policy(w: World) -> dict[str, Any]:
    return {
        "schemaVersion": 2,
        "fsProfiles": {
            "narrow": {
                "read": [
                    "/usr/**",
                    "/lib/**",
                    "/lib64/**",
                    "/etc/**",
                    f"{PROGRAMS}/**",
                    f"{w.granted}/**",
                ]
            }
        },
        "denyRead": [f"{w.granted}/secret/**", f"{w.granted}/secret.txt"],
    }


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    w = World()
    try:
        yield w
    finally:
        w.cleanup()


@pytest.fixture(scope="module")
def escapes(world: World) -> Iterator[Stack]:
    # The fs policy rides in its own drop-in, signed with the rest.
    doc = {"schema": "sensorium-os-config.v1", "action_catalog": [], "policy": _policy(world)}
    with running_stack(_declarations(world), {"60-policy": doc}) as s:
        yield s


def invoke(stack: Stack, name: str, params: dict[str, Any] | None = None) -> Outcome:
    """Invoke ``PREFIX.name`` and check the connector lived through it."""
    before = stack.pids()["connector"]
    with stack.client() as c:
        out = c.invoke(f"{PREFIX}.{name}", params or {})
    assert stack.pids()["connector"] == before
    assert before is not None and psutil.pid_exists(before)
    return out


def refused(stack: Stack, name: str) -> SensoriumError:
    """Invoke an action the connector must refuse before it runs anything."""
    before = stack.pids()["connector"]
    with stack.client() as c, pytest.raises(SensoriumError) as info:
        c.invoke(f"{PREFIX}.{name}", {})
    assert stack.pids()["connector"] == before
    return info.value


# --- 1. C1: no write outside the scratch -------------------------------------------------


@pytest.mark.parametrize("op", C1_OPS)
def test_c1_cannot_write_outside_its_scratch(escapes: Stack, world: World, op: str) -> None:
    before = snapshot(world.canary)
    out = invoke(escapes, "c1-write", {"op": op})
    assert out.status == "completed", out.stderr.text
    got = report(out)[op]
    assert _failed(got), got
    assert snapshot(world.canary) == before


@pytest.mark.parametrize(
    ("target", "op"),
    [(target, op) for target in ("world-writable", "owned") for op in META_OPS],
)
def test_c1_cannot_change_metadata_outside_its_scratch(
    escapes: Stack, world: World, target: str, op: str
) -> None:
    tree = world.owned if target == "owned" else world.canary
    before = snapshot(tree)
    out = invoke(escapes, "c1-meta", {"op": op, "target": target})
    assert out.status == "completed", out.stderr.text
    got = report(out)[op]
    # Each run snapshots afresh, so one escaped change never fails another test.
    assert snapshot(tree) == before, got
    assert _failed(got), got


# --- 2. reads outside the fs profile -----------------------------------------------------


def test_read_outside_the_profile_is_denied(escapes: Stack, world: World) -> None:
    out = invoke(escapes, "read-narrow")
    assert out.status == "completed", out.stderr.text
    got = report(out)
    assert got["allowed"] == {"ok": True, "value": world.allowed_bytes.decode()}
    assert got["outside"] == {"ok": False, "errno": "EACCES"}
    assert got["outside-dir"] == {"ok": False, "errno": "EACCES"}
    assert world.outside_secret.decode() not in out.stdout.text + out.stderr.text
    # DAC would have allowed it: the default profile reads the same file.
    wide = report(invoke(escapes, "read-default"))
    assert wide["outside"] == {"ok": True, "value": world.outside_secret.decode()}


@pytest.mark.parametrize("action", ["read-narrow", "read-default"])
def test_a_denied_path_inside_a_granted_tree_is_masked(
    escapes: Stack, world: World, action: str
) -> None:
    out = invoke(escapes, action)
    assert out.status == "completed", out.stderr.text
    got = report(out)
    # The sibling stays readable; the denied file reads empty or not at all.
    assert got["allowed"] == {"ok": True, "value": world.allowed_bytes.decode()}
    assert got["secret-file"] in ({"ok": True, "value": ""}, {"ok": False, "errno": "EACCES"})
    assert got["secret-dir"] in ({"ok": True, "value": []}, {"ok": False, "errno": "EACCES"})
    assert _failed(got["secret-inner"], {"EACCES", "ENOENT"}), got["secret-inner"]
    assert world.masked_bytes.decode() not in out.stdout.text + out.stderr.text
    # Masking happened in the action's mount namespace only.
    assert (world.granted / "secret.txt").read_bytes() == world.masked_bytes + b"-file"
    assert sorted(os.listdir(world.granted / "secret")) == ["inner.txt"]


# --- 3. C2: the script is the one the declaration names, sealed --------------------------


@pytest.mark.parametrize("action", ["c2-symlink", "c2-linkdir"])
def test_c2_a_script_path_through_a_symlink_is_refused(
    escapes: Stack, world: World, action: str
) -> None:
    err = refused(escapes, action)
    assert err.code == OsErrorCode.WORKING_DIRECTORY_FORBIDDEN, (err.code, err.message)
    assert world.marker not in err.message


def test_c2_a_script_changed_after_pinning_never_runs(escapes: Stack, world: World) -> None:
    out = invoke(escapes, "c2-pinned")
    assert out.status == "completed", out.stderr.text
    assert out.stdout.text == "original script\n"
    original = world.pinned.read_bytes()
    try:
        world.pinned.write_text(f"print({world.marker!r})\n")
        err = refused(escapes, "c2-pinned")
        assert err.code == OsErrorCode.SCRIPT_HASH_MISMATCH, (err.code, err.message)
        assert world.marker not in err.message
    finally:
        world.pinned.write_bytes(original)


class _Alarm:
    """Fail instead of hanging when a call blocks (an open on a FIFO, say)."""

    def __enter__(self) -> None:
        def ring(*_: object) -> None:
            raise TimeoutError("seal() blocked")

        signal.signal(signal.SIGALRM, ring)
        signal.setitimer(signal.ITIMER_REAL, 5.0)

    def __exit__(self, *_: object) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)


@pytest.fixture
def script_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "ok.py").write_text("print('ok')\n")
    (tmp_path / "outside.py").write_text("print('outside')\n")
    (root / "link.py").symlink_to(tmp_path / "outside.py")
    (root / "linkdir").symlink_to(tmp_path, target_is_directory=True)
    os.mkfifo(root / "fifo.py")
    return root


@pytest.mark.parametrize(
    ("relative", "code"),
    [
        ("link.py", OsErrorCode.WORKING_DIRECTORY_FORBIDDEN),
        ("linkdir/outside.py", OsErrorCode.WORKING_DIRECTORY_FORBIDDEN),
        ("../outside.py", OsErrorCode.WORKING_DIRECTORY_FORBIDDEN),
        ("sub/../../outside.py", OsErrorCode.WORKING_DIRECTORY_FORBIDDEN),
        ("/proc/self/root/etc/passwd", OsErrorCode.WORKING_DIRECTORY_FORBIDDEN),
        ("fifo.py", OsErrorCode.SCRIPT_NOT_EXECUTABLE),
    ],
)
def test_c2_seal_refuses_every_way_out_of_the_root(
    script_root: Path, relative: str, code: OsErrorCode
) -> None:
    path = relative if relative.startswith("/") else f"{script_root}/{relative}"
    with _Alarm(), pytest.raises(ScriptError) as info:
        seal(path, [str(script_root)], None)
    assert info.value.code == code, str(info.value)


def test_c2_seal_refuses_a_hash_mismatch(script_root: Path) -> None:
    path = script_root / "ok.py"
    pin = hashlib.sha256(b"print('something else')\n").hexdigest()
    with pytest.raises(ScriptError) as info:
        seal(str(path), [str(script_root)], pin)
    assert info.value.code == OsErrorCode.SCRIPT_HASH_MISMATCH


@pytest.mark.parametrize("swap", ["in-place", "rename"])
def test_c2_a_script_swapped_after_the_check_runs_the_sealed_bytes(
    script_root: Path, swap: str
) -> None:
    path = script_root / "ok.py"
    original = path.read_bytes()
    sealed = seal(str(path), [str(script_root)], hashlib.sha256(original).hexdigest())
    try:
        if swap == "in-place":
            path.write_bytes(b"print('swapped')\n")
        else:
            (script_root / "new.py").write_bytes(b"print('swapped')\n")
            os.replace(script_root / "new.py", path)
        assert os.pread(sealed.fd, 4096, 0) == original
        # The copy is sealed: nobody holding the fd can change it either.
        with pytest.raises(PermissionError):
            os.pwrite(sealed.fd, b"x", 0)
        with pytest.raises(PermissionError):
            os.ftruncate(sealed.fd, 0)
    finally:
        os.close(sealed.fd)


# --- 4. C3: all or nothing, and only inside write_root -----------------------------------


def _c3(
    stack: Stack, world: World, name: str, *, root_mtime: bool = True
) -> tuple[Outcome, dict[str, Any]]:
    """Run a C3 probe; nothing may be committed to its write root.

    ``root_mtime=False`` leaves write_root's own mtime out of the comparison, for runs
    whose (empty) commit goes ahead; test_c3_a_run_that_changes_nothing_... covers it.
    """
    root = world.roots[name]
    before = snapshot(root)
    out = invoke(stack, f"c3-{name}")
    after = snapshot(root)
    if not root_mtime:
        before["."], after["."] = _no_mtime(before["."]), _no_mtime(after["."])
    assert after == before, out.diagnostics
    assert not any(p.name.startswith(".sensorium-commit-") for p in root.rglob("*"))
    return out, report(out) if out.stdout.text.startswith("{") else {}


def _no_mtime(entry: tuple[Any, ...]) -> tuple[Any, ...]:
    return entry[:4] + entry[5:]


def test_c3_writes_past_max_bytes_total_commit_nothing(escapes: Stack, world: World) -> None:
    out, got = _c3(escapes, world, "total")
    # The upper layer filled up (ENOSPC) after more than the cap was written.
    assert got["fill"] == {"ok": False, "errno": "ENOSPC"}, got
    assert got["files"] * 16384 > 64 * 1024
    assert any("max_bytes_total" in m for m in violations(out)), out.diagnostics


def test_c3_no_file_over_max_bytes_per_file_reaches_write_root(
    escapes: Stack, world: World
) -> None:
    root = world.roots["perfile"]
    before = snapshot(root)
    out = invoke(escapes, "c3-perfile")
    got = report(out)
    # RLIMIT_FSIZE (the cap + 1, so an overflow is visible) stops every way past it: a
    # write, an extension, and a copy-up of a lower file already over it (append,
    # chmod, link, rename all copy it up).
    assert got["write"] == {"ok": True, "value": 1025}, got
    for name in ("write-more", "extend", "seek-write", "append", "chmod", "link", "rename"):
        assert got[name] == {"ok": False, "errno": "EFBIG"}, (name, got[name])
    # The overflowing file is seen, never committed truncated: nothing changes.
    assert snapshot(root) == before
    assert [(f.path, f.bytes) for f in out.files_touched] == [("big.bin", 1025)]
    assert any("nothing was committed" in m for m in violations(out)), out.diagnostics


def test_c3_a_path_pattern_miss_commits_nothing(escapes: Stack, world: World) -> None:
    out, got = _c3(escapes, world, "pattern")
    assert got["fits"]["ok"] and got["misses"]["ok"], got
    assert any("evil.sh" in m and "path_pattern" in m for m in violations(out)), out.diagnostics
    assert not (world.roots["pattern"] / "out").exists()


def test_c3_cannot_write_outside_its_write_root(escapes: Stack, world: World) -> None:
    canary = snapshot(world.canary)
    out, got = _c3(escapes, world, "outside", root_mtime=False)
    assert out.status == "completed", out.stderr.text
    # /var/tmp is 1777 and the canary 0777: only the sandbox refuses these (Landlock
    # or the read-only host tree, whichever the kernel checks first).
    for name in ("canary", "var-tmp", "parent"):
        assert got[name]["ok"] is False, (name, got[name])
        assert got[name]["errno"] in ("EACCES", "EROFS"), (name, got[name])
    for name in ("rename-out", "link-out"):
        assert _failed(got[name]), (name, got[name])
    assert snapshot(world.canary) == canary
    assert not world.escapee.exists()
    assert not (Path("/var/tmp") / f"escaped-{world.roots['outside'].name}").exists()


def test_c3_a_symlink_in_write_root_commits_nothing(escapes: Stack, world: World) -> None:
    passwd = Path("/etc/passwd").read_bytes()
    canary = snapshot(world.canary)
    out, got = _c3(escapes, world, "symlink")
    assert got["symlink"]["ok"] and got["regular"]["ok"], got
    assert _failed(got["through"]), got
    assert any("pw" in m and "symlink" in m for m in violations(out)), out.diagnostics
    assert Path("/etc/passwd").read_bytes() == passwd
    assert snapshot(world.canary) == canary


def test_c3_a_timeout_mid_write_commits_nothing(escapes: Stack, world: World) -> None:
    out, _got = _c3(escapes, world, "timeout")
    assert out.status == "timed-out", out.status
    assert out.stdout.text.startswith("written")
    assert any("timed out" in m for m in violations(out)), out.diagnostics


def test_c3_a_run_that_changes_nothing_leaves_write_root_untouched(
    escapes: Stack, world: World
) -> None:
    out, got = _c3(escapes, world, "noop")
    assert out.status == "completed" and got["read"]["ok"], (out.stderr.text, got)
    assert out.files_touched == [] and out.diagnostics == []


def test_c3_committed_files_stay_writable_by_the_next_run(escapes: Stack, world: World) -> None:
    root = world.roots["owner"]
    for _ in range(2):
        out = invoke(escapes, "c3-owner")
        got = report(out)
        assert got["append"]["ok"] and got["create"]["ok"], got
    assert (root / "keep.txt").read_bytes() == b"kept\nmore\nmore\n"
    assert (root / "sub" / "mine.txt").read_bytes() == b"mine\nmine\n"
    owners = {(p.stat().st_uid, p.stat().st_gid) for p in [root, *root.rglob("*")]}
    assert owners == {(SANDBOX_UID, SANDBOX_UID)}


# --- 5. C5: only regular files, within the caps, reach the lane --------------------------


def _c5(stack: Stack, name: str) -> tuple[Outcome, dict[str, Any], dict[str, bytes]]:
    """Run a C5 probe; return its outcome, report and what it added to the lane."""
    before = lane_files(stack)
    t0 = time.monotonic()
    out = invoke(stack, f"c5-{name}")
    assert time.monotonic() - t0 < 5, "promotion blocked"
    after = lane_files(stack)
    assert all(after.get(k) == v for k, v in before.items())
    added = {k: v for k, v in after.items() if k not in before}
    return out, report(out), added


def test_c5_a_symlink_to_a_secret_is_not_promoted(escapes: Stack, world: World) -> None:
    out, got, added = _c5(escapes, "symlink")
    assert got["read-secret"] == {"ok": False, "errno": "EACCES"}, got
    assert got["link"]["ok"], got
    assert any("leak.txt" in m and "symlink" in m for m in violations(out)), out.diagnostics
    # Only the regular file made it; the secret is nowhere in the lane.
    assert [r.media_type for r in out.artifact_refs] == ["text/plain"]
    assert [data[:5] for data in added.values()] == [b"note "]
    assert all(world.secret_bytes not in data for data in lane_files(escapes).values())
    assert world.secret.read_bytes() == world.secret_bytes


def test_c5_a_fifo_is_not_promoted_and_does_not_hang(escapes: Stack) -> None:
    out, got, added = _c5(escapes, "fifo")
    assert got["fifo"]["ok"], got
    assert any("pipe" in m and "FIFO" in m for m in violations(out)), out.diagnostics
    assert len(out.artifact_refs) == 1 and len(added) == 1


def test_c5_a_disallowed_media_type_promotes_nothing(escapes: Stack) -> None:
    out, _got, added = _c5(escapes, "media")
    assert out.artifact_refs == [] and added == {}
    assert any("image/png" in m for m in violations(out)), out.diagnostics


def test_c5_more_artifacts_than_max_count_promote_nothing(escapes: Stack) -> None:
    out, _got, added = _c5(escapes, "count")
    assert out.artifact_refs == [] and added == {}
    assert any("max_artifact_count" in m for m in violations(out)), out.diagnostics
