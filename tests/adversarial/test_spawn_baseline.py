"""Attempts to get more than the universal spawn baseline allows, through real spawns."""

from __future__ import annotations

import json
import time

import psutil
import pytest
from harness import Stack, none_running, program

INJECTIONS = [
    "; rm -rf /tmp/x #",
    "$(id)",
    "`id`",
    "a b c",
    "--help",
    "-rf",
    "x\ny",
    "' \" \\",
    "{{value}}",
    "*",
    "$HOME",
    "&& reboot",
]


@pytest.mark.parametrize("value", INJECTIONS)
def test_parameters_arrive_as_one_verbatim_argv_element(stack: Stack, value: str) -> None:
    with stack.client() as c:
        out = c.invoke("test.echo-args", {"value": value})
    assert out.status == "completed"
    assert json.loads(out.stdout.text) == ["--", value]
    assert out.argv[-1] == value


def test_option_injection_into_a_demo_action_is_refused(stack: Stack) -> None:
    from sensorium.client import ParametersInvalid

    with stack.client() as c, pytest.raises(ParametersInvalid):
        c.invoke("demo.fs.list-directory", {"path": "--recursive"})


def test_spawn_baseline(stack: Stack) -> None:
    with stack.client() as c:
        out = c.invoke("test.inspect")
    assert out.status == "completed", out.stderr.text
    seen = out.result.json if out.result else {}
    # A new session and process group of its own.
    assert seen["pid"] == seen["pgid"] == seen["sid"]
    # Only stdin, stdout, stderr (the listing itself opens one more, 3, for /proc/self/fd).
    assert [fd for fd in seen["fds"] if fd > 2] in ([], [3])
    # stdin is /dev/null (char device 1:3) and no descriptor is a terminal.
    assert seen["stdin_is_chr"] and seen["stdin_rdev"] == [1, 3]
    assert seen["isatty"] == [False, False, False]
    assert seen["no_new_privs"] == "1"
    assert seen["rlimit_core"] == [0, 0]
    # The curated environment: the baseline and nothing of the connector's.
    env = seen["env"]
    assert set(env) <= {"PATH", "LANG", "HOME", "TMPDIR", "LC_CTYPE"}
    assert env["HOME"] == env["TMPDIR"] == seen["cwd"]
    # cwd is the action's own scratch: a private tmpfs at /tmp that dies with its
    # namespace, where it is pid 2 (its init is pid 1).
    assert seen["cwd"] == "/tmp"
    assert seen["pid"] == 2


def test_connector_environment_does_not_leak(stack: Stack) -> None:
    with stack.client() as c:
        out = c.invoke("test.inspect")
    assert out.status == "completed" and out.result is not None, out.stderr.text
    env = out.result.json["env"]
    assert not any(k.startswith(("NOTIFY_SOCKET", "WATCHDOG", "SENSORIUM")) for k in env)


@pytest.mark.slow
def test_timeout_kills_a_grandchild_that_ignores_sigterm_and_holds_stdout(stack: Stack) -> None:
    t0 = time.monotonic()
    with stack.client() as c:
        out = c.invoke("test.grandchild", {"mode": "hold"}, timeout_ms=1000)
    elapsed = time.monotonic() - t0
    assert out.status == "timed-out"
    assert [d.code for d in out.diagnostics] == ["action-timeout"]
    assert "process timed out" in out.stderr.text
    assert none_running(program("grandchild.py"), 30)  # it never ends by itself
    # 1 s timeout + 5 s SIGTERM grace, then SIGKILL: bounded, not a hang.
    assert elapsed < 1 + 5 + 4


def test_grandchild_holding_the_pipe_after_its_parent_exits_does_not_hang(stack: Stack) -> None:
    with stack.client() as c:
        out = c.invoke("test.grandchild", {"mode": "exit"}, timeout_ms=20_000)
    assert out.status == "completed"  # a hang would have lasted to its timeout
    assert none_running(program("grandchild.py"), 30)  # it never ends by itself


@pytest.mark.slow
def test_one_gib_stdout_flood_is_capped_and_the_connector_stays_small(stack: Stack) -> None:
    connector = psutil.Process(stack.pids()["connector"])
    before = connector.memory_info().rss
    gib = 1 << 30
    with stack.client() as c:
        out = c.invoke("test.flood", {"bytes": gib}, timeout_ms=60_000)
    assert out.status == "completed", out.stderr.text
    assert out.stdout.truncated and out.stdout.bytes_total == gib
    assert out.stdout.bytes_captured == len(out.stdout.text) == 4096
    assert out.stderr.text == "flood done\n" and not out.stderr.truncated
    grown = connector.memory_info().rss - before
    assert grown < 64 * 1024 * 1024, f"connector grew by {grown} bytes reading 1 GiB"
