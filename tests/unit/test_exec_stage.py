"""The compiled exec stage (run/sandbox/exec_stage.c) against the Python path it replaces.

A parked target applies its plan either as Python (``stage.run_target``) or as the
exec stage. The action must not be able to tell which: the same ids, groups,
capabilities, no_new_privs, seccomp mode, signal masks, rlimits, fds, session, cwd,
environment and Landlock domain, and the same "could not start" lines. Each test runs
the same plan through a real zygote both ways (tests/programs/stage_compare.py) and
compares what the action saw, for a parked sandbox and for one started cold: as
root, and as an ordinary uid in a user namespace of its own ids (the zygote of an
unprivileged connector).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from typing import Any

import pytest
from harness import NODE_UID, PROGRAMS, PYTHON, unprivileged_runtime

from sensorium.connectors.os.run.sandbox import execstage, landlock, seccomp

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or not seccomp.available(),
        reason="namespaces, seccomp and a second uid need root here",
    ),
    pytest.mark.skipif(
        not execstage.BINARY.exists() and os.environ.get("CI") != "true",
        reason=f"{execstage.BINARY.name} was not built (no C compiler at install)",
    ),
]


@pytest.fixture(params=["root", "user"])
def compare(request: pytest.FixtureRequest) -> Any:
    """``compare(case)``: what the action saw by each path, run as root or as NODE_UID."""

    def run(case: str) -> dict[str, Any]:
        argv = [PYTHON, str(PROGRAMS / "stage_compare.py"), case]
        env = {"PATH": "/usr/bin:/bin"}
        user: int | None = None
        if request.param == "user":
            python, path = unprivileged_runtime()
            argv[0] = python
            env["PYTHONPATH"] = str(path)
            user = NODE_UID
        done = subprocess.run(
            argv,
            env=env,
            user=user,
            group=user,
            extra_groups=[] if user else None,
            cwd="/",
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        got: dict[str, Any] = json.loads(done.stdout)
        if case != "rlimit-unknown":
            parked = case != "cold"
            assert got["python"]["pooled"] == parked and not got["python"]["staged"], got
            assert got["staged"]["pooled"] == parked, got
            assert got["staged"]["staged"], "the stage did not run"
        return got

    return run


@pytest.mark.parametrize("case", ["probe", "cold"])
def test_the_action_cannot_tell_the_stage_from_the_python_path(case: str, compare: Any) -> None:
    got = compare(case)
    python, staged = got["python"], got["staged"]
    assert python["error"] is None and staged["error"] is None, got
    assert staged["stdout"] == python["stdout"]
    assert staged["stderr"] == python["stderr"] == "on stderr\n"
    # The same exit and the same measurements reported, by either init.
    assert staged["exit"] == python["exit"] == 0
    assert staged["usage"] == python["usage"], got
    assert set(staged["usage"]) >= {"cpu_user_ms", "cpu_system_ms", "io_write_bytes"}, got
    if case == "probe":
        # Parked: pid 1 was C from its start (park.c), never a fork of the zygote.
        assert staged["init"].split() == [execstage.BINARY.name[:15], execstage.BINARY.name, "park"]
        assert python["init"] != staged["init"], got
        # So the action's peak memory is its own, not a forked interpreter's high-water
        # mark carried through exec (a shell's is a few MiB; the zygote's is more).
        assert staged["peak"] < min(python["peak"], 8 << 20), got
    out = staged["stdout"]
    uid = 65534 if "Uid:\t65534" in out else NODE_UID
    assert f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}" in out, out
    assert "NoNewPrivs:\t1" in out and "Seccomp:\t2" in out
    assert "SigIgn:\t0000000000000000" in out and "SigBlk:\t0000000000000000" in out
    assert "CapEff:\t0000000000000000" in out
    fds = next(line for line in out.splitlines() if line.startswith("fds:")).split()[1:]
    # Only 0-2 (dash keeps its stdout at 10 while it redirects ls's).
    assert set(fds) - {"10"} == {"0", "1", "2"}, fds
    assert "session leader: 1" in out
    assert "/tmp\n" in out and "SPACED=a b\n" in out
    assert "Max open files            64" in out
    if landlock.abi_version() >= 1:
        assert "read-granted: yes" in out and "read-other: no" in out
        assert "write-full: yes" in out and "write-read: no" in out


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("cwd", "cwd /nonexistent: No such file or directory [errno 2]"),
        ("exec-missing", "exec /nonexistent/prog: No such file or directory [errno 2]"),
        ("exec-dir", "exec /usr: Permission denied [errno 13]"),
        (
            "gate-closed",
            "gate: the connector withdrew this start before it began: Operation canceled "
            "[errno 125]",
        ),
    ],
)
def test_a_plan_that_cannot_start_says_the_same_step_and_error(
    case: str, says: str, compare: Any
) -> None:
    got = compare(case)
    for path in ("python", "staged"):
        assert got[path]["error"] is not None and says in got[path]["error"], got
        assert got[path]["stdout"] == ""


def test_a_plan_the_stage_cannot_express_takes_the_cold_path(compare: Any) -> None:
    """An unknown rlimit: the parked stage is discarded and the cold path says why."""
    runs = compare("rlimit-unknown")["runs"]
    assert [r["pooled"] for r in runs] == [False, False]
    assert all(r["error"] is not None and "rlimits" in r["error"] for r in runs), runs


def _bare_plan() -> Any:
    from sensorium.connectors.os.run.sandbox.plan import Plan

    return Plan(executable="/bin/true", argv=["true"], env={}, cwd="/", namespaces=0, uid=0, gid=0)


def test_the_stage_fails_closed_on_records_it_does_not_know() -> None:
    """Anything but the zygote's exact records ends the stage before any exec."""
    good = execstage.encode(_bare_plan(), b"\x06\x00\x00\x00\x00\x00\xff\x7f", 0)
    assert good is not None
    for bad in (good + b"\x63\x00\x00\x00\x00\x00\x00\x00", good[:-3], b""):
        r, w = os.pipe()
        go_r, go_w = os.pipe()
        plan_ours, plan_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.close(go_w)
            plan_ours.close()
            fd = os.open(execstage.BINARY, os.O_RDONLY | os.O_CLOEXEC)
            execstage.become(fd, plan_theirs.fileno(), w, go_r)
        os.close(w)
        os.close(go_r)
        os.write(go_w, b"g")
        os.close(go_w)
        plan_theirs.close()
        out, err = os.pipe()
        if bad:
            socket.send_fds(plan_ours, [bad], [err, err])
        plan_ours.close()
        os.close(out)
        os.close(err)
        line = b""
        while chunk := os.read(r, 4096):
            line += chunk
        os.close(r)
        _, status = os.waitpid(pid, 0)
        if bad:
            assert os.waitstatus_to_exitcode(status) == 127 and line.startswith(b"setup: "), line
        else:  # EOF: a discarded sandbox ends quietly, having run nothing
            assert os.waitstatus_to_exitcode(status) == 0 and line == b""
