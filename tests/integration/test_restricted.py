"""A node where the kernel refuses mechanisms: it stays up, says why, and never runs open.

tests/confine.py puts the whole node under a seccomp filter that answers as a
restricted container does (EPERM for namespaces, mounts, Landlock; ENOSYS for
clone3). Each test runs the node as root and as an ordinary uid.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import (
    NODE_UID,
    PROGRAMS,
    Stack,
    python_action,
    running_stack,
    sensorium_command,
)

from sensorium.client.errors import ActionNotEnabled

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="starting a node as root and as another uid needs root"
)
# What Docker's default profile and systemd-nspawn's refuse.
CONTAINER = "unshare,mount,umount2,setns,pivot_root,landlock,clone-ns"
# How many status reads, after ready, must all see every process steady.
STEADY_READS = 50


def _peek_action(action_id: str, cls: str, **block: Any) -> dict[str, Any]:
    path = PROGRAMS / "peek_restricted.py"
    path.write_text(
        "import json, os, socket, sys\n"
        "got = {}\n"
        "for p in sys.argv[1:]:\n"
        "    try:\n"
        "        got[p] = len(open(p, 'rb').read())\n"
        "    except OSError as exc:\n"
        "        got[p] = exc.errno\n"
        "try:\n"
        "    socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
        "    got['inet'] = 'created'\n"
        "except OSError as exc:\n"
        "    got['inet'] = exc.errno\n"
        "print(json.dumps(got))\n"
    )
    path.chmod(0o755)
    decl = python_action(
        action_id,
        path.name,
        ["{{path}}"],
        {"path": {"type": "string"}},
        result_contract={"stdout_format": "json"},
        **block,
    )
    decl["class"] = cls
    return decl


def _actions(write_root: str) -> list[dict[str, Any]]:
    return [
        _peek_action("r.c1", "read-only-spawn"),
        _peek_action(
            "r.c3",
            "scoped-fs-write",
            fs_write={
                "write_root": write_root,
                "max_bytes_total": 4096,
                "max_bytes_per_file": 4096,
            },
        ),
        _peek_action(
            "r.c4",
            "egress-network-spawn",
            egress_network={
                "endpoints": [{"host": "localhost", "port": 9, "protocol": "tcp"}],
                "max_bytes_total": 4096,
                "max_bytes_per_connection": 1024,
            },
        ),
        _peek_action(
            "r.c5",
            "artifact-producing-spawn",
            artifact={
                "max_count": 1,
                "max_bytes_per": 16,
                "max_bytes_total": 16,
                "allowed_media_types": ["text/plain"],
            },
        ),
    ]


@pytest.fixture(scope="module", params=["root", "user"])
def node_user(request: pytest.FixtureRequest) -> int | None:
    return None if request.param == "root" else NODE_UID


@pytest.fixture(scope="module")
def write_root(node_user: int | None) -> Iterator[str]:
    # Not under /tmp: every action has its own.
    d = Path(tempfile.mkdtemp(prefix="sensorium-wr-", dir="/var/tmp"))
    d.chmod(0o755)
    owner = 65534 if node_user is None else node_user
    os.chown(d, owner, owner)
    yield str(d)
    shutil.rmtree(d, ignore_errors=True)


def _ledger(stack: Stack) -> dict[str, dict[str, Any]]:
    res = stack.cli("ledger", "--json")
    assert res.returncode == 0, res.stderr
    return {
        e["capabilityRef"].rsplit(":", 1)[-1]: {
            "state": e["effectiveState"],
            "why": [r for r in e["evidenceRefs"] if r.startswith("gap:")],
        }
        for e in json.loads(res.stdout)["entries"]
    }


def _steady(stack: Stack) -> None:
    """Every process ready, none ever restarted, over many reads of the supervisor."""
    for _ in range(STEADY_READS):
        status = stack.status()
        seen = [(c.name, c.state, c.restarts, c.last_exit) for c in status.children]
        if any((c.state, c.restarts) != ("ready", 0) for c in status.children):
            # The whole evidence: every child, and what each wrote on its way down.
            logs = {
                f.name: f.read_text(errors="replace")[-3000:]
                for f in sorted((stack.paths.root / "logs").glob("*"))
                if f.suffix == ".stderr" or "error" in f.read_text(errors="replace")
            }
            raise AssertionError(f"not steady: {seen}\n{logs}")


@pytest.fixture(scope="module")
def confined(node_user: int | None, write_root: str) -> Iterator[Stack]:
    with running_stack(_actions(write_root), user=node_user, confine=CONTAINER) as s:
        yield s


def test_a_container_without_namespaces_or_landlock_keeps_the_node_up(confined: Stack) -> None:
    _steady(confined)


def test_its_ledger_names_why_each_action_is_not_enabled(confined: Stack) -> None:
    ledger = _ledger(confined)
    for aid in ("r.c1", "r.c3", "r.c4", "r.c5"):
        row = ledger[aid]
        assert row["state"] == "unsupported_by_runtime", row
        text = json.dumps(row)
        assert "EPERM" in text or "seccomp" in text, row


def test_invoking_an_unenforceable_action_is_refused_before_anything_spawns(
    confined: Stack,
) -> None:
    with confined.client() as c, pytest.raises(ActionNotEnabled) as info:
        c.invoke("r.c1", {"path": "/etc/hostname"})
    assert "unsupported_by_runtime" in str(info.value)
    _steady(confined)


@pytest.fixture(scope="module")
def no_mount(node_user: int | None, write_root: str) -> Iterator[Stack]:
    with running_stack(_actions(write_root), user=node_user, confine="mount") as s:
        yield s


def test_without_mount_exactly_the_classes_that_need_a_namespace_leave_enabled(
    no_mount: Stack,
) -> None:
    ledger = _ledger(no_mount)
    states = {aid: ledger[aid]["state"] for aid in ("r.c1", "r.c3", "r.c4", "r.c5")}
    assert states == {
        "r.c1": "enabled",
        "r.c3": "unsupported_by_runtime",
        "r.c4": "unsupported_by_runtime",
        "r.c5": "unsupported_by_runtime",
    }, ledger
    _steady(no_mount)


def test_the_landlock_tier_still_confines_reads_and_the_network(no_mount: Stack) -> None:
    """Without namespaces the state dir is carved out of Landlock's grants and seccomp
    refuses every socket: the node's keys are unreadable, nothing reaches the network."""
    key = next((no_mount.paths.root / "keys").iterdir())
    with no_mount.client() as c:
        out = c.invoke("r.c1", {"path": str(key)})
        ok = c.invoke("r.c1", {"path": "/etc/hostname"})
    assert out.status == "completed", (out.stderr.text, out.diagnostics)
    assert out.result is not None and ok.result is not None
    assert out.result.json[str(key)] in (13, 2), out.result.json  # EACCES or ENOENT
    assert out.result.json["inet"] == 1, out.result.json  # EPERM
    assert isinstance(ok.result.json["/etc/hostname"], int) and ok.result.json["/etc/hostname"] >= 0


