"""What the zygote hands the exec stage, and what it keeps for the Python path.

``execstage.encode`` turns a plan into the stage's records, or says None: then the
plan takes the Python path, which applies it or reports exactly why it cannot. A plan
the stage would run differently from ``os.execve`` must never reach it.
"""

from __future__ import annotations

import os
import socket
import struct
from pathlib import Path
from typing import Any

import msgspec
import pytest
from forked import in_child

from sensorium.connectors.os.run.sandbox import execstage
from sensorium.connectors.os.run.sandbox.plan import Landlock, Plan

FILTER = bytes(8)  # one BPF instruction: a stand-in, never loaded here


def _plan(**changes: object) -> Plan:
    base = Plan(
        executable="/bin/sh",
        argv=["sh", "-c", "true"],
        env={"PATH": "/usr/bin:/bin"},
        cwd="/tmp",
        namespaces=0,
        uid=65534,
        gid=65534,
        rlimits={"nofile": 64},
        landlock=Landlock(read=["/usr"], full=["/tmp"], tcp_connect_ports=[443]),
    )
    return msgspec.structs.replace(base, **changes)


def _records(data: bytes) -> list[tuple[int, bytes]]:
    out, at = [], 0
    while at < len(data):
        tag, size = struct.unpack_from("=II", data, at)
        out.append((tag, data[at + 8 : at + 8 + size]))
        at += 8 + size
    assert at == len(data)
    return out


def test_a_plan_becomes_records_in_order_with_its_fds_by_role() -> None:
    data = execstage.encode(_plan(exec_fd=0, extra_fds=1), FILTER, landlock_abi=6)
    assert data is not None
    recs = _records(data)
    tags = [t for t, _ in recs]
    assert tags[:2] == [execstage.T_EXE, execstage.T_CWD]
    assert [v for t, v in recs if t == execstage.T_ARG] == [b"sh", b"-c", b"true"]
    assert (execstage.T_FD, struct.pack("=ii", execstage.R_EXEC, 3)) in recs
    assert tags[-1] == execstage.T_SECCOMP
    # ABI 6: fs, net and scopes handled; the port only with net.
    assert execstage.T_LL_PORT in tags and execstage.T_LL_RULESET in tags
    without_net = execstage.encode(_plan(), FILTER, landlock_abi=3)
    assert without_net is not None
    assert execstage.T_LL_PORT not in [t for t, _ in _records(without_net)]


@pytest.mark.parametrize(
    "changes",
    [
        {"argv": []},
        {"env": {"A=B": "1"}},
        {"env": {"": "1"}},
        {"env": {"A": "x\0y"}},
        {"argv": ["sh", "a\0b"]},
        {"rlimits": {"stack": 1}},
        {"argv": ["x"] * (execstage.MAX_ITEMS + 1)},
        {"env": {"BIG": "x" * (1 << 20)}},
        {"landlock": Landlock(read=[], full=[], tcp_connect_ports=[70000])},
    ],
)
def test_what_the_stage_would_run_otherwise_stays_on_the_python_path(
    changes: dict[str, object],
) -> None:
    assert execstage.encode(_plan(**changes), FILTER, landlock_abi=6) is None


def test_no_filter_or_no_landlock_leaves_the_python_path_to_say_so() -> None:
    assert execstage.encode(_plan(), None, landlock_abi=6) is None
    assert execstage.encode(_plan(), FILTER, landlock_abi=0) is None
    assert execstage.encode(_plan(seccomp=False, landlock=None), None, landlock_abi=0)


def test_a_stage_that_does_not_run_here_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Built for another machine, or not a program at all: the Python path is taken."""
    for name, body in (
        ("garbage", b"\x7fELF not really"),
        ("fails", b"#!/bin/sh\nexit 3\n"),
        ("silent", b"#!/bin/sh\nexit 0\n"),  # ends well, but is no stage of ours
        ("hangs", b"#!/bin/sh\nexec sleep 1000\n"),  # never answers: killed, not waited on
    ):
        fake = tmp_path / name
        fake.write_bytes(body)
        fake.chmod(0o755)
        monkeypatch.setenv(execstage.ENV_SWITCH, str(fake))
        assert execstage.open_stage() is None
    monkeypatch.setenv(execstage.ENV_SWITCH, "off")
    assert execstage.open_stage() is None
    if execstage.BINARY.exists() or os.environ.get("CI") == "true":
        monkeypatch.delenv(execstage.ENV_SWITCH)
        stage = execstage.open_stage()
        assert stage is not None, f"{execstage.BINARY} does not run here"
        os.close(stage.fd)


def test_a_target_that_cannot_become_the_stage_says_so() -> None:
    """Never a bare EOF on the error pipe: the init would report the action started."""
    r, w = os.pipe()
    plan_ours, plan_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    not_a_program = os.open(os.devnull, os.O_RDONLY)
    pid = os.fork()
    if pid == 0:
        os.close(r)
        execstage.become(not_a_program, plan_theirs.fileno(), w, r)
    os.close(w)
    for fd in (not_a_program,):
        os.close(fd)
    plan_ours.close()
    plan_theirs.close()
    said = b""
    while chunk := os.read(r, 4096):
        said += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 127
    assert said.startswith(b"setup: the exec stage could not start"), said


@pytest.mark.skipif(
    not execstage.BINARY.exists() and os.environ.get("CI") != "true",
    reason=f"{execstage.BINARY.name} was not built (no C compiler at install)",
)
def test_the_stage_passes_on_no_fd_it_inherited() -> None:
    """Whatever its starter left open (at the numbers the stage itself uses, too), the
    action gets fds 0-2 and nothing else. In a child: the strays take those numbers."""

    def probe() -> dict[str, Any]:
        stage = execstage.open_stage()
        assert stage is not None
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        stray = os.open(os.devnull, os.O_RDONLY)
        taken = [
            fd for fd in (out_r, out_w, err_r, err_w, ours.fileno(), theirs.fileno(), stage.fd)
        ]
        for n in (5, 64, 65, 72, 73, 100, 200):
            if n not in taken:
                os.dup2(stray, n)  # inheritable: posix_spawn hands them on
        go_r, go_w = os.pipe2(os.O_CLOEXEC)
        pid = execstage.spawn(stage, theirs.fileno(), err_w, go_r)
        theirs.close()
        os.close(err_w)
        os.close(go_r)
        os.write(go_w, b"g")
        os.close(go_w)
        plan = Plan(
            executable="/bin/sh",
            argv=["sh", "-c", "cd /proc/self/fd && echo *"],
            env={},
            cwd="/",
            namespaces=0,
            uid=os.getuid(),
            gid=os.getgid(),
            seccomp=False,
        )
        records = execstage.encode(plan, None, 0)
        assert records is not None
        socket.send_fds(ours, [records], [out_w, out_w, out_w])
        ours.close()
        os.close(out_w)
        said = os.read(err_r, 4096)
        got = b""
        while chunk := os.read(out_r, 4096):
            got += chunk
        _, status = os.waitpid(pid, 0)
        return {
            "said": said.decode(),
            "got": got.decode(),
            "code": os.waitstatus_to_exitcode(status),
        }

    seen = in_child(probe)
    assert seen.get("said") == "" and seen.get("code") == 0, seen
    # 3 is the listing's own directory fd; none of the strays.
    assert seen["got"].split() == ["0", "1", "2", "3"], seen
