"""Each process run alone, as its systemd unit runs it: the console script with --state-dir,
``NOTIFY_SOCKET`` and ``WATCHDOG_USEC`` from the manager (here, this test), peers found
through the state directory, started in the worst order: poller, then core, then the
connector."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import NODE_UID, SENSORIUM, log_events, sensorium_command, user_state_dir

from sensorium.client import Client
from sensorium.deploy import units
from sensorium.shared.ids import new_id
from sensorium.shared.paths import StatePaths
from sensorium.supervisor.notify import Notification, NotifySocket

WATCHDOG_S = 1.0
BY_NAME = {p.log_name: p for p in units.PROCESSES}


class Manager:
    """What systemd does for ``Type=notify`` units: one notify socket, senders told apart
    by the pid the kernel credits each datagram to."""

    def __init__(self, paths: StatePaths) -> None:
        self.paths = paths
        self.sock = NotifySocket(f"standalone-{new_id()}")
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.notes: list[Notification] = []
        self.launcher = units.find_launcher()

    def start(
        self, name: str, *, module: bool = False, user: int | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``name`` as its unit would (``module``: as ``python -m`` by hand; ``user``:
        as that ordinary uid, from the interpreter and path it can read)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFY_", "WATCHDOG_"))}
        preexec: Any = None
        program = (
            [sys.executable, "-m", BY_NAME[name].module]
            if module
            else self.launcher.argv(BY_NAME[name])
        )
        if user is not None:
            # The CLI's environment and privilege drop for that uid, this module's argv.
            cli, env, preexec = sensorium_command(user)
            program = [cli[0], "-m", BY_NAME[name].module]
        env["NOTIFY_SOCKET"] = self.sock.address
        env["WATCHDOG_USEC"] = str(int(WATCHDOG_S * 1_000_000))
        argv = [*program, "--state-dir", str(self.paths.root)]
        proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            cwd="/",
            preexec_fn=preexec,
        )
        self.procs[name] = proc
        return proc

    def fields(self, name: str) -> list[dict[str, str]]:
        pid = self.procs[name].pid
        return [n.fields for n in self.notes if n.pid == pid]

    def wait_for(
        self, name: str, check: Callable[[list[dict[str, str]]], bool], timeout_s: float
    ) -> list[dict[str, str]]:
        deadline = time.monotonic() + timeout_s
        while True:
            self.notes += self.sock.receive()
            got = self.fields(name)
            if check(got):
                return got
            proc = self.procs[name]
            assert proc.poll() is None, f"{name} exited with {proc.returncode}: {got}"
            left = deadline - time.monotonic()
            assert left > 0, f"{name}: not seen in {timeout_s}s; it said {got}"
            select.select([self.sock.fileno()], [], [], min(left, 0.2))

    def ready(self, name: str, timeout_s: float = 30.0) -> str:
        """READY=1 from ``name``; the STATUS= it came with."""
        got = self.wait_for(name, lambda fs: any(f.get("READY") == "1" for f in fs), timeout_s)
        return next(f.get("STATUS", "") for f in got if f.get("READY") == "1")

    def statuses(self, name: str) -> list[str]:
        return [f["STATUS"] for f in self.fields(name) if "STATUS" in f]

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        self.sock.close()


@pytest.fixture
def manager(state_dir: StatePaths) -> Iterator[Manager]:
    m = Manager(state_dir)
    try:
        yield m
    finally:
        m.close()


def _status_says(text: str) -> Callable[[list[dict[str, str]]], bool]:
    return lambda fs: any(text in f.get("STATUS", "") for f in fs)


def _pinged_after(seen: int) -> Callable[[list[dict[str, str]]], bool]:
    return lambda fs: {"WATCHDOG": "1"} in fs[seen:]


def _node_config(paths: StatePaths, ready_wait_s: float, user: int | None = None) -> None:
    """``limits.core_ready_wait_s`` (and a supervisor's ready timeout of at least twice
    that, as the config requires, though no supervisor runs here)."""
    paths.node_config.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "limits": {"core_ready_wait_s": ready_wait_s},
        "supervisor": {"ready_timeout_s": 2 * ready_wait_s + 30},
    }
    paths.node_config.write_text(json.dumps(doc))
    if user is not None:
        for d, _dirs, files in os.walk(paths.root.parent):
            for name in [d, *(os.path.join(d, f) for f in files)]:
                os.lchown(name, user, user)


def test_each_process_runs_alone_in_any_order_and_serves_once_all_are_up(
    manager: Manager,
) -> None:
    m = manager
    # Core alone waits this long for the connector's catalog before it says READY.
    _node_config(m.paths, 1.0)
    # The poller first: nothing else is up, yet it is ready (its registry is open) and
    # says in STATUS that core is away.
    m.start("poller")
    assert m.ready("poller").startswith("registry open")
    m.wait_for("poller", _status_says("core unreachable"), 10)
    # Core next: it serves its client socket without a connector, and says so.
    m.start("core")
    assert "connector not yet connected" in m.ready("core")
    assert log_events(m.paths, "core", "core.ready")[-1]["connector_reported"] is False
    m.wait_for("poller", _status_says("reachable;"), 10)
    # The connector last: core finds it through the state directory.
    m.start("connector")
    assert "catalog exposed" in m.ready("connector", 60)
    m.wait_for("core", _status_says("actions"), 30)

    with Client(state_dir=str(m.paths.root)) as client:
        outcome = client.invoke("demo.fs.stat", {"path": "/etc/hostname"}, retries=3)
    assert outcome.status == "completed", outcome
    assert outcome.exit_code == 0

    # Every process pings its watchdog at half the interval, from its event loop; and
    # SIGHUP (the units' ExecReload=) only reopens logs: the pings go on.
    for name in ("poller", "core", "connector"):
        m.wait_for(name, lambda fs: sum(f.get("WATCHDOG") == "1" for f in fs) >= 2, 5)
        m.procs[name].send_signal(signal.SIGHUP)
        m.wait_for(name, _pinged_after(len(m.fields(name))), 5)

    # SIGTERM: STOPPING=1, then a clean exit, as systemd expects of a stop.
    for name in ("poller", "core", "connector"):
        proc = m.procs[name]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, f"{name} exited with {proc.returncode}"
        m.notes += m.sock.receive()
        assert {"STOPPING": "1"} in m.fields(name), m.fields(name)


def _cli(paths: StatePaths, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SENSORIUM, "--state-dir", str(paths.root), *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _rows(paths: StatePaths) -> dict[str, dict[str, Any]]:
    res = _cli(paths, "status", "--json")
    return {p["name"]: p for p in json.loads(res.stdout)["processes"]}


def test_status_stop_and_the_watchdog_for_processes_started_by_hand(manager: Manager) -> None:
    """No supervisor, no systemd: `sensorium status` asks each process itself (its pid
    from the lock it holds), `restart` says it cannot, and `stop` drains them in order.
    A process whose socket is taken from it stops pinging its watchdog."""
    m = manager
    for name in ("connector", "core", "poller"):
        m.start(name, module=True)
        m.ready(name, 60)
    m.wait_for("core", _status_says("actions"), 30)

    res = _cli(m.paths, "status")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "started by hand" in res.stdout
    rows = _rows(m.paths)
    for name, proc in m.procs.items():
        row = rows[name]
        assert (row["state"], row["pid"], row["answers"]) == ("ready", proc.pid, True), rows

    res = _cli(m.paths, "restart", "connector")
    assert res.returncode == 1 and "started by hand" in res.stdout, res.stdout
    assert "sensorium up" not in res.stdout + res.stderr

    # Core loses its socket (someone unlinked it): it no longer serves, and says so by
    # withholding its watchdog pings; status shows it unreachable.
    (m.paths.run / "core.sock").unlink()
    # Ordered by events, not by timing: once core has withheld a ping (its log says so),
    # any ping decided before the unlink has arrived; none may follow.
    for _ in range(600):
        if log_events(m.paths, "core", "watchdog.ping.withheld"):
            break
        time.sleep(0.05)
    assert log_events(m.paths, "core", "watchdog.ping.withheld"), "core kept pinging"
    m.notes += m.sock.receive()
    seen = len(m.fields("core"))
    time.sleep(3 * WATCHDOG_S)
    m.notes += m.sock.receive()
    assert {"WATCHDOG": "1"} not in m.fields("core")[seen:], m.fields("core")[seen:]
    assert {"WATCHDOG": "1"} in m.fields("poller")[-5:]
    res = _cli(m.paths, "status")
    assert res.returncode == 1
    assert "unreachable" in res.stdout and "no answer on ipc://" in res.stdout, res.stdout
    core = _rows(m.paths)["core"]
    assert (core["state"], core["answers"]) == ("unreachable", False), core
    assert "sensorium up" not in res.stdout + res.stderr

    res = _cli(m.paths, "stop")
    assert res.returncode == 0, res.stdout + res.stderr
    for name, proc in m.procs.items():
        assert proc.wait(30) == 0, f"{name} exited with {proc.returncode}"
    res = _cli(m.paths, "status")
    assert res.returncode == 3 and "nothing of this node runs" in res.stdout


@pytest.fixture(params=["root", "ordinary-uid"])
def as_user(request: pytest.FixtureRequest) -> int | None:
    if request.param == "ordinary-uid" and os.geteuid() != 0:
        pytest.skip("starting a node as another uid needs root")
    return NODE_UID if request.param == "ordinary-uid" else None


def test_core_says_ready_once_it_can_admit_a_directive(as_user: int | None) -> None:
    """READY=1 from core means a directive can be admitted: it waits for the connector's
    catalog (``limits.core_ready_wait_s`` at most; long here, so that no machine's speed
    decides the verdict). A unit After= core, or a script run the moment systemd says
    started, is not refused connector-unavailable."""
    paths = (
        user_state_dir()
        if as_user is not None
        else StatePaths(Path(tempfile.mkdtemp(prefix="st-", dir="/tmp")))
    )
    m = Manager(paths)
    try:
        _node_config(paths, 600.0, as_user)
        m.start("core", user=as_user)
        m.wait_for("core", _status_says("waiting for the connector's report"), 60)
        m.notes += m.sock.receive()
        assert not any(f.get("READY") == "1" for f in m.fields("core")), m.fields("core")
        m.start("connector", user=as_user)
        status = m.ready("core", 120)
        assert "actions" in status, status
        # Sent at once, with no retry: admitted and run.
        with Client(state_dir=str(paths.root)) as client:
            outcome = client.invoke("demo.fs.stat", {"path": "/etc/hostname"}, retries=0)
        assert outcome.status == "completed", outcome
        ready = log_events(paths, "core", "core.ready")
        assert ready and ready[-1]["connector_reported"] is True, ready
    finally:
        m.close()
        shutil.rmtree(paths.root.parent if as_user is not None else paths.root, ignore_errors=True)