@pytest.fixture(scope="module")
def no_netlink(node_user: int | None, write_root: str) -> Iterator[Stack]:
    with running_stack(_actions(write_root), user=node_user, confine="netlink") as s:
        yield s


def test_a_canary_fails_only_the_envelopes_that_use_the_broken_mechanism(
    no_netlink: Stack,
) -> None:
    """Only C4 sets up routes over netlink: only C4 leaves enabled, with the errno."""
    ledger = _ledger(no_netlink)
    states = {aid: ledger[aid]["state"] for aid in ("r.c1", "r.c3", "r.c4", "r.c5")}
    assert states == {
        "r.c1": "enabled",
        "r.c3": "enabled",
        "r.c4": "unsupported_by_runtime",
        "r.c5": "enabled",
    }, ledger
    assert "EPERM" in json.dumps(ledger["r.c4"]) or "not permitted" in json.dumps(ledger["r.c4"])


def _doctor(user: int | None, confine: str | None) -> subprocess.CompletedProcess[str]:
    command, env, preexec = sensorium_command(user, confine)
    return subprocess.run(
        [*command, "doctor"],
        capture_output=True,
        text=True,
        env=env,
        preexec_fn=preexec,
        cwd="/",
        timeout=120,
    )


def test_doctor_finds_every_class_enforceable_on_this_host(node_user: int | None) -> None:
    res = _doctor(node_user, None)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "tier: namespaces" in res.stdout
    enabled = [ln for ln in res.stdout.splitlines() if ln.startswith("  enabled")]
    assert len(enabled) == 5, res.stdout
    # As root and as the node's ordinary uid alike, the installed exec stage runs.
    assert "ok  exec stage: " in res.stdout and "no interpreter before exec" in res.stdout


def test_doctor_names_each_missing_mechanism_and_its_fix(node_user: int | None) -> None:
    res = _doctor(node_user, CONTAINER)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "tier: none" in res.stdout
    assert "NO  Landlock (ABI 0)" in res.stdout and "EPERM" in res.stdout
    assert "fix: in a container" in res.stdout
    refused = [ln for ln in res.stdout.splitlines() if ln.startswith("  unsupported")]
    assert len(refused) == 5, res.stdout


def test_doctor_shows_the_landlock_tier_when_only_mounts_are_refused(
    node_user: int | None,
) -> None:
    res = _doctor(node_user, "mount")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "tier: landlock" in res.stdout
    enabled = [ln.split()[-1] for ln in res.stdout.splitlines() if ln.startswith("  enabled")]
    assert enabled == ["read-only-spawn", "allowlisted-script"], res.stdout


# A container's root: uid 0 without CAP_SYS_ADMIN or CAP_NET_ADMIN (podman's default set).
CONTAINER_ROOT = ["setpriv", "--bounding-set", "-sys_admin,-net_admin", "--"]


@pytest.fixture(scope="module")
def capless_root() -> Iterator[Stack]:
    d = Path(tempfile.mkdtemp(prefix="sensorium-wr-", dir="/var/tmp"))
    d.chmod(0o755)
    os.chown(d, 65534, 65534)
    try:
        with running_stack(_actions(str(d)), wrap=CONTAINER_ROOT) as s:
            yield s
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_a_root_without_sys_admin_goes_through_a_user_namespace(capless_root: Stack) -> None:
    """As in a default container: every class still runs, in namespaces owned by a user
    namespace that maps root and the sandbox uid to themselves."""
    ledger = _ledger(capless_root)
    assert all(ledger[a]["state"] == "enabled" for a in ("r.c1", "r.c3", "r.c4", "r.c5")), ledger
    key = next((capless_root.paths.root / "keys").iterdir())
    with capless_root.client() as c:
        for aid in ("r.c1", "r.c3", "r.c4", "r.c5"):
            out = c.invoke(aid, {"path": str(key)})
            assert out.status == "completed", (aid, out.stderr.text, out.diagnostics)
            assert out.result is not None
            assert out.result.json[str(key)] in (2, 13), (aid, out.result.json)
