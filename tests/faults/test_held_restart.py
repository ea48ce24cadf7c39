"""A restart's process is spawned as its backoff begins and held until it ends: its
interpreter and imports overlap the wait, and it does nothing else before its word.
Whatever happens to it or to the supervisor meanwhile, nothing is left behind and the
backoff still holds."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import psutil
import pytest
from harness import NODE_UID, Stack, log_events, running_stack

# Long enough that a held process on a loaded machine still reaches its wait inside it;
# every verdict below waits for a state or reads the supervisor's log, never a clock.
BACKOFF_S = 8.0
NODE = {"supervisor": {"backoff_initial_s": BACKOFF_S, "backoff_jitter": 0}}


@pytest.fixture(params=["root", "ordinary-uid"])
def node(request: pytest.FixtureRequest) -> Iterator[Stack]:
    if request.param == "ordinary-uid" and os.geteuid() != 0:
        pytest.skip("starting a node as another uid needs root")
    user = NODE_UID if request.param == "ordinary-uid" else None
    with running_stack([], node=NODE, user=user) as s:
        yield s


def _kill_and_find_held(stack: Stack, victim: str) -> tuple[int, int]:
    """Kill ``victim``; the old pid and the pid the supervisor spawned early for it."""
    old = stack.pids()[victim]
    assert old
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for event in log_events(stack.paths, "supervisor", "process.restart.scheduled"):
            if event["child"] == victim and event.get("held_pid"):
                return old, int(event["held_pid"])
        time.sleep(0.02)
    raise AssertionError(f"no early start for {victim} was logged")


def _state(stack: Stack, name: str) -> str:
    return {c.name: c.state for c in stack.status().children}[name]


# read(2)'s number, for the machines whose /proc may hide wait channels.
READ_SYSCALL = {"x86_64": "0", "aarch64": "63"}.get(os.uname().machine)


def _waiting_for_word(pid: int) -> bool:
    """Blocked reading its hold pipe: the kernel's wait channel, else the syscall it
    sleeps in, a read(2) of the hold fd (where /proc hides wait channels)."""
    proc = Path(f"/proc/{pid}")
    if (proc / "wchan").read_text().strip() in ("pipe_read", "anon_pipe_read"):
        return True
    environ = dict(
        item.split("=", 1) for item in (proc / "environ").read_text().split("\0") if "=" in item
    )
    fd = environ.get("SENSORIUM_HOLD_FD")
    fields = (proc / "syscall").read_text().split()
    return (
        fd is not None
        and len(fields) > 1
        and fields[0] == READ_SYSCALL
        and fields[1] == hex(int(fd))
    )


def _await_wait(pid: int) -> None:
    deadline = time.monotonic() + 60
    while not _waiting_for_word(pid):
        assert time.monotonic() < deadline, f"held process {pid} never waited for its word"
        time.sleep(0.02)


def _when(stack: Stack, event: str, **match: object) -> list[float]:
    return [
        datetime.fromisoformat(e["ts"].replace("Z", "+00:00")).timestamp()
        for e in log_events(stack.paths, "supervisor", event)
        if all(e.get(k) == v for k, v in match.items())
    ]


def test_a_restart_is_spawned_early_held_through_its_backoff_then_adopted(node: Stack) -> None:
    old, held = _kill_and_find_held(node, "poller")
    proc = psutil.Process(held)
    assert proc.ppid() == node.proc.pid
    assert "sensorium.poller" in " ".join(proc.cmdline())
    # Once it waits for its word, the held process has opened nothing in the state
    # directory but its stderr file (no log, no role lock, no store) and no socket; the
    # status still shows the old incarnation gone and no pid.
    _await_wait(held)
    root = Path(node.paths.root).resolve()
    opened = [f.path for f in proc.open_files() if Path(f.path).resolve().is_relative_to(root)]
    sockets = proc.net_connections(kind="unix")
    children = {c.name: c for c in node.status().children}
    assert children["poller"].state == "backoff", children["poller"]
    assert children["poller"].pid is None
    assert all(p.endswith("poller.stderr") for p in opened), opened
    assert not sockets, sockets
    # Then it is the new incarnation: the same pid, READY.
    new = node.wait_replaced("poller", old)
    assert new == held
    started = [
        e for e in log_events(node.paths, "supervisor", "process.started") if e["pid"] == held
    ]
    assert started and started[0]["early"] is True, started
    (scheduled,) = _when(node, "process.restart.scheduled", child="poller", held_pid=held)
    (word,) = _when(node, "process.started", child="poller", pid=held)
    assert word - scheduled >= BACKOFF_S - 0.05  # the backoff held


def test_a_held_process_that_dies_before_its_word_is_replaced_by_a_cold_start(
    node: Stack,
) -> None:
    old, held = _kill_and_find_held(node, "poller")
    os.kill(held, signal.SIGKILL)
    new = node.wait_replaced("poller", old)
    assert new != held
    gone = [e for e in log_events(node.paths, "supervisor", "process.held.exited")]
    assert [e["pid"] for e in gone] == [held], gone
    started = [e for e in log_events(node.paths, "supervisor", "process.started")]
    assert started[-1]["pid"] == new and started[-1]["early"] is False, started
    # Its death came before the backoff's end, and the cold start waited for that end.
    (scheduled,) = _when(node, "process.restart.scheduled", child="poller", held_pid=held)
    (died,) = _when(node, "process.held.exited", pid=held)
    (cold,) = _when(node, "process.started", child="poller", pid=new)
    assert scheduled <= died <= cold
    assert cold - scheduled >= BACKOFF_S - 0.05
    status = {c.name: c for c in node.status().children}["poller"]
    assert status.restarts == 1  # one crash, one restart: the held one's death is not a crash


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_a_supervisor_that_stops_or_dies_during_a_backoff_leaves_no_held_process(
    node: Stack, how: signal.Signals
) -> None:
    _old, held = _kill_and_find_held(node, "core")
    assert _state(node, "core") == "backoff"
    tree = node.tree()
    assert held in [p.pid for p in tree]
    node.proc.send_signal(how)
    node.proc.wait(timeout=30)
    # SIGTERM: the supervisor kills it. SIGKILL: it reads end of file and exits.
    _gone, alive = psutil.wait_procs(tree, timeout=20)
    assert not alive, f"left behind: {[(p.pid, p.cmdline()) for p in alive]}"
