"""`sensorium logs`: rotated files in the backlog, filters, following through size
rotation and logrotate's move + SIGHUP; the stack's processes live through SIGHUP."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import termios
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from harness import SENSORIUM, Stack
from log_writer import start_writer, wait_for

from sensorium.client.cli.main import main
from sensorium.shared.paths import StatePaths


def cli(root: Path, capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    """`sensorium logs` run in this process (its startup would dominate a subprocess)."""
    assert main(["logs", "--state-dir", str(root), *args]) == 0
    return capsys.readouterr().out.splitlines()


def ts(seconds_ago: float) -> str:
    at = datetime.now(UTC) - timedelta(seconds=seconds_ago)
    return at.isoformat().replace("+00:00", "Z")


def write(path: Path, events: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e) + "\n" for e in events))


def test_backlog_merges_rotated_files_and_processes_and_filters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logs = tmp_path / "logs"

    def ev(n: int, process: str, **kw: Any) -> dict[str, Any]:
        return {
            "ts": ts(3600 - 60 * n),
            "level": "info",
            "process": process,
            "event": "e",
            "n": n,
            **kw,
        }

    write(logs / "core.jsonl.2", [ev(0, "core"), ev(2, "core")])
    write(logs / "core.jsonl.1", [ev(4, "core"), ev(6, "core", level="warning")])
    write(logs / "core.jsonl", [ev(8, "core", **{"request/id": "R1"}), ev(10, "core")])
    write(logs / "poller.jsonl.1", [ev(1, "poller"), ev(3, "poller", action_id="a.b")])
    write(logs / "poller.jsonl", [ev(5, "poller"), ev(7, "poller"), ev(9, "poller")])
    (logs / "poller.jsonl").open("a").write('{"torn": ')  # a killed writer's last line
    (logs / "core.stderr").write_text("Traceback: not JSON, not shown\n")

    def ns(*args: str) -> list[int]:
        return [json.loads(line)["n"] for line in cli(tmp_path, capsys, "--json", *args)]

    assert ns() == list(range(11))
    assert ns("-n", "4") == [7, 8, 9, 10]
    assert ns("-n", "0") == []
    assert ns("--process", "poller", "-n", "2") == [7, 9]
    assert ns("--process", "poller", "--process", "core", "-n", "3") == [8, 9, 10]
    assert ns("--request-id", "R1") == [8]
    assert ns("--action", "a.b") == [3]
    assert ns("--level", "warning") == [6]
    assert ns("--event", "x") == [] and ns("--event", "") == list(range(11))
    assert ns("--since", "3330s") == [5, 6, 7, 8, 9, 10]  # a minute apart: slack for slow runs
    assert ns("--since", "55.5m") == [5, 6, 7, 8, 9, 10]
    assert ns("--since", ts(3030)) == [10]
    readable = cli(tmp_path, capsys, "-n", "1")
    assert len(readable) == 1 and " core " in readable[0] and "n=10" in readable[0]
    assert "\033[" not in readable[0]  # no colours off a terminal


def test_colours_on_a_terminal_only(tmp_path: Path) -> None:
    write(tmp_path / "logs" / "core.jsonl", [{"ts": ts(1), "level": "warning", "event": "w"}])
    master, slave = os.openpty()
    with os.fdopen(master, "rb", buffering=0) as tty:
        res = subprocess.run(
            [*SENSORIUM, "logs", "--state-dir", str(tmp_path)],
            stdin=subprocess.DEVNULL,
            stdout=slave,
            timeout=30,
        )
        os.close(slave)
        shown = tty.read(4096)
    assert res.returncode == 0 and shown.startswith(b"\033[33m") and b" w " in shown


def _follow(root: Path, *args: str) -> tuple[subprocess.Popen[str], list[str], threading.Thread]:
    proc = subprocess.Popen(
        [*SENSORIUM, "logs", "--state-dir", str(root), "-f", "--json", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return proc, out, reader


def _ticks_printed(out: list[str], last_event: str = "done") -> list[int]:
    wait_for(lambda: any(f'"{last_event}"' in line for line in out), 20)
    time.sleep(2 * 0.25)  # a repeat would come within a poll or two
    events = [json.loads(line) for line in out]
    assert [e["event"] for e in events].count(last_event) == 1
    return [e["i"] for e in events if e["event"] == "tick"]


def test_follow_prints_every_line_once_in_order_through_size_rotation(tmp_path: Path) -> None:
    node = {"logs": {"max_bytes": 4096, "keep": 60}}
    writer = start_writer(tmp_path, n=600, pause_s=0.002, node=node)
    log = tmp_path / "logs" / "writer.jsonl"
    wait_for(lambda: (tmp_path / "logs" / "writer.jsonl.2").exists())
    follower, out, _reader = _follow(tmp_path, "--process", "writer", "-n", "100000")
    try:
        assert writer.wait(timeout=30) == 0
        assert _ticks_printed(out) == list(range(600))
        assert len(list(log.parent.glob("writer.jsonl.*"))) > 10  # it did rotate, often
    finally:
        follower.kill()
        follower.wait()
        writer.kill()
        writer.wait()


def test_follow_finishes_a_moved_file_before_the_reopened_one(tmp_path: Path) -> None:
    writer = start_writer(tmp_path, n=500, pause_s=0.004, node={"logs": {"max_bytes": 0}})
    log = tmp_path / "logs" / "writer.jsonl"
    follower, out, _reader = _follow(tmp_path, "--process", "writer", "-n", "0")
    try:
        for round_ in range(3):
            wait_for(lambda: log.exists() and log.stat().st_size > 3000)
            for n in range(round_, 0, -1):  # as logrotate names them: .1 the newest
                log.with_name(f"writer.jsonl.{n}").rename(log.with_name(f"writer.jsonl.{n + 1}"))
            log.rename(log.with_name("writer.jsonl.1"))
            if round_ == 1:
                log.touch()  # logrotate's `create`: an empty new file at once
            time.sleep(0.3)  # the writer goes on in the moved file; the follower reads it
            os.kill(writer.pid, signal.SIGHUP)
        assert writer.wait(timeout=30) == 0
        printed = _ticks_printed(out)
    finally:
        follower.kill()
        follower.wait()
        writer.kill()
        writer.wait()
    assert printed[-1] == 499
    # -n 0: from where the writer was when we started, every line once, in order.
    assert printed == list(range(printed[0], 500))


def test_the_stack_lives_through_sighup_and_reopens_its_logs(stack: Stack) -> None:
    paths: StatePaths = stack.paths
    before = stack.pids()
    for pid in before.values():
        assert pid is not None
        os.kill(pid, signal.SIGHUP)  # as `systemctl reload` sends it to a unit
    with stack.client() as c:  # core writes a line: that reopen is done with
        assert c.invoke("test.echo-args", {"value": "before"}).status == "completed"
    for name in ("core", "supervisor"):
        paths.log_file(name).rename(paths.logs / f"{name}.jsonl.moved")
    os.kill(stack.proc.pid, signal.SIGHUP)  # the supervisor passes it on
    wait_for(lambda: paths.log_file("supervisor").exists(), 10)
    with stack.client() as c:
        assert c.invoke("test.echo-args", {"value": "after"}).status == "completed"
    assert stack.proc.poll() is None and stack.pids() == before
    assert all(s == "ready" for s in stack.states().values())
    events = [json.loads(line)["event"] for line in paths.log_file("core").read_text().splitlines()]
    assert any(e.startswith("directive.") for e in events)  # core reopened on the forward
    mine = stack.cli("logs", "--action", "test.echo-args", "--json").stdout.splitlines()
    assert {json.loads(line)["process"] for line in mine} >= {"core", "connector"}
    reopened = [
        e
        for e in map(json.loads, paths.log_file("supervisor").read_text().splitlines())
        if e["event"] == "supervisor.logs.reopened"
    ]
    assert reopened[0]["passed_to"] == ["connector", "core", "poller"]


def test_a_terminal_hangup_still_stops_sensorium_up(state_dir: StatePaths) -> None:
    master, slave = os.openpty()

    def take_terminal() -> None:  # as a login shell's job: the pty is our terminal
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        # And a login shell's job's signals, not what this test run inherited: under
        # `nohup` SIGHUP is ignored, and `up` then rightly takes a hangup for "reopen
        # the logs". The same for a run in the background (SIGINT, SIGQUIT ignored).
        for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())

    env = dict(os.environ)
    env.pop("NOTIFY_SOCKET", None)
    proc = subprocess.Popen(
        [*SENSORIUM, "up", "--quiet", "--state-dir", str(state_dir.root)],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
        preexec_fn=take_terminal,
        env=env,
    )
    os.close(slave)
    stack = Stack(state_dir, proc)
    try:
        stack.wait_ready(actions=False)
        os.close(master)  # the terminal goes away: SIGHUP, and reads say EIO
        assert proc.wait(timeout=20) == 0
    finally:
        stack.stop()


def test_the_backlog_misses_no_file_when_a_rotation_runs_while_it_looks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real rotation (every name shifts up, a new file takes the path) made to happen
    between two of the backlog's opens: the oldest file moved to a name it had not
    listed, and it used to be skipped."""
    import argparse

    from sensorium.client.cli import logs

    base = tmp_path / "w.jsonl"

    def line(i: int) -> str:
        return json.dumps({"ts": f"2026-01-01T00:00:0{i}.000000Z", "event": "tick", "i": i}) + "\n"

    for n, i in ((3, 0), (2, 1), (1, 2)):
        base.with_name(f"w.jsonl.{n}").write_text(line(i))
    base.write_text(line(3))
    real = logs._File.open.__func__  # type: ignore[attr-defined]
    pending = [True]

    def open_and_rotate(cls: type, path: Path) -> Any:
        f = real(cls, path)
        if pending and path.name == "w.jsonl.1":
            pending.clear()
            for n in (3, 2, 1):
                os.rename(base.with_name(f"w.jsonl.{n}"), base.with_name(f"w.jsonl.{n + 1}"))
            os.rename(base, base.with_name("w.jsonl.1"))
            base.write_text(line(4))
        return f

    monkeypatch.setattr(logs._File, "open", classmethod(open_and_rotate))
    args = argparse.Namespace(
        since=None, request_id=None, action=None, level=None, event=None, process=None
    )
    found = logs._Log(base).backlog(logs._Matcher(args), 100)
    assert [ev["i"] for _ts, ev, _raw in found] == [0, 1, 2, 3, 4]
